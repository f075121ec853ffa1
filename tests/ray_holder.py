"""A holder kind with labels of its own (issue 44): Ray actors, from a file of "pid job actor" lines. It is
one module plus its registration line, from the test suite only: `python -m tests.ray_holder FLAGS` registers
it and runs the exporter; tests/test_holder_registry.py reads its labels back from every view."""
from __future__ import annotations

import sys

from exporter.holders import Holder
from tests import dummy_holder


class RayActors(dummy_holder.LsfJobs):
    name = "ray"

    def holder(self, job: str, actor: str) -> Holder:
        return Holder(ray_job=job, ray_actor=actor)


SCHEDULER = True  # Ray places actors on GPUs
LABELS = {"ray_job": "the Ray job of an actor holder", "ray_actor": "the Ray actor holding the GPU"}
PANELS = {"ray_actor": ("Ray actors", "Actors from the mapping file (--ray-actor-file).",  # the workloads dashboard
                       "no Ray actor held a GPU in the range.")}


def add_arguments(parser) -> None:
    parser.add_argument_group("ray").add_argument("--ray-actor-file", default=None, help="lines of 'pid job actor'")


def build(args, nvml, explicit: bool = False):
    return RayActors(nvml, args.ray_actor_file, args.interval) if args.ray_actor_file else None


def register() -> None:
    from exporter import holders

    holders.KINDS["ray"] = "tests.ray_holder"  # its one registration line


if __name__ == "__main__":
    register()
    from exporter.__main__ import main

    sys.exit(main(sys.argv[1:]))
