"""Two real PyTorch jobs for the MPS side-by-side run (bench/record_cupti_mps.sh):

    python3 bench/cupti_models.py train --seconds 60     # an MLP trainer (batch 256, hidden 4096, AdamW)
    python3 bench/cupti_models.py infer --seconds 60     # a transformer encoder's forward passes (bf16, no grad)

Each prints one JSON line at the end: steps and their rate.
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


if __name__ == "__main__":
    sys.exit(main())
