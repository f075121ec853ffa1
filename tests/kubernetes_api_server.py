"""A small Kubernetes API server for the tests: real HTTP on 127.0.0.1 answering the two reads the
exporter makes, in the resource.k8s.io/v1 shape (ResourceSlice, ResourceClaim), from what the test
sets: slices, claims, a delay, a status, a body of its choosing, or a pace at which it drips the
answer out (its body, 1-byte chunks of it, or its headers)."""
from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GROUP = "/apis/resource.k8s.io/v1"
DRIPS = ("body", "chunks", "headers", "unframed")  # what FakeApiServer.drip sends one byte at a time
# ("unframed": the body without Content-Length or chunks, ended by closing the connection)


def nested(depth: int) -> bytes:
    """Valid JSON nested `depth` arrays deep inside an object."""
    return b'{"items":' + b"[" * depth + b"]" * depth + b"}"


def empty_objects(size: int) -> bytes:
    """`{"items":[{},{},...]}` of about `size` bytes: one Python dict per 3 bytes once parsed."""
    return b'{"items":[' + b"{}," * (size // 3) + b"{}]}"


def slice_pages(pages: int, devices_per_page: int) -> list[bytes]:
    """A hostile slice list: `pages` pages (each naming the next by its continue token) of slices of
    1,024 devices each, every device only a distinct name: some 3 JSON values per device."""
    out = []
    for page in range(pages):
        names = [f"d{page}-{i}" for i in range(devices_per_page)]
        items = [{"spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a", "pool": {"name": "node-a"},
                           "devices": [{"name": n} for n in names[at:at + 1024]]}}
                 for at in range(0, len(names), 1024)]
        more = {"continue": str(page + 1)} if page + 1 < pages else {}
        out.append(json.dumps({"kind": "ResourceSliceList", "metadata": more, "items": items}).encode())
    return out


def device(name: str, uuid: str, **capacity: str) -> dict:
    """A ResourceSlice device as NVIDIA's driver publishes it: a uuid attribute, capacities."""
    return {"name": name, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}},
            "capacity": {k: {"value": v} for k, v in capacity.items()}}


def resource_slice(pool: str, node: str, devices: list[dict], driver: str = "gpu.nvidia.com") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-x"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool, "generation": 1,
                                                                   "resourceSliceCount": 1},
                     "devices": devices}}


def claim(namespace: str, name: str, results: list[tuple[str, str, str | None, dict]]) -> dict:
    """results: [(pool, device, share_id, consumed capacity)]."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": dev,
                 **({"shareID": share} if share else {}), "consumedCapacity": consumed}
                for pool, dev, share, consumed in results]}}}}


class FakeApiServer:
    """Plain HTTP, or HTTPS with `tls` = (certificate file, key file)."""

    def __init__(self, tls: tuple[str, str] | None = None):
        self.slices: list[dict] = []
        self.claims: dict[tuple[str, str], dict] = {}
        self.delay = 0.0
        self.status = 200
        self.body: bytes | None = None  # answered instead of the objects when set
        self.slice_pages: list[bytes] | None = None  # the slice list's pages, answered by continue token "<n>"
        self.drip: tuple[str, float] | None = None  # (one of DRIPS, seconds between two bytes or chunks)
        self.chunk_sizes: list[int] | None = None  # what "chunks" cuts the body in (default: 1 byte each)
        self.raw_chunks: bytes | None = None  # or the chunked body as it is sent, framing and all
        self.requests: list[str] = []
        self.authorizations: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append(self.path)
                server.authorizations.append(self.headers.get("Authorization"))
                time.sleep(server.delay)
                body, status = server.answer(self.path, self.headers.get("Authorization"))
                if server.drip:
                    self._drip(body, status, *server.drip)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

            def _drip(self, body: bytes, status: int, what: str, every: float):
                chunked = what == "chunks"
                head = (f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
                        + ("Transfer-Encoding: chunked\r\n" if chunked else
                           "" if what == "unframed" else f"Content-Length: {len(body)}\r\n")
                        + "X-Padding: " + "x" * 4096 + "\r\n\r\n").encode()
                if chunked and server.raw_chunks is not None:
                    pieces = [server.raw_chunks]
                elif chunked:
                    pieces, at = [], 0
                    for size in server.chunk_sizes or [1] * len(body):
                        pieces.append(b"%x\r\n" % size + body[at:at + size] + b"\r\n")
                        at += size
                    pieces.append(b"0\r\n\r\n")
                elif what == "headers":
                    pieces = [head[i:i + 1] for i in range(len(head))] + [body]
                else:
                    pieces = [body[i:i + 1] for i in range(len(body))]
                try:
                    if what != "headers":
                        self.wfile.write(head)
                    if not every:  # at once: the framing is what is tested, not the pace
                        pieces = [b"".join(pieces)]
                    for piece in pieces:
                        self.wfile.write(piece)
                        time.sleep(every)
                except OSError:  # the reader gave up: what the test wants
                    pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        scheme = "http"
        if tls:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._http.socket = context.wrap_socket(self._http.socket, server_side=True)
            scheme = "https"
        self.port = self._http.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def answer(self, path: str, auth) -> tuple[bytes, int]:
        if self.body is not None:
            return self.body, self.status
        if self.status != 200:
            return json.dumps({"kind": "Status", "code": self.status}).encode(), self.status
        parsed = urllib.parse.urlsplit(path)
        if parsed.path == f"{GROUP}/resourceslices":
            query = urllib.parse.parse_qs(parsed.query)
            if self.slice_pages:
                page = query.get("continue", ["0"])[0]
                return self.slice_pages[int(page) if page.isdigit() else 0], 200
            selector = dict(s.split("=", 1) for s in query.get("fieldSelector", [""])[0].split(",") if "=" in s)
            items = [s for s in self.slices if s["spec"]["driver"] == selector.get("spec.driver", s["spec"]["driver"])
                     and s["spec"]["nodeName"] == selector.get("spec.nodeName", s["spec"]["nodeName"])]
            return json.dumps({"kind": "ResourceSliceList", "metadata": {}, "items": items}).encode(), 200
        parts = parsed.path.removeprefix(GROUP + "/namespaces/").split("/")
        if len(parts) == 3 and parts[1] == "resourceclaims" and (parts[0], parts[2]) in self.claims:
            return json.dumps(self.claims[(parts[0], parts[2])]).encode(), 200
        return json.dumps({"kind": "Status", "code": 404}).encode(), 404

    def start(self) -> "FakeApiServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
