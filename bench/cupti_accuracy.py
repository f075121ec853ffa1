"""Per-client accuracy of the cupti basis under MPS against the clients' own kernel counts.

    python3 bench/cupti_accuracy.py OUTDIR [--asked 10]   # the folder tools/record_cupti_mps.sh wrote

Truth (the spin jobs of the `acc` phase): every kernel spins exactly 4 ms (%globaltimer) with one block per
SM (each block asks for more than half an SM's shared memory), so while it runs it holds exactly --sms
SMs, each with warps resident: SM active counts them all and nothing else. A job's kernels finished in a
window (its progress file logs every synchronize, 4 kernels) x 4 ms over the window is its time share;
times --sms / 132 its share of the GPU's SM active. The window is the CLIENT'S OWN (the exporter's debug
log: "cupti window N: pid P traced S to E"): its time_share is its kernel-busy time over its own window, so
the truth is counted over the same interval. The GPU's window (the union of its clients') also holds the
time after this client closed its window, when its loop stalls behind its own flush (cupti-python holds
the GIL per buffer), which lowers a count over the union. Both are written. A log without the debug lines
(the first H200 run's) has no client's own bounds: --asked S then counts over [the union's start, + S], the
window every client was asked for (each starts it when the command arrives, within milliseconds of the
others; its end is later by its disable), else over the union. Measured: each job's time_share, sm_active (basis
cupti, scaled) and sm_estimate (unscaled) in /api/v1/workloads, one value per cupti window; and per window the GPU's SM active (GPM) over
the same window against the scaled sum. Writes OUTDIR/accuracy.json.
"""
from __future__ import annotations

import bisect
import json
import re
import sys
from pathlib import Path

KERNEL_S = 0.004
SPIN_SMS = {"301": 66, "302": 8, "303": 33}
SM_COUNT = 132
OWN = re.compile(r"cupti window (\d+): pid (\d+) traced ([\d.]+) to ([\d.]+)$")


def own_windows(log: Path) -> list[dict[int, tuple[float, float]]]:
    """Per cupti window of the exporter's debug log: pid -> that client's own (start, end)."""
    out: dict[int, dict[int, tuple[float, float]]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            m = OWN.search(line)
            if m:
                out.setdefault(int(m[1]), {})[int(m[2])] = (float(m[3]), float(m[4]))
    return [out[n] for n in sorted(out)]


def own_window(owns: list[dict], lo: float, hi: float, pid) -> tuple[float, float] | None:
    """The client's own window inside the GPU's window [lo, hi] (the union of that window's clients)."""
    for clients in owns:
        if clients and abs(min(s for s, _ in clients.values()) - lo) < 1e-3 and \
                abs(max(e for _, e in clients.values()) - hi) < 1e-3:
            return clients.get(pid)
    return None


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
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--asked", type=float, default=None, help="without own windows in the log: count the "
                        "truth over the first ASKED seconds of the GPU's window")
    args = parser.parse_args(argv)
    out = args.out
    report = {}
    acc = windows(out / "acc_workloads.jsonl")
    owns = own_windows(out / "acc_exporter.log")
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
                share = SPIN_SMS[job] / SM_COUNT
                union_n = kernels_between(out / f"acc_progress_{job}.txt", lo, hi)
                own = own_window(owns, lo, hi, (got.get("pids") or [None])[0])
                start, end = own or ((lo, lo + args.asked) if args.asked else (lo, hi))
                n = kernels_between(out / f"acc_progress_{job}.txt", start, end)
                truth_time = n * KERNEL_S / (end - start)
                cell.update(truth_window=[start, end], truth_over="own" if own else "asked" if args.asked else "union",
                            kernels=n,
                            truth_time_share=round(truth_time, 4), truth_sm_active=round(truth_time * share, 4),
                            time_error=round(got["time_share"] - truth_time, 4),
                            sm_error=None if got["sm_active"] is None else
                            round(got["sm_active"] - truth_time * share, 4),
                            estimate_error=None if got["sm_estimate"] is None else
                            round(got["sm_estimate"] - truth_time * share, 4),
                            union_truth_time_share=round(union_n * KERNEL_S / (hi - lo), 4),
                            union_time_error=round(got["time_share"] - union_n * KERNEL_S / (hi - lo), 4))
            row["jobs"][job] = cell
        rows.append(row)
    report["acc"] = rows
    models = windows(out / "models_workloads.jsonl")
    report["models"] = []
    for k, v in sorted(models.items()):
        scaled = sum(j["sm_active"] or 0 for j in v["jobs"].values())
        gpm = (v["gpu"] or {}).get("gpu_sm_active")
        report["models"].append({"window": list(k), "gpu": v["gpu"], "jobs": v["jobs"], "scaled_sum": round(scaled, 4),
                                 "sum_minus_gpu": None if gpm is None else round(scaled - gpm, 4)})
    for name in ("cost8_on", "cost8_off"):
        path = out / f"{name}_cpu.json"
        report[name] = json.loads(path.read_text()) if path.exists() else None
    (out / "accuracy.json").write_text(json.dumps(report, indent=1))
    print(f"{'window':>14} {'job':>4} {'truth t':>8} {'cupti t':>8} {'err':>7} {'truth SM':>8} {'cupti SM':>8} "
          f"{'err':>7} {'unscaled':>8} {'union err':>9}")
    for row in rows:
        for job, c in row["jobs"].items():
            print(f"{row['window'][1]:14.1f} {job:>4} {c.get('truth_time_share', ''):>8} {c['time_share']:>8} "
                  f"{c.get('time_error', ''):>7} {c.get('truth_sm_active', ''):>8} {c['sm_active']!s:>8} "
                  f"{c.get('sm_error', '')!s:>7} {c['sm_estimate']!s:>8} {c.get('union_time_error', '')!s:>9}")
        print(f"{'':>14} GPU SM active {row['gpu_sm_active']} scaled sum {row['scaled_sum']} estimated "
              f"{row['estimated']} scale {row['scale']} unattributed {row['unattributed']}")
    for row in report["models"]:
        print("models", row["window"], row["gpu"], row["jobs"], "scaled sum", row["scaled_sum"], "minus GPU",
              row["sum_minus_gpu"])
    print("exporter CPU, 8 tracing clients:", report["cost8_on"], "without --workload-cupti:", report["cost8_off"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
