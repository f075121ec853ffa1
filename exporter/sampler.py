"""The sampler contract: what every background source offers the engine, and what a per-process
workload source offers the workload join.

The engine (exporter/engine.py) runs one list of samplers, each in its own loop, and knows none of
them by kind: a new source is one module whose object has these attributes. What a sampler publishes
is its own `snapshot` (None: nothing), shown in the Snapshot under its `name`; spatial sources add
`results` per GPU, holder samplers `holdings` (exporter/holders.py), workload sources `fresh()`.

`SamplerDefaults` gives the optional attributes their usual values; a class may inherit it or spell
them itself (the Protocols are structural: nothing else is required).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

from exporter.snapshot import CollectorHealth, GpuIdentity, SourceResult, SpatialReading
from exporter.vocabulary import ACTIVE, OK, STANDBY


@runtime_checkable
class Sampler(Protocol):
    """A background source. `tick()` reads its source once (never on the scrape path) and leaves what
    it read in its own attributes; an exception is that tick's failure, never the engine's."""

    name: str  # the collector name of gpu_exporter_collector_success{collector}; unique among samplers
    interval: float  # seconds between the starts of two ticks
    health: CollectorHealth  # how its last tick went
    max_tick_seconds: float  # a tick running longer is stuck (0: the engine's default deadline)
    after_nvml: bool  # its loop starts once NVML's first tick has listed the GPUs (it maps things to them)
    in_nvml_loop: bool  # ticked in NVML's loop right before NVML: the same window as time utilization (GPM)
    snapshot: object  # what it publishes under its name in the Snapshot and /api/v1/gpus (None: nothing)

    def tick(self) -> None: ...

    def close(self) -> None:
        """Ends work in flight (a capture) and frees what the sampler holds; called once, at stop."""

    def more_health(self) -> dict[str, CollectorHealth]:
        """Health of helpers it ticks itself, by their own collector name (the kubelet's API reader)."""


@runtime_checkable
class SpatialSource(Sampler, Protocol):
    """A sampler of spatial utilization per GPU (dcgm, gpm, nsys): the chain picks one per GPU."""

    results: Mapping[str, SourceResult]  # GPU UUID -> state, reason and reading
    identities: Mapping[str, GpuIdentity]  # GPUs only this source knows (a replayed export's)
    instances: Mapping[tuple[str, int], SpatialReading]  # (GPU UUID, MIG GPU instance) -> its own SMs' reading


class SamplerDefaults:
    """The optional parts of the contract, at their usual values."""

    max_tick_seconds = 0.0
    after_nvml = False
    in_nvml_loop = False
    snapshot = None
    identities: Mapping[str, GpuIdentity] = {}
    instances: Mapping[tuple[str, int], SpatialReading] = {}

    def close(self) -> None:
        pass

    def more_health(self) -> dict[str, CollectorHealth]:
        return {}


def serves(sources: dict, name: str, uuid: str) -> bool:
    """Whether the source `name` among `sources` (name -> source) publishes this GPU now: live nsys
    captures leave a GPU that DCGM profiles alone (both cannot sample its counters at once)."""
    source = sources.get(name)
    result = source.results.get(uuid) if source is not None else None
    return result is not None and result.state == OK


# -- per-process workload sources ----------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessShare:
    """What one process did on one GPU over a window."""

    time: float  # share of the window its work was resident (ctxsw) or its SM work ran (cupti): union of intervals
    sm: float | None = None  # its SM-active share of the whole GPU over the window (cupti: the unscaled estimate)
    parts: tuple[tuple[str, float], ...] | None = None  # cupti: what its busy time is made of, shares of the window
    record_path: str | None = None  # cupti: how its tracer read CUPTI's records

    def to_json(self) -> dict:
        out = {"time": self.time, "sm": self.sm}
        if self.parts is not None:
            out["parts"] = dict(self.parts)
        if self.record_path is not None:
            out["record_path"] = self.record_path
        return out


@dataclass(frozen=True)
class ProcessWindow:
    """One window of a per-process source on one GPU (times: host wall clock, seconds)."""

    basis: str  # exporter.vocabulary CTXSW or CUPTI
    window_start: float
    window_end: float
    listed: frozenset[int] = frozenset()  # host pids the source saw on the GPU in the window, working or not
    shares: Mapping[int, ProcessShare] = field(default_factory=dict)  # host pid -> its share
    switch_overhead: float | None = None  # share of the window in context-switch gaps (ctxsw only)

    def covers(self, pids) -> bool:
        """Whether the window saw every one of `pids` (so their shares sum to all they did)."""
        return set(pids) <= self.listed | self.shares.keys()

    def to_json(self) -> dict:
        return {"basis": self.basis, "window": [self.window_start, self.window_end], "listed": sorted(self.listed),
                "shares": {str(pid): share.to_json() for pid, share in sorted(self.shares.items())},
                "switch_overhead": self.switch_overhead}


@dataclass(frozen=True)
class SourceState:
    """What a workload source says about one GPU, published as gpu_workload_<name>_state{state}."""

    state: str  # exporter.vocabulary.WORKLOAD_SOURCE_STATES
    reason: str
    window_start: float | None = None
    window_end: float | None = None

    def to_json(self) -> dict:
        return {"state": self.state, "reason": self.reason,
                "window": None if self.window_end is None else [self.window_start, self.window_end]}


@runtime_checkable
class WorkloadSource(Sampler, Protocol):
    """A per-process source the workload join reads (exporter/workload_sources.py registers them)."""

    basis: str  # exporter.vocabulary CTXSW or CUPTI
    description: str  # what it is, in its state series' help ("GPU context-switch source of ... (--flag)")

    def fresh(self, uuid: str, now: float) -> ProcessWindow | None:
        """The GPU's latest window; None when there is none or it is stale."""

    def state(self, uuid: str, now: float) -> SourceState:
        """The GPU's state, why, and the window's time."""


class LatestWindows(SamplerDefaults):
    """fresh() and state() of a workload source that keeps per GPU its last window (`readings`) and state
    (`states`): a window older than `max_age` is stale, so fresh() has none and an active state reads standby.
    `not_yet`: the standby reason before the first window; `stalled`: what a stale window means."""

    not_yet = "the first window has not been taken yet"
    stalled = ""

    def fresh(self, uuid: str, now: float) -> ProcessWindow | None:
        window = self.readings.get(uuid)
        return window if window is not None and now - window.window_end <= self.max_age else None

    def state(self, uuid: str, now: float) -> SourceState:
        state = self.states.get(uuid)
        if state is None:
            return SourceState(STANDBY, self.not_yet)
        if state.state == ACTIVE and self.fresh(uuid, now) is None:
            return SourceState(STANDBY, f"the last window is older than {self.max_age:g} s{self.stalled}",
                               state.window_start, state.window_end)
        return state
