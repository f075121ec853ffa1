"""Per-client accuracy of the cupti basis under MPS against the clients' own kernel counts.

    python3 bench/cupti_accuracy.py OUTDIR      # the folder bench/record_cupti_mps.sh wrote

Truth (the spin jobs of the `acc` phase): every kernel spins exactly 4 ms (%globaltimer) with one block per
SM (each block asks for more than half an SM's shared memory), so while it runs it holds exactly --sms
SMs, each with warps resident: SM active counts them all and nothing else. A job's kernels finished in a
window (its progress file logs every synchronize, 4 kernels) x 4 ms over the window is its time share;
times --sms / 132 its share of the GPU's SM active. Measured: each job's time_share, sm_active (basis
cupti, scaled) and sm_estimate (unscaled) in /api/v1/workloads, one value per cupti window; and per window
the GPU's SM active (GPM) over the same window against the scaled sum. Writes OUTDIR/accuracy.json.
"""
from __future__ import annotations

import bisect
import json
import sys
from pathlib import Path

KERNEL_S = 0.004
SPIN_SMS = {"301": 66, "302": 8, "303": 33}
SM_COUNT = 132


def windows(path: Path) -> dict[tuple, dict]:
    """cupti window -> {"jobs": job -> its values, "gpu": the GPU's scaling}, the last poll of each."""
    out: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        try:
            answer = json.loads(line)["w"]
        except (ValueError, TypeError, KeyError):
            continue
        gpu = {g["uuid"]: g for g in answer.get("cupti") or ()}
        for w in answer.get("workloads", ()):
            if w.get("time_share_basis") != "cupti" or not w.get("ctxsw_window"):
                continue
            key = tuple(w["ctxsw_window"])
            entry = out.setdefault(key, {"jobs": {}, "gpu": gpu.get(w["uuid"])})
            entry["jobs"][w["hpc_job"]] = {k: w.get(k) for k in ("time_share", "sm_active", "sm_active_basis",
                                                                  "sm_estimate", "pids")}
            if gpu.get(w["uuid"]):
                entry["gpu"] = gpu[w["uuid"]]
    return out


def kernels_between(progress: Path, lo: float, hi: float) -> int:
    rows = [tuple(map(float, line.split())) for line in progress.read_text().splitlines() if line.strip()]
    times = [t for t, _ in rows]

    def done(at: float) -> float:
        i = bisect.bisect_right(times, at) - 1
        return rows[i][1] if i >= 0 else 0.0
    return int(done(hi) - done(lo))


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    report = {}
    acc = windows(out / "acc_workloads.jsonl")
    rows = []
    for (lo, hi), entry in sorted(acc.items()):
        gpu = entry["gpu"] or {}
        scaled = sum(j["sm_active"] or 0 for j in entry["jobs"].values())
        row = {"window": [lo, hi], "gpu_sm_active": gpu.get("gpu_sm_active"), "estimated": gpu.get("estimated"),
               "scale": gpu.get("scale"), "unattributed": gpu.get("unattributed"), "scaled_sum": round(scaled, 4),
               "jobs": {}}
        for job, got in sorted(entry["jobs"].items()):
            cell = dict(got)
            if job in SPIN_SMS:
                n = kernels_between(out / f"acc_progress_{job}.txt", lo, hi)
                truth_time = n * KERNEL_S / (hi - lo)
                cell.update(kernels=n, truth_time_share=round(truth_time, 4),
                            truth_sm_active=round(truth_time * SPIN_SMS[job] / SM_COUNT, 4),
                            time_error=round(got["time_share"] - truth_time, 4),
                            sm_error=None if got["sm_active"] is None else
                            round(got["sm_active"] - truth_time * SPIN_SMS[job] / SM_COUNT, 4),
                            estimate_error=None if got["sm_estimate"] is None else
                            round(got["sm_estimate"] - truth_time * SPIN_SMS[job] / SM_COUNT, 4))
            row["jobs"][job] = cell
        rows.append(row)
    report["acc"] = rows
    models = windows(out / "models_workloads.jsonl")
    report["models"] = [{"window": list(k), "gpu": v["gpu"], "jobs": v["jobs"],
                         "scaled_sum": round(sum(j["sm_active"] or 0 for j in v["jobs"].values()), 4)}
                        for k, v in sorted(models.items())]
    for name in ("cost8_on", "cost8_off"):
        path = out / f"{name}_cpu.json"
        report[name] = json.loads(path.read_text()) if path.exists() else None
    (out / "accuracy.json").write_text(json.dumps(report, indent=1))
    print(f"{'window':>14} {'job':>4} {'truth t':>8} {'cupti t':>8} {'err':>7} {'truth SM':>8} {'cupti SM':>8} "
          f"{'err':>7} {'unscaled':>8}")
    for row in rows:
        for job, c in row["jobs"].items():
            print(f"{row['window'][1]:14.1f} {job:>4} {c.get('truth_time_share', ''):>8} {c['time_share']:>8} "
                  f"{c.get('time_error', ''):>7} {c.get('truth_sm_active', ''):>8} {c['sm_active']!s:>8} "
                  f"{c.get('sm_error', '')!s:>7} {c['sm_estimate']!s:>8}")
        print(f"{'':>14} GPU SM active {row['gpu_sm_active']} scaled sum {row['scaled_sum']} estimated "
              f"{row['estimated']} scale {row['scale']} unattributed {row['unattributed']}")
    for row in report["models"]:
        print("models", row["window"], row["gpu"], row["jobs"], "scaled sum", row["scaled_sum"])
    print("exporter CPU, 8 tracing clients:", report["cost8_on"], "without --workload-cupti:", report["cost8_off"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
