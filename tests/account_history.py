"""A 48-hour history of workload counters with every case the GPU account must get right (issue 28), and
its GPU-hours computed by hand, apart from the report's code: from each holder's rates and the seconds it
held its GPU while its exporter ran.

Cases: holders whole / time-sliced (busy basis nvml, SM time_share) / a MIG slice (no busy) / two MPS
clients (no busy, no SM: unknown) / an idle notebook / a Unix user's process on a host without a scheduler / a Slurm job measured from context switches (busy and
SM basis ctxsw) that ends at hour 20 / a holder that starts at hour 33.25 / fifteen short jobs (10-26 min) /
node-a's exporter restarting at hour 36 (down 60 s, its counters start again from 0) / a scrape and rules
outage from hour 40 to 41 (the exporters keep counting) / rollups only from hour 30 (rules added later).
Samples every 15 s; a holder's series ends with its last scrape (the value it reached then).
"""
from __future__ import annotations

from dataclasses import dataclass

HOUR = 3600.0
LENGTH = 48 * HOUR
STEP = 15.0
RULES_FROM = 30 * HOUR
OUTAGE = (40 * HOUR, 41 * HOUR)      # no scrapes, no rule evaluations
RESTART = (36 * HOUR - 60, 36 * HOUR)  # node-a's exporter down (exclusive); counts again from 0 at the end
RESTARTED = "node-a"
FAMILIES = ("held", "busy", "sm_active", "hidden_idle", "held_idle")


@dataclass(frozen=True)
class Hold:
    instance: str
    gpu: str
    start: float
    end: float
    held: float
    busy: float | None = None
    sm: float | None = None
    busy_basis: str = "nvml"
    sm_basis: str = "exact"
    idle: bool = False
    namespace: str = ""
    pod: str = ""
    hpc_job: str = ""
    user: str = ""
    model: str = "NVIDIA H100 80GB HBM3"

    def rates(self) -> dict:
        hidden = max(0.0, self.busy - self.sm) if self.busy is not None and self.sm is not None else None
        return {"held": self.held, "busy": self.busy, "sm_active": self.sm, "hidden_idle": hidden,
                "held_idle": self.held if self.idle else 0.0}

    def basis(self, family: str) -> str | None:
        return {"busy": self.busy_basis, "sm_active": self.sm_basis, "hidden_idle": self.sm_basis}.get(family)

    def labels(self, family: str) -> dict:
        out = {"job": "gpu-spatial-exporter", "instance": self.instance, "gpu": self.gpu,
               "uuid": f"GPU-{self.instance}-{self.gpu}", "model": self.model}
        out.update({k: v for k in ("namespace", "pod", "hpc_job", "user") if (v := getattr(self, k))})
        if out.get("pod"):
            out["container"] = "main"
        if self.basis(family):
            out["basis"] = self.basis(family)
        return out

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
        rate = self.rates()[family]
        return None if rate is None else rate * sum(b - a for a, b in self.counting())


# (start, length): every 3.7 h, and three across the edges of the rollups' spans (hour 30 + 2 min, hour 40 - 8 min,
# hour 48 - 7 min), where a wrong lag or a missed edge would count them twice or not at all
SHORT = [(2 * HOUR + i * 3.7 * HOUR, (11 + 1.5 * i) * 60 + 30) for i in range(12)] + \
    [(29.95 * HOUR, 14.5 * 60), (39.8 * HOUR, 10.5 * 60), (47.8 * HOUR, 10.5 * 60)]
HOLDS = (
    Hold("node-a", "0", 0, LENGTH, 1.0, busy=0.9, sm=0.6, namespace="team-a", pod="train-0"),
    Hold("node-a", "1", 33.25 * HOUR, LENGTH, 1.0, busy=0.8, sm=0.2, namespace="team-a", pod="train-1"),
    Hold("node-b", "3", 0, LENGTH, 3 / 7, sm=0.3, namespace="team-a", pod="mig-0"),
    Hold("node-a", "2", 0, LENGTH, 0.5, busy=0.5, sm=0.25, sm_basis="time_share", namespace="team-b", pod="infer-0"),
    Hold("node-a", "2", 0, LENGTH, 0.25, busy=0.3, sm=0.1, sm_basis="time_share", namespace="team-b", pod="infer-1"),
    Hold("node-a", "2", 0, LENGTH, 0.25, busy=0.0, sm=0.0, sm_basis="time_share", idle=True, namespace="team-b",
         pod="infer-2"),
    Hold("node-b", "0", 0, LENGTH, 0.5, namespace="team-c", pod="mps-0"),
    Hold("node-b", "0", 0, LENGTH, 0.5, namespace="team-d", pod="mps-1"),
    Hold("node-b", "1", 0, LENGTH, 1.0, busy=0.0, sm=0.0, idle=True, namespace="team-c", pod="notebook"),
    Hold("node-c", "0", 0, 20 * HOUR, 1.0, busy=0.5, sm=0.45, busy_basis="ctxsw", sm_basis="ctxsw", hpc_job="4242",
         model="NVIDIA A100-SXM4-80GB"),
    Hold("node-c", "1", 0, LENGTH, 1.0, busy=0.6, sm=0.3, namespace="team-e", pod="server"),
    Hold("node-d", "0", 0, LENGTH, 1.0, busy=0.4, sm=0.2, user="alice"),  # a shared host: a Unix user holds it
    *(Hold("node-c", "2", start, start + length, 1.0, busy=0.7, sm=0.5, namespace="team-e" if i < 12 else "team-f",
           pod=f"short-{i}") for i, (start, length) in enumerate(SHORT)),
)


def write_openmetrics(t0: float, fh) -> int:
    """Every counter from t0 to t0 + LENGTH, OpenMetrics for `promtool tsdb create-blocks-from openmetrics`."""
    count = 0
    times = [i * STEP for i in range(int(LENGTH // STEP) + 1)]
    for family in FAMILIES:
        name = f"gpu_workload_{family}_gpu_seconds"
        fh.write(f"# HELP {name} GPU-seconds ({family}) of a workload.\n# TYPE {name} counter\n")
        for hold in HOLDS:
            if hold.rates()[family] is None:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(hold.labels(family).items()))
            for t in times:
                value = hold.value(family, t)
                if value is not None:
                    fh.write(f"{name}_total{{{labels}}} {value:.6f} {t0 + t:.3f}\n")
                    count += 1
    fh.write("# EOF\n")
    return count


def prometheus_text(t0: float):
    """The same samples as Prometheus text with millisecond timestamps (VictoriaMetrics' import API), in
    pieces of about a megabyte."""
    lines = []
    for family in FAMILIES:
        name = f"gpu_workload_{family}_gpu_seconds_total"
        for hold in HOLDS:
            if hold.rates()[family] is None:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(hold.labels(family).items()))
            for i in range(int(LENGTH // STEP) + 1):
                value = hold.value(family, i * STEP)
                if value is not None:
                    lines.append(f"{name}{{{labels}}} {value:.6f} {int((t0 + i * STEP) * 1000)}\n")
                    if len(lines) >= 10000:
                        yield "".join(lines)
                        lines = []
    if lines:
        yield "".join(lines)


GROUP_OF = {"namespace": lambda h: (h.namespace,), "hpc_job": lambda h: (h.hpc_job,),
            "node": lambda h: (h.instance,), "model": lambda h: (h.model,), "user": lambda h: (h.user,), "pod": lambda h: (h.namespace, h.pod)}


def truth(by: str) -> dict[tuple, dict]:
    """GPU-hours per group by hand: {group: {family: hours, family_unknown: held hours without it,
    family_ends: GPU-hours of half a scrape after each series that ends before the history does (what
    Prometheus' extrapolation adds)}}."""
    out: dict[tuple, dict] = {}
    for hold in HOLDS:
        row = out.setdefault(GROUP_OF[by](hold), {})
        held = hold.truth("held") / 3600
        for family in FAMILIES:
            seconds = hold.truth(family)
            if seconds is None:
                row[f"{family}_unknown"] = row.get(f"{family}_unknown", 0.0) + held
            else:
                row[family] = row.get(family, 0.0) + seconds / 3600
                ends = hold.rates()[family] * STEP / 2 / 3600 if hold.end < LENGTH else 0.0
                row[f"{family}_ends"] = row.get(f"{family}_ends", 0.0) + ends
    return out
