"""The records of a context-switch attribution (nsys_ingest.ctxsw.attribute), apart from the code that computes
them: they import nothing heavy, so a process that only reads an attribution back (the exporter, from the child
process that computed it) does not load numpy."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessAttribution:
    """One process on one GPU over the window (a pid with several contexts is one)."""

    pid: int | None  # host pid; None: a context nsys could not tie to a process
    command: str
    slices: int
    resident_s: float
    time_share: float  # share of the window its contexts were resident
    while_resident: dict  # quantity -> its mean while the process was resident (None: not sampled)
    of_gpu: dict  # quantity -> while_resident x time_share: its share of the whole GPU

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class GpuAttribution:
    """One GPU's time slices over the window."""

    gpu: int
    name: str
    uuid: str | None
    slices: int
    samples: int
    switch_gap_s: float
    switch_gap_share: float  # share of the window no context was resident (switch gaps and idle)
    switch_between_share: float  # of it, the gaps between two slices: switch overhead (the ledger's), not idle edges
    gap_means: dict  # quantity -> its mean during the gaps
    gpu_means: dict  # quantity -> its mean over the window
    unmatched_events: int
    other_events: dict  # tag name -> count of switch events of other kinds
    fit_unconverged: tuple[str, ...]  # quantities whose fit stopped at its cap before converging: approximate
    processes: tuple[ProcessAttribution, ...]

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "processes"},
                "fit_unconverged": list(self.fit_unconverged), "processes": [p.to_json() for p in self.processes]}


@dataclass(frozen=True)
class Attribution:
    """What attribute() finds in an export: per GPU and process, over one window (`nsys-ingest workloads`)."""

    file: str
    estimator: str
    sampling_hz: float | None
    window_s: tuple[float, float]  # from the capture's start
    window_utc_s: tuple[float, float] | None
    quantities: tuple[str, ...]
    gpus: tuple[GpuAttribution, ...]

    def to_json(self) -> dict:
        return {"file": self.file, "estimator": self.estimator, "sampling_hz": self.sampling_hz,
                "window_s": list(self.window_s), "window_utc_s": None if self.window_utc_s is None else
                list(self.window_utc_s), "quantities": list(self.quantities), "gpus": [g.to_json() for g in self.gpus]}

    @classmethod
    def from_json(cls, data: dict) -> "Attribution":
        """The record from its to_json() (an answer that crossed a process boundary)."""
        gpus = tuple(GpuAttribution(**{**g, "fit_unconverged": tuple(g["fit_unconverged"]),
                                       "processes": tuple(ProcessAttribution(**p) for p in g["processes"])})
                     for g in data["gpus"])
        return cls(**{**data, "window_s": tuple(data["window_s"]), "quantities": tuple(data["quantities"]),
                      "window_utc_s": None if data["window_utc_s"] is None else tuple(data["window_utc_s"]),
                      "gpus": gpus})
