"""The ASGI app: /metrics, /healthz and /api/v1 all read the engine's latest snapshot.

The JSON API is a FastAPI app whose responses are typed by exporter/api_models.py (OpenAPI at
/openapi.json, docs at /docs with Swagger UI's files served from the package, committed as
docs/openapi.json). In front of it, at the ASGI level: the /metrics fast path, and LazyApi, which
answers /healthz and the lifespan itself and imports FastAPI only for the first request that needs
it: FastAPI and pydantic cost 19 MB of resident memory (bench/RESULTS.md), which a node that is only
scraped and probed never pays; `--no-api` switches the API off altogether."""
import asyncio
import dataclasses
import functools
import importlib
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
from exporter.samplers.kubelet import listed_pods

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
    listed, omitted = listed_pods(pods or ())
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
        "pods": None if pods is None else listed,
        "pods_omitted": omitted,
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
            "memory_free_bytes": tel.memory_free_bytes,
            "memory_reserved_bytes": tel.memory_reserved_bytes,
            "memory_clock_hertz": tel.memory_clock_hertz,
            "health": None if tel.health is None else dataclasses.asdict(tel.health),
            "xid_counts": {str(xid): count for xid, count in tel.xid_counts},
            "last_xid": tel.last_xid,
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
        "holders": {name: holdings.to_json() for name, holdings in snapshot.holdings.items()},
    }


def workload_json(record) -> dict:
    """One of the snapshot's workload records (exporter.workloads.WorkloadView) as the API's Workload."""
    return record.to_json()


def ctxsw_json(states) -> list[dict] | None:
    """A workload source's per-GPU states (WorkloadAccountant.source_states: ctxsw, cupti), or None when off."""
    if states is None:
        return None
    return [{"gpu": gpu.index, "uuid": gpu.uuid, "state": s.state, "reason": s.reason,
             "window": None if s.window_end is None else [s.window_start, s.window_end]} for gpu, s in states]


def cupti_json(accountant) -> list[dict] | None:
    """The cupti source's per-GPU states (WorkloadAccountant.source_states) with each MPS GPU's scaling
    (WorkloadAccountant.cupti_gpus), or None when off."""
    states = ctxsw_json(None if accountant is None else accountant.source_states.get("cupti"))
    if states is None:
        return None
    scaling = {gpu.uuid: s.to_json() for gpu, s in accountant.cupti_gpus}
    return [{**state, **{k: v for k, v in scaling.get(state["uuid"], {}).items() if k != "window"}}
            for state in states]


def health_json(snapshot, interval: float, nvml_on: bool) -> tuple[dict, int]:
    """/healthz: 503 when the samplers stopped, or when NVML was asked for and no GPU is known (a GPU
    node whose driver is missing is not healthy); 200 with status no_gpu where no GPU is what was asked
    for (--no-nvml); 200 with status gpu_lost and which GPUs, where one does not answer NVML."""
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
    lost = [view.identity for view in snapshot.gpus if view.telemetry is not None and view.telemetry.lost]
    if lost:
        # 200: the exporter is sound and serves the other GPUs; a liveness probe restarting it brings none back.
        named = ", ".join(f"GPU {gpu.index} ({gpu.uuid})" for gpu in lost)
        return {**body, "status": "gpu_lost", "lost": [{"gpu": gpu.index, "uuid": gpu.uuid, "model": gpu.model}
                                                       for gpu in lost],
                "reason": f"{named} {'is' if len(lost) == 1 else 'are'} lost (NVML GPU_IS_LOST: fell off the bus?); "
                          f"the other {len(snapshot.gpus) - len(lost)} GPU(s) are served"}, 200
    return body, 200


UPLOAD_BODY = {"requestBody": {"required": True, "description": "an Nsight Systems export (.sqlite), raw bytes",
                               "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
UPLOADS_OFF = "uploads are off: start the exporter with --nsys-upload-token-file"
API_OFF = b'{"error":"the JSON API is off (--no-api): this exporter serves /metrics and /healthz only"}'
# GET /: where a browser pointed at the exporter's port learns what it serves.
INDEX = ("<!doctype html><html><head><meta charset='utf-8'><title>gpu-spatial exporter</title></head><body>"
         "<h1>gpu-spatial exporter</h1><ul>"
         "<li><a href='/metrics'>/metrics</a>: Prometheus text (scrape this)</li>"
         "<li><a href='/healthz'>/healthz</a>: health</li>{api}</ul></body></html>\n")
INDEX_API = ("<li><a href='/api/v1/gpus'>/api/v1/gpus</a>: the snapshot as JSON</li>"
             "<li><a href='/api/v1/workloads'>/api/v1/workloads</a>: per holder and GPU</li>"
             "<li><a href='/docs'>/docs</a>: the JSON API, browsable</li>")
INDEX_NO_API = "<li>the JSON API is off (--no-api)</li>"
# Swagger UI's files, as the fastapi-offline package ships them (Swagger UI 5, Apache-2.0): /docs
# needs no CDN, so it works on an air-gapped cluster.
DOCS_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}


@functools.cache
def asset(path) -> bytes:
    """A /docs asset's bytes, read on its first request and shared by every answer after (1.6 MB in all)."""
    return path.read_bytes()
# Endpoints that read a query string; every other request's is dropped before the framework parses it.
TAKES_QUERY: frozenset = frozenset()


def snapshot_interval(engine) -> float:
    """The longest time between two snapshots of a working engine (NVML's loop slows down while unwatched)."""
    return getattr(engine, "longest_interval", engine.interval)


def nvml_enabled(engine) -> bool:
    """False with --no-nvml: no GPU is then what was asked for."""
    return getattr(engine.nvml, "enabled", True)


def api(engine, upload=None):
    """The FastAPI app of the JSON API (the engine's lifespan and the /metrics fast path are LazyApi's
    and MetricsFastPath's). `upload`: an exporter.uploads.UploadSpool, or None: then the POST
    routes answer 404 with why."""
    from fastapi import FastAPI, Path, Request, Security
    from fastapi.responses import JSONResponse
    from fastapi.security import HTTPBearer

    from exporter import api_models as models
    from exporter.holders import labels

    if models.HOLDER_LABELS != labels():  # a kind registered after the models were built: its labels too
        models = importlib.reload(models)

    upload_errors = {
        400: {"model": models.Error, "description": "not a usable export (one line why)"},
        401: {"model": models.Error, "description": "missing or wrong bearer token"},
        404: {"model": models.Error, "description": "uploads are off (no --nsys-upload-token-file)"},
        413: {"model": models.Error, "description": "larger than --nsys-upload-max-bytes"},
    }
    app = FastAPI(title="GPU spatial exporter", version="1", redoc_url=None, docs_url=None,
                  description="GPU time utilization next to spatial utilization (SM activity), per GPU and per "
                              "workload. Prometheus metrics: GET /metrics (text exposition; docs/metrics.md).")
    bearer = HTTPBearer(auto_error=False, description="the token in the exporter's --nsys-upload-token-file")

    # LazyApi answers /healthz before this app is loaded (same health_json): declared here for the schema.
    @app.get("/healthz", response_model=models.Health, responses={503: {"model": models.Health}})
    async def healthz():
        """ok, gpu_lost, no_gpu or stale; 503 when unhealthy (see the status's description)."""
        body, status = health_json(engine.snapshot, snapshot_interval(engine), nvml_enabled(engine))
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
                "workloads": [workload_json(w) for w in getattr(snapshot, "workloads", ())],
                "ctxsw": ctxsw_json(getattr(engine.workloads, "ctxsw_states", None)),
                "cupti": cupti_json(engine.workloads),
                "ledgers": [book.to_json() for book in getattr(engine.workloads, "gpu_ledgers", ())]}

    @app.post("/api/v1/nsys", status_code=201, response_model=models.Uploaded, openapi_extra=UPLOAD_BODY,
              responses={**upload_errors, 409: {"model": models.Error, "description": "the exporter runs --replay: "
                                                "it publishes no other export"}})
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

    serve_docs(app)
    return app


def serve_docs(app) -> None:
    """/docs: FastAPI's Swagger UI page, its script, style and icon served from the installed package."""
    from importlib.resources import files
    from pathlib import Path as FilePath

    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import JSONResponse, Response

    try:
        static = FilePath(str(files("fastapi_offline") / "static"))
    except ModuleNotFoundError:  # a source tree run without `pip install .`: the rest of the API works
        static = None

    @app.get("/docs", include_in_schema=False)
    async def docs():
        if static is None:
            return JSONResponse({"error": "Swagger UI's files are missing: pip install fastapi-offline (or the "
                                          "project: pip install .); /openapi.json is served"}, status_code=404)
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - API",
                                   swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/assets/swagger-ui.css",
                                   swagger_favicon_url="/docs/assets/favicon.png")

    @app.get("/docs/assets/{name}", include_in_schema=False)
    async def docs_asset(name: str):
        if name not in DOCS_ASSETS or static is None:
            return JSONResponse({"error": f"no asset {name!r}: /docs uses {', '.join(DOCS_ASSETS)}"}, status_code=404)
        # One copy in memory for every reader: a client that does not read holds a reference to it, where
        # streamed from the file it held chunks of its own (400 such clients: +41 MB).
        return Response(asset(static / name), media_type=DOCS_ASSETS[name], headers={"cache-control": "max-age=86400"})


class LazyApi:
    """ASGI: runs the engine over the server's lifespan and answers /healthz itself; everything else
    goes to the FastAPI app, imported and built (in a thread: scrapes go on meanwhile) on the first
    request that needs it, or, with the API off, is answered 404 with why."""

    def __init__(self, engine, upload=None, api_on: bool = True):
        self._engine = engine
        self._upload = upload
        self._api_on = api_on
        self._app = None
        self._loading = asyncio.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"] == "/healthz" and scope["method"] in ("GET", "HEAD"):
            body, status = health_json(self._engine.snapshot, snapshot_interval(self._engine), nvml_enabled(self._engine))
            await _send_body(send, scope, status, json.dumps(body, separators=(",", ":")).encode())
        elif scope["type"] == "http" and scope["path"] == "/" and scope["method"] in ("GET", "HEAD"):
            page = INDEX.format(api=INDEX_API if self._api_on else INDEX_NO_API).encode()
            await _send_body(send, scope, 200, page, b"text/html; charset=utf-8")
        elif not self._api_on:
            await _send_body(send, scope, 404, API_OFF)
        else:
            if scope["type"] == "http" and scope["path"] not in TAKES_QUERY:
                scope["query_string"] = b""  # parsing 60 KB of `a=1&` cost the framework 28x a plain request
            if scope["type"] == "http" and scope["path"].startswith("/api/"):
                watch = getattr(self._engine, "watch", None)
                if watch:  # top and API clients want values at --interval; Prometheus' scrapes do not ask for it
                    watch()
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


async def _send_body(send, scope, status: int, data: bytes, content_type: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data if scope["method"] != "HEAD" else b""})


def create_app(engine, upload=None, api_on: bool = True) -> MetricsFastPath:
    """The ASGI app: the JSON API (loaded on first use, or off) behind the /metrics fast path."""
    return MetricsFastPath(LazyApi(engine, upload, api_on), MetricsCache(engine, build_registry(engine)))
