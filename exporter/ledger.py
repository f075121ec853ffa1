"""The GPU ledger: every GPU-second of every GPU in exactly one cell (docs/ledger.md).

The physical view of the account. At every update each GPU's second is split into cells whose rates
sum to 1: a holder's SM-active work, a holder's hidden idle (its kernels ran, the SMs idled), a
holder's busy time whose SM split is unknown (no spatial reading), context-switch overhead (the gaps
between time slices: basis ctxsw only), time idle (no kernel ran) split among the holders by held
share, unheld (the idle time of the share nobody holds), the unattributed cells (busy time a basis
cannot split among holders: MPS clients without per-client numbers, MIG instances without
per-process ones, processes of no holder), unmeasured (the GPU's busy time could not be read) and lost
(the GPU answers GPU_IS_LOST: it still exists, and its holders still hold it, but nothing runs on it).
The rates, held until the next update, are integrated into counters per holder and per GPU; a view
that shows the ledger (report, top, /api/v1/workloads, the dashboards through the recording rules)
reads these cells and nothing else.

The allocation view (held GPU-seconds, used of what was held) is another account: a holder can use
more than it held when the others leave the GPU to it. The two are never added.

Time shares come in two kinds. Time-sliced (bases ctxsw, nvml): one context at a time, so the
holders' shares partition the GPU's busy time. Concurrent (basis cupti, under MPS): kernels of several
clients run at once, their time shares overlap and cannot be laid side by side on the wall clock, so
only their SM shares (scaled by the source so their sum never exceeds the GPU's SM active) are laid
side by side as work; the GPU's hidden idle (busy - SM active) is split by the clients' kernel-busy
shares where every client on the GPU traces (each client kept the GPU's kernels running in that
proportion), and stays unattributed where one does not (its part cannot be known).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Hashable, Mapping

from exporter.vocabulary import (BUSY_UNSPLIT, GPU_CELLS, HIDDEN_IDLE, HOLDER_CELLS, SM_ACTIVE_WORK, SWITCH_OVERHEAD,
                                 TIME_IDLE, UNATTRIBUTED_BUSY_UNSPLIT, UNATTRIBUTED_HIDDEN_IDLE,
                                 UNATTRIBUTED_SM_ACTIVE_WORK, UNATTRIBUTED_TIME_IDLE, UNHELD, UNMEASURED,
                                 LOST)

EPSILON = 1e-9


@dataclass(frozen=True)
class HolderUse:
    """What the workload join measured of one holder on one GPU at one update (shares of the whole GPU)."""

    held: float | None  # the allocation (None: unknown)
    time: float | None = None  # share of the time its kernels ran / its contexts were resident; None: unknown
    sm: float | None = None  # its SM-active share of the whole GPU; None: unknown
    concurrent: bool = False  # its time overlaps the other holders' (MPS, basis cupti)


@dataclass(frozen=True)
class GpuUse:
    """What is known of the whole GPU at the same update."""

    busy: float | None  # share of time at least one kernel ran (NVML time utilization, or the ctxsw window's
    #                     resident time of every process); None: unknown
    sm: float | None = None  # SM active of the whole GPU; None: no spatial reading
    switch_overhead: float = 0.0  # share of the time in context-switch gaps (ctxsw windows only)
    complete: bool = False  # every process on the GPU belongs to a holder whose time is known


def _clip(value: float) -> float:
    return min(max(value, 0.0), 1.0)


def cells(gpu: GpuUse, holders: Mapping[Hashable, HolderUse]) -> tuple[dict, dict]:
    """(per holder {cell: rate}, per GPU {cell: rate}) for one GPU and update. The GPU's cells sum to 1
    (the holders' cells are in it, summed per cell); a rate is GPU-seconds per wall-clock second."""
    switch = _clip(gpu.switch_overhead or 0.0)
    room = 1.0 - switch  # what kernels and idleness share
    mine: dict = {h: {} for h in holders}
    timed = {h: u for h, u in holders.items() if u.time is not None and not u.concurrent}
    concurrent = {h: u for h, u in holders.items() if u.time is not None and u.concurrent}
    spatial_only = {h: u for h, u in holders.items() if u.time is None and u.sm is not None}  # MIG instances

    busy = None if gpu.busy is None else _clip(gpu.busy)
    # the holders' own busy time, side by side on the wall clock: time-sliced shares whole, the rest by SM
    attributed = sum(u.time for u in timed.values()) + sum(u.sm for u in (*concurrent.values(), *spatial_only.values())
                                                         if u.sm is not None)
    cap = room if busy is None else min(max(busy, attributed), room)
    if busy is None and not attributed:
        cap = 0.0
    scale = cap / attributed if attributed > cap + EPSILON else 1.0  # shares summing past the GPU's time
    for h, u in timed.items():
        time = u.time * scale
        if u.sm is None:
            mine[h][BUSY_UNSPLIT] = time
        else:
            work = min(u.sm * scale, time)
            mine[h][SM_ACTIVE_WORK], mine[h][HIDDEN_IDLE] = work, time - work
    for h, u in (*concurrent.items(), *spatial_only.items()):
        if u.sm is not None:
            mine[h][SM_ACTIVE_WORK] = u.sm * scale
    known_busy = sum(c.get(SM_ACTIVE_WORK, 0.0) + c.get(HIDDEN_IDLE, 0.0) + c.get(BUSY_UNSPLIT, 0.0)
                     for c in mine.values())
    gpu_cells = {SWITCH_OVERHEAD: switch}
    if busy is None:
        gpu_cells[UNMEASURED] = max(room - known_busy, 0.0)  # busy or idle: nobody can tell
        idle = 0.0
    else:
        busy = cap
        rest = max(busy - known_busy, 0.0)  # busy time no holder's share covers
        if concurrent and gpu.complete and gpu.sm is not None and rest > EPSILON:
            # MPS, every client tracing: the GPU's hidden idle by the clients' kernel-busy shares
            hidden = max(busy - max(gpu.sm, known_busy), 0.0)
            total = sum(u.time for u in concurrent.values())
            for h, u in concurrent.items():
                mine[h][HIDDEN_IDLE] = hidden * u.time / total if total > 0 else 0.0
            rest -= sum(mine[h][HIDDEN_IDLE] for h in concurrent)
        if gpu.sm is None:
            gpu_cells[UNATTRIBUTED_BUSY_UNSPLIT] = rest
        else:
            work = sum(c.get(SM_ACTIVE_WORK, 0.0) for c in mine.values())
            unattributed_work = min(max(gpu.sm - work, 0.0), rest)
            gpu_cells[UNATTRIBUTED_SM_ACTIVE_WORK] = unattributed_work
            gpu_cells[UNATTRIBUTED_HIDDEN_IDLE] = rest - unattributed_work
        idle = max(room - busy, 0.0)
    held = {h: u.held for h, u in holders.items()}
    known = sum(v for v in held.values() if v is not None)
    whole = max(known, 1.0)  # held shares summing past the GPU (estimates) split the idle time among them
    for h, share in held.items():
        if share is not None:
            mine[h][TIME_IDLE] = idle * share / whole
    free = idle * (1.0 - known / whole)
    # where a holder's share is unknown, the idle time beyond the known shares is not known to be unheld
    gpu_cells[UNATTRIBUTED_TIME_IDLE if None in held.values() else UNHELD] = free
    for c in mine.values():
        for cell in HOLDER_CELLS:
            if cell in c:
                gpu_cells[cell] = gpu_cells.get(cell, 0.0) + c[cell]
    return mine, {cell: gpu_cells[cell] for cell in GPU_CELLS if cell in gpu_cells}


def waste(counts: Mapping[str, float]) -> float:
    """Physical waste of cells (a holder's or a GPU's): hidden idle, time idle, switch overhead."""
    from exporter.vocabulary import WASTE_CELLS

    return sum(counts.get(cell, 0.0) for cell in WASTE_CELLS)


@dataclass
class GpuLedger:
    """One GPU's cells: the rates of the last update, and the GPU-seconds integrated since `created`."""

    gpu: object  # exporter.snapshot.GpuIdentity
    created: float
    rates: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    observed: float = 0.0  # wall-clock seconds integrated: the cells' sum

    def to_json(self) -> dict:
        return {"gpu": self.gpu.index, "uuid": self.gpu.uuid, "model": self.gpu.model,
                "cells": {k: round(v, 6) for k, v in self.rates.items()},
                "gpu_seconds": {k: round(v, 6) for k, v in self.counters.items()},
                "observed_seconds": round(self.observed, 6)}


LOST_RATES = {LOST: 1.0}  # a lost GPU's whole second


class Ledger:
    """Per GPU cells integrated over time: held rates x the seconds to the next update (as the workload
    counters are). A lost GPU stays in the ledger, its second in the `lost` cell (it still exists: the
    report's wall clock counts it); a GPU that is not in an update (gone) leaves it: its series end."""

    def __init__(self):
        self._gpus: dict[str, GpuLedger] = {}
        self._lock = threading.Lock()

    def integrate(self, dt: float) -> None:
        with self._lock:
            for book in self._gpus.values():
                if not book.rates:
                    continue
                for cell, rate in book.rates.items():
                    book.counters[cell] = book.counters.get(cell, 0.0) + rate * dt
                book.observed += dt

    def set(self, gpu, rates: dict, now: float) -> None:
        with self._lock:
            book = self._gpus.setdefault(gpu.uuid, GpuLedger(gpu, now))
            book.gpu, book.rates = gpu, dict(rates)
            for cell in rates:  # a cell's series exists from the update that names it, at 0 until integrated
                book.counters.setdefault(cell, 0.0)

    def keep(self, uuids) -> None:
        with self._lock:
            for uuid in self._gpus.keys() - set(uuids):
                del self._gpus[uuid]

    def books(self) -> tuple[GpuLedger, ...]:
        """Copies, in GPU order: what the snapshot holds."""
        with self._lock:
            return tuple(GpuLedger(b.gpu, b.created, dict(b.rates), dict(b.counters), b.observed)
                         for b in sorted(self._gpus.values(), key=lambda b: b.gpu.index))
