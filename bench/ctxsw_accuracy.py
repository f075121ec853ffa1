"""Per-job accuracy of the live context-switch basis and of the NVML basis against the 10 kHz truth.

    python3 bench/ctxsw_accuracy.py OUTDIR      # the folder tools/record_ctxsw_live.sh wrote

Truth (OUTDIR/truth_within.json): `nsys_ingest workloads --estimator within` of a 10 kHz context-switch
capture of the same steady jobs. Time share is the job's processes' resident time from the switch trace
(exact at any sampling rate); SM active is the mean SM activity of the 0.1 ms samples that lie wholly
inside the job's own slices, times its resident share (as a share of the whole GPU). Jobs map to pids
through their cgroups (OUTDIR/jobs.json). Live values: each job's published time share and SM active in
/api/v1/workloads, averaged over the polls of the steady part (ctxsw: only values with basis ctxsw, one
per window; nvml: every poll). Writes OUTDIR/accuracy.json and prints a table.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def truth(out: Path) -> dict[str, dict]:
    data = json.loads((out / "truth_within.json").read_text())
    jobs = json.loads((out / "jobs.json").read_text())
    procs = {p["pid"]: p for g in data["gpus"] if g["gpu"] == 0 for p in g["processes"]}
    result = {}
    for job, pids in jobs.items():
        mine = [procs[p] for p in pids if p in procs]
        result[job] = {"time_share": round(sum(p["time_share"] for p in mine), 4),
                       "sm_active": round(sum(p["of_gpu"]["sm_active"] or 0.0 for p in mine), 4)}
    return result


def polled(path: Path, basis: str | None) -> dict[str, dict]:
    """job -> mean time share and SM active over the polls (ctxsw: one value per window)."""
    seen: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        try:
            answer = json.loads(line)["w"]
        except (ValueError, TypeError, KeyError):
            continue  # a poll before the exporter answered
        for w in answer.get("workloads", ()):
            if w.get("gpu") != 0 or w.get("time_share") is None:
                continue
            if basis is not None and w.get("time_share_basis") != basis:
                continue
            key = tuple(w.get("ctxsw_window") or ()) if basis else answer.get("snapshot_version")
            seen.setdefault(w["hpc_job"], {})[key] = (w["time_share"], w.get("sm_active"))
    out = {}
    for job, values in seen.items():
        shares = [v[0] for v in values.values()]
        sms = [v[1] for v in values.values() if v[1] is not None]
        out[job] = {"time_share": round(sum(shares) / len(shares), 4), "sm_active": round(sum(sms) / len(sms), 4)
                    if sms else None, "values": len(values)}
    return out


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    t = truth(out)
    bases = {"ctxsw": polled(out / "ctxsw_workloads.jsonl", "ctxsw"), "nvml": polled(out / "nvml_workloads.jsonl", None)}
    rows = []
    print(f"{'job':>5} {'truth time':>10} {'truth SM':>9} | {'ctxsw time':>10} {'err':>7} {'ctxsw SM':>9} {'err':>7} | "
          f"{'nvml time':>9} {'err':>7} {'nvml SM':>8} {'err':>7}")
    for job in sorted(t):
        row = {"job": job, "truth": t[job]}
        cells = []
        for name, got in bases.items():
            g = got.get(job)
            row[name] = g
            if g is None:
                cells.append(f"{'n/a':>10} {'':>7} {'n/a':>9} {'':>7}")
                continue
            row[name + "_error"] = {"time_share": round(g["time_share"] - t[job]["time_share"], 4),
                                    "sm_active": None if g["sm_active"] is None else
                                    round(g["sm_active"] - t[job]["sm_active"], 4)}
            sm = "n/a" if g["sm_active"] is None else f"{g['sm_active']:.4f}"
            sm_err = "" if g["sm_active"] is None else f"{row[name + '_error']['sm_active']:+.4f}"
            cells.append(f"{g['time_share']:>10.4f} {row[name + '_error']['time_share']:>+7.4f} {sm:>9} {sm_err:>7}")
        rows.append(row)
        print(f"{job:>5} {t[job]['time_share']:>10.4f} {t[job]['sm_active']:>9.4f} | " + " | ".join(cells))
    (out / "accuracy.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
