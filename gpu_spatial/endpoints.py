"""What serves a URL a user gave: the gpu-spatial exporter, or a Prometheus query API. `top --url` wants the
first and `report --prometheus` the second; both are pasted the wrong way round, and both then say which
one they were given instead of "HTTP 404". Each probe is one bounded request (hostio/answers.py) whose
answer is hostile like any other: a few kB, a few values, only a yes or no comes out."""
from __future__ import annotations

import re
import time
import urllib.parse

from hostio import answers

PROBE_BYTES = 4096
# The exporter's own paths: a URL people paste (the "serving on .../metrics" log line) names its base.
EXPORTER_PATHS = re.compile(r"/(metrics|healthz|docs|openapi\.json|api(/v1(/[^?#]*)?)?)/?$")


def with_scheme(url: str) -> str:
    """127.0.0.1:9478 (the form curl takes, and the README's curl line) as http://127.0.0.1:9478."""
    return url if "://" in url else "http://" + url


def exporter_base(url: str) -> str:
    """http://host:9478 from http://host:9478, .../metrics, .../api/v1/gpus, ... (query and fragment dropped)."""
    parts = urllib.parse.urlsplit(url)
    path = EXPORTER_PATHS.sub("", parts.path).rstrip("/")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _json(url: str, timeout: float):
    try:
        answer = answers.fetch(url, time.monotonic() + timeout, PROBE_BYTES, headers={"Accept": "application/json"})
        return answer.status, answers.parse_json(answer.body, 64)
    except (answers.AnswerError, OSError, ValueError):
        return None, None


def serves_exporter(base: str, timeout: float) -> bool:
    """Whether `base` serves the exporter's /healthz (its JSON: status and a GPU count; 503 included, while
    it has no GPU or stalled)."""
    _status, health = _json(base + "/healthz", timeout)
    return isinstance(health, dict) and health.get("status") in ("ok", "no_gpu", "stale") and "gpus" in health


def serves_prometheus_api(base: str, timeout: float) -> bool:
    """Whether `base` answers an instant query as the Prometheus HTTP API does (Prometheus, VictoriaMetrics,
    Thanos, Mimir's prefix)."""
    status, data = _json(base + "/api/v1/query?query=1", timeout)
    return status == 200 and isinstance(data, dict) and data.get("status") == "success"
