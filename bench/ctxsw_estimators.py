"""Which estimator gives a time-sliced GPU's SM activity to its processes best, measured on one capture.

    python3 bench/ctxsw_estimators.py CAPTURE_10KHZ.sqlite OUTDIR [--to-hz 1000] [--start S --end S]

Truth: the capture itself at its own frequency, attributed with the "within" estimator: only the
0.1 ms samples wholly inside one slice count (~95 % of them against ~2 ms slices), so no sample mixes
two processes, and what is left out is the first and last 0.1 ms of each slice. Candidates: the same capture's samples
averaged over `hz / to_hz` consecutive samples per GPU (mean of 10 at 10 kHz: exactly what a 1 kHz
capture would read, with the same slices), attributed with each estimator. Per GPU and process: the
error of the time share (none expected: it comes from the switch trace alone) and of SM active while
resident and as a share of the GPU. Writes OUTDIR/ctxsw_estimators.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nsys_ingest.ctxsw import ESTIMATORS, attribute
from nsys_ingest.reader import Export, IngestError

QUANTITIES = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")


def per_process(result: dict) -> dict[tuple[int, int], dict]:
    return {(g["gpu"], p["pid"]): p for g in result["gpus"] for p in g["processes"]}


def errors(truth: dict, estimate: dict) -> dict:
    """Per process: estimate - truth of time share and each quantity (while resident, of the GPU)."""
    rows, worst = [], {}
    got = per_process(estimate)
    for key, t in sorted(per_process(truth).items(), key=lambda kv: (kv[0][0], -kv[1]["time_share"])):
        e = got.get(key)
        row = {"gpu": key[0], "pid": key[1], "command": t["command"], "time_share": t["time_share"],
               "time_share_error": None if e is None else round(e["time_share"] - t["time_share"], 6)}
        for q in QUANTITIES:
            for kind in ("while_resident", "of_gpu"):
                tv, ev = t[kind].get(q), (e or {}).get(kind, {}).get(q)
                row[f"{q}_{kind}"] = tv
                row[f"{q}_{kind}_error"] = None if tv is None or ev is None else round(ev - tv, 6)
        rows.append(row)
        for name, value in row.items():
            if name.endswith("_error") and value is not None:
                worst[name] = max(worst.get(name, 0.0), abs(value))
    return {"processes": rows, "max_abs_error": worst}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("capture", help="an export with --gpuctxsw=true at a high GPU-metrics frequency (10 kHz)")
    p.add_argument("outdir", type=Path)
    p.add_argument("--to-hz", type=float, default=1000.0, help="the frequency the candidates see (default 1000)")
    p.add_argument("--truth", choices=ESTIMATORS, default="within",
                   help="the estimator applied to every sample of the capture for the truth (default within)")
    p.add_argument("--start", type=float, help="window start, seconds from capture start")
    p.add_argument("--end", type=float, help="window end, seconds from capture start")
    args = p.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    window = dict(start_ns=None if args.start is None else int(args.start * 1e9),
                  end_ns=None if args.end is None else int(args.end * 1e9))
    try:
        with Export(args.capture) as export:
            hz = export.sampling_hz
            if not hz:
                raise IngestError("the capture does not say its GPU-metrics frequency (META_DATA_CAPTURE)")
            combine = max(1, round(hz / args.to_hz))
            started = time.perf_counter()
            truth = attribute(export, estimator=args.truth, **window).to_json()
            timings = {"truth": round(time.perf_counter() - started, 3)}
            candidates = {}
            for estimator in ESTIMATORS:
                started = time.perf_counter()
                candidates[estimator] = attribute(export, estimator=estimator, combine=combine, **window).to_json()
                timings[estimator] = round(time.perf_counter() - started, 3)
    except IngestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = {
        "capture": str(args.capture), "sampling_hz": hz, "candidate_hz": hz / combine, "combined_samples": combine,
        "window_s": truth["window_s"], "truth": f"{args.truth} estimator on every sample of the capture",
        "seconds": timings,
        "gpus": [{k: g[k] for k in ("gpu", "name", "slices", "samples", "switch_gap_share", "unmatched_events")}
                 for g in truth["gpus"]],
        "estimators": {name: errors(truth, estimate) for name, estimate in candidates.items()},
    }
    (args.outdir / "ctxsw_estimators.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.capture}: truth at {hz:g} Hz, candidates at {hz / combine:g} Hz (mean of {combine}), "
          f"window {truth['window_s'][0]:.3f}-{truth['window_s'][1]:.3f} s")
    print(f"{'estimator':<9} {'gpu':>3} {'pid':>8} {'command':<18} {'share':>6} {'SM act':>7} {'error':>7} "
          f"{'SM of GPU err':>13} {'occ err':>8} {'tensor err':>10}")
    for name, found in result["estimators"].items():
        for row in found["processes"]:
            cells = [row["sm_active_while_resident"], row["sm_active_while_resident_error"],
                     row["sm_active_of_gpu_error"], row["sm_occupancy_while_resident_error"],
                     row["tensor_active_while_resident_error"]]
            shown = ["n/a" if c is None else f"{c:+.4f}" if i else f"{c:.4f}" for i, c in enumerate(cells)]
            print(f"{name:<9} {row['gpu']:>3} {row['pid']!s:>8} {row['command'][:18]:<18} {row['time_share']:6.3f} "
                  f"{shown[0]:>7} {shown[1]:>7} {shown[2]:>13} {shown[3]:>8} {shown[4]:>10}")
        worst = found["max_abs_error"]
        print(f"{name:<9} worst |error|: SM active while resident {worst.get('sm_active_while_resident_error', 0):.4f}, "
              f"of the GPU {worst.get('sm_active_of_gpu_error', 0):.4f}, time share {worst.get('time_share_error', 0):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
