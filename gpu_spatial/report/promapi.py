"""A small client for the Prometheus HTTP query API, which Thanos, Mimir and VictoriaMetrics also serve.

Everything the server says is hostile input: each whole request has a deadline, each body a size cap,
what it parses into a cap of values (hostio/answers.py, docs/limits.md), and every failure
becomes one ReportError line that names the problem and the fix.
"""
from __future__ import annotations

import base64
import os
import re
import time
import urllib.parse
from pathlib import Path

from hostio import answers

from ..endpoints import exporter_base, serves_exporter

TOKEN_ENV = "GPU_SPATIAL_PROMETHEUS_TOKEN"
BASIC_AUTH_ENV = "GPU_SPATIAL_PROMETHEUS_BASIC_AUTH"


class ReportError(Exception):
    """A problem the user can fix: printed as one line, exit status 2."""


class TooManySamples(ReportError):
    """The server's per-query sample limit (Prometheus --query.max-samples, VictoriaMetrics
    -search.maxSamplesPerQuery): the caller asks again for a shorter window."""


SAMPLE_LIMIT = re.compile(r"too many samples|maxSamplesPerQuery|max-samples|cannot select more than", re.I)


def read_secret(path: str, what: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from None
    if not text:
        raise ReportError(f"the {what} file {path} is empty")
    return text


def auth_header(bearer_token_file: str | None, basic_auth_file: str | None) -> str | None:
    """Authorization header from the flags, else from the environment; a file wins over the environment."""
    if bearer_token_file and basic_auth_file:
        raise ReportError("give either --bearer-token-file or --basic-auth-file, not both")
    token = read_secret(bearer_token_file, "bearer token") if bearer_token_file else None
    basic = read_secret(basic_auth_file, "basic auth") if basic_auth_file else None
    if token is None and basic is None:
        token = os.environ.get(TOKEN_ENV) or None
        basic = None if token else (os.environ.get(BASIC_AUTH_ENV) or None)
    if token:
        return f"Bearer {token}"
    if basic:
        if ":" not in basic:
            raise ReportError("basic auth must be USER:PASSWORD (--basic-auth-file or " + BASIC_AUTH_ENV + ")")
        return "Basic " + base64.b64encode(basic.encode()).decode()
    return None


class PrometheusAPI:
    def __init__(self, url: str, authorization: str | None = None, timeout: float = 60.0,
                 max_bytes: int = 64 << 20):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ReportError(f"--prometheus {url!r} is not an http(s) URL (e.g. http://prometheus:9090)")
        self.url = url.rstrip("/")
        self.authorization = authorization
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_values = max_bytes // answers.BYTES_PER_VALUE
        self.requests = 0
        self.dialect = ""  # "promql" once the server refused a MetricsQL function (account.sightings)

    def _call(self, path: str, params: dict, post: bool = True) -> dict:
        """POST where the API allows it (long matchers stay out of URLs and logs), GET elsewhere. The whole
        request (connect, headers, body) ends within --timeout; redirects are never followed (they would carry
        the Authorization header wherever they point)."""
        encoded = urllib.parse.urlencode(params, doseq=True)
        headers = {"Accept": "application/json"}
        if post:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if self.authorization:
            headers["Authorization"] = self.authorization
        self.requests += 1
        status = None
        try:
            answer = answers.fetch(self.url + path + ("" if post else f"?{encoded}"),
                                        time.monotonic() + self.timeout, self.max_bytes,
                                        "POST" if post else "GET", encoded.encode() if post else b"", headers)
            status = answer.status
            if 300 <= status < 400:
                raise ReportError(f"{self.url} redirects (HTTP {status}) to {answer.headers.get('location', '?')[:200]}: "
                                  f"give --prometheus the final URL (redirects are not followed)")
            if status in (401, 403):
                raise ReportError(f"{self.url} refused the credentials (HTTP {status}): set --bearer-token-file, "
                                  f"{TOKEN_ENV}, or --basic-auth-file")
            if status == 404 and serves_exporter(exporter_base(self.url), self.timeout):
                raise ReportError(f"{self.url} is a gpu-spatial exporter, not a Prometheus query API: the report "
                                  f"reads the Prometheus (or VictoriaMetrics, Thanos, Mimir) that scrapes it, e.g. "
                                  f"--prometheus http://127.0.0.1:9090")
            data = answers.parse_json(answer.body, self.max_values)
        except answers.AnswerError as exc:
            raise self._answer_error(exc, path, status) from None
        except OSError as exc:
            raise ReportError(f"cannot reach {self.url} ({getattr(exc, 'strerror', None) or exc}): check --prometheus "
                              f"and that the server is up (timeout {self.timeout:g} s, --timeout)") from None
        if not isinstance(data, dict) or data.get("status") != "success":
            error = str(data.get("error", "no error message") if isinstance(data, dict) else data)[:300]
            if SAMPLE_LIMIT.search(error):
                raise TooManySamples(f"{self.url} refused to read that many samples in one query ({error}): raise "
                                     f"its limit or narrow --match")
            raise ReportError(f"{self.url} rejected the query (HTTP {status}): {error}")
        return data.get("data")

    def _answer_error(self, exc: answers.AnswerError, path: str, status: int | None) -> ReportError:
        if exc.kind == "slow":
            return ReportError(f"{self.url} took longer than {self.timeout:g} s to answer one query: narrow the "
                               f"range or --match, or raise --timeout")
        if exc.kind == "large":
            return ReportError(f"{self.url} answered one query with {exc} (--max-response-mib {self.max_bytes >> 20} "
                               f"allows {self.max_bytes} bytes and {self.max_values} JSON values): narrow --match or "
                               f"the range, or raise --max-response-mib")
        if exc.kind == "json" and status is not None and status >= 500:
            return ReportError(f"{self.url} failed (HTTP {status}): try again, or a shorter range")
        if exc.kind == "json":
            return ReportError(f"{self.url}{path} answered HTTP {status} with something that is not the Prometheus "
                               f"JSON API ({exc}): is --prometheus the API's base URL?")
        return ReportError(f"{self.url} answered with something that is not HTTP ({exc}): is --prometheus the API's "
                           f"base URL?")

    def query(self, expr: str, at: float) -> list[dict]:
        """An instant vector: [{"metric": {...}, "value": [t, "v"]}]."""
        data = self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        return vector(data, expr)

    def query_matrix(self, expr: str, at: float) -> list[dict]:
        """A range vector at one time (its raw samples): [{"metric": {...}, "values": [[t, "v"], ...]}]."""
        data = self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise ReportError(f"the answer to {expr[:80]!r} is not a range vector: is --prometheus a Prometheus API?")
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        data = self._call("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                  "step": f"{step:.3f}"})
        if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise ReportError(f"{self.url} answered a range query without a matrix: is it a Prometheus API?")
        return data["result"]

    def label_values(self, label: str, selector: str, start: float, end: float) -> list:
        """The values `label` takes on the series of `selector` between start and end (a few bytes back)."""
        data = self._call(f"/api/v1/label/{label}/values", {"match[]": selector, "start": f"{start:.3f}",
                                                             "end": f"{end:.3f}"}, post=False)
        return data if isinstance(data, list) else []

    def targets(self) -> list:
        """The active scrape targets (Prometheus, VictoriaMetrics); ReportError where there is no targets API."""
        data = self._call("/api/v1/targets", {"state": "active"}, post=False)
        targets = data.get("activeTargets") if isinstance(data, dict) else None
        return targets if isinstance(targets, list) else []

    def runtime_info(self) -> dict:
        """Prometheus' runtime information (its start time); ReportError where the server has none."""
        data = self._call("/api/v1/status/runtimeinfo", {}, post=False)
        return data if isinstance(data, dict) else {}

    def configuration(self) -> dict:
        """Prometheus' configuration as it rendered it ({"yaml": ...}); ReportError where the server has none."""
        data = self._call("/api/v1/status/config", {}, post=False)
        return data if isinstance(data, dict) else {}

    def metric_names(self, names: list[str], start: float, end: float) -> set[str]:
        """Which of `names` have series between start and end (the label values API: a few bytes back)."""
        found = self.label_values("__name__", '{__name__=~"%s"}' % "|".join(names), start, end)
        return set(found) & set(names)


def vector(data, expr: str) -> list[dict]:
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise ReportError(f"the answer to {expr[:80]!r} is not an instant vector: is --prometheus a Prometheus API?")
    return data["result"]
