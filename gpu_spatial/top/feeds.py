"""Where the snapshot comes from: the exporter's samplers in this process, or a running exporter's
JSON API. Both hand the same JSON to state.screen_state, so both paths render the same."""
from __future__ import annotations

import threading
import time
import urllib.parse

from gpu_spatial.endpoints import exporter_base, serves_prometheus_api, with_scheme
from gpu_spatial.top.state import LocalProcesses, ScreenState, mapping, screen_state
from hostio import answers

MAX_BODY_BYTES = 16 * 1024 * 1024  # a snapshot of 8 GPUs with hundreds of processes is ~100 kB
STALE_AFTER_TICKS = 10  # as the exporter's /healthz


def clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall))


class InProcessFeed:
    """The exporter's engine, built from the exporter's own flags, sampled in this process."""

    def __init__(self, exporter_args):
        from exporter.__main__ import build_engine

        self.engine, _upload = build_engine(exporter_args)
        self.engine.unwatched_interval = None  # top watches as long as it runs: every --interval
        self.interval = exporter_args.interval
        self.replayed = bool(exporter_args.replay or exporter_args.nvml_replay)
        # A replayed pid is not this host's: never name a local process's user for it.
        self.local = None if exporter_args.nvml_replay else LocalProcesses(exporter_args.proc_root)
        self.origin = "in-process" + (" (replay)" if self.replayed else "")
        self._cached: tuple[int, ScreenState] | None = None

    def start(self) -> None:
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()

    def state(self) -> ScreenState:
        from exporter.app import snapshot_json, workload_json

        snapshot = self.engine.snapshot
        if snapshot.version == 0:
            return ScreenState(self.origin, problem="waiting for the first sample")
        if self._cached is None or self._cached[0] != snapshot.version:
            data = {**snapshot_json(snapshot), "workloads": [workload_json(w) for w in snapshot.workloads],
                    "ledgers": [book.to_json() for book in getattr(self.engine.workloads, "gpu_ledgers", ())]}
            self._cached = (snapshot.version, screen_state(data, self.origin, self.local))
        state = self._cached[1]
        age = time.time() - snapshot.created
        if age > STALE_AFTER_TICKS * max(self.interval, 1.0):
            return ScreenState(self.origin, problem=f"samplers stalled: last snapshot {age:.0f} s ago")
        return state


class WrongServer(ValueError):
    """The URL answers, but cannot be read by top --url: the exporter with its JSON API switched off
    (--no-api), or a Prometheus. Said once, never retried."""


class HttpFeed:
    """Polls GET {url}/api/v1/gpus in a thread, so keys answer while a slow exporter times out."""

    def __init__(self, url: str, interval: float, timeout: float = 2.0):
        self.url = exporter_base(with_scheme(url))
        self.interval = interval
        self.timeout = timeout
        host = urllib.parse.urlsplit(self.url).hostname or ""
        # Its pids are this host's only when the exporter runs here.
        self.local = LocalProcesses() if host in ("localhost", "127.0.0.1", "::1") else None
        self.origin = self.url
        self._lock = threading.Lock()
        self._state = ScreenState(self.origin, problem=f"connecting to {self.url}")
        self._failing_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="top-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def state(self) -> ScreenState:
        with self._lock:
            return self._state

    def _get(self, path: str):
        """The JSON of GET path, the whole request within the timeout and bounded in bytes and parsed values;
        or raises OSError, ValueError or AnswerError with a one-line reason (ApiOff: the API is switched off)."""
        answer = answers.fetch(self.url + path, time.monotonic() + self.timeout, MAX_BODY_BYTES,
                                    headers={"Accept": "application/json"})
        if answer.status == 404 and b"--no-api" in answer.body[:4096]:
            raise WrongServer(f"the exporter at {self.url} answers, but its JSON API is off (--no-api): top --url "
                              "reads /api/v1/gpus; start it without --no-api, or run gpu-spatial top on that host")
        if answer.status in (400, 404) and serves_prometheus_api(self.url, self.timeout):  # VictoriaMetrics: 400
            raise WrongServer(f"{self.url} is a Prometheus query API, not a gpu-spatial exporter: top --url reads "
                              f"the exporter's JSON API (e.g. --url http://127.0.0.1:9478); the account from this "
                              f"Prometheus: gpu-spatial report --prometheus {self.url}")
        if answer.status != 200:
            raise ValueError(f"HTTP {answer.status}")
        return answers.parse_json(answer.body, MAX_BODY_BYTES // answers.BYTES_PER_VALUE)

    def fetch(self) -> dict:
        """One snapshot with its workload records (who holds each pid)."""
        data = self._get("/api/v1/gpus")
        if not isinstance(data, dict) or "gpus" not in data:
            raise ValueError("not a gpu-spatial exporter (no 'gpus' in /api/v1/gpus)")
        try:
            workloads = mapping(self._get("/api/v1/workloads"))
            data["workloads"], data["ledgers"] = workloads.get("workloads"), workloads.get("ledgers")
        except ValueError:  # an exporter from before /api/v1/workloads (HTTP 404): no holders shown
            pass
        return data

    def poll_once(self) -> None:
        try:
            state = screen_state(self.fetch(), self.origin, self.local)
            self._failing_since = None
        except WrongServer as exc:
            self._failing_since = None
            state = ScreenState(self.origin, problem=str(exc), refused=True)
        except (OSError, ValueError, answers.AnswerError) as exc:  # refused, reset, slow, large, not JSON
            now = time.time()
            self._failing_since = self._failing_since or now
            reason = getattr(exc, "reason", None) or exc
            state = ScreenState(self.origin, problem=f"exporter at {self.url} not answering since "
                                f"{clock(self._failing_since)}: retrying ({reason})")
        with self._lock:
            self._state = state

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.05, self.interval - (time.monotonic() - started)))
