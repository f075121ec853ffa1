"""Workload counters whose GPU-seconds are known by construction, as OpenMetrics (for promtool backfill)
or as the exposition at a point of the scenario (for a live scrape): the report's tests and bench/fleet_sim.py.

Each holder holds `held` GPUs from `start` to `end` (seconds into the scenario) at constant rates, so a
counter's value at t is rate x (t - start) clipped to the hold, and its increase over any range that
covers the hold is rate x (end - start). Busy and SM-active are absent where `busy`/`sm` are None (MPS;
busy on MIG), hidden-idle is max(0, busy - sm) only where both exist, held-idle is `held` while `idle`.
"""
from __future__ import annotations

from dataclasses import dataclass

GPU_LABELS = ("instance", "job", "gpu", "uuid", "model", "namespace", "pod", "container", "hpc_job", "user", "claim")
FAMILIES = ("held", "busy", "sm_active", "hidden_idle", "held_idle")


@dataclass(frozen=True)
class Holder:
    instance: str
    gpu: str
    start: float
    end: float
    held: float
    busy: float | None = None
    sm: float | None = None
    basis: str = "exact"
    idle: bool = False
    namespace: str = ""
    pod: str = ""
    container: str = ""
    hpc_job: str = ""
    model: str = "NVIDIA H100 80GB HBM3"
    job: str = "gpu-spatial-exporter"
    user: str = ""
    claim: str = ""
    busy_basis: str = ""  # busy's basis label (nvml, ctxsw) where set

    @property
    def uuid(self) -> str:
        return f"GPU-{self.instance}-{self.gpu}"

    def labels(self) -> dict:
        return {k: v for k in GPU_LABELS if (v := str(getattr(self, k)))}

    def rates(self) -> dict[str, float | None]:
        """GPU-seconds per second of each counter while held; None: the series does not exist."""
        hidden = max(0.0, self.busy - self.sm) if self.busy is not None and self.sm is not None else None
        return {"held": self.held, "busy": self.busy, "sm_active": self.sm, "hidden_idle": hidden,
                "held_idle": self.held if self.idle else 0.0}

    def gpu_seconds(self, family: str) -> float | None:
        rate = self.rates()[family]
        return None if rate is None else rate * (self.end - self.start)

    def value(self, family: str, t: float) -> float:
        return self.rates()[family] * min(max(t - self.start, 0.0), self.end - self.start)


def series(holders):
    """(family, label text, holder) of every counter series, family by family."""
    for family in FAMILIES:
        for holder in holders:
            if holder.rates()[family] is None:
                continue
            labels = holder.labels()
            if family in ("sm_active", "hidden_idle"):
                labels["basis"] = holder.basis
            elif family == "busy" and holder.busy_basis:
                labels["basis"] = holder.busy_basis
            yield family, ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())), holder


def gpu_hours_by_group(holders, group_of, gpu_seconds) -> dict[tuple, dict]:
    """{group: {family: GPU-hours, family_unknown: held GPU-hours of holders without that series}};
    gpu_seconds(holder, family) is a holder's GPU-seconds, None where the series does not exist."""
    out: dict[tuple, dict] = {}
    for holder in holders:
        row = out.setdefault(group_of(holder), {})
        held = gpu_seconds(holder, "held") / 3600
        for family in FAMILIES:
            seconds = gpu_seconds(holder, family)
            if seconds is None:
                row[f"{family}_unknown"] = row.get(f"{family}_unknown", 0.0) + held
            else:
                row[family] = row.get(family, 0.0) + seconds / 3600
    return out


def write_openmetrics(holders, t0: float, duration: float, step: float, fh) -> int:
    """Counters from t0 to t0 + duration every `step` seconds; returns the number of samples."""
    count, last_family = 0, None
    times = [t0 + i * step for i in range(int(duration // step) + 1)]
    for family, labels, holder in series(holders):
        name = f"gpu_workload_{family}_gpu_seconds"
        if family != last_family:
            fh.write(f"# HELP {name} GPU-seconds ({family}) of a workload.\n# TYPE {name} counter\n")
            last_family = family
        fh.writelines(f"{name}_total{{{labels}}} {holder.value(family, t - t0):.6f} {t:.3f}\n" for t in times)
        count += len(times)
    fh.write("# EOF\n")
    return count


def exposition(holders, elapsed: float) -> str:
    """Prometheus text with every counter's value `elapsed` seconds into the scenario."""
    lines = [f"gpu_workload_{family}_gpu_seconds_total{{{labels}}} {holder.value(family, elapsed):.6f}"
             for family, labels, holder in series(holders)]
    return "\n".join(lines) + "\n"


MINUTE = 60.0
# 40 minutes; every hold lies within minutes 5 to 35, so a range covering the scenario sees whole holds.
DURATION = 40 * MINUTE
SCENARIO = (
    # team-a: two exclusive GPUs (SM exact) and a 3/7 MIG slice (SM exact, no busy: MIG has no time share)
    Holder("node-a", "0", 5 * MINUTE, 35 * MINUTE, 1.0, busy=0.9, sm=0.6, namespace="team-a", pod="train-0",
           container="main"),
    Holder("node-a", "1", 5 * MINUTE, 25 * MINUTE, 1.0, busy=0.8, sm=0.2, namespace="team-a", pod="train-1",
           container="main"),
    Holder("node-b", "3", 10 * MINUTE, 31 * MINUTE, 3 / 7, sm=0.3, namespace="team-a", pod="mig-0",
           container="main"),
    # team-b: three pods time-sliced on one GPU (4 replicas): SM by time share; b-2 holds and idles
    Holder("node-a", "2", 10 * MINUTE, 30 * MINUTE, 0.5, busy=0.5, sm=0.25, basis="time_share",
           namespace="team-b", pod="infer-0", container="server"),
    Holder("node-a", "2", 10 * MINUTE, 30 * MINUTE, 0.25, busy=0.3, sm=0.1, basis="time_share",
           namespace="team-b", pod="infer-1", container="server"),
    Holder("node-a", "2", 10 * MINUTE, 30 * MINUTE, 0.25, busy=0.0, sm=0.0, basis="time_share", idle=True,
           namespace="team-b", pod="infer-2", container="server"),
    # team-c and team-d share a GPU through MPS (no busy, no SM: unknown); team-c also holds an idle GPU
    Holder("node-b", "0", 5 * MINUTE, 35 * MINUTE, 0.5, namespace="team-c", pod="mps-0", container="worker"),
    Holder("node-b", "0", 5 * MINUTE, 35 * MINUTE, 0.5, namespace="team-d", pod="mps-1", container="worker"),
    Holder("node-b", "1", 5 * MINUTE, 35 * MINUTE, 1.0, busy=0.0, sm=0.0, idle=True, namespace="team-c",
           pod="notebook", container="jupyter"),
    # a Slurm job, no namespace
    Holder("node-c", "0", 5 * MINUTE, 35 * MINUTE, 1.0, busy=0.5, sm=0.45, hpc_job="4242",
           model="NVIDIA A100-SXM4-80GB"),
)
