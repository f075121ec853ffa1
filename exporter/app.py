"""The ASGI app: /metrics, /healthz and /api/v1 all read the engine's latest snapshot.

The JSON API is a FastAPI app whose responses are typed by exporter/api_models.py (OpenAPI at
/openapi.json, docs at /docs, committed as docs/openapi.json). In front of it, at the ASGI level: the
/metrics fast path, and LazyApi, which answers /healthz and the lifespan itself and imports FastAPI
only for the first request that needs it: FastAPI and pydantic cost 17 MB of resident memory
(bench/RESULTS.md), which a node that is only scraped and probed never pays."""
import asyncio
import dataclasses
import json
import logging
import time

from prometheus_client import CollectorRegistry

from exporter.chain import time_utilization_source
from exporter.collectors.gpu import GpuCollector
from exporter.collectors.health import HealthCollector
from exporter.collectors.mps import MpsCollector
from exporter.collectors.workloads import WorkloadCollector
from exporter.fastpath import MetricsCache, MetricsFastPath

log = logging.getLogger(__name__)
STALE_AFTER_TICKS = 10


def build_registry(engine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(engine))
    registry.register(MpsCollector(engine))
    registry.register(WorkloadCollector(engine))
    registry.register(HealthCollector(engine))
    return registry


def gpu_json(view, kubelet) -> dict:
    tel = view.telemetry
    pods = None if kubelet is None or kubelet.error else kubelet.pods.get(view.identity.uuid, ())
    return {
        "index": view.identity.index,
        "uuid": view.identity.uuid,
        "minor": view.identity.minor,
        "model": view.identity.model,
        "time_utilization": view.time_utilization,
        "time_utilization_source": time_utilization_source(view),
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
            "mig_sm_count": tel.mig_sm_count,
            "errors": list(tel.errors),
        },
    }


def snapshot_json(snapshot) -> dict:
    kubelet = snapshot.kubelet
    return {
        "snapshot_version": snapshot.version,
        "snapshot_time": snapshot.created,
        "gpus": [gpu_json(view, kubelet) for view in snapshot.gpus],
        "collectors": {name: dataclasses.asdict(h) for name, h in snapshot.health.items()},
        "mps": snapshot.mps.to_json() if snapshot.mps is not None else None,
        "kubelet": kubelet.to_json() if kubelet is not None else None,
        "spool": dataclasses.asdict(snapshot.spool) if snapshot.spool is not None else None,
        "slurm": snapshot.slurm.to_json() if snapshot.slurm is not None else None,
    }


def workload_json(record) -> dict:
    """One of the snapshot's workload records (exporter.workloads.WorkloadView) as the API's Workload."""
    return record.to_json()


def health_json(snapshot, interval: float, nvml_on: bool) -> tuple[dict, int]:
    """/healthz: 503 when the samplers stopped, or when NVML was asked for and no GPU is known (a GPU
    node whose driver is missing is not healthy); 200 with status no_gpu where no GPU is what was asked
    for (--no-nvml)."""
    age = time.time() - snapshot.created
    body = {"status": "ok", "snapshot_age_seconds": round(age, 3), "gpus": len(snapshot.gpus)}
    if snapshot.version == 0 or age >= STALE_AFTER_TICKS * max(interval, 1.0):
        return {**body, "status": "stale", "reason": "the samplers stopped publishing snapshots"}, 503
    if not snapshot.gpus:
        nvml = snapshot.health.get("nvml")
        if not nvml_on:
            return {**body, "status": "no_gpu", "reason": "NVML switched off (--no-nvml) and no export replayed"}, 200
        why = nvml.error if nvml and nvml.error else "NVML found no GPU"
        return {**body, "status": "no_gpu", "reason": f"{why}; on a host without a GPU, pass --no-nvml"}, 503
    return body, 200


UPLOAD_BODY = {"requestBody": {"required": True, "description": "an Nsight Systems export (.sqlite), raw bytes",
                               "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
UPLOADS_OFF = "uploads are off: start the exporter with --nsys-upload-token"


def nvml_enabled(engine) -> bool:
    """False with --no-nvml: no GPU is then what was asked for."""
    return getattr(engine.nvml, "enabled", True)


def api(engine, upload=None):
    """The FastAPI app of the JSON API (the engine's lifespan and the /metrics fast path are LazyApi's
    and MetricsFastPath's). `upload`: an exporter.samplers.nsys.UploadSpool, or None: then the POST
    routes answer 404 with why."""
    from fastapi import FastAPI, Path, Request, Security
    from fastapi.responses import JSONResponse
    from fastapi.security import HTTPBearer

    from exporter import api_models as models

    upload_errors = {
        400: {"model": models.Error, "description": "not a usable export (one line why)"},
        401: {"model": models.Error, "description": "missing or wrong bearer token"},
        404: {"model": models.Error, "description": "uploads are off (no --nsys-upload-token)"},
        413: {"model": models.Error, "description": "larger than --nsys-upload-max-bytes"},
    }
    app = FastAPI(title="GPU spatial exporter", version="1", redoc_url=None,
                  description="GPU time utilization next to spatial utilization (SM activity), per GPU and per "
                              "workload. Prometheus metrics: GET /metrics (text exposition; docs/metrics.md).")
    bearer = HTTPBearer(auto_error=False, description="the exporter's --nsys-upload-token")

    # LazyApi answers /healthz before this app is loaded (same health_json): declared here for the schema.
    @app.get("/healthz", response_model=models.Health, responses={503: {"model": models.Health}})
    async def healthz():
        """ok, no_gpu or stale; 503 when unhealthy (see the status's description)."""
        body, status = health_json(engine.snapshot, engine.interval, nvml_enabled(engine))
        return JSONResponse(body, status_code=status)

    @app.get("/api/v1/gpus", response_model=models.Gpus)
    async def gpus():
        """Every GPU of the latest snapshot, with every source's state and reason."""
        return snapshot_json(engine.snapshot)

    @app.get("/api/v1/gpus/{gpu}", response_model=models.Gpu,
             responses={404: {"model": models.Error, "description": "no such GPU"}})
    async def gpu(gpu: str = Path(description="NVML index (`0`) or UUID (`GPU-...`)")):
        """One GPU, by NVML index (`0`) or UUID (`GPU-...`)."""
        snapshot = engine.snapshot
        for view in snapshot.gpus:
            if gpu in (str(view.identity.index), view.identity.uuid):
                return gpu_json(view, snapshot.kubelet)
        known = ", ".join(f"{v.identity.index} ({v.identity.uuid})" for v in snapshot.gpus) or "none"
        return JSONResponse({"error": f"no GPU {gpu!r} here: give an index or a UUID; known GPUs: {known}"},
                            status_code=404)

    @app.get("/api/v1/workloads", response_model=models.Workloads)
    async def workloads():
        """Holders of each GPU (Kubernetes containers and DRA claims, Slurm jobs, Unix users) and what they do with it."""
        snapshot = engine.snapshot
        return {"snapshot_version": snapshot.version, "snapshot_time": snapshot.created,
                "workloads": [workload_json(w) for w in getattr(snapshot, "workloads", ())]}

    @app.post("/api/v1/nsys", status_code=201, response_model=models.Uploaded, responses=upload_errors,
              openapi_extra=UPLOAD_BODY)
    async def nsys_upload(request: Request, _token=Security(bearer)):
        """Upload an export into the spool the nsys source publishes from (validated first)."""
        if upload is None:
            return JSONResponse({"error": UPLOADS_OFF}, status_code=404)
        return await upload.handle(request)

    @app.post("/api/v1/diagnose", response_model=models.Diagnosed, responses=upload_errors,
              openapi_extra=UPLOAD_BODY)
    async def diagnose(request: Request, _token=Security(bearer)):
        """`nsys-ingest diagnose --json` of an uploaded export; nothing is kept."""
        if upload is None:
            return JSONResponse({"error": UPLOADS_OFF}, status_code=404)
        return await upload.diagnose(request)

    return app


class LazyApi:
    """ASGI: runs the engine over the server's lifespan and answers /healthz itself; everything else
    goes to the FastAPI app, imported and built (in a thread: scrapes go on meanwhile) on the first
    request that needs it."""

    def __init__(self, engine, upload=None):
        self._engine = engine
        self._upload = upload
        self._app = None
        self._loading = asyncio.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"] == "/healthz" and scope["method"] in ("GET", "HEAD"):
            body, status = health_json(self._engine.snapshot, self._engine.interval, nvml_enabled(self._engine))
            data = json.dumps(body, separators=(",", ":")).encode()
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data if scope["method"] == "GET" else b""})
        else:
            await (await self.app())(scope, receive, send)

    async def app(self):
        async with self._loading:
            if self._app is None:
                self._app = await asyncio.to_thread(api, self._engine, self._upload)
        return self._app

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self._engine.start()
                except Exception as exc:  # noqa: BLE001 - the server says why and exits
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self._engine.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_app(engine, upload=None) -> MetricsFastPath:
    """The ASGI app: the JSON API (loaded on first use) behind the /metrics fast path."""
    return MetricsFastPath(LazyApi(engine, upload), MetricsCache(engine, build_registry(engine)))
