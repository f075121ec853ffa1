"""A real gRPC server speaking the kubelet's PodResources v1 API on a unix socket, for the tests.

Its answer, a delay and stop/start are set by the test while the exporter polls it; `GarbageServer`
sits on the same kind of socket and answers bytes that are no HTTP/2 at all."""
from __future__ import annotations

import os
import socket
import threading
import time
from concurrent import futures

import grpc

from exporter.kubelet import podresources_pb2 as pb
from exporter.kubelet import podresources_pb2_grpc as pb_grpc
from exporter.nvml_replay import cut
from tests.helpers import FIXTURES

SLICED_UUID = "GPU-0cc7d789-89a7-98d7-87e6-31b003867920"  # tests/fixtures/nvml_h100_time_sliced.json
GPU = "nvidia.com/gpu"
TRAINER_ID, NOTEBOOK_ID = "a" * 64, "b" * 64


def pod(namespace: str, name: str, containers: dict[str, list[tuple[str, list[str]]]]) -> pb.PodResources:
    """containers: name -> [(resource name, device IDs)]."""
    return pb.PodResources(namespace=namespace, name=name, containers=[
        pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devs])
        for c, devs in containers.items()])


def ids_of_size(size: int) -> list[str]:
    """Index-style device IDs ("0::<n>", the shortest the device plugin hands out), about `size` bytes
    of them once serialised: the most IDs, so the most Python strings, an answer of that size holds."""
    ids, total = [], 16
    while total < size:
        ids.append(f"0::{len(ids)}")
        total += len(ids[-1]) + 2
    return ids


def padded_to(answer: bytes, size: int) -> bytes:
    """A List or Allocatable answer's bytes grown to exactly `size` by a field of zeros at its end (number
    15, which neither message has: walked past, never read), to try the receive cap byte for byte."""
    from google.protobuf.internal.encoder import _VarintBytes

    for tag in (_VarintBytes(15 << 3 | 2), b"\x70\x00" + _VarintBytes(15 << 3 | 2)):  # a length's varint may
        for varint_bytes in (1, 2, 3, 4):  # fall short of a size by one byte: a varint field 14 = 0 first
            fill = size - len(answer) - len(tag) - varint_bytes
            if fill >= 0 and len(_VarintBytes(fill)) == varint_bytes:
                return answer + tag + _VarintBytes(fill) + bytes(fill)
    raise ValueError(f"{len(answer)} bytes cannot be grown to {size}")


def node_replicas(gpus: int = 8, replicas: int = 16) -> list[str]:
    """The device IDs of `gpus` GPUs offered as `replicas` time-slicing replicas each, as the NVIDIA device
    plugin names them (GPU-<uuid>::<n>): a large node's."""
    return [f"GPU-{g:08x}-89a7-98d7-87e6-31b003867920::{n}" for g in range(gpus) for n in range(replicas)]


def large_node(pods: int, device_ids: list[str]) -> list[pb.PodResources]:
    """A large real node's List answer, pessimistic: `pods` pods of an init container, a main container
    with 16 exclusive CPUs and memory on two NUMA nodes, and a sidecar, with names as long as Deployments
    make them; the replicas `device_ids` handed out one per pod in turn, with their NUMA topology."""
    numa = lambda node: pb.TopologyInfo(nodes=[pb.NUMANode(ID=node)])
    held: list[list[str]] = [[] for _ in range(pods)]
    for n, device_id in enumerate(device_ids):
        held[n % pods].append(device_id)
    return [pb.PodResources(namespace="team-ml-inference-prod", name=f"llm-inference-server-7d9f8b6c5d-{i:05d}", containers=[
        pb.ContainerResources(name="init-model-download"),
        pb.ContainerResources(name="inference-server", devices=[pb.ContainerDevices(
            resource_name=GPU, device_ids=ids, topology=numa(i % 2))] if ids else [],
            cpu_ids=range(16 * (i % 12), 16 * (i % 12) + 16),
            memory=[pb.ContainerMemory(memory_type="memory", size=64 << 30, topology=numa(node)) for node in (0, 1)]),
        pb.ContainerResources(name="istio-proxy")]) for i, ids in enumerate(held)]


DRA = "gpu.nvidia.com"


def claim_pod(namespace: str, name: str, containers: dict[str, list[tuple]]) -> pb.PodResources:
    """containers: name -> [(claim name, [(device name, share_id or None)], driver, pool)]; driver and
    pool may be left out (gpu.nvidia.com, pool "node-a")."""
    def resources(claim):
        claim_name, devices, driver, pool = (*claim, DRA, "node-a")[:4]
        return pb.DynamicResource(claim_name=claim_name, claim_namespace=namespace, claim_resources=[
            pb.ClaimResource(driver_name=driver, pool_name=pool, device_name=device,
                             cdi_devices=[pb.CDIDevice(name=f"k8s.{driver}/claim={claim_name}-{device}")],
                             **({"share_id": share} if share is not None else {}))
            for device, share in devices])
    return pb.PodResources(namespace=namespace, name=name, containers=[
        pb.ContainerResources(name=c, dynamic_resources=[resources(claim) for claim in claims])
        for c, claims in containers.items()])


class PodResources(pb_grpc.PodResourcesListerServicer):
    def __init__(self):
        self.pods: list[pb.PodResources] = []
        # [(resource name, device IDs)]; None: answer UNIMPLEMENTED, like old kubelets; an answer built
        # once (a hostile one of 16 MiB is not built again each call); or bytes, sent as they are
        self.allocatable: list[tuple[str, list[str]]] | pb.AllocatableResourcesResponse | bytes | None = None
        self.delay = 0.0
        self.answering = threading.Event()  # cleared: every List waits until it is set again (at most 60 s)
        self.answering.set()
        self.calls = 0
        # answered instead of `pods` when set, as they are: fields in any order, given twice, in wire
        # types the exporter's own reader refuses (protobuf would put its fields in order again)
        self.raw: bytes | None = None

    def List(self, request, context):
        self.calls += 1
        self.answering.wait(60)
        time.sleep(self.delay)
        if self.raw is not None:
            return self.raw
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request, context):
        if self.allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAllocatableResources is not enabled")
        if isinstance(self.allocatable, pb.AllocatableResourcesResponse):
            return self.allocatable
        if isinstance(self.allocatable, bytes):
            return self.allocatable
        return pb.AllocatableResourcesResponse(devices=[
            pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in self.allocatable])


def serialized(answer) -> bytes:
    return answer if isinstance(answer, bytes) else answer.SerializeToString()


class KubeletServer:
    def __init__(self, path: str):
        self.path = path
        self.service = PodResources()
        self._server = None

    def start(self) -> "KubeletServer":
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        # the kubelet's two calls, answering messages or bytes as they are
        handlers = {name: grpc.unary_unary_rpc_method_handler(getattr(self.service, name), request.FromString, serialized)
                    for name, request in (("List", pb.ListPodResourcesRequest),
                                          ("GetAllocatableResources", pb.AllocatableResourcesRequest))}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),))
        self._server.add_insecure_port(f"unix://{self.path}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        if os.path.exists(self.path):
            os.unlink(self.path)


class GarbageServer:
    """Accepts connections on a unix socket and answers garbage."""

    def __init__(self, path: str):
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(8)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.sendall(b"this is no kubelet\r\n" * 64)
                except OSError:
                    pass

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        os.unlink(self.path)


def kubernetes_node(tmp_path):
    """A GPU node of a cluster: one frame of the time-sliced recording (pids 417-420 at 30/10/40/20 %
    SM time), a proc tree in which 417 and 418 run in the trainer's container, 419 in the notebook's
    and 420 on the host, the kubelet's log links naming those containers, and a kubelet (not started)
    on a unix socket. Returns (server, exporter flags)."""
    cut(FIXTURES / "nvml_h100_time_sliced.json", tmp_path / "nvml.json", frame=0)
    proc = tmp_path / "proc"
    for pid, cid in ((417, TRAINER_ID), (418, TRAINER_ID), (419, NOTEBOOK_ID), (420, None)):
        (proc / str(pid)).mkdir(parents=True)
        path = f"/kubepods.slice/kubepods-pod1.slice/cri-containerd-{cid}.scope" if cid else "/user.slice/session-1.scope"
        (proc / str(pid) / "cgroup").write_text(f"0::{path}\n")
    logs = tmp_path / "containers"
    logs.mkdir()
    for name in (f"train-0_team-a_trainer-{TRAINER_ID}.log", f"notebook_team-b_nb-{NOTEBOOK_ID}.log",
                 "garbage.log", f"other_team-c_x-{'e' * 64}.log"):
        (logs / name).symlink_to("/nonexistent")  # only names are read
    server = KubeletServer(str(tmp_path / "kubelet.sock"))
    args = ("--nvml-replay", str(tmp_path / "nvml.json"), "--no-mps", "--interval", "0.2",
            "--kubelet-socket", server.path, "--kubelet-interval", "0.2", "--kubelet-container-logs", str(logs),
            "--proc-root", str(proc))
    return server, args
