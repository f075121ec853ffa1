"""GET /metrics answered at the ASGI level from a cached render, ahead of the framework's routing.

One render per snapshot per format (Prometheus text or OpenMetrics) and per encoding (identity or
gzip): fifty scrapers of one snapshot cost one render, and a scraper that asks for gzip costs one
compression per snapshot, not one per scrape. The render runs in a worker thread, not on the event
loop: a node of 8 GPUs and 512 holders renders 2 MB in ~0.1-0.25 s (bench/RESULTS.md, "Cost per GPU"),
which every other scraper waited for at every publish. While a snapshot renders, the scrapes that
come meanwhile get the previous snapshot's body if it is under FRESH_S old; the scrape that asked for
the render, and any scraper alone (Prometheus every 15 s), gets the current snapshot."""
from __future__ import annotations

import asyncio
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
FRESH_S = 1.0  # a body rendered this recently answers the scrapes that come while the next one renders


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
        self._rendering: dict[tuple[bool, bool], tuple[int, asyncio.Future]] = {}  # key -> (version, its render)

    def collect(self):
        """Both registries as one collector: OpenMetrics must end in a single `# EOF`."""
        yield from self._registry.collect()
        # The exporter's own process metrics refresh with each snapshot too: reading /proc/self
        # on every scrape would double a scrape's cost for no news.
        yield from self._process.collect()

    def render(self, openmetrics: bool = False, gzipped: bool = False) -> bytes:
        """The body of the latest snapshot, rendered once per snapshot."""
        key = (openmetrics, gzipped)
        version = self._engine.snapshot.version
        with self._lock:
            cached = self._bodies.get(key)
        if cached is not None and cached[0] == version:
            return cached[2]
        if gzipped:
            body = gzip.compress(self.render(openmetrics), compresslevel=GZIP_LEVEL, mtime=0)
        else:
            body = _ENCODERS[openmetrics](self)
        with self._lock:
            if version >= self._bodies.get(key, (-1,))[0]:
                self._bodies[key] = (version, self._clock(), body)
        return body

    async def body(self, openmetrics: bool = False, gzipped: bool = False) -> bytes:
        """render() off the event loop: the latest snapshot's body, rendered in a worker thread; while that
        render runs, the previous snapshot's body if it is under FRESH_S old."""
        key = (openmetrics, gzipped)
        version = self._engine.snapshot.version
        cached = self._bodies.get(key)
        if cached is not None and cached[0] == version:
            return cached[2]
        running = self._rendering.get(key)
        if running is None or running[0] != version:
            future = asyncio.get_running_loop().run_in_executor(None, self.render, openmetrics, gzipped)
            running = self._rendering[key] = (version, future)
            future.add_done_callback(lambda _f, mine=running: self._rendering.get(key) is mine and self._rendering.pop(key))
        elif cached is not None and self._clock() - cached[1] < FRESH_S:
            return cached[2]
        return await asyncio.shield(running[1])


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
        body = await self._cache.body(om, gzipped)
        # No Vary header: nothing caches /metrics, and uvicorn checks every header it sends.
        headers = [(b"content-type", _CONTENT_TYPES[om]), (b"content-length", str(len(body)).encode())]
        if gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body if method == "GET" else b""})
