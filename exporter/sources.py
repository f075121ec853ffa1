"""Spatial sources: the registry config.py, __main__.py, engine.py and chain.py read.

A spatial source is one module plus its line in SOURCES (node_exporter's collectors register themselves and
their flags the same way). The module declares
- add_arguments(parser): its flags, in an argument group named after it, and optionally
  check_arguments(args) -> str | None: why they cannot work together (one line), or None;
- build(args, nvml, built) -> (its source, None), or (None, why it was not built): a reason (not configured:
  state disabled) or a SourceResult (configured, but it could not start). `nvml`: the NvmlSampler;
  `built`: the sources built before it, by name (a source that only fills gaps leaves their GPUs alone);
- HOLDS_PROFILER (optional, with PAUSE_PROFILER: the command that pauses it): True where it holds the
  GPU's profiling counters while it serves the GPU (DCGM profiling); nsys captures (live windows, context
  switches) cannot sample the GPU meanwhile and leave it alone.
The order of SOURCES is the default order of preference (--spatial-sources) and the order they are built in.
Only what a module imports at its top is loaded for its flags: a source's heavy parts load in build().
"""
from __future__ import annotations

import importlib

SOURCES = {"dcgm": "exporter.samplers.dcgm", "gpm": "exporter.samplers.gpm", "nsys": "exporter.samplers.nsys"}


def default_order() -> tuple[str, ...]:
    return tuple(SOURCES)


def _module(name: str):
    return importlib.import_module(SOURCES[name])


def add_arguments(parser) -> None:
    for name in SOURCES:
        _module(name).add_arguments(parser)


def check_arguments(args) -> list[str]:
    """Why the sources' flags cannot work, one line each (a module's optional check_arguments(args))."""
    checks = [getattr(_module(name), "check_arguments", None) for name in SOURCES]
    return [why for why in (check(args) for check in checks if check is not None) if why]


def profilers() -> dict[str, str]:
    """The sources that hold the GPU's profiling counters while they serve it: name -> how to pause it."""
    return {name: getattr(module, "PAUSE_PROFILER", "") for name in SOURCES
            if getattr(module := _module(name), "HOLDS_PROFILER", False)}


def profiled_by(sources: dict, uuid: str) -> tuple[str, str] | None:
    """(name, how to pause it) of a source among `sources` (name -> source) that profiles this GPU now, or None."""
    from exporter.sampler import serves

    return next(((name, pause) for name, pause in profilers().items() if serves(sources, name, uuid)), None)


def build_spatial_sources(args, nvml) -> tuple[dict, dict]:
    """Returns (the sources --spatial-sources names that were built, by name in the order of SOURCES; why
    each other one was not: a reason string for one not configured, a SourceResult (state error) for one
    that failed to start)."""
    built, disabled = {}, {}
    for name in SOURCES:
        if name not in args.spatial_sources:
            continue
        source, why = _module(name).build(args, nvml, dict(built))
        if source is not None:
            built[name] = source
        else:
            disabled[name] = why
    return built, disabled
