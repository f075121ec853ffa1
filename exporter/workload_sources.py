"""Per-process workload sources: the registry the workload join (exporter/workloads.py) reads.

A source is an exporter.sampler.WorkloadSource: per GPU a ProcessWindow of what each process did
(basis ctxsw: the GPU's context switches; cupti: an MPS client's own kernels). A new source is one
module plus its line in SOURCES; the module has
- add_arguments(parser): its flags, in an argument group named after it;
- check_arguments(args) -> str | None: why its flags cannot work together (one line), or None;
- build(args, nvml, spatial) -> the sampler, or None where its flags do not ask for it. `nvml`: the
  NvmlSampler; `spatial`: the spatial sources by name (one may exclude it from a GPU: DCGM profiling).
"""
from __future__ import annotations

import importlib

# Name -> module. Order: the order in which their flags are listed and their samplers built.
SOURCES = {"ctxsw": "exporter.samplers.ctxsw", "cupti": "exporter.samplers.cupti"}


def _modules():
    return [importlib.import_module(module) for module in SOURCES.values()]


def add_arguments(parser) -> None:
    for module in _modules():
        module.add_arguments(parser)


def check_arguments(args) -> list[str]:
    """Why the sources' flags cannot work, one line each."""
    return [why for why in (module.check_arguments(args) for module in _modules()) if why]


def build_sources(args, nvml, spatial) -> list:
    """The workload sources the flags ask for."""
    return [source for source in (module.build(args, nvml, spatial) for module in _modules()) if source is not None]
