"""GET /metrics answered at the ASGI level from a cached render, ahead of the framework's routing.

One render per snapshot per format (Prometheus text or OpenMetrics) and per encoding (identity or
gzip): fifty scrapers of one snapshot cost one render, and a scraper that asks for gzip costs one
compression per snapshot, not one per scrape. Under steady scraping the render leaves the scrape path:
a body rendered less than FRESH_S ago answers while the next snapshot's renders in a thread of its own
(a node of 8 GPUs and 512 holders renders 2 MB in ~0.1-0.2 s, which fifty scrapers would otherwise all
wait for, at every publish: bench/RESULTS.md, "Cost per GPU"). A scrape after a quiet spell (Prometheus
every 15 s) gets the current snapshot, rendered then."""
from __future__ import annotations

import gzip
import threading
import time

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.process_collector import ProcessCollector

# Level 6 (zlib's default) is within 10% of level 9's size at a third of its time on our bodies.
GZIP_LEVEL = 6
ALLOWED_METHODS = b"GET, HEAD"
_NOT_ALLOWED = b"method not allowed: /metrics answers GET and HEAD\n"
_ENCODERS = {False: generate_latest, True: openmetrics.generate_latest}
_CONTENT_TYPES = {False: CONTENT_TYPE_LATEST.encode(), True: openmetrics.CONTENT_TYPE_LATEST.encode()}
FRESH_S = 1.0  # a body rendered this recently answers while the newer snapshot renders in the background


class MetricsCache:
    """The exposition of the latest snapshot, rendered once per (format, encoding)."""

    def __init__(self, engine, registry, clock=time.monotonic):
        self._engine = engine
        self._registry = registry
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)  # the exporter's own CPU and memory, always fresh
        self._clock = clock
        self._lock = threading.Lock()
        self._bodies: dict[tuple[bool, bool], tuple[int, float, bytes]] = {}  # key -> (version, rendered at, body)
        self._due: set[tuple[bool, bool]] = set()  # keys whose newer render was asked for
        self._wake = threading.Event()
        self._renderer: threading.Thread | None = None

    def collect(self):
        """Both registries as one collector: OpenMetrics must end in a single `# EOF`."""
        yield from self._registry.collect()
        # The exporter's own process metrics refresh with each snapshot too: reading /proc/self
        # on every scrape would double a scrape's cost for no news.
        yield from self._process.collect()

    def render(self, openmetrics: bool = False, gzipped: bool = False) -> bytes:
        """The body of the latest snapshot; or, while a body of the previous one is under FRESH_S old, that
        body, the newer one rendering in the background."""
        key = (openmetrics, gzipped)
        version = self._engine.snapshot.version
        with self._lock:
            cached = self._bodies.get(key)
            if cached is not None and cached[0] == version:
                return cached[2]
            if cached is not None and self._clock() - cached[1] < FRESH_S:
                self._due.add(key)
                self._start_renderer()
                self._wake.set()
                return cached[2]
        return self._render(key, version)

    def _render(self, key: tuple[bool, bool], version: int) -> bytes:
        openmetrics, gzipped = key
        if gzipped:
            body = gzip.compress(self._render((openmetrics, False), version), compresslevel=GZIP_LEVEL, mtime=0)
        else:
            with self._lock:
                cached = self._bodies.get(key)
            body = cached[2] if cached is not None and cached[0] == version else _ENCODERS[openmetrics](self)
        with self._lock:
            if version >= self._bodies.get(key, (-1,))[0]:
                self._bodies[key] = (version, self._clock(), body)
        return body

    def _start_renderer(self) -> None:
        if self._renderer is None:
            self._renderer = threading.Thread(target=self._render_due, name="metrics-render", daemon=True)
            self._renderer.start()

    def _render_due(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                due, self._due = sorted(self._due), set()
            version = self._engine.snapshot.version
            for key in due:
                try:
                    self._render(key, version)
                except Exception:  # noqa: BLE001 - a collector that raises fails the synchronous render too, said there
                    pass


def accepts(header: bytes, wanted: bytes) -> bool:
    """Whether an Accept or Accept-Encoding value lists `wanted` (case-insensitive) with a q above 0."""
    for item in header.lower().split(b","):
        name, _, params = item.partition(b";")
        if name.strip() == wanted:
            return _quality(params) > 0
    return False


def _quality(params: bytes) -> float:
    for param in params.split(b";"):
        key, _, value = param.partition(b"=")
        if key.strip() == b"q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


class MetricsFastPath:
    """Answers /metrics straight from the cache: under fifty concurrent scrapers the framework's
    per-request work was most of a scrape's cost. Everything else (lifespan included) goes to `app`."""

    def __init__(self, app, cache: MetricsCache):
        self.app = app
        self._cache = cache

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/metrics":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await send({"type": "http.response.start", "status": 405,
                        "headers": [(b"allow", ALLOWED_METHODS), (b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(_NOT_ALLOWED)).encode())]})
            await send({"type": "http.response.body", "body": _NOT_ALLOWED})
            return
        om = gzipped = False
        for name, value in scope["headers"]:  # the substring tests skip the parse for most clients
            if name == b"accept" and b"openmetrics" in value:
                om = accepts(value, b"application/openmetrics-text")
            elif name == b"accept-encoding" and b"gzip" in value:
                gzipped = accepts(value, b"gzip")
        body = self._cache.render(om, gzipped)
        # No Vary header: nothing caches /metrics, and uvicorn checks every header it sends.
        headers = [(b"content-type", _CONTENT_TYPES[om]), (b"content-length", str(len(body)).encode())]
        if gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body if method == "GET" else b""})
