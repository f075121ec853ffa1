"""CPU of one engine publish with the kubelet sampler's bound of holders on one GPU (MAX_CONTAINERS
device-plugin pods), in process: the work every update does for a kubelet flood (issue 39, attack 7).

    python3 bench/kube_publish_cost.py [--pods N] [--publishes 50]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from exporter.__main__ import build_engine
from exporter.config import parse_args
from exporter.samplers.dra import MAX_CONTAINERS
from tests.kubelet_server import GPU, SLICED_UUID as UUID, kubernetes_node, pod


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=MAX_CONTAINERS)
    parser.add_argument("--publishes", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, flags = kubernetes_node(Path(tmp))
        server.service.pods = [pod("team", f"d{i}", {"c": [(GPU, [f"{UUID}::{i}"])]}) for i in range(args.pods)]
        server.start()
        try:
            engine, _ = build_engine(parse_args([*flags, "--kubernetes-api", "off"]))
            engine.nvml.tick()
            engine.holders[0].tick()
            engine.publish()
            started = time.process_time()
            for _ in range(args.publishes):
                engine.publish()
            print(f"{args.pods} pods: {(time.process_time() - started) / args.publishes * 1000:.1f} ms CPU a publish")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
