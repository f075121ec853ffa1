"""/metrics latency on a big node, replayed (issue 37): 8 GPUs, 64 pods holding time-sliced replicas of each, 4
processes running on every GPU in 4 of its pods, 50 scrapers. No GPU needed:

    python3 bench/scrape_8x64.py --out F [--seconds 10] [--gpus 8] [--pods-per-gpu 64] [--clients 1,50]

The node: the time-sliced H100 recording (tests/fixtures/nvml_h100_time_sliced.json, one frame) on 8 GPUs, each
with its own UUID and its own 4 pids; a proc tree placing those pids in their pods' containers, the kubelet's log
links naming the containers, and a real gRPC PodResources server (tests/kubelet_server.py) answering 8 x 64 pods
and what each holds. The exporter runs with its defaults (--interval 1, the holder series limit it ships with).
Each scraper is its own process with a keep-alive connection scraping back to back (bench/scrape_bench.py).
Each level runs twice: without and with `Accept-Encoding: gzip` (what Prometheus sends). Reports p50/p99,
scrapes per second, the exporter's CPU per scrape, the body's size and series count. Never asserts.

--out is written after every stage; a run that fails says why there (`error`, the traceback's end, the
exporter's log tail) and exits 1, and `versions` names the Python, grpcio and protobuf it ran with: the test
kubelet's stubs need grpcio >= 1.85.1 and protobuf >= 7.35.1 (pyproject.toml), which a device's own Python may
not have (bench/device_wheels.sh fetches them).
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.ctxsw_live_cost import stop
from bench.scrape_bench import scrape_latencies
from exporter.nvml_replay import cut
from tests.helpers import FIXTURES, free_port, http_get, wait_for

PIDS = (417, 418, 419, 420)  # the recording's four processes


def uuid_of(index: int) -> str:
    return f"GPU-0cc7d789-89a7-98d7-87e6-{index:012d}"


def node_recording(tmp: Path, gpus: int) -> Path:
    """One frame of the time-sliced recording on `gpus` GPUs: each its own UUID, its pids shifted by 1000 x index."""
    cut(FIXTURES / "nvml_h100_time_sliced.json", tmp / "frame.json", frame=0)
    data = json.loads((tmp / "frame.json").read_text())
    calls: dict = {"device_count": [{"value": gpus}]}
    for key, answers in data["calls"].items():
        method, _, device = key.partition("/")
        if device != "0":
            calls.setdefault(key, answers)
            continue
        for index in range(gpus):
            text = json.dumps(answers)
            for pid in PIDS:
                text = text.replace(f'"pid": {pid}', f'"pid": {pid + 1000 * index}')
            copy = json.loads(text)
            if method == "identity":
                copy = [{"value": {**copy[0]["value"], "uuid": uuid_of(index), "minor": index}}]
            calls[f"{method}/{index}"] = copy
    data["calls"] = calls
    data["note"] = f"{gpus} GPUs cloned from one frame of nvml_h100_time_sliced.json (bench/scrape_8x64.py)"
    path = tmp / "node.json"
    path.write_text(json.dumps(data))
    return path


def node(tmp: Path, gpus: int, pods_per_gpu: int):
    """(the test kubelet, the exporter's flags). Imported here: its gRPC stubs are what a device may lack."""
    from tests.kubelet_server import GPU, KubeletServer, pod

    recording = node_recording(tmp, gpus)
    proc, logs = tmp / "proc", tmp / "containers"
    logs.mkdir()
    server = KubeletServer(str(tmp / "kubelet.sock"))
    allocatable = []
    for index in range(gpus):
        replicas = [f"{uuid_of(index)}::{n}" for n in range(pods_per_gpu)]
        allocatable += replicas
        for n, replica in enumerate(replicas):
            name, container = f"job-{index}-{n}", f"{index:02x}{n:02x}" * 16
            server.service.pods.append(pod("bench", name, {"main": [(GPU, [replica])]}))
            (logs / f"{name}_bench_main-{container}.log").symlink_to("/nonexistent")  # only names are read
            if n < len(PIDS):  # the GPU's processes run in its first pods
                pid = PIDS[n] + 1000 * index
                (proc / str(pid)).mkdir(parents=True)
                (proc / str(pid) / "cgroup").write_text(
                    f"0::/kubepods.slice/kubepods-pod{index}{n}.slice/cri-containerd-{container}.scope\n")
    server.service.allocatable = [(GPU, allocatable)]
    args = ["--nvml-replay", str(recording), "--no-mps", "--kubelet-socket", server.path, "--kubelet-container-logs",
            str(logs), "--proc-root", str(proc)]
    return server, args


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--pods-per-gpu", type=int, default=64)
    p.add_argument("--clients", default="1,50")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="scrape-8x64-"))
    result: dict = {"gpus": args.gpus, "pods_per_gpu": args.pods_per_gpu, "seconds": args.seconds,
                    "versions": versions(), "stage": "start"}
    server = exporter = None
    try:
        server, flags = node(tmp, args.gpus, args.pods_per_gpu)
        server.start()
        port = free_port()
        result["stage"] = "exporter starting"
        save(args.out, result)
        exporter = subprocess.Popen([sys.executable, "-m", "exporter", "--port", str(port), "--interval", "1", *flags],
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp / "exporter.log", "wb"))

        def body() -> str:
            status, data = http_get(f"http://127.0.0.1:{port}/metrics", 5)
            return data.decode() if status == 200 else ""

        wait_for(lambda: body().count("gpu_workload_time_share_ratio{") >= args.gpus, 60, 0.5, "workloads on every GPU")
        time.sleep(2)
        text = body()
        result.update({"body_bytes": len(text), "series": sum(1 for line in text.splitlines() if line and line[0] != "#"),
                       "workload_series": sum(1 for line in text.splitlines() if line.startswith("gpu_workload_")),
                       "pods_series": text.count("gpu_pods{"), "stage": "scraping", "latency": []})
        save(args.out, result)
        for gzipped in (False, True):
            for n in args.clients.split(","):
                result["latency"].append(scrape_latencies(port, int(n), args.seconds, exporter.pid, gzipped))
                save(args.out, result)
        result["stage"] = "done"
    except Exception as exc:  # noqa: BLE001 - unattended on the device: the cause comes back in --out
        result["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        result["traceback_tail"] = traceback.format_exc()[-2000:]
    finally:
        if exporter is not None:
            stop(exporter)
        if server is not None:
            server.stop()
        log = tmp / "exporter.log"
        if "error" in result and log.is_file():
            result["exporter_log_tail"] = log.read_bytes()[-3000:].decode(errors="replace")
        save(args.out, result)
    print(json.dumps(result, indent=1))
    return 1 if "error" in result else 0


def versions() -> dict:
    """What this run's Python has: the gRPC stubs' runtime needs (pyproject.toml)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("grpcio", "protobuf"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def save(out: Path | None, result: dict) -> None:
    if out is not None:
        out.write_text(json.dumps(result, indent=1) + "\n")

if __name__ == "__main__":
    sys.exit(main())
