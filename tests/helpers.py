"""Start real processes (the exporter, Prometheus, node-exporter) on 127.0.0.1 for the tests."""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def needs(*tools: str):
    """Skips a test where a tool it runs is not installed (.ci/run installs them all)."""
    import shutil

    import pytest

    missing = [t for t in tools if shutil.which(t) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed (see .ci/run)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A bound on a test's own HTTP request, not a figure it checks: generous, because on a busy 2-core CI
# machine the first /api/v1/gpus (it imports and builds the JSON API) took 5.9 s and a 5 s bound failed.
# A test that checks how fast something answers says so with its own bound.
HTTP_TIMEOUT_S = 60.0
START_TIMEOUT_S = 60.0  # the exporter's start (imports, a replay's first tick) on a loaded machine


def http_get(url: str, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
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

    def __init__(self, *args: str, env: dict | None = None, module: str = "exporter"):
        self.module = module  # a module that registers a part of its own, then runs the exporter
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--listen-address", "127.0.0.1", "--port", str(self.port), *args]
        # NVML read every --interval, as the tests' waits assume (an exporter nobody watches reads it every 10 s:
        # tests/test_cadence.py holds that); a test may pass its own.
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPU_EXPORTER_UNWATCHED_INTERVAL": "0", **(env or {})}
        self.proc = None
        self.log_path = None
        self.cwd = ROOT  # the source tree run (bench/hostile_cases.py --code measures another one)

    def __enter__(self):
        return self.start().wait_ready()

    def start(self) -> "Exporter":
        """The process started, not yet waited for (see side_by_side)."""
        import tempfile

        self.log_path = Path(tempfile.mkstemp(prefix="exporter-", suffix=".log")[1])
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, *self.args], cwd=self.cwd, env=self.env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self) -> "Exporter":
        try:
            wait_for(self._ready, START_TIMEOUT_S, what=f"exporter on {self.url}")
        except TimeoutError:
            self.__exit__(None, None, None)
            raise RuntimeError(f"exporter did not start:\n{self.log()}") from None
        return self

    def _ready(self):
        """Serving a snapshot: 200, or 503 `no_gpu` on this host without a GPU (NVML asked for)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"exporter exited with {self.proc.returncode}:\n{self.log()}")
        status, body = http_get(self.url + "/healthz", timeout=5)
        return status == 200 or (status == 503 and json.loads(body)["status"] == "no_gpu")

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


@contextlib.contextmanager
def side_by_side(*exporters: Exporter):
    """The exporters started at once, then each waited for: their imports and first ticks overlap instead
    of queueing (~2 s each on a busy machine). All are stopped on exit."""
    with contextlib.ExitStack() as stack:
        for exporter in exporters:
            stack.push(exporter.__exit__)
            exporter.start()
        for exporter in exporters:
            exporter.wait_ready()
        yield exporters


def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Samples by metric name, with their labels, from exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def sample_value(samples, name: str, **labels) -> float | None:
    """The value of the one sample of `name` whose labels include `labels`; None when there is none."""
    for have, value in samples.get(name, ()):
        if all(have.get(k) == v for k, v in labels.items()):
            return value
    return None


RULES = ROOT / "rules" / "gpu-utilization.rules.yaml"


def shorten_for(rules_text: str, to: str = "3s") -> str:
    """The rules with every `for:` cut to seconds, so a test sees alerts fire."""
    import re

    return re.sub(r"^(\s*for:) \d+m$", rf"\1 {to}", rules_text, flags=re.M)


class Prometheus:
    """Debian's Prometheus on a free port with our rules (for: shortened), scraping `jobs`
    ({job: [targets]}) every second; alerts go to `alertmanager` (host:port) when given."""

    def __init__(self, tmp: Path, jobs: dict[str, list[str]], alertmanager: str | None = None,
                 external_labels: dict | None = None, target_labels: dict | None = None, alert_for: str = "3s",
                 group_interval: str | None = None):
        import yaml

        rules = shorten_for(RULES.read_text(), alert_for)
        if group_interval:  # groups with an interval of their own (the rollups: 1m) evaluated this often instead
            rules = re.sub(r"^(\s*interval:) \S+$", rf"\1 {group_interval}", rules, flags=re.M)
        (tmp / "rules.yaml").write_text(rules)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "external_labels": external_labels or {}},
            "rule_files": [str(tmp / "rules.yaml")],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets, "labels": target_labels or {}}]}
                               for job, targets in jobs.items()],
        }
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}],
                                  "alert_relabel_configs": [{"action": "labeldrop",
                                                             "regex": "runbook_base_url|grafana_url"}]}
        (tmp / "prometheus.yaml").write_text(yaml.safe_dump(config))
        self._start(tmp)

    @classmethod
    def from_config(cls, tmp: Path) -> "Prometheus":
        """Debian's Prometheus on a free port with the configuration already written to tmp/prometheus.yaml."""
        self = cls.__new__(cls)
        self._start(tmp)
        return self

    def _start(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yaml'}",
                                      f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list:
        import urllib.parse

        status, body = http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", (expr, data)
        return data["data"]["result"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()
