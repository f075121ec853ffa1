"""nsys_ingest summary on a large export against a bare SQLite scan of the same file.

    python3 bench/ingest_bench.py --rows 50000000 --work /tmp/ingest-bench

Builds the large export from a real one (tests/fixtures/h100_phases_100hz.sqlite: its GPU_METRICS
rows repeated with shifted timestamps until --rows), then measures, each in a fresh process:
rows per second and peak memory (ru_maxrss) of `summary`, and of
`SELECT typeId, metricId, avg(value) FROM GPU_METRICS GROUP BY typeId, metricId`.
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
SOURCE = ROOT / "tests" / "fixtures" / "h100_phases_100hz.sqlite"
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
else:
    con = sqlite3.connect(path)
    rows = con.execute("select max(rowid) from GPU_METRICS").fetchone()[0]
    con.execute("select typeId, metricId, avg(value) from GPU_METRICS group by typeId, metricId").fetchall()
seconds = time.perf_counter() - t
print(json.dumps({{"kind": kind, "rows": rows, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}}))
"""


def build(target: Path, rows: int) -> None:
    shutil.copyfile(SOURCE, target)
    con = sqlite3.connect(target)
    con.execute("pragma journal_mode=off")
    con.execute("pragma synchronous=off")
    base = con.execute("select count(*), max(timestamp) + 10000000 from GPU_METRICS").fetchone()
    have, span = base
    copy = 1
    while have < rows:
        take = min(have, rows - have)
        con.execute("insert into GPU_METRICS (rawTimestamp, timestamp, typeId, metricId, value) "
                    "select rawTimestamp + ?, timestamp + ?, typeId, metricId, value from GPU_METRICS "
                    "where rowid <= ?", (span * copy, span * copy, take))
        con.commit()
        copy *= 2
        have += take
    con.close()


def measure(kind: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT)), kind, str(path)],
                          capture_output=True, text=True, check=True, env={"NSYS_INGEST_NO_PROGRESS": "1"})
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ingest-bench"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / f"export_{args.rows}.sqlite"
    if not path.exists():
        started = time.perf_counter()
        build(path, args.rows)
        print(f"built {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s")
    bare = measure("bare_sql", path)  # first: both then read a warm page cache
    bare = measure("bare_sql", path)
    summary = measure("summary", path)
    result = {"rows": summary["rows"], "file_gb": round(path.stat().st_size / 1e9, 2), "summary": summary,
              "bare_sql": bare, "summary_time_over_bare": round(summary["seconds"] / bare["seconds"], 2)}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
