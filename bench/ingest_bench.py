"""nsys_ingest summary (or diagnose) on a large export against a bare SQLite scan of the same file.

    python3 bench/ingest_bench.py --rows 50000000 --work /tmp/ingest-bench
    python3 bench/ingest_bench.py --kernels --rows 10000000 --work /tmp/ingest-bench

Builds the large export from a real one (tests/fixtures/h100_phases_100hz.sqlite: its GPU_METRICS
rows repeated with shifted timestamps until --rows), then measures, each in a fresh process:
rows per second and peak memory (ru_maxrss) of `summary`, and of
`SELECT typeId, metricId, avg(value) FROM GPU_METRICS GROUP BY typeId, metricId`.
With --kernels: the kernel trace of tests/fixtures/h100_diag_time_sliced.sqlite (6 processes) and
its GPU metrics repeated until --rows kernels; `diagnose` against Python's sqlite3 reading the
columns diagnose reads from every kernel row (the least any Python reader does), and against
SQLite alone summing kernel durations (no row reaches Python); and diagnose again on a copy whose
kernel rows are in random order (the fallback that sorts in SQLite).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.synthetic_exports import grown

CHILD = """
import json, resource, sqlite3, sys, time
sys.path.insert(0, {root!r})
kind, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if kind == "summary":
    from nsys_ingest.analysis import summarise
    from nsys_ingest.reader import Export
    with Export(path) as export:
        rows = export.row_estimate
        summarise(export)
elif kind == "diagnose":
    from nsys_ingest.diagnose import diagnose
    from nsys_ingest.kernels import kernel_row_estimate
    from nsys_ingest.reader import Export
    with Export(path, require_metrics=False) as export:
        rows = kernel_row_estimate(export)
        verdicts = [g["verdict"]["verdict"] for g in diagnose(export)["gpus"]]
elif kind == "bare_kernels":
    con = sqlite3.connect(path)
    rows = con.execute("select max(rowid) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    cursor = con.execute("select start, end, deviceId, globalPid, gridX * gridY * gridZ from CUPTI_ACTIVITY_KIND_KERNEL")
    while cursor.fetchmany(200000):
        pass
elif kind == "sqlite_kernels":
    con = sqlite3.connect(path)
    rows = con.execute("select max(rowid) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.execute("select count(*), sum(end - start) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
else:
    con = sqlite3.connect(path)
    rows = con.execute("select max(rowid) from GPU_METRICS").fetchone()[0]
    con.execute("select typeId, metricId, avg(value) from GPU_METRICS group by typeId, metricId").fetchall()
seconds = time.perf_counter() - t
print(json.dumps({{"kind": kind, "rows": rows, **({{"verdicts": verdicts}} if kind == "diagnose" else {{}}),
                  "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}}))
"""


def measure(kind: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT)), kind, str(path)],
                          capture_output=True, text=True, check=True, env={"NSYS_INGEST_NO_PROGRESS": "1"})
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ingest-bench"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--kernels", action="store_true", help="diagnose on a kernel trace instead of summary")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / f"{'kernels' if args.kernels else 'export'}_{args.rows}.sqlite"
    if not path.exists():
        started = time.perf_counter()
        grown(path, args.rows, args.kernels)
        print(f"built {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s")
    if args.kernels:
        shuffled = path.with_name(path.stem + "_random_order.sqlite")
        if not shuffled.exists():  # the fallback path: a kernel table not in time order
            shutil.copyfile(path, shuffled)
            con = sqlite3.connect(shuffled)
            con.executescript("create table k as select * from CUPTI_ACTIVITY_KIND_KERNEL order by random(); "
                              "delete from CUPTI_ACTIVITY_KIND_KERNEL; "
                              "insert into CUPTI_ACTIVITY_KIND_KERNEL select * from k; drop table k;")
            con.close()
        return report(args, path, "diagnose", ("bare_kernels", "sqlite_kernels"), {"diagnose_random_order": shuffled})
    return report(args, path, "summary", ("bare_sql",))


def report(args, path: Path, tool: str, baselines, variants=None) -> int:
    measure(baselines[0], path)  # first: everything after reads a warm page cache
    bare = {kind: measure(kind, path) for kind in baselines}
    ran = measure(tool, path)
    more = {name: measure(tool, other) for name, other in (variants or {}).items()}
    result = {"rows": ran["rows"], "file_gb": round(path.stat().st_size / 1e9, 2), tool: ran, **bare, **more,
              f"{tool}_time_over_{baselines[0]}": round(ran["seconds"] / bare[baselines[0]]["seconds"], 2)}
    return write_result(result, args.out)


def write_result(result: dict, out: Path | None) -> int:
    """Prints a benchmark's result, and writes it to `out` (bench/results/...) when given."""
    print(json.dumps(result, indent=1))
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
