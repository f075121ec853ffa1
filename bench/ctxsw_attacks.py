"""Hostile context-switch exports (issue 39, attacks 1-3), measured from outside, before and after a change.

    python3 bench/ctxsw_attacks.py --out bench/results/ctxsw_attacks_after.json
    python3 bench/ctxsw_attacks.py --code /tmp/before --out bench/results/ctxsw_attacks_before.json

Each case is built by tests/synthetic_exports.py (in a temporary directory) and run two ways:
- cli: `python -m nsys_ingest workloads FILE --json` in a fresh process: wall seconds, peak RSS (VmRSS every
  0.1 s from /proc), exit status, the last stderr line, the size of the --json answer; killed at --timeout.
- live (--live): the exporter's --workload-ctxsw source with the fake nsys replaying the file (1 s windows
  every 2 s, the H100's recorded NVML answers), for --live-seconds: the exporter's peak RSS, the latency of
  a scraper of /metrics every 50 ms (p50, p99, max) and the ctxsw source's state and success.
`--code DIR` measures another source tree (e.g. `git archive BASE | tar -x -C DIR`) on the same files.
Reports, never asserts: tests/test_ctxsw.py holds the bounds on sizes and counts.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import synthetic_exports as synth
from tests.helpers import Exporter, http_get, parse_metrics
from tests.http_load import MB, RssWatch, Scraper, run_measured

# name -> (builder, keyword arguments): the sizes
CASES = {
    "one_sample_5000_slices_of_1ns": (synth.switches_in_one_sample, {"slices": 5000, "slice_ns": 1, "samples_ms": 1}),
    "ten_million_rows_of_1us_slices": (synth.switches_in_one_sample,
                                       {"slices": 5_000_000, "slice_ns": 1000, "samples_ms": 10_001}),
    "one_million_unknown_tags": (synth.unknown_tags, {"rows": 1_000_000}),
    "ten_million_unknown_tags": (synth.unknown_tags, {"rows": 10_000_000}),
    "ill_conditioned_128_pairs": (synth.ill_conditioned, {"pairs": 128, "samples": 2000}),
}
LIVE = ("one_sample_5000_slices_of_1ns", "one_million_unknown_tags", "ill_conditioned_128_pairs")


def cli(code: Path, path: Path, timeout: float) -> dict:
    done = run_measured([sys.executable, "-m", "nsys_ingest", "workloads", str(path), "--json"], code,
                        {**os.environ, "PYTHONPATH": str(code), "NSYS_INGEST_NO_PROGRESS": "1"}, timeout)
    lines, answer = done.pop("stderr").strip().splitlines(), done.pop("stdout")
    return {**done, "stderr_last_line": lines[-1][:300] if lines else "", "stderr_lines": len(lines),
            "json_bytes": len(answer)}


def live(code: Path, path: Path, seconds: float, work: Path) -> dict:
    from tests.test_ctxsw_live import NVML_UUID, slurm_node

    con = sqlite3.connect(path)  # the GPU as the recorded NVML knows it
    con.execute("update TARGET_INFO_GPU set uuid = ? where id = 0", (NVML_UUID.removeprefix("GPU-"),))
    con.commit()
    con.close()
    args, env, _ = slurm_node(work, path, {417: "4242", 418: "4242", 419: "5151"})
    exporter = Exporter(*args, env={**env, "PYTHONPATH": str(code)})
    exporter.cwd = code
    with exporter:
        before = RssWatch(exporter.proc.pid)
        before.step()
        with RssWatch(exporter.proc.pid) as watch, Scraper(exporter.port) as scraper:
            time.sleep(seconds)
        status, body = http_get(exporter.url + "/api/v1/workloads", timeout=30)
        states = json.loads(body).get("ctxsw") if status == 200 else None
        metrics = parse_metrics(exporter.metrics())
        success = {l["collector"]: v for l, v in metrics["gpu_exporter_collector_success"]}.get("ctxsw")
        log = exporter.log()
    return {"rss_start_mb": round(before.peak / MB, 1), "peak_rss_mb": round(watch.peak / MB, 1),
            "scrape": scraper.figures(), "ctxsw_success": success,
            "ctxsw_state": [(s["state"], s["reason"][:200]) for s in states or []],
            "tracebacks": log.count("Traceback")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--code", type=Path, default=ROOT, help="the source tree to measure (default: this one)")
    parser.add_argument("--only", nargs="*", help="only these cases")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds before a cli run is killed")
    parser.add_argument("--live", action="store_true", help="also run the live source on " + ", ".join(LIVE))
    parser.add_argument("--live-seconds", type=float, default=30.0)
    args = parser.parse_args()
    code = args.code.resolve()
    results = {"code": str(code), "cases": {}}
    with tempfile.TemporaryDirectory() as work:
        for name, (builder, kwargs) in CASES.items():
            if args.only and name not in args.only:
                continue
            path = Path(work) / f"{name}.sqlite"
            builder(path, **kwargs)
            entry = results["cases"][name] = {"export_mb": round(path.stat().st_size / MB, 1),
                                              "cli": cli(code, path, args.timeout)}
            if args.live and name in LIVE:
                (Path(work) / name).mkdir()
                entry["live"] = live(code, path, args.live_seconds, Path(work) / name)
            print(name, json.dumps(entry), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
