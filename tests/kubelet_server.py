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


def pod(namespace: str, name: str, containers: dict[str, list[tuple[str, list[str]]]]) -> pb.PodResources:
    """containers: name -> [(resource name, device IDs)]."""
    return pb.PodResources(namespace=namespace, name=name, containers=[
        pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devs])
        for c, devs in containers.items()])


class PodResources(pb_grpc.PodResourcesListerServicer):
    def __init__(self):
        self.pods: list[pb.PodResources] = []
        self.delay = 0.0
        self.calls = 0

    def List(self, request, context):  # noqa: N802 - the API's name
        self.calls += 1
        time.sleep(self.delay)
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


class KubeletServer:
    def __init__(self, path: str):
        self.path = path
        self.service = PodResources()
        self._server = None

    def start(self) -> "KubeletServer":
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PodResourcesListerServicer_to_server(self.service, self._server)
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
