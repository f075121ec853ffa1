"""Workloads: who holds each GPU, how much of it they use, and which ones hold it idle.

One place joins the holders of every kind (exporter/holders.py: containers and DRA claims from the
kubelet, Slurm jobs, Unix users), their processes and NVML's per-process samples into one view per
(holder, GPU), without knowing where the holders came from, and keeps
the GPU-second counters that make accounting exact over any range. Every quantity is in
GPU-equivalents (shares of the whole physical GPU); docs/metrics.md, "Workloads", is the contract.

What is exact and what is not (docs/workloads.md):
- held share: what the scheduler allocated. Exact.
- time share: basis "ctxsw" where the live context-switch source (exporter/samplers/ctxsw.py) has a
  fresh window of the GPU covering all the holder's processes: their resident time share, exact;
  else basis "nvml": the holder's processes' NVML per-process utilization, scaled so that all processes
  on the GPU add up to the GPU's own time utilization of the same tick. Not under MPS (NVML charges the
  MPS server for every client) nor on MIG devices (no per-process utilization there).
- SM active: exact when the holder is the only one running on the GPU, or holds a MIG device whole
  (GPM of that MIG GPU instance); on a time-sliced GPU the SM activity of its own slices (basis
  "ctxsw"), else the GPU's SM active split by time shares (basis "time_share"); nothing when several
  MPS clients share a GPU.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from dataclasses import dataclass, field

from exporter import ledger
from exporter.holders import OTHER, WHOLE, Held, Holder, join_gpu, join_owners, weakest_basis
from exporter.sampler import ProcessShare
from exporter.snapshot import GpuIdentity, LogOnce
from exporter.vocabulary import (BUSY, BUSY_BY_BASIS, CTXSW, CUPTI, EXACT, HELD, HELD_IDLE, HELD_SHARE_BASES, HIDDEN_IDLE,
                                 LEDGER, MPS, MPS_CLIENT, MPS_SERVER, NVML, PLAIN_QUANTITIES, QUANTITIES_BY_BASIS,
                                 SM_ACTIVE, SM_ACTIVE_BASES, TIME_SHARE, TIME_SHARE_BASES, check)

log = logging.getLogger(__name__)

IDLE_TIME_SHARE = 0.01  # a holder using under 1% of the GPU's time holds it idle
HELD_IDLE_AFTER_S = 1800.0
HOLDER_SERIES_LIMIT = 64  # holders published per GPU; the rest are summed into OTHER
MAX_STEP_S = 30.0  # a longer gap between two updates (a stalled engine) is not integrated over
# counters kept per key: busy by basis, SM-active and hidden-idle by basis, the ledger's cells (exporter/ledger.py)
BY_KEY = (*QUANTITIES_BY_BASIS, LEDGER)
MPS_REASON = "MPS: NVML charges the MPS server for its clients' kernels, so no per-client time exists"
MIG_REASON = "MIG device: NVML has no per-process utilization on MIG devices"
NOT_RESIDENT = ProcessShare(time=0.0, sm=0.0)  # a process the window listed that got no slice


@dataclass(frozen=True, kw_only=True)
class WorkloadView:
    holder: Holder
    gpu: GpuIdentity
    held_share: float | None  # None: the scheduler's share cannot be known (see the kubelet's log line)
    processes: int | None  # None: NVML could not list the GPU's processes
    pids: tuple[int, ...]
    time_share: float | None
    time_share_reason: str  # how the time share was obtained, or why there is none
    sm_active: float | None
    sm_active_basis: str | None
    idle_seconds: float | None
    held_idle: bool
    counters: dict  # name -> GPU-seconds (busy_basis, sm_active and hidden_idle: basis -> GPU-seconds)
    created: float
    held_share_basis: str = WHOLE  # exporter.holders.HELD_SHARE_BASES
    folded: int = 0  # the holder OTHER: how many holders of the GPU it sums
    time_share_basis: str | None = None  # "ctxsw" or "nvml"
    ctxsw_window: tuple[float, float] | None = None  # wall time of the context-switch (or cupti) window used
    sm_estimate: float | None = None  # cupti: its clients' own SM estimate before the scaling to the GPU's SM active
    ledger: dict = field(default_factory=dict)  # its ledger cells now: cell -> share of the GPU (exporter/ledger.py)

    def __post_init__(self):
        check(self.held_share_basis, HELD_SHARE_BASES, "held-share basis")
        check(self.time_share_basis, TIME_SHARE_BASES, "time-share basis", optional=True)
        check(self.sm_active_basis, SM_ACTIVE_BASES, "SM-active basis", optional=True)

    def to_json(self) -> dict:
        return {"gpu": self.gpu.index, "uuid": self.gpu.uuid, "model": self.gpu.model, **self.holder.to_json(),
                "held_share": self.held_share, "held_share_basis": self.held_share_basis, "processes": self.processes,
                "pids": list(self.pids), "time_share": self.time_share, "time_share_reason": self.time_share_reason,
                "time_share_basis": self.time_share_basis,
                "ctxsw_window": None if self.ctxsw_window is None else list(self.ctxsw_window),
                "sm_active": self.sm_active, "sm_active_basis": self.sm_active_basis, "sm_estimate": self.sm_estimate,
                "idle_seconds": self.idle_seconds, "held_idle": self.held_idle,
                "gpu_seconds": self.counters, "folded": self.folded, "ledger": self.ledger}


@dataclass
class _Account:
    """Per (GPU, holder): the rates of the last update and the counters they are integrated into."""

    created: float
    rates: dict = field(default_factory=dict)
    counters: dict = field(default_factory=lambda: {**dict.fromkeys(PLAIN_QUANTITIES, 0.0),
                                                    **{name: {} for name in BY_KEY}})
    idle_since: float | None = None
    folded: bool = False  # its rates go to OTHER's counters, not its own
    step: dict = field(default_factory=dict)  # what the last integrate added: OTHER takes it over on folding

    def integrate(self, dt: float) -> None:
        r = self.rates
        self.step = {name: r[name] * dt for name in PLAIN_QUANTITIES if r.get(name) is not None}
        # busy per basis (the best one available at each update), sm_active and hidden_idle: basis -> rate
        self.step.update({name: {basis: v * dt for basis, v in r[name].items()}
                          for name in BY_KEY if r.get(name)})
        self.add(self.step)

    def add(self, amounts: dict) -> None:
        for name, value in amounts.items():
            if isinstance(value, dict):
                for basis, v in value.items():
                    self.counters[name][basis] = self.counters[name].get(basis, 0.0) + v
            else:
                self.counters[name] += value

    def published_counters(self) -> dict:
        return {k: (dict(v) if isinstance(v, dict) else round(v, 6)) for k, v in self.counters.items()}


def _sum(values):
    known = [v for v in values if v is not None]
    return round(sum(known), 9) if known else None


def _weakest_time_basis(bases):
    """Of summed time shares: ctxsw (or cupti) only where every part was measured so, else nvml; None: no part."""
    found = set(bases)
    return None if not found else next(iter(found)) if len(found) == 1 else NVML


def _sum_by_basis(rates) -> dict:
    out: dict[str, float] = {}
    for by_basis in rates:
        for basis, value in (by_basis or {}).items():
            out[basis] = out.get(basis, 0.0) + value
    return out


def busiest_first(view: WorkloadView):
    """Which holders of a GPU stay published: the busiest in time, then the largest held shares, then
    those running processes; ties by name, so the same ones stay from tick to tick."""
    return (-(view.time_share or 0.0), -(view.held_share or 0.0), -(view.processes or 0), view.holder)


def mig_sm_active(view, holders: dict[Holder, Held], instances) -> dict[Holder, float | None]:
    """Per holder of whole MIG devices of one GPU: the SM activity of its instances (GPM per MIG GPU
    instance) times each device's share of the GPU's SMs; None where an instance was not read."""
    tel = view.telemetry
    if not tel.mig_enabled or not instances:
        return {}
    devices = {m.uuid: m for m in tel.mig_devices}
    out = {}
    for holder, held in holders.items():
        if not held.mig:
            continue
        total = 0.0
        for mig_uuid in held.mig:
            device = devices.get(mig_uuid)
            reading = instances.get((view.identity.uuid, device.gpu_instance)) if device else None
            if reading is None or reading.sm_active is None or not device.sm_count or not tel.mig_sm_count:
                total = None
                break
            total += reading.sm_active * device.sm_count / tel.mig_sm_count
        out[holder] = None if total is None else round(min(total, 1.0), 6)
    return out


class SmHistory:
    """Per GPU, the spatial source's last SM-active readings, so that a per-client window (cupti: tens of
    seconds, read up to two periods later) is compared with the GPU's SM active over the SAME window."""

    def __init__(self, keep: int = 600):
        self.keep = keep  # readings per GPU: 10 minutes at the default 1 s interval
        self._readings: dict[str, collections.deque] = {}

    def add(self, uuid: str, reading) -> None:
        """`reading`: the GPU's SpatialReading (None or without SM active: nothing)."""
        if reading is None or reading.sm_active is None or reading.window_end <= reading.window_start:
            return
        kept = self._readings.setdefault(uuid, collections.deque(maxlen=self.keep))
        if not kept or kept[-1][1] < reading.window_end:  # each window once
            kept.append((reading.window_start, reading.window_end, reading.sm_active))

    def mean(self, uuid: str, start: float, end: float, coverage: float = 0.5) -> float | None:
        """SM active averaged over [start, end], weighted by overlap; None when the readings cover less
        than `coverage` of it."""
        covered = total = 0.0
        for lo, hi, value in self._readings.get(uuid, ()):
            overlap = min(hi, end) - max(lo, start)
            if overlap > 0:
                covered += overlap
                total += overlap * value
        if end <= start or covered < coverage * (end - start):
            return None
        return total / covered

    def forget(self, keep_uuids) -> None:
        for uuid in self._readings.keys() - set(keep_uuids):
            del self._readings[uuid]


@dataclass(frozen=True)
class CuptiGpu:
    """One MPS GPU's per-client attribution (basis cupti) over its clients' last window."""

    window: tuple[float, float]
    gpu_sm_active: float | None  # the spatial source's SM active over the same window; None: not known
    estimated: float  # the traced clients' unscaled SM estimates, summed
    scale: float  # what they are multiplied by: their sum never exceeds gpu_sm_active
    unattributed: float | None  # gpu_sm_active less the scaled sum: the SM activity of untraced clients (and error)
    traced: int  # clients NVML lists on the GPU whose window was traced
    untraced: int  # clients NVML lists that did not trace (no tracer, no CUPTI)
    clients: tuple = ()  # (pid, ProcessShare) of every traced client: its time, SM, busy parts, record path

    def to_json(self) -> dict:
        return {"window": list(self.window), "gpu_sm_active": self.gpu_sm_active, "estimated": self.estimated,
                "scale": self.scale, "unattributed": self.unattributed, "traced": self.traced,
                "untraced": self.untraced, "clients": {str(pid): share.to_json() for pid, share in self.clients}}


def cupti_gpu(window, clients: set[int], gpu_sm: float | None) -> CuptiGpu:
    """The scaling of one GPU's client estimates (`clients`: the MPS clients NVML lists on it; only their
    reports count, so a process that reports a GPU it does not run on changes nothing)."""
    traced = clients & window.shares.keys()
    estimated = round(sum(window.shares[pid].sm or 0.0 for pid in traced), 6)
    scale = min(1.0, gpu_sm / estimated) if gpu_sm is not None and estimated > 0 else 1.0
    unattributed = None if gpu_sm is None else round(max(0.0, gpu_sm - estimated * scale), 6)
    return CuptiGpu((window.window_start, window.window_end), None if gpu_sm is None else round(gpu_sm, 6),
                    estimated, round(scale, 6), unattributed, len(traced), len(clients - traced),
                    tuple((pid, window.shares[pid]) for pid in sorted(traced)))


@dataclass(frozen=True)
class HolderShare:
    """What one holder did on one GPU at one update (gpu_shares)."""

    pids: tuple[int, ...]  # its processes on the GPU
    processes: int | None  # how many; None: NVML could not list the GPU's processes
    time_share: float | None
    time_share_basis: str | None  # exporter.vocabulary.TIME_SHARE_BASES
    reason: str  # how the time share was obtained, or why there is none
    sm_active: float | None
    sm_active_basis: str | None  # exporter.vocabulary.SM_ACTIVE_BASES
    window: tuple[float, float] | None = None  # wall time of the per-process window behind the values
    sm_estimate: float | None = None  # cupti: its MPS clients' own SM estimate, unscaled


# a holder of a GPU that answers GPU_IS_LOST: it holds it still, it runs nothing NVML can see
LOST_SHARE = HolderShare(pids=(), processes=None, time_share=None, time_share_basis=None,
                         reason="the GPU is lost (GPU_IS_LOST: fell off the bus): only its allocation is known",
                         sm_active=None, sm_active_basis=None)


def _holder_share(entry: dict) -> HolderShare:
    """The record of one holder's entry as gpu_shares builds it up."""
    return HolderShare(pids=entry["pids"], processes=entry["processes"], time_share=entry["time_share"],
                       time_share_basis=entry["time_share_basis"], reason=entry["reason"],
                       sm_active=entry["sm_active"], sm_active_basis=entry["basis"], window=entry["window"],
                       sm_estimate=entry.get("sm_estimate"))


def gpu_shares(view, holders, owners: dict[int, Holder],
               mig_sm: dict[Holder, float | None] | None = None, ctxsw=None, cupti=None,
               cupti_scaling: CuptiGpu | None = None) -> dict[Holder, HolderShare]:
    """Per holder of one GPU (`holders`: any collection of Holder): its pids, time share (with its basis,
    how or why not), SM active with its basis. `owners`: pid -> the holder running it (Holder.owner()).
    `mig_sm`: the SM activity of the MIG instances each holder holds whole (mig_sm_active).
    `ctxsw`: the GPU's fresh context-switch window (exporter.sampler.ProcessWindow), or None.
    `cupti`: the GPU's fresh window of MPS clients' own traces (exporter.sampler.ProcessWindow), with
    `cupti_scaling` (cupti_gpu) the factor that keeps their SM estimates within the GPU's SM active."""
    tel = view.telemetry
    compute = None if tel.compute_processes is None else [p for p in tel.compute_processes if p.kind != MPS_SERVER]
    mps = view.sharing_mode == MPS or any(p.kind == MPS_CLIENT for p in compute or ())
    mig = bool(tel.mig_enabled)
    raw = {p.pid: p.sm for p in tel.processes}
    total_raw = sum(raw.values())
    gpu_time = view.time_utilization
    scale = gpu_time / total_raw if gpu_time is not None and total_raw > 0 else None
    sm = view.spatial.sm_active if view.spatial is not None else None
    pids = {h: tuple(sorted(p.pid for p in compute if owners.get(p.pid) == h.owner())) for h in holders} \
        if compute is not None else {h: () for h in holders}
    running = [h for h in holders if pids[h]]
    owning = {h.owner() for h in holders}
    strangers = compute is not None and any(owners.get(p.pid) not in owning for p in compute)
    out = {}
    for holder in holders:
        entry = {"pids": pids[holder], "processes": None if compute is None else len(pids[holder]),
                 "time_share": None, "time_share_basis": None, "sm_active": None, "basis": None, "window": None}
        if compute is None:
            entry["reason"] = "NVML could not list the GPU's processes"
            out[holder] = _holder_share(entry)
            continue
        if mig:
            entry["reason"] = MIG_REASON
            if (mig_sm or {}).get(holder) is not None:
                entry["sm_active"], entry["basis"] = mig_sm[holder], EXACT  # its own instance's SMs
        elif mps:
            entry["reason"] = MPS_REASON
            if cupti is not None and pids[holder] and set(pids[holder]) <= cupti.shares.keys():
                own = [cupti.shares[pid] for pid in pids[holder]]  # every client of the holder traced its window
                entry["time_share"] = round(min(sum(share.time for share in own), 1.0), 6)
                entry["time_share_basis"], entry["window"] = CUPTI, (cupti.window_start, cupti.window_end)
                entry["reason"] = ("its MPS clients' own GPU work (CUPTI): the union of their kernels, device-side "
                                   "copies and queued work")
                entry["sm_estimate"] = round(min(sum(share.sm or 0.0 for share in own), 1.0), 6)
            elif cupti is not None and pids[holder]:
                entry["reason"] = (f"{MPS_REASON}; {len(set(pids[holder]) - cupti.shares.keys())} of its clients do "
                                   "not trace their kernels (gpu-spatial trace: docs/mps-clients.md)")
        else:
            own = sum(raw.get(pid, 0.0) for pid in pids[holder])
            entry["time_share"] = round(min(own * (scale if scale is not None else 1.0), 1.0), 6)
            entry["time_share_basis"] = NVML
            entry["reason"] = ("NVML per-process utilization, scaled to the GPU's time utilization"
                               if scale is not None else "NVML per-process utilization (no GPU total to scale to)")
            # every process of the holder ran (or held its context) during the window: its slices are its time
            if ctxsw is not None and ctxsw.covers(pids[holder]):
                own = [ctxsw.shares.get(pid, NOT_RESIDENT) for pid in pids[holder]]
                entry["time_share"] = round(min(sum(share.time for share in own), 1.0), 6)
                entry["time_share_basis"], entry["window"] = CTXSW, (ctxsw.window_start, ctxsw.window_end)
                entry["reason"] = "GPU context switches: the resident time of its processes' slices"
                if all(share.sm is not None or share.time == 0 for share in own):
                    entry["ctxsw_sm"] = round(min(sum(share.sm or 0.0 for share in own), 1.0), 6)
        if not mig and sm is None and pids[holder] and entry.get("ctxsw_sm") is not None:
            entry["sm_active"], entry["basis"] = entry["ctxsw_sm"], CTXSW  # no spatial source for the GPU itself
        elif sm is not None and not mig:
            if not pids[holder]:
                entry["sm_active"], entry["basis"] = 0.0, EXACT  # runs nothing on it
            elif len(running) == 1 and not strangers:
                entry["sm_active"], entry["basis"] = sm, EXACT  # the only one running on it, MPS or not
            elif entry.get("sm_estimate") is not None and cupti_scaling is not None and \
                    cupti_scaling.gpu_sm_active is not None:  # its clients' estimate, the sum kept within the GPU's
                entry["sm_active"] = round(min(entry["sm_estimate"] * cupti_scaling.scale, 1.0), 6)
                entry["basis"] = CUPTI
            elif entry.get("ctxsw_sm") is not None:
                entry["sm_active"], entry["basis"] = entry["ctxsw_sm"], CTXSW  # the SM activity of its own slices
            elif entry["time_share"] is not None and gpu_time and entry["time_share_basis"] != CUPTI:
                # (MPS clients' kernels overlap: their time shares do not split the GPU's SM activity)
                entry["sm_active"] = round(min(sm * entry["time_share"] / gpu_time, 1.0), 6)
                entry["basis"] = TIME_SHARE
        out[holder] = _holder_share(entry)
    return out


def ledger_holder(held: Held, entry: HolderShare) -> ledger.HolderUse:
    """What the ledger needs of one holder's entry of gpu_shares."""
    return ledger.HolderUse(held.share, entry.time_share, entry.sm_active, concurrent=entry.time_share_basis == CUPTI)


def ledger_gpu(view, entries: dict, window) -> ledger.GpuUse:
    """What the ledger needs of the whole GPU: its busy time and SM active from the context-switch window
    where one is fresh (the same window as the holders' ctxsw shares: every process's resident time, its
    switch gaps), else NVML's time utilization and the spatial source; `complete` where every process on
    the GPU is a holder's whose time is known."""
    tel = view.telemetry
    compute = None if tel.compute_processes is None else {p.pid for p in tel.compute_processes if p.kind != MPS_SERVER}
    timed = {pid for entry in entries.values() if entry.time_share is not None for pid in entry.pids}
    complete = compute is not None and compute <= timed
    sm = view.spatial.sm_active if view.spatial is not None else None
    if window is not None:
        shares = list(window.shares.values())
        if sm is None and shares and all(s.sm is not None or s.time == 0 for s in shares):
            sm = sum(s.sm or 0.0 for s in shares)
        return ledger.GpuUse(sum(s.time for s in shares), sm, window.switch_overhead or 0.0, complete)
    return ledger.GpuUse(view.time_utilization, sm, 0.0, complete)


class WorkloadAccountant:
    """Builds the workload views at every engine update and integrates the GPU-second counters."""

    @property
    def ctxsw_states(self) -> tuple | None:
        """The context-switch source's per-GPU states; None without the source."""
        return self.source_states.get(CTXSW)

    def __init__(self, held_idle_after: float = HELD_IDLE_AFTER_S, series_limit: int = HOLDER_SERIES_LIMIT,
                 sources=()):
        """`sources`: the workload sources (exporter.sampler.WorkloadSource, exporter/workload_sources.py);
        the engine ticks them, the join reads their fresh windows."""
        self.held_idle_after = held_idle_after
        self.series_limit = max(1, series_limit)
        self.sources = {source.name: source for source in sources}
        # source name -> per GPU at the last update: (GpuIdentity, exporter.sampler.SourceState)
        self.source_states: dict[str, tuple] = {source.name: () for source in sources}
        self.sm_history = SmHistory()
        self.cupti_gpus: tuple = ()  # (GpuIdentity, CuptiGpu) of every MPS GPU with a fresh cupti window
        self._log = LogOnce(log)
        self._accounts: dict[tuple[str, Holder], _Account] = {}
        self.ledger = ledger.Ledger()  # per GPU: every GPU-second in one cell
        self.gpu_ledgers: tuple[ledger.GpuLedger, ...] = ()  # its copies at the last update, for the scrape and API
        self._last: float | None = None
        self._lock = threading.Lock()

    def update(self, now: float, views, holdings=(), mig_instances=None, owners=None) -> tuple[WorkloadView, ...]:
        """`holdings`: the exporter.holders.Holdings of every holder sampler; `mig_instances`:
        GpmSource.instances, (GPU UUID, GPU instance id) -> SpatialReading; `owners`: their joined
        process owners (exporter.holders.join_owners, which the engine computes once per update)."""
        with self._lock:
            dt = 0.0 if self._last is None else min(max(now - self._last, 0.0), MAX_STEP_S)
            self._last = now
            for account in self._accounts.values():  # the rates of the last update held until now
                account.integrate(dt)
            self.ledger.integrate(dt)
            owners = join_owners(holdings) if owners is None else owners
            out, seen, cupti_gpus = [], set(), []
            for view in views:
                tel = view.telemetry
                self.sm_history.add(view.identity.uuid, view.spatial)
                if tel is None:
                    continue  # a GPU NVML cannot read has no holders to show: nothing stale
                holders = join_gpu(view.identity.uuid, holdings)
                if tel.lost:  # it still exists and is still held (the allocation view); nothing on it is measured
                    entries = {holder: LOST_SHARE for holder in holders}
                    mine, gpu_cells = {holder: {} for holder in holders}, ledger.LOST_RATES
                else:
                    mig_sm = mig_sm_active(view, holders, mig_instances)
                    windows = {source.basis: source.fresh(view.identity.uuid, now) for source in self.sources.values()}
                    scaling = self._cupti_scaling(view, windows.get(CUPTI))
                    if scaling is not None:
                        cupti_gpus.append((view.identity, scaling))
                    entries = gpu_shares(view, holders, owners, mig_sm, windows.get(CTXSW),
                                         windows.get(CUPTI) if scaling else None, scaling)
                    mine, gpu_cells = ledger.cells(ledger_gpu(view, entries, windows.get(CTXSW)), {
                        holder: ledger_holder(holders[holder], entry) for holder, entry in entries.items()})
                gpu_views = []
                self.ledger.set(view.identity, gpu_cells, now)
                for holder, entry in entries.items():
                    key = (view.identity.uuid, holder)
                    seen.add(key)
                    account = self._accounts.setdefault(key, _Account(created=now))
                    gpu_views.append(self._view(view.identity, holder, holders[holder], entry, account, now,
                                                mine[holder]))
                out.extend(self._bounded(view.identity, gpu_views, now, seen))
            for key in self._accounts.keys() - seen:  # holders that left take their series with them
                del self._accounts[key]
            self.ledger.keep(v.identity.uuid for v in views if v.telemetry is not None)
            self.gpu_ledgers = self.ledger.books()
            self.sm_history.forget(v.identity.uuid for v in views)
            self.cupti_gpus = tuple(cupti_gpus)
            for source in self.sources.values():
                self.source_states[source.name] = tuple((v.identity, source.state(v.identity.uuid, now)) for v in views
                                                        if v.telemetry is not None and not v.telemetry.lost)
            return tuple(sorted(out, key=lambda w: (w.gpu.index, w.holder)))

    def _cupti_scaling(self, view, window) -> CuptiGpu | None:
        """The scaling of a GPU's MPS clients' estimates over their fresh cupti window; None: no MPS client
        or no window."""
        clients = {p.pid for p in view.telemetry.compute_processes or () if p.kind == MPS_CLIENT}
        if window is None or not clients:
            return None
        return cupti_gpu(window, clients, self.sm_history.mean(view.identity.uuid, window.window_start,
                                                               window.window_end))

    def _bounded(self, gpu, views: list[WorkloadView], now: float, seen: set) -> list[WorkloadView]:
        """At most series_limit holders of one GPU, the rest summed into OTHER, whose counters integrate
        the folded holders' rates: every second of every holder counts once, in its own series or in
        OTHER's. A holder that comes back out of OTHER starts its counters again (a counter reset)."""
        key = f"workloads fold {gpu.uuid}"
        views.sort(key=busiest_first)
        kept, folded = views[:self.series_limit], views[self.series_limit:]
        for i, w in enumerate(kept):  # the counters of the kept only: a flood's folded thousands cost none
            account = self._accounts[(gpu.uuid, w.holder)]
            if account.folded:
                account.folded = False
                account.counters, account.created = _Account(now).counters, now
            kept[i] = dataclasses.replace(w, counters=account.published_counters(), created=account.created)
        if not folded:
            self._log.clear(key, f"GPU {gpu.index}: every holder published again")
            return kept
        self._log.problem(key, f"GPU {gpu.index}: {len(views)} holders, more than --holder-series-limit "
                          f"{self.series_limit}: the {len(folded)} least busy are published summed as pod=\"other\" "
                          "(gpu_workload_folded_holders)", kind="folded")
        parts = [self._accounts[(gpu.uuid, w.holder)] for w in folded]
        seen.add((gpu.uuid, OTHER))
        other = self._accounts.setdefault((gpu.uuid, OTHER), _Account(created=now))
        for account in parts:
            if not account.folded:  # published until the last update: its last step goes to OTHER
                account.folded = True
                other.add(account.step)
        rates = [a.rates for a in parts]
        other.rates = {name: _sum(r.get(name) for r in rates) for name in PLAIN_QUANTITIES}
        other.rates.update({name: _sum_by_basis(r.get(name) for r in rates) for name in BY_KEY})
        sm_bases = {w.sm_active_basis for w in folded if w.sm_active is not None}
        processes = [w.processes for w in folded]
        kept.append(WorkloadView(
            holder=OTHER, gpu=gpu, held_share=_sum(w.held_share for w in folded),
            processes=None if None in processes else sum(processes), pids=tuple(sorted(p for w in folded for p in w.pids)),
            time_share=_sum(w.time_share for w in folded),
            time_share_reason=f"the sum of {len(folded)} holders beyond --holder-series-limit",
            sm_active=_sum(w.sm_active for w in folded),
            sm_active_basis=TIME_SHARE if len(sm_bases) > 1 else next(iter(sm_bases), None), idle_seconds=None,
            held_idle=False, counters=other.published_counters(), created=other.created,
            held_share_basis=weakest_basis(w.held_share_basis for w in folded), folded=len(folded),
            time_share_basis=_weakest_time_basis(w.time_share_basis for w in folded if w.time_share is not None),
            ledger={cell: round(v, 6) for cell, v in other.rates[LEDGER].items()}))
        return kept

    def _view(self, gpu, holder, held: Held, entry: HolderShare, account: _Account, now: float,
              cells: dict) -> WorkloadView:
        share = held.share
        processes, time_share = entry.processes, entry.time_share
        if processes is not None:  # unknown process lists leave the idle clock as it was
            idle = processes == 0 or (time_share is not None and time_share < IDLE_TIME_SHARE)
            if not idle:
                account.idle_since = None
            elif account.idle_since is None:
                account.idle_since = now
        idle_seconds = None if processes is None and account.idle_since is None else \
            (0.0 if account.idle_since is None else round(now - account.idle_since, 3))
        sm, basis = entry.sm_active, entry.sm_active_basis
        account.rates = {
            HELD: share,
            BUSY: time_share,
            BUSY_BY_BASIS: {entry.time_share_basis: time_share} if time_share is not None else None,
            HELD_IDLE: share if share is not None and account.idle_since is not None else None,
            SM_ACTIVE: {basis: sm} if sm is not None else None,
            HIDDEN_IDLE: {basis: max(0.0, time_share - sm)} if sm is not None and time_share is not None else None,
            LEDGER: cells,
        }
        return WorkloadView(holder=holder, gpu=gpu, held_share=share, processes=processes, pids=entry.pids,
                            time_share=time_share, time_share_reason=entry.reason, sm_active=sm, sm_active_basis=basis,
                            idle_seconds=idle_seconds,
                            held_idle=idle_seconds is not None and idle_seconds >= self.held_idle_after,
                            counters={}, created=account.created, held_share_basis=held.basis,  # _bounded's
                            time_share_basis=entry.time_share_basis, ctxsw_window=entry.window,
                            sm_estimate=entry.sm_estimate,
                            ledger={cell: round(v, 6) for cell, v in cells.items()})
