"""The ASGI app: /metrics, /healthz and /api/v1 all read the engine's latest snapshot.

Starlette, the toolkit FastAPI is built on, without FastAPI itself: three routes need no request
models, and FastAPI with pydantic cost 15 MB of resident memory (bench/RESULTS.md, footprint)."""
from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from exporter.collectors.gpu import GpuCollector
from exporter.collectors.health import HealthCollector
from exporter.collectors.mps import MpsCollector

log = logging.getLogger(__name__)
STALE_AFTER_TICKS = 10


def build_registry(engine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(engine))
    registry.register(MpsCollector(engine))
    registry.register(HealthCollector(engine))
    return registry


class MetricsCache:
    """Renders the exposition once per snapshot: fifty scrapers of one snapshot cost one render."""

    def __init__(self, engine, registry):
        self._engine = engine
        self._registry = registry
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)  # the exporter's own CPU and memory, always fresh
        self._version = -1
        self._body = b""

    def render(self) -> bytes:
        snapshot = self._engine.snapshot
        if snapshot.version != self._version:
            # The exporter's own process metrics refresh with each snapshot too: reading /proc/self
            # on every scrape would double a scrape's cost for no news.
            self._body = generate_latest(self._registry) + generate_latest(self._process)
            self._version = snapshot.version
        return self._body


class MetricsFastPath:
    """Answers GET /metrics straight from the cache at the ASGI level, before routing: under fifty
    concurrent scrapers the framework's per-request work was most of a scrape's cost. Everything
    else (lifespan included) goes to the Starlette app."""

    def __init__(self, app, cache: MetricsCache):
        self.app = app
        self._cache = cache
        self._content_type = CONTENT_TYPE_LATEST.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/metrics" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        body = self._cache.render()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", self._content_type), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})


def snapshot_json(snapshot) -> dict:
    gpus = []
    kubelet = snapshot.kubelet
    for view in snapshot.gpus:
        tel = view.telemetry
        pods = None if kubelet is None or kubelet.error else kubelet.pods.get(view.identity.uuid, ())
        gpus.append({
            "index": view.identity.index,
            "uuid": view.identity.uuid,
            "model": view.identity.model,
            "time_utilization": view.time_utilization,
            "memory_time_utilization": view.memory_time_utilization,
            "time_window": view.time_window,
            "spatial": dataclasses.asdict(view.spatial) if view.spatial else None,
            "hidden_idle_sm_ratio": view.hidden_idle,
            "sharing_mode": view.sharing_mode,
            "diagnosis": view.diagnosis[0].to_json(view.diagnosis[1]) if view.diagnosis else None,
            "sources": [dataclasses.asdict(s) for s in view.sources],
            "pods": None if pods is None else [dataclasses.asdict(ref) for ref in pods],
            "telemetry": None if tel is None else {
                "lost": tel.lost,
                "memory_used_bytes": tel.memory_used_bytes,
                "memory_total_bytes": tel.memory_total_bytes,
                "power_watts": tel.power_watts,
                "sm_clock_hertz": tel.sm_clock_hertz,
                "temperature_celsius": tel.temperature_celsius,
                "processes": [dataclasses.asdict(p) for p in tel.processes],
                "compute_processes": None if tel.compute_processes is None else
                [dataclasses.asdict(p) for p in tel.compute_processes],
                "mig_enabled": tel.mig_enabled,
                "mig_devices": [dataclasses.asdict(m) for m in tel.mig_devices],
                "errors": list(tel.errors),
            },
        })
    return {
        "snapshot_version": snapshot.version,
        "snapshot_time": snapshot.created,
        "gpus": gpus,
        "collectors": {name: dataclasses.asdict(h) for name, h in snapshot.health.items()},
        "mps": snapshot.mps.to_json() if snapshot.mps is not None else None,
        "kubelet": kubelet.to_json() if kubelet is not None else None,
        "spool": dataclasses.asdict(snapshot.spool) if snapshot.spool is not None else None,
    }


def create_app(engine, upload=None) -> MetricsFastPath:
    """The ASGI app. `upload`: an exporter.samplers.nsys.UploadSpool, or None to leave
    POST /api/v1/nsys disabled."""

    @asynccontextmanager
    async def lifespan(_app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    async def healthz(_request):
        snapshot = engine.snapshot
        age = time.time() - snapshot.created
        healthy = snapshot.version > 0 and age < STALE_AFTER_TICKS * max(engine.interval, 1.0)
        body = {"status": "ok" if healthy else "stale", "snapshot_age_seconds": round(age, 3),
                "gpus": len(snapshot.gpus)}
        return JSONResponse(body, status_code=200 if healthy else 503)

    async def gpus(_request):
        return JSONResponse(snapshot_json(engine.snapshot))

    routes = [Route("/healthz", healthz), Route("/api/v1/gpus", gpus)]
    if upload is not None:
        routes.append(Route("/api/v1/nsys", upload.handle, methods=["POST"]))
        routes.append(Route("/api/v1/diagnose", upload.diagnose, methods=["POST"]))
    app = Starlette(routes=routes, lifespan=lifespan)
    cache = MetricsCache(engine, build_registry(engine))
    return MetricsFastPath(app, cache)
