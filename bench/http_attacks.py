"""Two attacks on the exporter's HTTP server without a token (issue 25, items 1 and 2), measured from outside.

    python3 bench/http_attacks.py --out bench/results/http_attacks_after.json
    python3 bench/http_attacks.py --source-dir /tmp/before --out bench/results/http_attacks_before.json

- pipelining: CONNECTIONS sockets each send REQUESTS `GET /metrics` in one stream and never read.
- query strings: CLIENTS clients request `GET /api/v1/gpus?a=1&a=1&...` (QUERY_BYTES long) back to back.
- api_first_load: resident memory before and after the first /api/v1/gpus (FastAPI loads), and with --no-api.
For each: the exporter's resident memory (VmRSS from /proc, sampled every 0.1 s: before, peak, and after
the clients left), the latency of a separate scraper (one keep-alive connection scraping /metrics every
50 ms, 5 s timeout: p50, p99, max, failures), and the tracebacks in the exporter's log. `--source-dir`
runs `python -m exporter` from another checkout (the before figure). Reports, never asserts on time;
tests/test_exposure.py asserts what holds on any machine (memory bounds, scrapes keep succeeding).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.helpers import free_port, http_get, wait_for  # noqa: E402

MB = 1024 * 1024
PIPELINED = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
ATTACKER = "127.0.0.2"  # another client address than the scraper's, as an attacker on the network would be


def rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    if found is None:  # exited, not yet reaped: no memory left to measure
        raise ProcessLookupError(pid)
    return int(found.group(1)) * 1024


class Exporter:
    """`python -m exporter --no-nvml --no-mps` from `source_dir` on a free port, its log in a file."""

    def __init__(self, source_dir: Path = ROOT, *extra: str):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="exporter-", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONPATH": str(source_dir), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter", "--no-nvml", "--no-mps", "--port",
                                      str(self.port), *extra], cwd=source_dir, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: http_get(f"http://127.0.0.1:{self.port}/healthz", 1)[0] == 200, 30, what="exporter up")

    def tracebacks(self) -> int:
        return Path(self.log.name).read_text(errors="replace").count("Traceback")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        Path(self.log.name).unlink(missing_ok=True)


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


def measure(source_dir: Path, attack, preload_api: bool, **kwargs) -> dict:
    exporter = Exporter(source_dir)
    try:
        if preload_api:  # FastAPI's one-time load is not the attack's cost
            http_get(f"http://127.0.0.1:{exporter.port}/api/v1/gpus", 10)
        time.sleep(2)
        before = rss(exporter.proc.pid)
        with RssWatch(exporter.proc.pid) as watch, Scraper(exporter.port) as scraper:
            time.sleep(1)
            what = attack(exporter.port, **kwargs)
        time.sleep(3)  # the clients are gone: what is kept
        after = rss(exporter.proc.pid)
        return {**what, "rss_before_mb": round(before / MB, 1), "rss_peak_mb": round(watch.peak / MB, 1),
                "rss_after_mb": round(after / MB, 1), "rss_kept_mb": round((after - before) / MB, 1),
                "scrapes_during": scraper.figures(), "tracebacks_in_log": exporter.tracebacks(),
                "exporter_alive": exporter.proc.poll() is None}
    finally:
        exporter.stop()


def api_first_load(source_dir: Path) -> dict:
    """Resident memory before and after the first JSON API request (FastAPI and pydantic load then),
    and the same request with --no-api."""
    out = {}
    for name, extra in (("api_on", ()), ("no_api", ("--no-api",))):
        exporter = Exporter(source_dir, *extra)
        try:
            for _ in range(3):
                http_get(f"http://127.0.0.1:{exporter.port}/metrics", 5)
            time.sleep(2)
            before = rss(exporter.proc.pid)
            status = http_get(f"http://127.0.0.1:{exporter.port}/api/v1/gpus", 30)[0]
            time.sleep(1)
            out[name] = {"status": status, "rss_before_mb": round(before / MB, 1),
                         "rss_after_mb": round(rss(exporter.proc.pid) / MB, 1),
                         "grown_mb": round((rss(exporter.proc.pid) - before) / MB, 1)}
        finally:
            exporter.stop()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 bench/http_attacks.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--source-dir", type=Path, default=ROOT, help="checkout whose exporter is attacked")
    p.add_argument("--out", type=Path, help="JSON file to write (printed too)")
    p.add_argument("--seconds", type=float, default=15.0, help="how long each attack lasts")
    p.add_argument("--connections", type=int, default=40)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--query-bytes", type=int, default=60_000)
    p.add_argument("--attacks", default="pipelining,query_strings,api_first_load",
                   help="which to run, comma-separated (api_first_load: FastAPI's one-time cost, and --no-api)")
    p.add_argument("--label", default="", help="what is measured, e.g. the commit of --source-dir")
    args = p.parse_args(argv)
    attacks = {"pipelining": (pipelining, False, dict(connections=args.connections, requests=args.requests)),
               "query_strings": (query_strings, True, dict(clients=args.clients, query_bytes=args.query_bytes))}
    commit = subprocess.run(["git", "-C", str(args.source_dir), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {"source_dir": str(args.source_dir), "label": args.label, "commit": commit or "unknown",
              "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    for name in args.attacks.split(","):
        if name == "api_first_load":
            result[name] = api_first_load(args.source_dir)
            continue
        attack, preload_api, kwargs = attacks[name]
        result[name] = measure(args.source_dir, attack, preload_api, seconds=args.seconds, **kwargs)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
