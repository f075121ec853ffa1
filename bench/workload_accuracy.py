"""Per-job numbers of the exporter against nsys, from what bench/record_workloads.sh wrote.

    python3 bench/workload_accuracy.py OUTDIR > accuracy.json

Time-sliced run: each job's mean time share over the steady window (10 s after the start to 2 s before
the end) against its process's kernel busy share in nsys' CUDA trace of the same window, and the
sum over jobs against the GPU's time utilization. MPS run: processes per job, that no time share was
published and why, and whether the job with no kernels was flagged held idle.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def records(path: Path, start: float, end: float) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if start <= doc.get("snapshot_time", 0) <= end:
            out.append(doc)
    return out


def mean(values):
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def per_job(docs: list[dict]) -> dict[str, dict]:
    jobs: dict[str, dict] = {}
    for doc in docs:
        for w in doc["workloads"]:
            j = jobs.setdefault(w["hpc_job"], {"time_share": [], "sm_active": [], "processes": [], "basis": set(),
                                               "held_share": w["held_share"], "reasons": set(), "held_idle": []})
            j["time_share"].append(w["time_share"])
            j["sm_active"].append(w["sm_active"])
            j["processes"].append(w["processes"])
            j["basis"].add(w["sm_active_basis"])
            j["reasons"].add(w["time_share_reason"])
            j["held_idle"].append(w["held_idle"])
    return {job: {"held_share": j["held_share"], "time_share": mean(j["time_share"]), "sm_active": mean(j["sm_active"]),
                  "sm_active_basis": sorted(b for b in j["basis"] if b), "processes": mean(j["processes"]),
                  "time_share_reasons": sorted(j["reasons"]), "held_idle_at_end": j["held_idle"][-1],
                  "samples": len(j["time_share"])} for job, j in sorted(jobs.items())}


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    result = {}
    ts = json.loads((out / "ts_pids.json").read_text())
    start, end = ts["window"][0] + 10, ts["window"][1] - 2
    jobs = per_job(records(out / "ts_workloads.jsonl", start, end))
    busy = {}
    diagnose = json.loads((out / "ts_diagnose.json").read_text())
    for gpu in diagnose.get("gpus", []):
        for proc in gpu.get("processes", []):
            busy[proc["pid"]] = proc.get("busy_share")
    rows = []
    for job, pid in sorted(ts["jobs"].items()):
        mine = jobs.get(job, {})
        nsys = busy.get(pid, 0.0)
        share = mine.get("time_share")
        rows.append({"job": job, "pid": pid, "exporter_time_share": share, "nsys_busy_share": nsys,
                     "error_points": None if share is None or nsys is None else round(100 * (share - nsys), 2),
                     **{k: mine.get(k) for k in ("held_share", "sm_active", "sm_active_basis", "processes")}})
    result["time_sliced"] = {"window": [start, end], "jobs": rows,
                             "sum_exporter": round(sum(r["exporter_time_share"] or 0 for r in rows), 4),
                             "sum_nsys": round(sum(r["nsys_busy_share"] or 0 for r in rows), 4),
                             "nsys_gpu_busy": (diagnose.get("gpus") or [{}])[0].get("kernels", {}).get("busy_share")}
    mps = json.loads((out / "mps_pids.json").read_text())
    result["mps"] = {"window": mps["window"], "jobs": per_job(records(out / "mps_workloads.jsonl",
                                                                       mps["window"][0] + 10, mps["window"][1]))}
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
