"""Two real PyTorch jobs for the MPS side-by-side run (tools/record_cupti_mps.sh):

    python3 bench/cupti_models.py train --seconds 60     # an MLP trainer (batch 256, hidden 4096, AdamW)
    python3 bench/cupti_models.py infer --seconds 60     # a transformer encoder's forward passes (bf16, no grad)

Each prints one JSON line at the end: steps and their rate.

    python3 bench/cupti_models.py train --seconds 80 --probe 3

--probe N: the job traces itself (no exporter) in N windows of 10 s, 5 s apart, on a thread of its own as the
client does, and prints one JSON line per window: how long after the window's end the answer came, whether
its flush had returned (complete), the seconds and records it covered, each CUPTI step's seconds at the answer
and once the worker ended (the flush's whole drain), and the records that arrived after the answer. The last
window waits for the flush however long it takes (flush_wait_s 60 s): the answer the first tracer gave.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("train", "infer"))
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--probe", type=int, default=0, help="trace this process in N windows (no exporter)")
    args = p.parse_args(argv)
    import torch

    torch.manual_seed(0)
    if args.kind == "train":
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                                    torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x, y = torch.randn(256, 4096, device="cuda"), torch.randint(0, 10, (256,), device="cuda")

        def step():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    else:
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 4).cuda().to(torch.bfloat16).eval()
        x = torch.randn(8, 256, 512, device="cuda", dtype=torch.bfloat16)

        def step():
            with torch.no_grad():
                model(x)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    if args.probe:
        import threading

        threading.Thread(target=probe, args=(args.probe,), daemon=True).start()
    steps, started = 0, time.time()
    while time.time() - started < args.seconds:
        step()
        steps += 1
        if steps % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    took = time.time() - started
    print(json.dumps({"kind": args.kind, "pid": os.getpid(), "steps": steps, "rate": round(steps / took, 2)}))
    return 0


def probe(windows: int, seconds: float = 10.0) -> None:
    from gpu_trace.tracer import Tracer

    tracer = Tracer()
    for n in range(windows):
        time.sleep(5)
        if n == windows - 1:
            tracer.flush_wait_s = 60.0
        late, asked = tracer.late, time.monotonic()
        try:
            body = tracer.trace(seconds)
        except Exception as exc:  # noqa: BLE001 - printed: the probe's point
            body = {"error": f"{type(exc).__name__}: {exc}"}
        answered = time.monotonic() - asked - seconds
        at_answer = tracer.took
        tracer.idle(120)
        print(json.dumps({"probe": n + 1, "flush_wait_s": tracer.flush_wait_s, "answered_after_s": round(answered, 3),
                          "complete": body.get("complete"), "covered_s": round(body["end"] - body["start"], 3)
                          if "end" in body else None, "records": body.get("records"), "error": body.get("error"),
                          "took_at_answer": at_answer, "took": tracer.took, "records_after_answer": tracer.late - late,
                          "devices": body.get("devices")}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
