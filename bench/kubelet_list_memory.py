"""Where a List answer at the exporter's 16 MiB receive cap costs memory: the kubelet sampler's own gRPC
call receiving one pod of 1.5 million device IDs (tests/kubelet_server.py, in a process of its own),
then read_pods walking it. Prints this process's VmRSS and VmHWM, in MB, after each step.

    python3 bench/kubelet_list_memory.py
"""
from __future__ import annotations

import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def serve(path: str, ready) -> None:
    from exporter.samplers.kubelet import MAX_MESSAGE_BYTES
    from tests.kubelet_server import GPU, KubeletServer, ids_of_size, pod

    server = KubeletServer(path)
    server.service.pods = [pod("team", "hoarder", {"c": [(GPU, ids_of_size(MAX_MESSAGE_BYTES - 5000))]})]
    server.start()
    ready.set()
    time.sleep(600)


def memory_mb() -> str:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return " ".join(f"{key} {int(status[key].split()[0]) // 1024}" for key in ("VmRSS", "VmHWM"))


def main() -> int:
    from exporter.samplers.kubelet import KubeletSampler, read_pods

    spawn = multiprocessing.get_context("spawn")  # the server's memory is not this process's
    with tempfile.TemporaryDirectory() as tmp:
        path, ready = f"{tmp}/kubelet.sock", spawn.Event()
        server = spawn.Process(target=serve, args=(path, ready), daemon=True)
        server.start()
        ready.wait(120)
        try:
            sampler = KubeletSampler(path, None, container_logs=None)
            call = sampler._connect()
            print("connected:", memory_mb())
            answer = call(sampler._request, timeout=60)
            print(f"received {len(answer)} bytes:", memory_mb())
            pods, _ = read_pods(answer)
            print(f"read {len(pods)} pod:", memory_mb())
            sampler.close()
        finally:
            server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
