"""How NVML's per-process utilization should be read: raw samples next to known duty cycles.

    python3 bench/process_util_probe.py --scenario ts3 --seconds 8 --out probe.json

Starts workers with known GPU duty cycles (tests/gpu/workloads.py kernels), and while they run reads
nvmlDeviceGetProcessUtilization two ways in one process: (A) every 0.1 s with lastSeenTimeStamp 0,
(B) every 1 s with the newest timestamp B has seen; plus the GPU's own utilization samples. Writes
every raw sample (pid, timestamp_us, sm, mem) of both, the workers' pids and windows, to --out.
Scenarios: "duty" (one process, 50% duty), "ts3" (three time-sliced processes with different kernel
sizes plus one that holds a context and launches nothing). Run it under nsys --trace=cuda for the
processes' kernel busy time (tools/record_verdicts.sh records it so).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GPU_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "gpu")  # workloads.py
WORKERS = {
    # name: (kind, args) run by `--worker`
    "duty": [("duty50", "spin 4 10 10")],
    "ts3": [("spin8", "spin 8 2 0"), ("matmul_half", "matmul 4096 30 30"), ("launch", "launch 0 1 1"),
            ("holder", "hold 0 0 0")],
}


def worker(kind: str, size: int, on_ms: float, off_ms: float, seconds: float) -> None:
    """Runs `kind` for on_ms, sleeps off_ms, repeatedly, for `seconds`."""
    sys.path.insert(0, GPU_TESTS)
    import torch

    import workloads

    torch.zeros(1, device="cuda")  # a context
    deadline = time.time() + seconds
    if kind == "hold":
        time.sleep(seconds)
        return
    if kind == "matmul":
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    x = torch.zeros(16, device="cuda")
    while time.time() < deadline:
        until = time.time() + on_ms / 1e3
        while time.time() < until:
            if kind == "spin":
                workloads.spin(size, 0.0005, kernel_ms=1)
            elif kind == "matmul":
                a @ a
                torch.cuda.synchronize()
            else:
                for _ in range(10):
                    x.add_(1.0)
                torch.cuda.synchronize()
        if off_ms:
            time.sleep(off_ms / 1e3)


def probe(seconds: float):
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    a, b, gpu = [], [], []
    last_b = 0
    next_b = time.time() + 1.0
    deadline = time.time() + seconds
    start_us = int(time.time() * 1e6)
    while time.time() < deadline:
        try:
            for s in nv.nvmlDeviceGetProcessUtilization(h, 0):
                a.append([int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil), round(time.time(), 4)])
        except nv.NVMLError as exc:
            a.append(["error", str(exc), round(time.time(), 4)])
        if time.time() >= next_b:
            next_b += 1.0
            try:
                got = nv.nvmlDeviceGetProcessUtilization(h, last_b)
                for s in got:
                    b.append([int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil), round(time.time(), 4)])
                if got:
                    last_b = max(int(s.timeStamp) for s in got)
            except nv.NVMLError as exc:
                b.append(["error", str(exc), round(time.time(), 4)])
        time.sleep(0.1)
    _kind, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, start_us)
    gpu = [[int(s.timeStamp), int(s.sampleValue.uiVal)] for s in samples]
    procs = [{"pid": int(p.pid)} for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
    return {"A_every_0.1s_ts0": a, "B_every_1s_lastseen": b, "gpu_samples": gpu, "compute_processes": procs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=sorted(WORKERS), default="ts3")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out", required=True)
    p.add_argument("--worker", nargs=4, metavar=("KIND", "SIZE", "ON_MS", "OFF_MS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        kind, size, on_ms, off_ms = args.worker
        worker(kind, int(size), float(on_ms), float(off_ms), args.seconds)
        return 0
    children = []
    for name, spec in WORKERS[args.scenario]:
        cmd = [sys.executable, __file__, "--out", "-", "--seconds", str(args.seconds + 6), "--worker", *spec.split()]
        children.append((name, subprocess.Popen(cmd)))
    time.sleep(5)  # contexts up, warm
    t0 = time.time()
    result = probe(args.seconds)
    result.update(scenario=args.scenario, window=[t0, time.time()],
                  workers={name: {"pid": proc.pid, "spec": spec}
                           for (name, proc), (_n, spec) in zip(children, WORKERS[args.scenario])})
    for _name, proc in children:
        proc.wait(timeout=30)
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(f"{args.out}: {len(result['A_every_0.1s_ts0'])} A samples, {len(result['B_every_1s_lastseen'])} B samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
