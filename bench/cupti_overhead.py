"""Where tracing's cost to a launch-bound loop comes from (one process, one GPU).

    python3 bench/cupti_overhead.py OUT.json --mode count|tracer|kineto [--seconds 3]

The main thread runs x.add_(1) on 16 elements in a loop (tests/gpu/workloads.py `launch`); its rate is
measured over --seconds with nothing, then with (--mode, one per process): count, CUPTI's kernel activity on and a
buffer callback that only counts the records (the cost of CUPTI and of cupti-python handing records to Python); tracer, the tracer's own
window (gpu_trace.tracer.Tracer: five numbers kept per record; CUPTI detached after it, twice; tracer_attached:
the same without the detach); kineto, PyTorch's profiler (CUPTI in C++).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import argparse

    import torch

    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--mode", choices=("count", "tracer", "tracer_attached", "kineto"), required=True)
    args = p.parse_args(argv)
    x = torch.zeros(16, device="cuda")

    def rate(seconds):
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(100):
                x.add_(1.0)
            done += 100
            torch.cuda.synchronize()
        return done / (time.perf_counter() - start)

    rate(1.0)
    results = {"mode": args.mode, "nothing": rate(args.seconds)}
    if args.mode == "count":
        import cupti.cupti as cupti

        counted = [0]
        cupti.activity_register_callbacks(lambda: (4 << 20, 0),
                                          lambda acts: counted.__setitem__(0, counted[0] + len(acts)))
        cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
        results["traced"] = rate(args.seconds)
        cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
        cupti.activity_flush_all(1)
        results["records"] = counted[0]
    elif args.mode in ("tracer", "tracer_attached"):
        from gpu_trace.tracer import Tracer

        tracer, body = Tracer(detach=args.mode == "tracer"), {}
        for window in ("traced", "traced_again"):  # the second window: after a detach, CUPTI attaches again
            thread = threading.Thread(target=lambda: body.update(tracer.trace(args.seconds + 1.0)))
            thread.start()
            time.sleep(0.3)
            results[window] = rate(args.seconds)
            thread.join()
            results[f"{window}_records"] = body.get("records")
            results[f"after_{window}"] = rate(args.seconds)
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]):
            results["traced"] = rate(args.seconds)
    results["nothing_after"] = rate(args.seconds)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
