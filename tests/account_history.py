"""A 48-hour history of workload counters with every case the GPU account must get right (issue 28), and
its GPU-hours computed by hand, apart from the report's code: from each holder's rates and the seconds it
held its GPU while its exporter ran.

Cases: holders whole / time-sliced (SM time_share) / a MIG slice (no busy) / two MPS clients (no busy, no
SM: unknown) / an idle notebook / a Unix user's process on a host without a scheduler / a DRA claim / a Slurm job
measured from context switches (busy and SM basis ctxsw) that ends at hour 20 / a holder that starts at hour 33.25 /
fifteen short jobs (10-26 min) /
node-a's exporter restarting at hour 36 (down 60 s, its counters start again from 0) / a scrape and rules
outage from hour 40 to 41 (the exporters keep counting) / rollups only from hour 30 (rules added later).
Samples every 15 s; a holder's series ends with its last scrape (the value it reached then).
"""
from __future__ import annotations

from dataclasses import dataclass

from tests.workload_scenario import FAMILIES, Holder, gpu_hours_by_group, series  # noqa: F401 - FAMILIES: re-exported for the tests

HOUR = 3600.0
LENGTH = 48 * HOUR
STEP = 15.0
RULES_FROM = 30 * HOUR
OUTAGE = (40 * HOUR, 41 * HOUR)      # no scrapes, no rule evaluations
RESTART = (36 * HOUR - 60, 36 * HOUR)  # node-a's exporter down (exclusive); counts again from 0 at the end
RESTARTED = "node-a"


@dataclass(frozen=True)
class Hold(Holder):
    """A holder of tests/workload_scenario.py whose exporter restarts and whose scrapes stop for the outage."""

    def counting(self) -> list[tuple[float, float]]:
        """The spans in which the exporter counted this hold (its node's restart cut out)."""
        if self.instance != RESTARTED or not (self.start < RESTART[0] and self.end > RESTART[1]):
            return [(self.start, self.end)]
        return [(self.start, RESTART[0]), (RESTART[1], self.end)]

    def value(self, family: str, t: float) -> float | None:
        """The counter at t, None where no sample exists (not held, exporter down, outage)."""
        if not self.start <= t <= self.end or OUTAGE[0] <= t < OUTAGE[1]:
            return None
        if self.instance == RESTARTED and RESTART[0] < t < RESTART[1]:
            return None
        rate = self.rates()[family]
        since = RESTART[1] if self.instance == RESTARTED and t >= RESTART[1] > self.start else self.start
        return rate * (t - since)

    def truth(self, family: str) -> float | None:
        """GPU-seconds by hand: the rate times the seconds counted."""
        # (Holder.gpu_seconds is rate x (end - start): this one leaves the restart's minute out)
        rate = self.rates()[family]
        return None if rate is None else rate * sum(b - a for a, b in self.counting())


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
)


# The ledger of every GPU (issue 35, docs/ledger.md), by hand from the holds above. A holder: work = its SM,
# hidden idle = busy - SM, time idle = its held share of the time no kernel ran on its GPU. A GPU: its holders'
# cells summed, the MPS GPU's busy time unattributed (no per-client numbers), the MIG GPU's unread time
# unmeasured, the idle time of the share nobody holds unheld; every GPU exported for the whole 48 hours.
MPS_GPU, MPS_BUSY, MPS_SM = ("node-b", "0"), 0.8, 0.3
MIG_GPU = ("node-b", "3")
GPUS = sorted({(h.instance, h.gpu): h.model for h in HOLDS}.items())


def ledger_cells(gpu: tuple, active) -> tuple[dict, dict]:
    """(per hold {cell: rate}, the GPU's {cell: rate}) while exactly the holds `active` hold `gpu`."""
    mine = {}
    gpu_cells: dict[str, float] = {}
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
                for h in active}
    if busy is not None:
        gpu_cells["unheld"] = (1 - busy) * (1 - sum(h.held for h in active))
    for cells in mine.values():
        for cell, rate in cells.items():
            gpu_cells[cell] = gpu_cells.get(cell, 0.0) + rate
    return mine, gpu_cells


def gpu_segments(gpu: tuple) -> list[tuple[float, float, tuple, dict, dict]]:
    """(start, end, active holds, their cells, the GPU's cells) between every change of the GPU's holders."""
    holds = [h for h in HOLDS if (h.instance, h.gpu) == gpu]
    edges = sorted({0.0, LENGTH, *(h.start for h in holds), *(h.end for h in holds)})
    out = []
    for a, b in zip(edges, edges[1:]):
        active = tuple(h for h in holds if h.start <= (a + b) / 2 < h.end)
        out.append((a, b, active, *ledger_cells(gpu, active)))
    return out


def _ledger_value(instance: str, spans, t: float) -> float | None:
    """A ledger counter at t from (start, end, rate) spans, None where no sample exists; it counts from 0
    again after node-a's restart."""
    if OUTAGE[0] <= t < OUTAGE[1] or (instance == RESTARTED and RESTART[0] < t < RESTART[1]):
        return None
    since = RESTART[1] if instance == RESTARTED and t >= RESTART[1] else 0.0
    return sum(rate * max(0.0, min(t, b) - max(a, since)) for a, b, rate in spans)


def _counted(instance: str, a: float, b: float) -> float:
    """Seconds of (a, b) the exporter counted (node-a's restart minute cut out)."""
    cut = max(0.0, min(b, RESTART[1]) - max(a, RESTART[0])) if instance == RESTARTED else 0.0
    return b - a - cut


def ledger_series():
    """(metric name, label text, instance, [(start, end, rate)], end of the series) of every ledger counter."""
    for (instance, index), model in GPUS:
        segments = gpu_segments((instance, index))
        gpu_labels = f'gpu="{index}",instance="{instance}",job="gpu-spatial-exporter",model="{model}",uuid="GPU-{instance}-{index}"'
        cells = sorted({c for seg in segments for c in seg[4]})
        for cell in cells:
            yield ("gpu_ledger_gpu_seconds", f'cell="{cell}",{gpu_labels}', instance,
                   [(a, b, g.get(cell, 0.0)) for a, b, _act, _m, g in segments], LENGTH)
        yield "gpu_ledger_observed_seconds", gpu_labels, instance, [(0.0, LENGTH, 1.0)], LENGTH
        for hold in {h for seg in segments for h in seg[2]}:
            mine = next(m[hold] for _a, _b, act, m, _g in segments if hold in act)
            for cell, rate in sorted(mine.items()):
                labels = dict(hold.labels(), cell=cell)
                yield ("gpu_workload_ledger_gpu_seconds", ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())),
                       instance, [(hold.start, hold.end, rate)], hold.end)


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


def gpu_ledger_truth() -> tuple[dict, float]:
    """({cell: GPU-hours} over every GPU, GPU-hours that existed) by hand."""
    cells: dict[str, float] = {}
    existed = 0.0
    for (instance, index), _model in GPUS:
        existed += _counted(instance, 0.0, LENGTH) / 3600
        for a, b, _act, _m, gpu_cells in gpu_segments((instance, index)):
            for cell, rate in gpu_cells.items():
                cells[cell] = cells.get(cell, 0.0) + rate * _counted(instance, a, b) / 3600
    return cells, existed


def samples(t0: float, millis: bool = False):
    """(metric name, label text, value, timestamp) of every sample, series by series."""
    def stamp(i):
        return f"{int((t0 + i * STEP) * 1000)}" if millis else f"{t0 + i * STEP:.3f}"

    for family, labels, hold in series(HOLDS):
        for i in range(int(LENGTH // STEP) + 1):
            value = hold.value(family, i * STEP)
            if value is not None:
                yield f"gpu_workload_{family}_gpu_seconds", labels, value, stamp(i)
    for name, labels, instance, spans, end in ledger_series():
        for i in range(int(min(end, LENGTH) // STEP) + 1):
            value = _ledger_value(instance, spans, i * STEP)
            if value is not None and i * STEP >= min(a for a, _b, _r in spans):
                yield name, labels, value, stamp(i)


def write_openmetrics(t0: float, fh) -> int:
    """Every counter from t0 to t0 + LENGTH, OpenMetrics for `promtool tsdb create-blocks-from openmetrics`."""
    count, last = 0, None
    for name, labels, value, stamp in samples(t0):
        if name != last:
            fh.write(f"# HELP {name} GPU-seconds ({name}).\n# TYPE {name} counter\n")
            last = name
        fh.write(f"{name}_total{{{labels}}} {value:.6f} {stamp}\n")
        count += 1
    fh.write("# EOF\n")
    return count


def prometheus_text(t0: float):
    """The same samples as Prometheus text with millisecond timestamps (VictoriaMetrics' import API), in
    pieces of 10,000 lines."""
    lines = []
    for name, labels, value, stamp in samples(t0, millis=True):
        lines.append(f"{name}_total{{{labels}}} {value:.6f} {stamp}\n")
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
