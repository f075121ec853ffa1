"""A hostile Kubernetes API server and a hostile kubelet against the real exporter (issue 39, attacks 4-7),
measured from outside on 127.0.0.1.

    python3 bench/kube_attacks.py --out bench/results/kube_attacks_after.json
    python3 bench/kube_attacks.py --code /tmp/before --out bench/results/kube_attacks_before.json

Each case: a kubelet (tests/kubelet_server.py, real gRPC on a unix socket) lists a time-sliced GPU's
pods, a small API server (tests/kubernetes_api_server.py) answers well until the exporter has read it
once, then as the case says (and a third shared claim makes the exporter ask), and the exporter
(`python -m exporter` from --code, default intervals: 1 s, kubelet 5 s) runs for --seconds. A
separate scraper takes /metrics every 0.1 s, /api/v1/gpus is fetched every second; after a third of
the run the pod `leaver` leaves the kubelet's list. Three cases are a kubelet's answers at the old 16 MiB
receive cap, past the default 1 MiB one since issue 42 (refused): GetAllocatableResources listing 1.5
million device IDs (`allocatable_16mib`), and List with one pod holding as many (`list_16mib`), both in one
tick (`both_16mib`); the `*_at_cap` cases are the same just under the default cap, `large_node` a large
real node's answers (250 pods, 384 replicas); and an API server whose ResourceSlice list is ten pages of
60,000 devices each (`slice_devices_600k`), listed again every 10 s for a device no slice names. Scraper and client
run in a process of their own. Reported: the exporter's RSS (VmRSS before the attack, once it has served /metrics
and /api/v1/gpus, its peak VmHWM since, reset then through /proc/PID/clear_refs), its CPU
seconds over the run (a figure the machine's load hardly moves), scrape p50/p99/max, /api/v1/gpus max, API requests
made, the last
kubernetes_api and kubelet success, how many scrapes still showed `leaver` after it left (two kubelet
intervals of grace), the log's lines about the API server and its tracebacks. Reports, never asserts
on time (tests/test_dra.py asserts what holds on any machine).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.scrape_bench import cpu_seconds
from tests.helpers import Exporter, http_get, parse_metrics, wait_for
from tests.http_load import Every, Scraper
from exporter.samplers.kubelet import MAX_MESSAGE_BYTES
from tests.kubelet_server import GPU, SLICED_UUID as UUID, claim_pod, ids_of_size, kubernetes_node, large_node, node_replicas, pod
from tests.kubernetes_api_server import (FakeApiServer, claim, device, empty_objects, nested,
                                         resource_slice, slice_pages)

KUBELET_INTERVAL = 5.0


def shared_claims(n: int) -> list:
    return [claim_pod("team", f"p{i}", {"c": [(f"c{i}", [("gpu-0", f"s{i}")])]}) for i in range(n)]


def set_api(api: FakeApiServer, case: str) -> None:
    """An API server knowing the two shared claims, answering as the case says."""
    api.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4", memory="80Gi")])]
    api.claims = {("team", f"c{i}"): claim("team", f"c{i}", [("node-a", "gpu-0", f"s{i}", {"shares": "1"})])
                  for i in range(3)}
    if case == "nested_json":
        api.body = nested(100_000)
    elif case == "huge_quantity":  # valid quantities: an exbibyte and two exa
        api.claims[("team", "c2")] = claim("team", "c2", [("node-a", "gpu-0", "s2", {"shares": "1Ei", "memory": "2E"})])
    elif case.startswith("drip_"):
        api.drip = (case.removeprefix("drip_"), 0.5)
    elif case == "empty_objects":
        api.body = empty_objects(8 * 1024 * 1024 - 64)
    elif case == "slice_devices_600k":  # ten pages of 60,000 devices, each page under the answer's caps
        api.slice_pages = slice_pages(10, 60_000)


CASES = {  # name -> (kubelet pods, API server on)
    "baseline": ("api", True),
    "nested_json": ("api", True),
    "huge_quantity": ("api", True),
    "drip_body": ("api", True),
    "drip_chunks": ("api", True),
    "drip_headers": ("api", True),
    "empty_objects": ("api", True),
    "slice_devices_600k": ("api", True),
    "claims_100k": (100_000, False),
    "claims_10k": (10_000, False),
    "device_plugin_10k": ("dp10k", False),
    "allocatable_16mib": ("allocatable16", False),
    "list_16mib": ("list16", False),
    "both_16mib": ("both16", False),
    # issue 42, items 6 and 8: names past Kubernetes' bounds, device IDs of 1.4 MB
    "pod_name_16mib": ("name16", False),
    "pod_names_3x4mib": ("names3x4", False),
    "device_ids_11x1_4mb": ("ids11", False),
    # issue 42's gaps: the largest answers the default receive cap lets in, and a large real node's
    "list_at_cap": ("list_cap", False),
    "allocatable_at_cap": ("allocatable_cap", False),
    "both_at_cap": ("both_cap", False),
    "pod_name_at_cap": ("name_cap", False),
    "device_ids_11_at_cap": ("ids11_cap", False),
    "large_node": ("large", False),
}


HOSTILE_BYTES = 16 * 1024 * 1024 - 1024  # just under the old 16 MiB receive cap
AT_CAP = MAX_MESSAGE_BYTES - 1024  # just under the default one
LARGE_NODE_IDS = [f"{UUID}::{n}" for n in range(8 * 48)]  # 8 GPUs of 48 replicas, as bytes go (one GPU here)


def hostile_allocatable(size: int = HOSTILE_BYTES):
    """GetAllocatableResources of a kubelet answering `size` bytes of device IDs (16 MiB: 1.5 million)."""
    from exporter.kubelet import podresources_pb2 as pb

    return pb.AllocatableResourcesResponse(devices=[pb.ContainerDevices(resource_name=GPU,
                                                                        device_ids=ids_of_size(size))])


def allocatable_of(kind):
    """What the case's kubelet answers to GetAllocatableResources (None: UNIMPLEMENTED)."""
    if kind in ("allocatable16", "both16"):
        return hostile_allocatable()
    if kind in ("allocatable_cap", "both_cap"):
        return hostile_allocatable(AT_CAP)
    if kind == "large":
        return [(GPU, LARGE_NODE_IDS)]
    return None


def kubelet_pods(kind) -> list:
    leaver = pod("team", "leaver", {"c": [(GPU, [f"{UUID}::7"])]})
    if kind == "api":
        return [leaver, *shared_claims(2)]
    if kind in ("list16", "both16"):  # one pod listing 16 MiB of device IDs: parsed whole, as one pod is
        return [leaver, pod("team", "hoarder", {"c": [(GPU, ids_of_size(HOSTILE_BYTES - 4096))]})]
    if kind in ("allocatable16", "allocatable_cap"):
        return [leaver]
    if kind in ("list_cap", "both_cap"):
        return [leaver, pod("team", "hoarder", {"c": [(GPU, ids_of_size(AT_CAP - 4096))]})]
    if kind == "name_cap":
        return [leaver, pod("team", "n" * (AT_CAP - 4096), {"c": [(GPU, [f"{UUID}::3"])]})]
    if kind == "ids11_cap":
        return [leaver, *(pod("team", f"g{i}", {"c": [(GPU, [f"GPU-{i}" + "x" * (AT_CAP // 11 - 1024)])]}) for i in range(11))]
    if kind == "large":  # the leaver holds a replica of its own
        return [leaver, *large_node(250, LARGE_NODE_IDS[:7] + LARGE_NODE_IDS[8:])]
    if kind == "name16":
        return [leaver, pod("team", "n" * (HOSTILE_BYTES - 4096), {"c": [(GPU, [f"{UUID}::3"])]})]
    if kind == "names3x4":
        return [leaver, *(pod("team", f"{i}" + "n" * (4 * 2**20 - 1), {"c": [(GPU, [f"{UUID}::{i + 3}"])]}) for i in range(3))]
    if kind == "ids11":  # eleven pods holding an unknown device ID of 1.4 MB each
        return [leaver, *(pod("team", f"g{i}", {"c": [(GPU, [f"GPU-{i}" + "x" * 1_468_000])]}) for i in range(11))]
    if kind == "dp10k":
        return [leaver, *(pod("team", f"d{i}", {"c": [(GPU, [f"{UUID}::{i + 10}"])]}) for i in range(10_000))]
    return [leaver, *shared_claims(kind)]


DURATION = re.compile(rb'gpu_exporter_collector_duration_seconds\{collector="(kubelet|kubernetes_api)"\} (\S+)')


class Presence(Scraper):
    """The scraper (a fresh connection each time), also counting the scrapes that show `leaver` after
    `since` (time.monotonic(), one clock for every process), and keeping the longest tick the kubelet
    and API reader reported."""

    def __init__(self, port: int, since: float):
        super().__init__(port, every=0.1, timeout=30)
        self.since, self.stale, self.longest, self.largest = since, 0, {}, 0

    def step(self):
        started = time.perf_counter()
        try:
            status, body = http_get(f"http://127.0.0.1:{self.port}/metrics", self.timeout)
        except OSError as exc:
            status, body = repr(exc)[:120], b""
        self.latencies.append(time.perf_counter() - started)
        if status != 200:
            self.failures.append(f"status {status}")
        self.largest = max(self.largest, len(body))
        if time.monotonic() > self.since:
            self.stale += b'pod="leaver"' in body
        for name, value in DURATION.findall(body):
            self.longest[name.decode()] = max(self.longest.get(name.decode(), 0.0), float(value))


class ApiGets(Every):
    def __init__(self, url: str):
        super().__init__(1.0)
        self.url, self.latencies, self.largest = url, [], 0

    def step(self):
        started = time.perf_counter()
        self.largest = max(self.largest, len(http_get(self.url + "/api/v1/gpus", 60)[1]))
        self.latencies.append(time.perf_counter() - started)


def measure(port: int, seconds: float, since: float, results) -> None:
    """The scraper and the /api/v1/gpus client for `seconds`, in a process of their own: in the bench's,
    the test kubelet serialising 10^5 pods would hold their GIL and count its own time as the exporter's."""
    scraper, gets = Presence(port, since), ApiGets(f"http://127.0.0.1:{port}")
    with scraper, gets:
        time.sleep(seconds)
    results.put({**scraper.figures(), "api_gpus_max_ms": round(max(gets.latencies, default=float("nan")) * 1000, 1),
                 "metrics_max_bytes": scraper.largest, "api_gpus_max_bytes": gets.largest,
                 "longest_tick_s": {k: round(v, 2) for k, v in scraper.longest.items()},
                 "leaver_scrapes_after_it_left": scraper.stale})


def reset_peak(pid: int) -> int:
    """The process's VmRSS, its VmHWM reset to it (/proc/PID/clear_refs): the peak read later is the attack's."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status_kb(pid, "VmRSS")


def status_kb(pid: int, key: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in text.splitlines() if line.startswith(key + ":")).split()[1])


def run_case(case: str, code: Path, seconds: float) -> dict:
    kind, with_api = CASES[case]
    with tempfile.TemporaryDirectory() as tmp:
        server, args = kubernetes_node(Path(tmp))
        args = [a for a in args]
        for flag, value in (("--interval", "1"), ("--kubelet-interval", str(KUBELET_INTERVAL))):
            args[args.index(flag) + 1] = value
        api = FakeApiServer().start()
        set_api(api, "baseline")
        attack = kubelet_pods(kind), allocatable_of(kind)
        # the kubelet's attack comes once the exporter is warm (below); the API server's answers it reads
        server.service.pods = attack[0] if with_api else attack[0][:1]  # the leaver alone
        server.start()
        exporter = Exporter(*args, "--kubernetes-api", api.url if with_api else "off", env={"NODE_NAME": "node-a"})
        exporter.cwd = code
        exporter.env["PYTHONPATH"] = str(code)
        try:
            with exporter:
                if with_api:  # read well once; then the attack, and a new claim that makes the API asked
                    wait_for(lambda: b'collector="kubernetes_api"} 1' in http_get(exporter.url + "/metrics")[1],
                             30, 0.2, "a good API server read")
                wait_for(lambda: b'pod="leaver"' in http_get(exporter.url + "/metrics")[1], 30, 0.2, "leaver")
                http_get(exporter.url + "/api/v1/gpus", 60)  # the API's models load on its first request (+18 MB)
                if not with_api:
                    server.service.pods, server.service.allocatable = attack
                start = reset_peak(exporter.proc.pid)
                asked_before = len(api.requests)
                set_api(api, case)
                if with_api:
                    server.service.pods = [*server.service.pods, *shared_claims(3)[2:]]
                if case == "slice_devices_600k":  # a device no slice names: the slices are listed again each 10 s
                    server.service.pods = [*server.service.pods, claim_pod("team", "newcomer", {"c": [("cn", [("gpu-1", None)])]})]
                spawn = multiprocessing.get_context("spawn")  # no fork of the gRPC server's threads
                results = spawn.Queue()
                since = time.monotonic() + seconds / 3 + 2 * KUBELET_INTERVAL
                child = spawn.Process(target=measure, args=(exporter.port, seconds, since, results))
                child.start()
                cpu_before = cpu_seconds(exporter.proc.pid)
                time.sleep(seconds / 3)
                server.service.pods = [p for p in server.service.pods if p.name != "leaver"]
                figures = results.get(timeout=seconds + 120)
                cpu = cpu_seconds(exporter.proc.pid) - cpu_before
                child.join(30)
                samples = parse_metrics(exporter.metrics())
                success = {l["collector"]: v for l, v in samples["gpu_exporter_collector_success"]}
                log = exporter.log()
                peak = status_kb(exporter.proc.pid, "VmHWM")
        finally:
            api.stop()
            server.stop()
    return {"case": case, "seconds": seconds, "rss_before_mb": round(start / 1024, 1),
            "rss_peak_mb": round(peak / 1024, 1), "cpu_s": round(cpu, 2), **figures, "api_requests": len(api.requests) - asked_before,
            "kubernetes_api_success": success.get("kubernetes_api"), "kubelet_success": success.get("kubelet"),
            "api_log_lines": log.count("kubernetes api"), "tracebacks": log.count("Traceback")}


def typical_list_bytes(pods: int) -> int:
    """The bytes of a List answer of `pods` pods of two containers (a server and a sidecar), one pod in
    four holding a replica of a GPU: what a node's kubelet answers, against the 16 MiB receive cap."""
    from exporter.kubelet import podresources_pb2 as pb

    listed = [pod("team-ml-prod", f"inference-server-7d9f8b6c5d-{i:05d}",
                  {"server": [(GPU, [f"{UUID}::{i % 16}"])] if i % 4 == 0 else [], "istio-proxy": []})
              for i in range(pods)]
    return len(pb.ListPodResourcesResponse(pod_resources=listed).SerializeToString())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--code", type=Path, default=ROOT, help="the source tree to run (default: this one)")
    parser.add_argument("--seconds", type=float, default=36.0)
    parser.add_argument("--only", nargs="*", choices=sorted(CASES))
    parser.add_argument("--sizes", action="store_true", help="print the bytes of typical List answers, run nothing")
    args = parser.parse_args()
    if args.sizes:
        from exporter.kubelet import podresources_pb2 as pb

        for pods in (110, 250, 1024):
            print(f"{pods} pods: {typical_list_bytes(pods)} bytes")
        for pods, gpus, replicas in ((110, 8, 16), (250, 8, 48)):  # tests/kubelet_server.py large_node
            listed = pb.ListPodResourcesResponse(pod_resources=large_node(pods, node_replicas(gpus, replicas)))
            offered = pb.AllocatableResourcesResponse(devices=[pb.ContainerDevices(
                resource_name=GPU, device_ids=node_replicas(gpus, replicas))], cpu_ids=range(192))
            print(f"a large node, {pods} pods of three containers, {gpus} GPUs of {replicas} replicas: List "
                  f"{listed.ByteSize()} bytes, Allocatable {offered.ByteSize()} bytes")
        return 0
    results = []
    for case in args.only or CASES:
        result = run_case(case, args.code.resolve(), args.seconds)
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.out:
        args.out.write_text(json.dumps({"code": str(args.code), "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
