"""Start real processes (the exporter, Prometheus, node-exporter) on 127.0.0.1 for the tests."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"{what} not met within {timeout} s (last: {last!r})")


class Exporter:
    """`python -m exporter` as a child process on a free port, stopped on exit."""

    def __init__(self, *args: str, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--listen-address", "127.0.0.1", "--port", str(self.port), *args]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = None
        self.log_path = None

    def __enter__(self):
        import tempfile

        self.log_path = Path(tempfile.mkstemp(prefix="exporter-", suffix=".log")[1])
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter", *self.args], cwd=ROOT, env=self.env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_for(self._ready, 20, what=f"exporter on {self.url}")
        except TimeoutError:
            self.__exit__(None, None, None)
            raise RuntimeError(f"exporter did not start:\n{self.log()}") from None
        return self

    def _ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"exporter exited with {self.proc.returncode}:\n{self.log()}")
        return http_get(self.url + "/healthz", timeout=1)[0] == 200

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path else ""

    def metrics(self) -> str:
        status, body = http_get(self.url + "/metrics")
        assert status == 200, body
        return body.decode()

    def gpus(self) -> dict:
        status, body = http_get(self.url + "/api/v1/gpus")
        assert status == 200, body
        return json.loads(body)

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.poll() is None:
                self.proc.kill()
        if self.log_path:
            self._log.close()


def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Samples by metric name, with their labels, from exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out
