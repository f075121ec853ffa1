"""The MPS experiment on one GPU, with the whole exporter running, checked against nsys.

On the device (see bench/RESULTS.md for the exact command):
    bash tools/nsys-capture.sh OUT/mps_run.sqlite 50 -- python3 bench/mps_experiment.py run --out OUT
    python3 bench/mps_experiment.py report --out OUT --nsys OUT/mps_run.sqlite

`run`: N small training processes time-sliced, a pause, the same N under MPS (own pipe and log
directories, quit afterwards), a compute-saturated phase (bf16 matrix products), with the exporter
sampling at 0.5 s; then the exporter's cost: one worker's throughput with the exporter sampling at
0.1 s against without it, alternating segments over 8 time-sliced workers. `report`: per phase the exporter's time utilization, SM
active, occupancy, tensor active, hidden idle and MPS server metrics, the workers' throughput, and
nsys' values for the same wall-clock window; exits 1 if SM active differs from nsys' by > 0.05.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.helpers import free_port, http_get, wait_for

TOLERANCE = 0.05
EDGE_S = (2.0, 1.0)  # left out at a phase's start and end: ramps, not the phase's steady state


class Poller(threading.Thread):
    """Keeps every snapshot the exporter serves, as JSON lines."""

    def __init__(self, url: str, path: Path, every: float):
        super().__init__(daemon=True)
        self.url, self.path, self.every = url, path, every
        self.stop = threading.Event()

    def run(self):
        with open(self.path, "a") as out:
            while not self.stop.is_set():
                status, body = http_get(self.url, timeout=2)
                if status == 200:
                    out.write(json.dumps({"t": time.time(), **json.loads(body)}) + "\n")
                self.stop.wait(self.every)


def start_exporter(interval: float, pipe_dir: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--port", str(port), "--interval", str(interval),
                             "--spatial-sources", "gpm", "--mps-pipe-dir", pipe_dir], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz", 1)[0] == 200, 30, what="exporter")
    return proc, port


def run_workers(n: int, seconds: float, env: dict, warmup: float) -> tuple[float, float, list[dict]]:
    start_at = time.time() + warmup
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu" / "train_worker.py"), "--start-at", str(start_at),
                               "--seconds", str(seconds)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=warmup + seconds + 120)
        results.append(json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 else {"steps": 0, "error": proc.returncode})
    return start_at, start_at + seconds, results


def mps_control(env: dict, command: str) -> str:
    return subprocess.run(["nvidia-cuda-mps-control"], input=command + "\n", env=env, capture_output=True,
                          text=True, timeout=30).stdout


def cmd_run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = tempfile.mkdtemp(prefix="mps-exp-")
    mps_env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{base}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{base}/log"}
    os.makedirs(mps_env["CUDA_MPS_PIPE_DIRECTORY"]), os.makedirs(mps_env["CUDA_MPS_LOG_DIRECTORY"])
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    phases = []
    exporter, port = start_exporter(0.5, mps_env["CUDA_MPS_PIPE_DIRECTORY"])
    poller = Poller(f"http://127.0.0.1:{port}/api/v1/gpus", out / "readings.jsonl", 0.5)
    poller.start()
    try:
        start, end, workers = run_workers(args.workers, args.seconds, plain_env, args.warmup)
        phases.append({"phase": "time-sliced", "start": start, "end": end, "workers": workers})
        time.sleep(3)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps_env, check=True)
        try:
            start, end, workers = run_workers(args.workers, args.seconds, mps_env, args.warmup)
            phases.append({"phase": "mps", "start": start, "end": end, "workers": workers})
        finally:
            mps_control(mps_env, "quit")
        time.sleep(3)
        sys.path.insert(0, str(ROOT / "tests" / "gpu"))
        from workloads import matmul

        matmul(1.0)
        start = time.time()
        products = matmul(args.seconds / 2)
        phases.append({"phase": "saturated", "start": start, "end": time.time(),
                       "workers": [{"steps": products}]})
    finally:
        poller.stop.set()
        poller.join()
        exporter.terminate()
        exporter.wait(10)
    (out / "phases.json").write_text(json.dumps(phases, indent=1))
    (out / "overhead.json").write_text(json.dumps(measure_overhead(args.overhead_segments, args.segment_seconds,
                                                                   mps_env["CUDA_MPS_PIPE_DIRECTORY"]), indent=1))
    print(f"phases and overhead written to {out}")
    return 0


def measure_overhead(segments: int, seconds: float, pipe_dir: str, workers: int = 8) -> dict:
    """`workers` train throughout (time-sliced); the exporter (0.1 s interval) runs in every other
    segment. Their summed steps per second are compared: one worker alone is too noisy (~13%)."""
    total = segments * seconds
    start_at = time.time() + 20
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu" / "train_worker.py"), "--start-at", str(start_at),
                               "--seconds", str(total)], stdout=subprocess.PIPE, text=True) for _ in range(workers)]
    plan = []
    exporter = None
    while time.time() < start_at:
        time.sleep(0.01)
    for i in range(segments):
        on = i % 2 == 0
        if on:
            exporter = subprocess.Popen([sys.executable, "-m", "exporter", "--port", str(free_port()), "--interval",
                                         "0.1", "--mps-pipe-dir", pipe_dir], cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        plan.append(on)
        time.sleep(max(0.0, start_at + (i + 1) * seconds - time.time()))
        if on:
            exporter.terminate()
            exporter.wait(10)
    per_second = [0] * int(total)
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        for i, steps in enumerate(json.loads(out.strip().splitlines()[-1])["per_second"]):
            per_second[i] += steps
    rates = {True: [], False: []}
    for i, on in enumerate(plan):
        seg = per_second[int(i * seconds) + 2: int((i + 1) * seconds)]  # skip the exporter's start-up seconds
        rates[on].extend(seg)
    with_exporter, without = statistics.mean(rates[True]), statistics.mean(rates[False])
    spread = statistics.stdev(rates[False])
    return {"workers": workers, "segments": segments, "segment_seconds": seconds,
            "steps_per_s_with_exporter_0.1s": round(with_exporter, 1), "steps_per_s_without": round(without, 1),
            "slowdown_percent": round(100 * (1 - with_exporter / without), 3),
            "per_second_stdev": round(spread, 2),
            # two standard errors of the difference of the two means: slowdowns inside it are noise
            "resolution_percent": round(100 * 2 * spread * (2 / len(rates[False])) ** 0.5 / without, 2)}


def cmd_report(args) -> int:
    from nsys_ingest.analysis import summarise
    from nsys_ingest.reader import Export

    out = Path(args.out)
    phases = json.loads((out / "phases.json").read_text())
    readings = [json.loads(line) for line in (out / "readings.jsonl").read_text().splitlines() if line.strip()]
    rows, failed = [], False
    with Export(args.nsys) as export:
        for phase in phases:
            lo, hi = phase["start"] + EDGE_S[0], phase["end"] - EDGE_S[1]
            snaps = [r for r in readings if r["gpus"] and r["gpus"][0]["spatial"]
                     and lo <= r["gpus"][0]["spatial"]["window_end"] <= hi]
            gpus = [r["gpus"][0] for r in snaps]
            mean = lambda values: round(statistics.mean(values), 4) if values else None
            exporter = {
                "time_utilization": mean([g["time_utilization"] for g in gpus if g["time_utilization"] is not None]),
                "sm_active": mean([g["spatial"]["sm_active"] for g in gpus]),
                "sm_occupancy": mean([g["spatial"]["sm_occupancy"] for g in gpus if g["spatial"]["sm_occupancy"] is not None]),
                "tensor_active": mean([g["spatial"]["tensor_active"] for g in gpus if g["spatial"]["tensor_active"] is not None]),
                "hidden_idle": mean([g["hidden_idle_sm_ratio"] for g in gpus if g["hidden_idle_sm_ratio"] is not None]),
                "snapshots": len(gpus),
            }
            servers = [[d for d in r["mps"]["daemons"] if d["role"] == "server"] for r in snaps if r.get("mps")]
            servers = [s[0] for s in servers if s]
            mps = None
            if servers:
                mps = {"server_major_faults_delta": servers[-1]["major_faults"] - servers[0]["major_faults"],
                       "server_rss_bytes_max": max(s["resident_bytes"] or 0 for s in servers),
                       "clients_max": max(sum(r["mps"]["clients"].values()) for r in snaps if r.get("mps"))}
            summary = summarise(export, export.to_ns(lo), export.to_ns(hi))["gpus"][0]
            nsys = {"gr_active": summary["time"]["gr_active"]["mean"],
                    "sm_active": summary["spatial"]["sm_active"]["mean"],
                    "sm_occupancy": summary["spatial"]["sm_occupancy"]["mean"],
                    "tensor_active": summary["spatial"]["tensor_active"]["mean"]}
            steps = sum(w.get("steps", 0) for w in phase["workers"])
            diff = abs(exporter["sm_active"] - nsys["sm_active"]) if exporter["sm_active"] is not None else None
            ok = diff is not None and diff <= TOLERANCE
            failed |= not ok
            rows.append({"phase": phase["phase"], "window_s": round(hi - lo, 1), "exporter": exporter, "mps": mps,
                         "nsys": nsys, "sm_active_difference": round(diff, 4) if diff is not None else None,
                         "within_tolerance": ok, "throughput_per_s": round(steps / (phase["end"] - phase["start"]), 1),
                         "workers": len(phase["workers"])})
    overhead = json.loads((out / "overhead.json").read_text()) if (out / "overhead.json").exists() else None
    report = {"phases": rows, "overhead": overhead, "tolerance": TOLERANCE}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    plot(rows, out / "mps_experiment.png")
    print(json.dumps(report, indent=1))
    return 1 if failed else 0


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["phase"] for r in rows]
    series = [("time (NVML)", [r["exporter"]["time_utilization"] or 0 for r in rows], "black"),
              ("SM active (exporter, GPM)", [r["exporter"]["sm_active"] or 0 for r in rows], "tab:blue"),
              ("SM active (nsys)", [r["nsys"]["sm_active"] or 0 for r in rows], "tab:cyan"),
              ("SM occupancy", [r["exporter"]["sm_occupancy"] or 0 for r in rows], "tab:green"),
              ("tensor active", [r["exporter"]["tensor_active"] or 0 for r in rows], "tab:orange")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.16
    for i, (label, values, color) in enumerate(series):
        ax.bar([x + (i - 2) * width for x in range(len(rows))], values, width, label=label, color=color)
    ax.set_xticks(range(len(rows)), [f"{n}\n{r['throughput_per_s']:.0f} steps/s" for n, r in zip(names, rows)])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("ratio")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("Time vs spatial utilization per phase (H100)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--out", required=True)
    run.add_argument("--workers", type=int, default=24)
    run.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    run.add_argument("--warmup", type=float, default=25.0, help="seconds the workers get to start CUDA")
    run.add_argument("--overhead-segments", type=int, default=6)
    run.add_argument("--segment-seconds", type=float, default=8.0)
    over = sub.add_parser("overhead", help="only the exporter-cost measurement")
    over.add_argument("--out", required=True)
    over.add_argument("--segments", type=int, default=10)
    over.add_argument("--segment-seconds", type=float, default=8.0)
    over.add_argument("--workers", type=int, default=8)
    rep = sub.add_parser("report")
    rep.add_argument("--out", required=True)
    rep.add_argument("--nsys", required=True)
    args = parser.parse_args()
    if args.command == "overhead":
        Path(args.out).mkdir(parents=True, exist_ok=True)
        result = measure_overhead(args.segments, args.segment_seconds, tempfile.mkdtemp(), args.workers)
        (Path(args.out) / "overhead.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
        return 0
    return cmd_run(args) if args.command == "run" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
