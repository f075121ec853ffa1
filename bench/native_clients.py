"""MPS clients this project's tracer was not built against, each with its own truth, for the native tracer's
accuracy and cost runs on the device (bench/native_tracer_device.py).

    python3 bench/native_clients.py deepqueue --seconds 40 --truth OUT.json
    python3 bench/native_clients.py d2d --seconds 30 --truth OUT.json
    python3 bench/native_clients.py resnet --seconds 60 --progress STEPS.txt [--profile-windows 5:15]

deepqueue: bf16 products of 2048^3 queued in bursts of 1,500, the host running up to three bursts ahead of
the GPU (it waits on the event that ends the burst three back), so that kernels launched before any window
run inside it. d2d: device-to-device copies of 512 MiB (`copy_`), 20 at a time, then a synchronize and
3 ms of host sleep. Truth for both: CUDA events around every burst or copy, put on the wall clock through
one anchor event recorded after a synchronize: the union of those intervals is the time the GPU ran the
client's work, whatever the tracer sees.
resnet: torchvision ResNet-50 training, bf16 autocast, batch 64, SGD; appends "wall steps" after every
step to --progress (the host's), and with --gpu-progress the wall time the GPU finished each step (events:
the host runs up to 50 steps ahead, so only the GPU's times give the rate inside a window).
--profile-windows W:P: PyTorch's profiler (CUPTI through kineto, C++) records W s every P s instead, and
the kernels' union inside each window is written to --truth (its kernel-busy).
"""
from __future__ import annotations

import argparse
import json
import time


def anchored():
    """(event, wall time) of one instant: the event recorded on an idle GPU, the wall time right after."""
    import torch

    torch.cuda.synchronize()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    torch.cuda.synchronize()
    return event, time.time()


def intervals_on_wall(anchor, pairs):
    event0, wall0 = anchor
    return [(wall0 + event0.elapsed_time(b) / 1e3, wall0 + event0.elapsed_time(e) / 1e3) for b, e in pairs]


def deepqueue(args) -> dict:
    import torch

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        a @ b
    anchor = anchored()
    pairs, deadline = [], time.time() + args.seconds
    while time.time() < deadline:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(1500):
            torch.mm(a, b)
        end.record()
        pairs.append((begin, end))
        if len(pairs) > 3:
            pairs[-4][1].synchronize()  # three bursts stay queued ahead of the GPU
    torch.cuda.synchronize()
    return {"kind": "deepqueue", "busy": intervals_on_wall(anchor, pairs)}


def d2d(args) -> dict:
    import torch

    src = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    anchor = anchored()
    pairs, deadline = [], time.time() + args.seconds
    while time.time() < deadline:
        for _ in range(20):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            dst.copy_(src)
            end.record()
            pairs.append((begin, end))
        torch.cuda.synchronize()
        time.sleep(0.003)
    return {"kind": "d2d", "busy": intervals_on_wall(anchor, pairs)}


def resnet(args) -> dict:
    import torch
    import torchvision

    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (64,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(10):
        step()
    anchor = anchored()
    done = []  # (steps, event recorded after that step's work): when the GPU finished it
    windows, profiled = [], None
    if args.profile_windows:
        window_s, period_s = (float(v) for v in args.profile_windows.split(":"))
        start0 = time.time() + 5.0
        windows = [(start0 + i * period_s, start0 + i * period_s + window_s) for i in range(int(args.seconds // period_s))]
    steps, deadline = 0, time.time() + args.seconds
    out = open(args.progress, "a") if args.progress else None
    truth = []
    while time.time() < deadline:
        now = time.time()
        if profiled is None and windows and windows[0][0] <= now:
            profiled = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            profiled.__enter__()
            window = windows.pop(0)
        step().item() if steps % 50 == 0 else step()
        steps += 1
        if args.gpu_progress:
            done.append((steps, torch.cuda.Event(enable_timing=True)))
            done[-1][1].record()
        if out:
            out.write(f"{time.time():.6f} {steps}\n")
        if profiled is not None and time.time() >= window[1]:
            torch.cuda.synchronize()
            profiled.__exit__(None, None, None)
            truth.append(kernel_busy(profiled, window))
            profiled = None
    torch.cuda.synchronize()
    if out:
        out.close()
    if args.gpu_progress:  # the host runs up to 50 steps ahead: the GPU's own finishing times are the rate
        event0, wall0 = anchor
        with open(args.gpu_progress, "w") as f:
            f.writelines(f"{wall0 + event0.elapsed_time(e) / 1e3:.6f} {n}\n" for n, e in done)
    return {"kind": "resnet", "steps": steps, "profiler_windows": truth}


def union(spans) -> float:
    """The length of the union of (start, end) spans."""
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            busy += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + (cur_e - cur_s if cur_e is not None else 0.0)


def kernel_busy(prof, window) -> dict:
    """The union of the profiler's kernel intervals over the window it ran (its own trace's clock)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    if not spans:
        return {"window": window, "kernel_busy": None}
    lo, hi = spans[0][0], max(e for _, e in spans)
    busy = union(spans)
    return {"window": window, "kernel_busy_s": busy / 1e6, "span_s": (hi - lo) / 1e6,
            "kernel_busy_share": round(busy / (window[1] - window[0]) / 1e6, 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("deepqueue", "d2d", "resnet"))
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--truth", default=None)
    p.add_argument("--progress", default=None)
    p.add_argument("--gpu-progress", default=None, help="resnet: 'wall steps' when the GPU finished each step")
    p.add_argument("--profile-windows", default=None)
    p.add_argument("--stacks-after", type=float, default=0, help="print every thread's stack and exit after S s")
    args = p.parse_args(argv)
    if args.stacks_after:
        import faulthandler

        faulthandler.dump_traceback_later(args.stacks_after, exit=True)
    result = {"deepqueue": deepqueue, "d2d": d2d, "resnet": resnet}[args.kind](args)
    if args.truth:
        with open(args.truth, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
