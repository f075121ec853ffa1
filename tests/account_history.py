"""A 48-hour history of workload counters with every case the GPU account must get right (issue 28), and
its GPU-hours computed by hand, apart from the report's code: from each holder's rates and the seconds it
held its GPU while its exporter ran.

Cases: holders whole / time-sliced (SM time_share) / a MIG slice (no busy) / two MPS clients (no busy, no
SM: unknown) / an idle notebook / a Unix user's process on a host without a scheduler / a DRA claim / a Slurm job
measured from context switches (busy and SM basis ctxsw) that ends at hour 20 / a holder that starts at hour 33.25 /
fifteen short jobs (10-26 min) /
node-a's exporter restarting at hour 36 (down 60 s, its counters start again from 0) / a scrape and rules
outage from hour 40 to 41 (the exporters keep counting) / rollups only from hour 30 (rules added later).
Issue 45 (node-e): its exporter down for 10 minutes at hour 12 / its GPU 0 lost at hour 30 (GPU_IS_LOST)
while Slurm job 5151 still holds it / the node restarted at hour 44 (down 5 minutes), after which its
exporter lists the lost GPU alone: GPU 1 (an A100 without GPM: no spatial reading, held by Unix user bob)
and GPU 2 (held by nobody) are no longer observed, though they exist to the end.
Samples every 15 s; a holder's series ends with its last scrape (the value it reached then); `up` is 1 while
a node's exporter answers, 0 while it is down; `gpu_lost` is 1 from a GPU's loss on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tests.workload_scenario import FAMILIES, Holder, gpu_hours_by_group, series  # noqa: F401 - FAMILIES: re-exported for the tests

HOUR = 3600.0
LENGTH = 48 * HOUR
STEP = 15.0
RULES_FROM = 30 * HOUR
OUTAGE = (40 * HOUR, 41 * HOUR)      # no scrapes, no rule evaluations
RESTART = (36 * HOUR - 60, 36 * HOUR)  # node-a's exporter down (exclusive); counts again from 0 at the end
RESTARTED = "node-a"
# Each node's exporter downtimes (exclusive; no sample, `up` 0): its counters start again from 0 at the end
DOWN = {RESTARTED: (RESTART,), "node-e": ((12 * HOUR, 12 * HOUR + 600), (44 * HOUR, 44 * HOUR + 300))}
LOST_GPU, LOST_AT = ("node-e", "0"), 30 * HOUR  # answers GPU_IS_LOST from then on: its second is `lost`
UNLISTED = {("node-e", "1"): 44 * HOUR, ("node-e", "2"): 44 * HOUR}  # the restarted exporter lists them no more
UNHELD_GPUS = (("node-e", "2"),)  # GPUs nobody holds


# These take a time or an array of times (numpy: the 2 M samples are computed series by series, not one by one).
def down(instance: str, t):
    out = np.zeros(np.shape(t), bool)
    for a, b in DOWN.get(instance, ()):
        out |= (a < t) & (t < b)
    return out


def counted_since(instance: str, t, start: float = 0.0):
    """Where the exporter of `instance` started counting what it shows at t: its last restart, or `start`."""
    since = np.full(np.shape(t), start)
    for _a, b in DOWN.get(instance, ()):
        since = np.where(b <= t, np.maximum(since, b), since)
    return since


def _counted(instance: str, a, b):
    """Seconds of (a, b) the exporter of `instance` counted (its downtimes cut out)."""
    return b - a - sum(np.maximum(0.0, np.minimum(b, d1) - np.maximum(a, d0)) for d0, d1 in DOWN.get(instance, ()))


def _outage(t):
    return (OUTAGE[0] <= t) & (t < OUTAGE[1])


def _spans_sum(instance: str, spans, since, t):
    """The sum over (start, end, rate) spans of rate x the seconds of (max(start, since), min(end, t)) counted."""
    total = 0
    for a, b, rate in spans:
        lo, hi = np.maximum(a, since), np.minimum(b, t)
        total = total + np.where(hi > lo, rate * _counted(instance, lo, hi), 0.0)
    return total


@dataclass(frozen=True)
class Hold(Holder):
    """A holder of tests/workload_scenario.py whose exporter goes down, whose scrapes stop for the outage and
    whose GPU can be lost (then only its held time counts on: nothing on the GPU is measured)."""

    def rates_at(self, t: float) -> dict:
        if (self.instance, self.gpu) == LOST_GPU and t >= LOST_AT:
            return {family: (rate if family == "held" or rate is None else 0.0) for family, rate in self.rates().items()}
        return self.rates()

    def spans(self) -> list[tuple[float, float]]:
        """The hold cut where its rates change (the loss of its GPU)."""
        if (self.instance, self.gpu) == LOST_GPU and self.start < LOST_AT < self.end:
            return [(self.start, LOST_AT), (LOST_AT, self.end)]
        return [(self.start, self.end)]

    def values(self, family: str, t: np.ndarray) -> np.ndarray:
        """The counter at each of the times t, NaN where no sample exists (not held, exporter down, outage)."""
        spans = [(a, b, self.rates_at(a)[family]) for a, b in self.spans()]
        value = _spans_sum(self.instance, spans, counted_since(self.instance, t, self.start), t)
        return np.where((t < self.start) | (t > self.end) | _outage(t) | down(self.instance, t), np.nan, value)

    def truth(self, family: str) -> float | None:
        """GPU-seconds by hand: the rate times the seconds counted (its node's downtimes left out)."""
        if self.rates()[family] is None:
            return None
        return sum(self.rates_at(a)[family] * _counted(self.instance, a, b) for a, b in self.spans())


# (start, length): every 3.7 h, and three across the edges of the rollups' spans (hour 30 + 2 min, hour 40 - 8 min,
# hour 48 - 7 min), where a wrong lag or a missed edge would count them twice or not at all
SHORT = [(2 * HOUR + i * 3.7 * HOUR, (11 + 1.5 * i) * 60 + 30) for i in range(12)] + \
    [(29.95 * HOUR, 14.5 * 60), (39.8 * HOUR, 10.5 * 60), (47.8 * HOUR, 10.5 * 60)]
HOLDS = (
    Hold("node-a", "0", 0, LENGTH, 1.0, busy=0.9, sm=0.6, namespace="team-a", pod="train-0", container="main"),
    Hold("node-a", "1", 33.25 * HOUR, LENGTH, 1.0, busy=0.8, sm=0.2, namespace="team-a", pod="train-1", container="main"),
    Hold("node-b", "3", 0, LENGTH, 3 / 7, sm=0.3, namespace="team-a", pod="mig-0", container="main"),
    Hold("node-a", "2", 0, LENGTH, 0.5, busy=0.5, sm=0.25, basis="time_share", namespace="team-b", pod="infer-0", container="main"),
    Hold("node-a", "2", 0, LENGTH, 0.25, busy=0.3, sm=0.1, basis="time_share", namespace="team-b", pod="infer-1", container="main"),
    Hold("node-a", "2", 0, LENGTH, 0.25, busy=0.0, sm=0.0, basis="time_share", idle=True, namespace="team-b",
         pod="infer-2", container="main"),
    Hold("node-b", "0", 0, LENGTH, 0.5, namespace="team-c", pod="mps-0", container="main"),
    Hold("node-b", "0", 0, LENGTH, 0.5, namespace="team-d", pod="mps-1", container="main"),
    Hold("node-b", "1", 0, LENGTH, 1.0, busy=0.0, sm=0.0, idle=True, namespace="team-c", pod="notebook", container="main"),
    Hold("node-c", "0", 0, 20 * HOUR, 1.0, busy=0.5, sm=0.45, busy_basis="ctxsw", basis="ctxsw", hpc_job="4242",
         model="NVIDIA A100-SXM4-80GB"),
    Hold("node-c", "1", 0, LENGTH, 1.0, busy=0.6, sm=0.3, namespace="team-e", pod="server", container="main"),
    Hold("node-d", "0", 0, LENGTH, 1.0, busy=0.4, sm=0.2, user="alice"),  # a shared host: a Unix user holds it
    Hold("node-d", "1", 6 * HOUR, LENGTH, 0.5, busy=0.3, sm=0.1, basis="time_share", namespace="team-g", pod="dra-0",
         container="main", claim="gpu-claim-0"),  # a DRA claim
    *(Hold("node-c", "2", start, start + length, 1.0, busy=0.7, sm=0.5, namespace="team-e" if i < 12 else "team-f",
           pod=f"short-{i}", container="main") for i, (start, length) in enumerate(SHORT)),
    Hold("node-e", "0", 0, LENGTH, 1.0, busy=0.7, sm=0.5, hpc_job="5151"),  # still listed by Slurm once lost
    Hold("node-e", "1", 0, UNLISTED[("node-e", "1")], 1.0, busy=0.6, user="bob",  # no GPM: no SM series
         model="NVIDIA A100-SXM4-80GB"),
)


# The ledger of every GPU (issue 35, docs/ledger.md), by hand from the holds above. A holder: work = its SM,
# hidden idle = busy - SM, time idle = its held share of the time no kernel ran on its GPU. A GPU: its holders'
# cells summed, the MPS GPU's busy time unattributed (no per-client numbers), the MIG GPU's unread time
# unmeasured, the idle time of the share nobody holds unheld; every GPU exported for the whole 48 hours.
MPS_GPU, MPS_BUSY, MPS_SM = ("node-b", "0"), 0.8, 0.3
MIG_GPU = ("node-b", "3")
GPUS = sorted({**{gpu: "NVIDIA H100 80GB HBM3" for gpu in UNHELD_GPUS}, **{(h.instance, h.gpu): h.model for h in HOLDS}}.items())


def ledger_cells(gpu: tuple, active, lost: bool = False) -> tuple[dict, dict]:
    """(per hold {cell: rate}, the GPU's {cell: rate}) while exactly the holds `active` hold `gpu`."""
    mine = {}
    gpu_cells: dict[str, float] = {}
    if lost:  # the whole second is lost; its holders hold it still, with no cell of their own
        return {h: {cell: 0.0 for cell in ledger_cells(gpu, active)[0][h]} for h in active}, {"lost": 1.0}
    if gpu == MPS_GPU:
        busy = MPS_BUSY if active else 0.0
        gpu_cells = {"unattributed_sm_active_work": MPS_SM if active else 0.0,
                     "unattributed_hidden_idle": busy - MPS_SM if active else 0.0}
        mine = {h: {"time_idle": h.held * (1 - busy)} for h in active}
    elif gpu == MIG_GPU:
        busy = None
        mine = {h: {"sm_active_work": h.sm} for h in active}
        gpu_cells = {"unmeasured": 1.0 - sum(h.sm for h in active)}
    else:
        busy = sum(h.busy for h in active)
        mine = {h: {"sm_active_work": h.sm, "hidden_idle": h.busy - h.sm, "time_idle": h.held * (1 - busy)}
                if h.sm is not None else {"busy_unsplit": h.busy, "time_idle": h.held * (1 - busy)} for h in active}
    if busy is not None:
        gpu_cells["unheld"] = (1 - busy) * (1 - sum(h.held for h in active))
    for cells in mine.values():
        for cell, rate in cells.items():
            gpu_cells[cell] = gpu_cells.get(cell, 0.0) + rate
    return mine, gpu_cells


def gpu_segments(gpu: tuple) -> list[tuple[float, float, tuple, dict, dict]]:
    """(start, end, active holds, their cells, the GPU's cells) between every change of the GPU's holders."""
    holds = [h for h in HOLDS if (h.instance, h.gpu) == gpu]
    end = UNLISTED.get(gpu, LENGTH)  # (an unlisted GPU's existence goes on: unobserved, not in its series)
    lost = {LOST_AT} if gpu == LOST_GPU else set()
    edges = sorted({0.0, end, *lost, *(h.start for h in holds), *(min(h.end, end) for h in holds)})
    out = []
    for a, b in zip(edges, edges[1:]):
        active = tuple(h for h in holds if h.start <= (a + b) / 2 < h.end)
        out.append((a, b, active, *ledger_cells(gpu, active, lost=bool(lost) and a >= LOST_AT)))
    return out


def _ledger_values(instance: str, spans, t: np.ndarray) -> np.ndarray:
    """A ledger counter at each of the times t from (start, end, rate) spans, NaN where no sample exists; it
    counts from 0 again after each of its node's downtimes."""
    value = _spans_sum(instance, spans, counted_since(instance, t), t)
    return np.where(_outage(t) | down(instance, t), np.nan, value)


def ledger_series():
    """(metric name, label text, instance, [(start, end, rate)], end of the series) of every ledger counter."""
    for (instance, index), model in GPUS:
        segments = gpu_segments((instance, index))
        end = UNLISTED.get((instance, index), LENGTH)
        gpu_labels = f'gpu="{index}",instance="{instance}",job="gpu-spatial-exporter",model="{model}",uuid="GPU-{instance}-{index}"'
        cells = sorted({c for seg in segments for c in seg[4]})
        for cell in cells:
            yield ("gpu_ledger_gpu_seconds", f'cell="{cell}",{gpu_labels}', instance,
                   [(a, b, g.get(cell, 0.0)) for a, b, _act, _m, g in segments], end)
        yield "gpu_ledger_observed_seconds", gpu_labels, instance, [(0.0, end, 1.0)], end
        for hold in {h for seg in segments for h in seg[2]}:
            spans = [(a, b, m[hold]) for a, b, act, m, _g in segments if hold in act]
            for cell in sorted({c for _a, _b, mine in spans for c in mine}):
                labels = dict(hold.labels(), cell=cell)
                yield ("gpu_workload_ledger_gpu_seconds", ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())),
                       instance, [(a, b, mine.get(cell, 0.0)) for a, b, mine in spans], hold.end)


def gauge_series():
    """(metric name, label text, instance, value at t or None, start) of the gauges: each GPU's gpu_lost
    while its exporter lists it, each node's `up`."""
    for (instance, index), model in GPUS:
        labels = f'gpu="{index}",instance="{instance}",job="gpu-spatial-exporter",model="{model}",uuid="GPU-{instance}-{index}"'
        listed = UNLISTED.get((instance, index), LENGTH)
        lost_at = LOST_AT if (instance, index) == LOST_GPU else math.inf
        yield "gpu_lost", labels, instance, lambda t, lost_at=lost_at, listed=listed: (
            None if t > listed else float(t >= lost_at))
    for instance in sorted({instance for (instance, _i), _m in GPUS}):
        yield "up", f'instance="{instance}",job="gpu-spatial-exporter"', None, lambda t, i=instance: (
            0.0 if down(i, t) else 1.0)


def ledger_truth(by: str) -> dict[tuple, dict]:
    """The holders' ledger GPU-hours per group and cell by hand, and per cell `<cell>_ends`: half a scrape of
    each series that ends before the history does (Prometheus' extrapolation)."""
    out: dict[tuple, dict] = {}
    for (instance, index), _model in GPUS:
        for a, b, active, mine, _g in gpu_segments((instance, index)):
            for hold in active:
                row = out.setdefault(GROUP_OF[by](hold), {})
                for cell, rate in mine[hold].items():
                    row[cell] = row.get(cell, 0.0) + rate * _counted(instance, a, b) / 3600
                    if hold.end < LENGTH and b == hold.end:
                        row[f"{cell}_ends"] = row.get(f"{cell}_ends", 0.0) + rate * STEP / 2 / 3600
    return out


def gpu_ledger_truth(gpus=None) -> tuple[dict, float]:
    """({cell: GPU-hours} over `gpus` (default every GPU), unobserved included, GPU-hours observed) by hand.
    Every GPU exists for the whole 48 hours (its node is up at the end); what its exporter did not count
    is unobserved."""
    cells: dict[str, float] = {}
    observed = 0.0
    for (instance, index), _model in GPUS:
        if gpus is not None and (instance, index) not in gpus:
            continue
        seen = _counted(instance, 0.0, UNLISTED.get((instance, index), LENGTH))
        observed += seen / 3600
        cells["unobserved"] = cells.get("unobserved", 0.0) + (LENGTH - seen) / 3600
        for a, b, _act, _m, gpu_cells in gpu_segments((instance, index)):
            for cell, rate in gpu_cells.items():
                cells[cell] = cells.get(cell, 0.0) + rate * _counted(instance, a, b) / 3600
    return cells, observed


def samples(t0: float, millis: bool = False):
    """(metric name, label text, value, timestamp) of every sample, series by series."""
    def stamp(i):
        return f"{int((t0 + i * STEP) * 1000)}" if millis else f"{t0 + i * STEP:.3f}"

    times = np.arange(int(LENGTH // STEP) + 1) * STEP
    for family, labels, hold in series(HOLDS):
        values = hold.values(family, times)
        for i in np.flatnonzero(~np.isnan(values)).tolist():
            yield f"gpu_workload_{family}_gpu_seconds", labels, float(values[i]), stamp(i)
    for name, labels, instance, spans, end in ledger_series():
        t = times[:int(min(end, LENGTH) // STEP) + 1]
        values = _ledger_values(instance, spans, t)
        for i in np.flatnonzero(~np.isnan(values) & (t >= min(a for a, _b, _r in spans))).tolist():
            yield name, labels, float(values[i]), stamp(i)
    for name, labels, instance, value_at in gauge_series():
        for i in range(int(LENGTH // STEP) + 1):
            t = i * STEP
            value = None if OUTAGE[0] <= t < OUTAGE[1] or (instance and down(instance, t)) else value_at(t)
            if value is not None:
                yield name, labels, value, stamp(i)


GAUGES = ("gpu_lost", "up")


def write_openmetrics(t0: float, fh) -> int:
    """Every counter from t0 to t0 + LENGTH, OpenMetrics for `promtool tsdb create-blocks-from openmetrics`."""
    count, last = 0, None
    for name, labels, value, stamp in samples(t0):
        kind = "gauge" if name in GAUGES else "counter"
        if name != last:
            fh.write(f"# HELP {name} {name} ({kind}).\n# TYPE {name} {kind}\n")
            last = name
        fh.write(f"{name}{'_total' * (kind == 'counter')}{{{labels}}} {value:.6f} {stamp}\n")
        count += 1
    fh.write("# EOF\n")
    return count


def prometheus_text(t0: float):
    """The same samples as Prometheus text with millisecond timestamps (VictoriaMetrics' import API), in
    pieces of 10,000 lines."""
    lines = []
    for name, labels, value, stamp in samples(t0, millis=True):
        lines.append(f"{name}{'_total' * (name not in GAUGES)}{{{labels}}} {value:.6f} {stamp}\n")
        if len(lines) >= 10000:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)


GROUP_OF = {"namespace": lambda h: (h.namespace,), "hpc_job": lambda h: (h.hpc_job,),
            "node": lambda h: (h.instance,), "model": lambda h: (h.model,), "user": lambda h: (h.user,),
            "claim": lambda h: (h.claim,), "pod": lambda h: (h.namespace, h.pod)}


def truth(by: str) -> dict[tuple, dict]:
    """GPU-hours per group by hand: {group: {family: hours, family_unknown: held hours without it,
    family_ends: GPU-hours of half a scrape after each series that ends before the history does (what
    Prometheus' extrapolation adds)}}."""
    out = gpu_hours_by_group(HOLDS, GROUP_OF[by], lambda hold, family: hold.truth(family))
    for hold in HOLDS:
        row = out[GROUP_OF[by](hold)]
        for family, rate in hold.rates().items():
            if rate is not None:
                row[f"{family}_ends"] = row.get(f"{family}_ends", 0.0) + (
                    rate * STEP / 2 / 3600 if hold.end < LENGTH else 0.0)
    return out
