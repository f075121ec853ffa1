"""A 48-hour history of workload counters with every case the GPU account must get right (issue 28), and
its GPU-hours computed by hand, apart from the report's code: from each holder's rates and the seconds it
held its GPU while its exporter ran.

Cases: holders whole / time-sliced (SM time_share) / a MIG slice (no busy) / two MPS clients (no busy, no
SM: unknown) / an idle notebook / a Unix user's process on a host without a scheduler / a DRA claim / a Slurm job
measured from context switches (busy and SM basis ctxsw) that ends at hour 20 / a holder that starts at hour 33.25 / fifteen short jobs (10-26 min) /
node-a's exporter restarting at hour 36 (down 60 s, its counters start again from 0) / a scrape and rules
outage from hour 40 to 41 (the exporters keep counting) / rollups only from hour 30 (rules added later).
Samples every 15 s; a holder's series ends with its last scrape (the value it reached then).
"""
from __future__ import annotations

from dataclasses import dataclass

from tests.workload_scenario import FAMILIES, Holder, gpu_hours_by_group, series  # noqa: F401 (FAMILIES: for the tests)

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


def samples(t0: float, millis: bool = False):
    """(family, label text, value, timestamp) of every sample, series by series."""
    for family, labels, hold in series(HOLDS):
        for i in range(int(LENGTH // STEP) + 1):
            value = hold.value(family, i * STEP)
            if value is not None:
                yield family, labels, value, (f"{int((t0 + i * STEP) * 1000)}" if millis else f"{t0 + i * STEP:.3f}")


def write_openmetrics(t0: float, fh) -> int:
    """Every counter from t0 to t0 + LENGTH, OpenMetrics for `promtool tsdb create-blocks-from openmetrics`."""
    count, last = 0, None
    for family, labels, value, stamp in samples(t0):
        name = f"gpu_workload_{family}_gpu_seconds"
        if family != last:
            fh.write(f"# HELP {name} GPU-seconds ({family}) of a workload.\n# TYPE {name} counter\n")
            last = family
        fh.write(f"{name}_total{{{labels}}} {value:.6f} {stamp}\n")
        count += 1
    fh.write("# EOF\n")
    return count


def prometheus_text(t0: float):
    """The same samples as Prometheus text with millisecond timestamps (VictoriaMetrics' import API), in
    pieces of 10,000 lines."""
    lines = []
    for family, labels, value, stamp in samples(t0, millis=True):
        lines.append(f"gpu_workload_{family}_gpu_seconds_total{{{labels}}} {value:.6f} {stamp}\n")
        if len(lines) >= 10000:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)


GROUP_OF = {"namespace": lambda h: (h.namespace,), "hpc_job": lambda h: (h.hpc_job,),
            "node": lambda h: (h.instance,), "model": lambda h: (h.model,), "user": lambda h: (h.user,), "claim": lambda h: (h.claim,), "pod": lambda h: (h.namespace, h.pod)}


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
