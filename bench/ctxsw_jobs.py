"""One job with a known GPU footprint, for the per-workload accuracy runs under time-slicing.

    python3 bench/ctxsw_jobs.py spin --sms 66 --kernel-ms 4 --seconds 60
    python3 bench/ctxsw_jobs.py spin --sms 8 --kernel-ms 2 --on-ms 100 --off-ms 150 --seconds 60
    python3 bench/ctxsw_jobs.py matmul --size 8192 --seconds 60
    python3 bench/ctxsw_jobs.py launch --seconds 60
    python3 bench/ctxsw_jobs.py hold --seconds 60

spin: back-to-back kernels on exactly --sms SMs (tests/gpu/workloads.py), in bursts of --on-ms with
--off-ms of sleep between (0: no pause). matmul: bf16 products of two --size square matrices back
to back (every SM, tensor cores). launch: a launch-bound loop (tiny kernels, the host in between).
hold: a CUDA context that launches nothing. On exit prints one JSON line: the work done and its rate,
which the slowdown runs compare with and without a capture. --progress FILE: the job also
appends "wall-time done" lines to FILE every 0.2 s (spin: kernels finished at every synchronize), so that one
long run can be cut into seconds with and without a capture (bench/ctxsw_live_cost.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "gpu"))  # workloads.py


def run(args) -> int:
    import workloads

    deadline = time.time() + args.seconds
    if args.kind == "hold":
        import torch

        torch.zeros(1, device="cuda")  # a context, nothing launched
        time.sleep(args.seconds)
        return 0
    step = progress_writer(args.progress, 0.0 if args.kind == "spin" else 0.2)  # spin: exact window edges
    if args.kind == "spin":
        workloads.spin(args.sms, 0.05, kernel_ms=args.kernel_ms)  # compile before the clock starts
        done = 0
        while time.time() < deadline:
            burst = args.on_ms / 1e3 if args.off_ms else deadline - time.time()
            done += workloads.spin(args.sms, min(burst, deadline - time.time()), kernel_ms=args.kernel_ms,
                                   on_step=step, done=done)
            if args.off_ms:
                time.sleep(args.off_ms / 1e3)
        return done
    if args.kind == "matmul":
        workloads.matmul(0.3, args.size)  # cuBLAS initialised before the clock starts
        return workloads.matmul(args.seconds, args.size, on_step=step)
    return workloads.launch(args.seconds, on_step=step)


def progress_writer(path: str | None, every_s: float = 0.2):
    """None, or a callback writing "time done" to `path` at most every `every_s` (0: at every call)."""
    if not path:
        return None
    out = open(path, "a", buffering=1)
    last = [0.0]

    def step(done: int) -> None:
        now = time.time()
        if now - last[0] >= every_s:
            out.write(f"{now:.4f} {done}\n")
            last[0] = now
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("spin", "matmul", "launch", "hold"))
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--sms", type=int, default=8)
    p.add_argument("--kernel-ms", type=float, default=2.0)
    p.add_argument("--on-ms", type=float, default=0.0)
    p.add_argument("--off-ms", type=float, default=0.0)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--progress", default=None, help="append 'time done' lines here every 0.2 s (spin: kernels "
                   "finished, at every synchronize)")
    args = p.parse_args(argv)
    started = time.time()
    done = run(args)
    took = time.time() - started
    print(json.dumps({"kind": args.kind, "pid": os.getpid(), "done": done, "seconds": round(took, 3),
                      "rate": round(done / took, 3) if took else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
