"""Memory and CPU of the ctxsw source's attribution, which runs in a child process (issue 37), and what the
exporter's own process keeps:

    python3 bench/attribution_memory.py EXPORT.sqlite [EXPORT.sqlite ...] [--runs 3]
        (e.g. tests/fixtures/h200_ctxsw_1khz.sqlite, bench/results/ctxsw/h200_ctxsw_1khz_full.sqlite.xz unpacked)

For each export, --runs times: the child exactly as the source starts it (`python -m exporter.samplers.ctxsw
EXPORT`), its peak resident memory (getrusage's ru_maxrss of the reaped child, and the VmHWM it reports
itself) and CPU (user + system); and this process, which has loaded what the exporter loads
(exporter.engine) and waits for the child as the exporter does: its VmRSS and VmHWM before and after.
Prints one JSON document. Never asserts.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def status_mib(field: str) -> float:
    return round(int(Path("/proc/self/status").read_text().split(f"{field}:")[1].split()[0]) / 1024, 1)


def one(path: str) -> dict:
    """One child, as the source runs it, reaped with wait4 for its own peak and CPU."""
    proc = subprocess.Popen([sys.executable, "-m", "exporter.samplers.ctxsw", path, "--window", "10"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    answer = json.loads(out.decode().strip().splitlines()[-1])
    return {"exit": proc.returncode, "child_peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "child_reported_vmhwm_mib": round((answer.get("peak_rss_bytes") or 0) / 2**20, 1),
            "child_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "gpus": len((answer.get("result") or {}).get("gpus", ())), "error": answer.get("error")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("exports", nargs="+")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    report: dict = {"start": {"VmRSS": status_mib("VmRSS")}}
    importlib.import_module("exporter.engine")  # what the exporter itself loads
    importlib.import_module("exporter.samplers.ctxsw")
    report["exporter imported"] = {"VmRSS": status_mib("VmRSS"), "VmHWM": status_mib("VmHWM")}
    report["runs"] = {path: [one(path) for _ in range(args.runs)] for path in args.exports}
    report["after the attributions"] = {"VmRSS": status_mib("VmRSS"), "VmHWM": status_mib("VmHWM")}
    report["pandas_in_this_process"] = "pandas" in sys.modules
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
