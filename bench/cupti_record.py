"""Record real CUPTI activity records through the tracer, for the CPU replay tests (on the device).

    python3 bench/cupti_record.py OUT.json [--seconds 2]

In one process: a window over spin kernels on 66 SMs (4 ms each, one block per SM: tests/gpu/workloads.py),
a window over a launch-bound loop (x.add_(1) on 16 elements) and a window over bf16 8192^3 products.
Each window goes through gpu_trace.tracer.Tracer with the real CUPTI boundary wrapped so that the first
records of every buffer are written to OUT.json (fields the tracer reads, the window's CUPTI timestamps,
the devices), with the tracer's summary and the work's own count (the truth for the spin window:
kernels x 4 ms x 66 / SM count over the window).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

FIELDS = ("kind", "device_id", "start", "end", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
          "registers_per_thread", "static_shared_memory", "dynamic_shared_memory")
KEEP = 400  # records kept per window for the fixture


class Recording:
    """The real CuptiApi, with the records and timestamps it hands the tracer written down."""

    def __init__(self, api):
        self.api, self.records, self.stamps = api, [], []
        self.kernel_kind, self.copy_kinds = api.kernel_kind, api.copy_kinds

    def register(self, requested, completed):
        def keep(activities):
            for a in activities[:max(0, KEEP - len(self.records))]:
                self.records.append({f: int(getattr(a, f)) for f in FIELDS if hasattr(a, f)})
            completed(activities)
        self.api.register(requested, keep)

    def timestamp(self):
        t = self.api.timestamp()
        self.stamps.append(t)
        return t

    def __getattr__(self, name):
        return getattr(self.api, name)


def main(argv=None) -> int:
    import argparse

    import workloads
    from gpu_trace.tracer import CuptiApi, Tracer

    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    api = Recording(CuptiApi())
    tracer = Tracer(api)
    devices = {o: [u, vars(lim)] for o, (u, lim) in api.devices().items()}
    windows = []

    def window(name, work):
        api.records, api.stamps = [], []
        done = {}
        stop = threading.Event()
        thread = threading.Thread(target=lambda: done.update(n=work(stop)))
        thread.start()
        time.sleep(0.5)  # the work runs before the window opens and after it closes
        summary = tracer.trace(args.seconds)
        stop.set()
        thread.join()
        windows.append({"name": name, "stamps": api.stamps[:2], "records": api.records, "summary": summary,
                        "work": done})
        print(json.dumps({"name": name, **{k: v for k, v in summary.items()}}), flush=True)

    def spin(stop):
        import cupy

        sms, ms = 66, 4.0
        kernel = cupy.RawKernel(workloads.SPIN_SOURCE, "spin")
        smem = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
        kernel.max_dynamic_shared_size_bytes = smem
        n = 0
        while not stop.is_set():
            kernel((sms,), (256,), (cupy.uint64(int(ms * 1e6)),), shared_mem=smem)
            n += 1
            if n % 4 == 0:
                cupy.cuda.Device().synchronize()
        cupy.cuda.Device().synchronize()
        return n

    def launch(stop):
        import torch

        x = torch.zeros(16, device="cuda")
        n = 0
        while not stop.is_set():
            for _ in range(100):
                x.add_(1.0)
            n += 100
            torch.cuda.synchronize()
        return n

    def matmul(stop):
        import torch

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        n = 0
        while not stop.is_set():
            a @ b
            n += 1
            torch.cuda.synchronize()
        return n

    window("spin66", spin)
    window("launch", launch)
    window("matmul", matmul)
    Path(args.out).write_text(json.dumps({"devices": devices, "windows": windows}, indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
