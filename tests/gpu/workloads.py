"""GPU workloads with known spatial footprints, for the GPU tests, fixtures and benchmarks.

    python3 tests/gpu/workloads.py --phases idle:1,33:3,132:3,matmul:3   # prints each phase's wall window as JSON

A phase "N:S" spins back-to-back kernels on exactly N SMs for S seconds: every block asks for most of
an SM's shared memory, so no two blocks share an SM and N blocks occupy N SMs. NVML reads such a load
as ~100% utilized whatever N is; SM activity reads N / SM count. "matmul:S" runs bf16 matrix products
on every SM (tensor cores busy), "idle:S" sleeps. Memory- and host-bound phases for the verdicts:
"triad:S" (a = b + 2c over 1.5 GiB fp32 tensors: kernels bound by DRAM bandwidth), "copy:S"
(device-to-device copies of 3 GiB fp16 tensors back and forth: copies, no kernels), "launch:S" (one
process adding to a 16-element tensor in a loop: tiny kernels with the host in between), "oneblock:S"
(one block spinning 50 ms kernels on one SM). Needs CuPy (spin) and PyTorch (the others).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    extern __shared__ char hold_the_sm[];
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    if (threadIdx.x == 0 && now == 0) hold_the_sm[0] = 1;  // keep the allocation
}
"""
KERNEL_MS = 20  # short kernels launched back to back, like a real small job


def sm_count() -> int:
    import cupy

    return cupy.cuda.Device().attributes["MultiProcessorCount"]


def spin(sms: int, seconds: float, threads: int = 256, kernel_ms: float = KERNEL_MS, on_step=None,
         done: int = 0) -> int:
    """Spin on `sms` SMs for `seconds`; returns the number of kernels launched. `on_step(done + kernels
    finished)` after each synchronize."""
    import cupy

    kernel = cupy.RawKernel(SPIN_SOURCE, "spin")
    attrs = cupy.cuda.Device().attributes
    smem = attrs["MaxSharedMemoryPerBlockOptin"]  # > half an SM's shared memory: one block per SM
    kernel.max_dynamic_shared_size_bytes = smem
    launched = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        kernel((sms,), (threads,), (cupy.uint64(int(kernel_ms * 1_000_000)),), shared_mem=smem)
        launched += 1
        if launched % 4 == 0:
            cupy.cuda.Device().synchronize()
            if on_step is not None:
                on_step(done + launched)
    cupy.cuda.Device().synchronize()
    if on_step is not None:
        on_step(done + launched)
    return launched


def matmul(seconds: float, size: int = 8192, on_step=None) -> int:
    """`on_step(done)` after each synchronize: the slowdown runs log progress over time."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    done = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        for _ in range(4):
            a @ b
        torch.cuda.synchronize()
        done += 4
        if on_step is not None:
            on_step(done)
    return done


def triad(seconds: float, elements: int = 384 * 1024 * 1024) -> int:
    import torch

    b = torch.rand(elements, device="cuda")
    c = torch.rand(elements, device="cuda")
    a = torch.empty_like(b)
    done = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        torch.add(b, c, alpha=2.0, out=a)
        done += 1
        if done % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return done


def copy(seconds: float, elements: int = 1536 * 1024 * 1024) -> int:
    import torch

    a = torch.ones(elements, device="cuda", dtype=torch.float16)
    b = torch.empty_like(a)
    done = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        b.copy_(a)
        a.copy_(b)
        done += 2
        torch.cuda.synchronize()
    return done


def launch(seconds: float, on_step=None) -> int:
    import torch

    x = torch.zeros(16, device="cuda")
    done = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        for _ in range(100):
            x.add_(1.0)
        done += 100
        torch.cuda.synchronize()
        if on_step is not None:
            on_step(done)
    return done


PHASES = {"matmul": matmul, "triad": triad, "copy": copy, "launch": launch}


def warm_up(spec: str) -> None:
    """Compile the kernel and initialise cuBLAS before the timeline starts: phases start on time."""
    kinds = {part.split(":")[0] for part in spec.split(",")}
    if kinds - {"idle", *PHASES}:
        spin(1, 0.05)
    for kind in kinds & set(PHASES):
        PHASES[kind](0.3)


def run_phases(spec: str) -> list[dict]:
    warm_up(spec)
    phases = []
    for part in spec.split(","):
        kind, seconds = part.split(":")
        start = time.time()
        if kind == "idle":
            time.sleep(float(seconds))
            work = 0
        elif kind in PHASES:
            work = PHASES[kind](float(seconds))
        elif kind == "oneblock":
            work = spin(1, float(seconds), kernel_ms=50)
        else:
            work = spin(int(kind), float(seconds))
        phases.append({"phase": kind, "start": start, "end": time.time(), "work": work})
    return phases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", required=True, help="comma-separated KIND:SECONDS (idle, matmul, triad, copy, "
                                                         "launch, oneblock, or a number of SMs)")
    args = parser.parse_args(argv)
    json.dump({"sm_count": sm_count(), "phases": run_phases(args.phases)}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
