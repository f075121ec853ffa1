"""A spatial source the exporter has never heard of (issue 44: a new source is one module): a fixed SM
activity for every GPU NVML lists, as a site's own profiler would publish it. `python -m tests.dummy_spatial
FLAGS` registers it first in the default order and runs the exporter; tests/test_source_registry.py reads it
back. It holds the GPU's profiling counters, as DCGM does: nsys captures leave a GPU it serves alone."""
from __future__ import annotations

import sys
import time

from exporter.sampler import SamplerDefaults
from exporter.snapshot import OK, CollectorHealth, SourceResult, SpatialReading

HOLDS_PROFILER = True
PAUSE_PROFILER = "fixedctl pause"


class FixedSource(SamplerDefaults):
    name = "fixed"

    def __init__(self, nvml, sm_active: float, interval: float):
        self.nvml, self.sm_active, self.interval = nvml, sm_active, interval
        self.results = {}
        self.health = CollectorHealth(False, 0.0, "not sampled yet")

    def tick(self) -> None:
        now = time.time()
        self.results = {gpu.uuid: SourceResult(OK, "a fixed value", SpatialReading(
            "fixed", now - self.interval, now, sm_active=self.sm_active)) for gpu in self.nvml.gpus}
        self.health = CollectorHealth(True, 0.0)


def add_arguments(parser) -> None:
    parser.add_argument_group("fixed").add_argument("--fixed-sm-active", type=float, default=None,
                                                     help="the SM activity published for every GPU")


def check_arguments(args) -> str | None:
    if args.fixed_sm_active is not None and not 0 <= args.fixed_sm_active <= 1:
        return f"--fixed-sm-active {args.fixed_sm_active}: a ratio is 0..1"
    return None


def build(args, nvml, built=None):
    if args.fixed_sm_active is None:
        return None, "not configured: pass --fixed-sm-active"
    return FixedSource(nvml, args.fixed_sm_active, args.interval), None


def register() -> None:
    from exporter import sources

    sources.SOURCES = {"fixed": "tests.dummy_spatial", **sources.SOURCES}  # its one registration line: first


if __name__ == "__main__":
    register()
    from exporter.__main__ import main

    sys.exit(main(sys.argv[1:]))
