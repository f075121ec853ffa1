"""CPU of one live-source window, by part, for a few window lengths and GPU-metrics frequencies, on the device
(root) while a matmul loop and a launch loop share GPU 0:

    NSYS_EXTRA_LIB=DIR timeout 400 python3 bench/ctxsw_window_cost.py OUT.json [--configs 10:1000,10:500,...]

Per config (window seconds:frequency Hz), one capture as the ctxsw source runs it (bench/nsys_export_cost.py's
two steps): `nsys profile` + `nsys export` (children's getrusage), nsys' agent outside our tree (its
/proc CPU, polled every 0.2 s), and the attribution (nsys_ingest.ctxsw.attribute, this process's CPU). The
exporter's cost at a duty is then its CPU without captures plus this sum divided by the period; the 10-minute
default-duty run in bench/ctxsw_live_cost.py checks that sum against a whole run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ctxsw_live_cost import JOBS, Meter, environment, find_nsys, stop, workers
from bench.nsys_export_cost import children_cpu
from exporter.samplers.ctxsw import profile_command


def one(nsys: str, window: float, hz: int, env: dict) -> dict:
    from nsys_ingest.ctxsw import attribute
    from nsys_ingest.reader import Export

    work = Path(tempfile.mkdtemp(prefix="ctxsw-window-cost-"))
    meter, halt = Meter(os.getpid(), nsys), threading.Event()  # our nsys children are in getrusage, not here

    def poll():
        while not halt.wait(0.2):
            meter.sample_stray()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    cpu0 = children_cpu()
    subprocess.run(profile_command(nsys, "0", hz, work / "r", window), env=env, capture_output=True, timeout=window + 120,
                   check=False)
    subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(work / "r.sqlite"), "-f", "true", str(work / "r.nsys-rep")],
                   env=env, capture_output=True, timeout=120, check=False)
    cli = children_cpu() - cpu0
    time.sleep(1.0)  # the agent's last poll
    halt.set()
    poller.join()
    own0 = time.process_time()
    with Export(work / "r.sqlite", require_metrics=False) as export:
        result = attribute(export).to_json()
    attribution = time.process_time() - own0
    shutil.rmtree(work, ignore_errors=True)
    agent = meter.stray_cpu()
    return {"window_s": window, "hz": hz, "cli_and_export_cpu_s": round(cli, 3), "agent_cpu_s": round(agent, 3),
            "attribution_cpu_s": round(attribution, 3), "total_cpu_s": round(cli + agent + attribution, 3),
            "agents": meter.stray_by_command(),
            "shares": {p["pid"]: (p["time_share"], p["of_gpu"].get("sm_active")) for g in result["gpus"]
                       for p in g["processes"]}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--configs", default="10:1000,10:500,10:250,5:1000")
    p.add_argument("--nsys")
    args = p.parse_args(argv)
    nsys, env = find_nsys(args.nsys), environment()
    configs = [(float(c.split(":")[0]), int(c.split(":")[1])) for c in args.configs.split(",")]
    jobs = workers(sum(w + 15 for w, _ in configs) + 60, env, list(JOBS), [None] * len(JOBS), Path(tempfile.mkdtemp()))
    time.sleep(10)
    runs = []
    try:
        for window, hz in configs:
            runs.append(one(nsys, window, hz, env))
            print(json.dumps({k: v for k, v in runs[-1].items() if k not in ("agents",)}), flush=True)
    finally:
        for job in jobs:
            stop(job)
    args.out.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
