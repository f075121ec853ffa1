"""One small training process: an MLP trained on random data, like a small-batch job or a notebook.

    python3 tests/gpu/train_worker.py --start-at EPOCH --seconds 20 [--cpu-input-ms 10]

Initialises CUDA and warms up first, trains from --start-at for --seconds, then prints
{"steps": N, "per_second": [...]} (steps in each second of the window, for the overhead comparison).
--cpu-input-ms makes each batch on the host first (CPU work for that long, then a copy to the GPU),
like a loop whose data loading cannot keep up: the GPU waits between steps.
"""
import argparse
import json
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-at", type=float, required=True, help="wall time at which counting starts")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--cpu-input-ms", type=float, default=0.0, help="host-side work per batch")
    args = parser.parse_args()

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10)).cuda()
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.hidden, device="cuda")
    y = torch.randint(0, 10, (args.batch,), device="cuda")

    host_batch = torch.empty(args.batch, args.hidden).pin_memory()

    def load_batch():
        until = time.perf_counter() + args.cpu_input_ms / 1e3
        while time.perf_counter() < until:  # decoding, augmentation: CPU time the GPU waits for
            host_batch.normal_()
        x.copy_(host_batch, non_blocking=True)

    def step():
        if args.cpu_input_ms:
            load_batch()
        optimiser.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimiser.step()
        return loss.item()  # a real loop logs its loss: one host sync per step

    for _ in range(20):
        step()
    while time.time() < args.start_at:
        time.sleep(0.01)
    end = args.start_at + args.seconds
    per_second = [0] * int(args.seconds + 1)
    steps = 0
    while (now := time.time()) < end:
        step()
        steps += 1
        per_second[min(int(now - args.start_at), len(per_second) - 1)] += 1
    json.dump({"steps": steps, "per_second": per_second[: int(args.seconds)]}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
