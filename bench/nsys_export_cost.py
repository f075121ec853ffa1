"""CPU of one live-source window's nsys steps: `nsys profile` then `nsys export` (what the ctxsw source runs)
against `nsys profile --export=sqlite` (one process writes both), on the device (root, nsys found as
bench/ctxsw_live_cost.py finds it):

    NSYS_EXTRA_LIB=DIR timeout 300 python3 bench/nsys_export_cost.py OUT.json [--reps 2] [--window 10] [--nsys PATH]

CPU is the children's user + system time (getrusage), so nsys' daemon outside our tree is not in it; the
export's tables are listed to check that both ways give what the attribution reads.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ctxsw_live_cost import environment, find_nsys
from exporter.samplers.ctxsw import profile_command


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one(nsys: str, mode: str, window: float, env: dict) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nsys-export-cost-"))
    cmd = profile_command(nsys, "all", 1000, work / "r", window)
    if mode == "one-step":
        cmd.insert(2, "--export=sqlite")
    cpu0, t0 = children_cpu(), time.monotonic()
    steps = [subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=window + 120, check=False)]
    if mode == "two-step":
        steps.append(subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(work / "r.sqlite"), "-f", "true",
                                     str(work / "r.nsys-rep")], env=env, capture_output=True, text=True, timeout=120,
                                    check=False))
    result = {"mode": mode, "cpu_s": round(children_cpu() - cpu0, 3), "wall_s": round(time.monotonic() - t0, 2),
              "exits": [s.returncode for s in steps]}
    export = work / "r.sqlite"
    if export.is_file():
        with sqlite3.connect(export) as con:
            result["tables"] = sorted(r[0] for r in con.execute("select name from sqlite_master where type='table'"))
        result["sqlite_bytes"] = export.stat().st_size
    else:
        result["error"] = "; ".join((s.stdout + s.stderr).strip()[-200:] for s in steps)
    shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--nsys")
    args = p.parse_args(argv)
    nsys, env = find_nsys(args.nsys), environment()
    runs = [one(nsys, mode, args.window, env) for _ in range(args.reps) for mode in ("two-step", "one-step")]
    args.out.write_text(json.dumps(runs, indent=1) + "\n")
    print(json.dumps([{k: r.get(k) for k in ("mode", "cpu_s", "wall_s", "exits", "sqlite_bytes", "error")} for r in runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
