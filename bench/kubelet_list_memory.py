"""Where a List answer at the exporter's receive cap costs memory: the kubelet sampler's own gRPC call
receiving one pod of index-style device IDs (tests/kubelet_server.py, in a process of its own) of about
--bytes (default: just under the cap), then read_pods walking it; or, past --cap, gRPC refusing it.
Prints this process's VmRSS and VmHWM, in MB, after each step.

    python3 bench/kubelet_list_memory.py [--bytes 16M --cap 16M]
    python3 bench/kubelet_list_memory.py --bytes 40M --cap 1M   # refused from its length prefix
"""
from __future__ import annotations

import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def serve(path: str, size: int, ready) -> None:
    from tests.kubelet_server import GPU, KubeletServer, ids_of_size, pod

    server = KubeletServer(path)
    server.service.pods = [pod("team", "hoarder", {"c": [(GPU, ids_of_size(size))]})]
    server.start()
    ready.set()
    time.sleep(600)


def memory_mb() -> str:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return " ".join(f"{key} {int(status[key].split()[0]) / 1024:.1f}" for key in ("VmRSS", "VmHWM"))


def main() -> int:
    import argparse

    import grpc

    from exporter.config import size
    from exporter.samplers.kubelet import MAX_MESSAGE_BYTES, KubeletSampler, read_pods

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=size, default=MAX_MESSAGE_BYTES, help="the sampler's receive cap")
    parser.add_argument("--bytes", type=size, help="the answer's size (default: the cap less 5,000 bytes)")
    args = parser.parse_args()

    spawn = multiprocessing.get_context("spawn")  # the server's memory is not this process's
    with tempfile.TemporaryDirectory() as tmp:
        path, ready = f"{tmp}/kubelet.sock", spawn.Event()
        server = spawn.Process(target=serve, args=(path, args.bytes or args.cap - 5000, ready), daemon=True)
        server.start()
        ready.wait(120)
        try:
            sampler = KubeletSampler(path, None, container_logs=None, max_answer_bytes=args.cap)
            call = sampler._connect()
            print("connected:", memory_mb())
            try:
                answer = call(sampler._request, timeout=60)
            except grpc.RpcError as exc:
                print(f"refused ({exc.code().name}):", memory_mb())
                return 0
            print(f"received {len(answer)} bytes:", memory_mb())
            pods, _ = read_pods(answer)
            print(f"read {len(pods)} pod:", memory_mb())
            sampler.close()
        finally:
            server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
