"""Load from outside against an exporter's HTTP server, shared by tests/test_http.py and the attack benches
(bench/http_attacks.py, ctxsw_attacks.py, kube_attacks.py, report_attacks.py): a scraper that times /metrics, a
watch of a process's resident memory, a command measured in a fresh process, and two attacks without a token
(pipelined requests that are never read, long query strings)."""
from __future__ import annotations

import http.client
import re
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

MB = 1024 * 1024
PIPELINED = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
ATTACKER = "127.0.0.2"  # another client address than the scraper's, as an attacker on the network would be


def rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    if found is None:  # exited, not yet reaped: no memory left to measure
        raise ProcessLookupError(pid)
    return int(found.group(1)) * 1024


class Every:
    """Calls `step()` every `every` s in a thread while the `with` block runs."""

    def __init__(self, every: float):
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set() and self.step() is not False:
            self._stop.wait(self.every)

    def step(self):
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(15)


class Scraper(Every):
    """One keep-alive connection scraping /metrics every `every` s (reconnecting after a failure)."""

    def __init__(self, port: int, every: float = 0.05, timeout: float = 5.0):
        super().__init__(every)
        self.port, self.timeout = port, timeout
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._conn = None

    def step(self):
        started = time.perf_counter()
        try:
            self._conn = self._conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            self._conn.request("GET", "/metrics")
            response = self._conn.getresponse()
            response.read()
            if response.status != 200:
                self.failures.append(f"status {response.status}")
        except (OSError, http.client.HTTPException) as exc:
            self.failures.append(repr(exc)[:120])
            self._conn.close()
            self._conn = None
        self.latencies.append(time.perf_counter() - started)

    def figures(self) -> dict:
        ms = sorted(x * 1000 for x in self.latencies) or [float("nan")]
        return {"scrapes": len(self.latencies), "failures": len(self.failures), "failure_examples": self.failures[:3],
                "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2),
                "max_ms": round(ms[-1], 2)}


class RssWatch(Every):
    """The process's VmRSS every 0.1 s: its peak while the `with` block runs."""

    def __init__(self, pid: int):
        super().__init__(0.1)
        self.pid, self.peak = pid, 0

    def step(self):
        try:
            self.peak = max(self.peak, rss(self.pid))
        except OSError:
            return False


def run_measured(argv: list[str], cwd: Path, env: dict, timeout: float) -> dict:
    """A command in a fresh process: exit status (or "killed at N s"), wall seconds, peak RSS (MB, VmRSS every
    0.1 s), its stdout (bytes) and stderr (text)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=env)
        with RssWatch(proc.pid) as watch:
            try:
                status = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status = f"killed at {timeout:g} s"
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return {"exit": status, "seconds": round(seconds, 2), "peak_rss_mb": round(watch.peak / MB, 1),
                "stdout": out.read(), "stderr": err.read().decode(errors="replace")}


def pipelining(port: int, connections: int, requests: int, seconds: float) -> dict:
    """`connections` sockets each sending `requests` pipelined GET /metrics and never reading, held for
    `seconds`; what they got sent in is counted. Returns when the sockets are closed."""
    sent = [0] * connections
    socks = []

    def flood(i: int, sock: socket.socket):
        try:
            sock.sendall(PIPELINED * requests)  # blocks once the server stops reading: that is the point
            sent[i] = len(PIPELINED) * requests
        except OSError:
            pass

    threads = []
    for i in range(connections):
        sock = socket.create_connection(("127.0.0.1", port), source_address=(ATTACKER, 0))
        sock.settimeout(seconds)
        socks.append(sock)
        threads.append(threading.Thread(target=flood, args=(i, sock), daemon=True))
        threads[-1].start()
    time.sleep(seconds)
    for sock in socks:
        sock.close()
    for thread in threads:
        thread.join(1)
    return {"connections": connections, "requests_each": requests}


def query_strings(port: int, clients: int, query_bytes: int, seconds: float) -> dict:
    """`clients` threads requesting /api/v1/gpus with a `query_bytes` query string back to back."""
    query = ("a=1&" * (query_bytes // 4))[:query_bytes]
    request = f"GET /api/v1/gpus?{query} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    deadline = time.monotonic() + seconds
    statuses: dict[str, int] = {}
    lock = threading.Lock()

    def client():
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(ATTACKER, 0)) as sock:
                    sock.sendall(request)
                    answer = b""
                    while chunk := sock.recv(65536):
                        answer += chunk
                status = answer[9:12].decode(errors="replace") or "closed"
            except OSError as exc:
                status = type(exc).__name__
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 15)
    return {"clients": clients, "query_bytes": query_bytes, "answers": statuses}
