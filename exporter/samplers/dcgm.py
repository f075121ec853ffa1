"""DCGM profiling (DCP) spatial source: from a dcgm-exporter endpoint, or DCGM's Python bindings.

GPUs are matched by UUID, never by index: dcgm-exporter's gpu label is DCGM's own numbering, which
need not be NVML's (CUDA_VISIBLE_DEVICES, MIG, containers).
"""
from __future__ import annotations

import logging
import time

from hostio import answers
from exporter.config import duration
from exporter.sampler import SamplerDefaults
from exporter.snapshot import ERROR, OK, UNSUPPORTED, CollectorHealth, LogOnce, SourceResult, SpatialReading, as_ratio

log = logging.getLogger(__name__)

# Our quantity -> (DCGM field id, legacy exporter name). DCGM 4.6 renamed fields with a unit suffix
# (e.g. ..._RATIO); a name is accepted when it is the legacy one or starts with it plus a suffix.
FIELDS = {
    "graphics_engine_active": (1001, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    "sm_active": (1002, "DCGM_FI_PROF_SM_ACTIVE"),
    "sm_occupancy": (1003, "DCGM_FI_PROF_SM_OCCUPANCY"),
    "tensor_active": (1004, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    "dram_active": (1005, "DCGM_FI_PROF_DRAM_ACTIVE"),
}
PERCENT_SUFFIXES = ("_PERCENT", "_PCT")
NOT_LOADED = "module of DCGM that is not currently loaded"
# dcgm-exporter answers ~30 KB per GPU with its default counters: 8 MB is far past any real host,
# and parsing more would hold the source's thread and memory for nothing.
MAX_BODY_BYTES = 8 * 1024 * 1024
# dcgm-exporter keeps serving the last values it read when its host engine restarts or hangs. Real
# profiling counters of a busy GPU never repeat to the last bit for this long; an idle GPU's zeros do.
DEFAULT_FROZEN_AFTER_S = 30.0


def quantity_of(metric_name: str) -> tuple[str, float] | None:
    """(our quantity, multiplier to a ratio) for a dcgm-exporter metric name, or None."""
    for quantity, (_, legacy) in FIELDS.items():
        if metric_name == legacy:
            return quantity, 1.0
        if metric_name.startswith(legacy + "_"):
            suffix = metric_name[len(legacy):]
            if suffix.upper().endswith(("_TOTAL", "_BUCKET", "_COUNT", "_SUM", "_CREATED")):
                continue
            return quantity, 0.01 if suffix.endswith(PERCENT_SUFFIXES) else 1.0
    return None


def parse_exposition(text: str) -> dict[str, dict]:
    """Profiling values per GPU UUID from dcgm-exporter's /metrics text.

    Returns {uuid: {"index": str, "model": str, quantity: ratio...}}. Raises ValueError on text that
    is not Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    gpus: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            match = quantity_of(sample.name)
            if match is None:
                continue
            labels = sample.labels
            uuid = labels.get("UUID") or labels.get("uuid")
            if not uuid or labels.get("GPU_I_ID"):  # MIG instances are not the whole GPU
                continue
            entry = gpus.setdefault(uuid, {"index": labels.get("gpu", ""),
                                           "model": labels.get("modelName", labels.get("model_name", ""))})
            value = as_ratio(sample.value * match[1])
            if value is not None:
                entry[match[0]] = value
    return gpus


class _DcgmSource(SamplerDefaults):
    """What both ways of reading DCGM keep: results per GPU UUID, health, the window a value covers."""

    name = "dcgm"

    def __init__(self, window_s: float, interval: float, nvml, frozen_after_s: float = DEFAULT_FROZEN_AFTER_S):
        self.window_s = window_s
        self.interval = interval
        self.frozen_after_s = frozen_after_s
        self._nvml = nvml
        self.results: dict[str, SourceResult] = {}
        self.health = CollectorHealth(False, 0.0, "not sampled yet")
        self._log = LogOnce(log)
        self._unchanged_since: dict[str, tuple[tuple, float]] = {}  # uuid -> (values, first seen)

    def _frozen(self, uuid: str, values: dict, now: float) -> bool:
        """True when non-zero values have repeated exactly for `frozen_after_s`."""
        key = tuple(sorted(values.items()))
        seen = self._unchanged_since.get(uuid)
        if seen is None or seen[0] != key:
            self._unchanged_since[uuid] = (key, now)
            return False
        return any(values.values()) and now - seen[1] >= self.frozen_after_s

    def _readings(self, gpus: dict[str, dict], known: set[str], origin: str) -> dict[str, SourceResult]:
        """Results per GPU from profiling values per UUID; GPUs this host does not have are left out."""
        end = time.time()
        strangers = sorted(set(gpus) - known) if known else []
        if strangers:
            self._log.problem("dcgm unknown GPUs", f"{origin} serves GPUs NVML does not see here, ignored: "
                              f"{', '.join(strangers)} (another node's dcgm-exporter?)", kind="unknown")
        else:
            self._log.clear("dcgm unknown GPUs")
        results = {}
        for uuid in known or set(gpus):
            values = gpus.get(uuid)
            if not values or "sm_active" not in values:
                results[uuid] = SourceResult(UNSUPPORTED, f"{origin} serves no profiling fields for this GPU "
                                             "(profiling unsupported, or DCP fields not enabled)")
                continue
            fields = {q: values.get(q) for q in FIELDS}
            if self._frozen(uuid, fields, end):
                results[uuid] = SourceResult(ERROR, f"{origin} has served the same values for {self.frozen_after_s:.0f} s "
                                             "or more: frozen (host engine restarted or hung?)")
                self._log.problem(f"dcgm frozen {uuid}", results[uuid].reason)
                continue
            self._log.clear(f"dcgm frozen {uuid}", "values move again")
            results[uuid] = SourceResult(OK, origin, SpatialReading("dcgm", end - self.window_s, end, **fields))
        return results


class DcgmExporterSource(_DcgmSource):
    """Scrapes dcgm-exporter with a timeout; a down, slow or garbled endpoint is an error state."""

    def __init__(self, url: str, timeout: float = 2.0, window_s: float = 1.0, interval: float = 1.0, nvml=None,
                 frozen_after_s: float = DEFAULT_FROZEN_AFTER_S):
        super().__init__(window_s, interval, nvml, frozen_after_s)
        self.url = url
        self.timeout = timeout

    @property
    def max_tick_seconds(self) -> float:
        """The engine's deadline for a tick (exporter/engine.py): `timeout` bounds the whole request, so a
        dcgm-exporter that trickles its answer is cut off at it; the engine's deadline is the last resort."""
        return 2 * self.timeout + 5

    def _fetch(self) -> str:
        answer = answers.fetch(self.url, time.monotonic() + self.timeout, MAX_BODY_BYTES,
                                    headers={"Accept": "text/plain"})
        if answer.status != 200:
            raise answers.AnswerError(f"HTTP {answer.status}", "status")
        if NOT_LOADED.encode() in answer.body:
            raise LookupError("DCGM's profiling module is not loaded: " + answer.body.decode(errors="replace")[:200])
        return answer.body.decode("utf-8", errors="replace")

    def tick(self) -> None:
        started = time.perf_counter()
        known = {gpu.uuid for gpu in getattr(self._nvml, "gpus", ())}
        try:
            gpus = parse_exposition(self._fetch())
        except LookupError as exc:  # profiling unsupported on this host: a state, not a failure
            self.results = {uuid: SourceResult(UNSUPPORTED, str(exc)) for uuid in known}
            self.health = CollectorHealth(True, time.perf_counter() - started)
            self._log.problem("dcgm", str(exc), logging.INFO)
            return
        except (answers.AnswerError, OSError, ValueError) as exc:
            reason = _reason(exc, self.url, self.timeout)
            self._unchanged_since.clear()  # values after an outage are judged afresh
            self.results = {uuid: SourceResult(ERROR, reason) for uuid in known}
            self.health = CollectorHealth(False, time.perf_counter() - started, reason)
            self._log.problem("dcgm", reason)
            return
        self._log.clear("dcgm", f"dcgm-exporter at {self.url} answers")
        self.results = self._readings(gpus, known, f"dcgm-exporter {self.url}")
        self.health = CollectorHealth(True, time.perf_counter() - started)


def _reason(exc: Exception, url: str, timeout: float) -> str:
    kind = getattr(exc, "kind", None)  # answers.AnswerError
    if kind == "slow" or isinstance(exc, TimeoutError):
        return f"dcgm-exporter at {url} did not answer within {timeout} s"
    if kind == "status":
        return f"dcgm-exporter at {url} answered {exc}"
    if kind == "large":
        return f"dcgm-exporter at {url} answered more than {MAX_BODY_BYTES // 2**20} MB: not dcgm-exporter's /metrics?"
    if kind is not None or isinstance(exc, ValueError):
        return f"dcgm-exporter at {url} answered something that is not Prometheus text ({exc})"
    return f"dcgm-exporter at {url} unreachable: {getattr(exc, 'strerror', None) or exc}"


class DcgmBindingsSource(_DcgmSource):
    """Reads the profiling fields through DCGM's own Python bindings (pydcgm) from an nv-hostengine.

    Only where the bindings import (they ship with DCGM, not on PyPI); fields are watched once at
    start and read as latest values each tick."""

    def __init__(self, host: str, window_s: float = 1.0, interval: float = 1.0, nvml=None,
                 frozen_after_s: float = DEFAULT_FROZEN_AFTER_S):
        import dcgm_structs  # noqa: F401 - raises ImportError where DCGM is not installed
        import pydcgm

        super().__init__(window_s, interval, nvml, frozen_after_s)
        self._handle = pydcgm.DcgmHandle(ipAddress=host)
        self._system = self._handle.GetSystem()
        self._group = self._system.GetDefaultGroup()
        field_ids = [fid for fid, _ in FIELDS.values()]
        self._fields = pydcgm.DcgmFieldGroup(self._handle, name="gpu-spatial-exporter", fieldIds=field_ids)
        self._group.samples.WatchFields(self._fields, int(interval * 1e6), 60.0, 0)
        self._uuids = {gpu_id: self._system.discovery.GetGpuAttributes(gpu_id).identifiers.uuid
                       for gpu_id in self._group.GetGpuIds()}

    def tick(self) -> None:
        started = time.perf_counter()
        try:
            latest = self._group.samples.GetLatest(self._fields).values
        except Exception as exc:  # noqa: BLE001 - any DCGM error is this source's error state
            reason = f"DCGM host engine: {exc}"
            state = UNSUPPORTED if "not currently loaded" in str(exc) or "NOT_SUPPORTED" in str(exc) else ERROR
            self.results = {uuid: SourceResult(state, reason) for uuid in self._uuids.values()}
            self.health = CollectorHealth(state != ERROR, time.perf_counter() - started, reason)
            self._log.problem("dcgm", reason)
            return
        by_id = {fid: quantity for quantity, (fid, _) in FIELDS.items()}
        gpus = {}
        for gpu_id, fields in latest.items():
            values = gpus.setdefault(self._uuids.get(gpu_id), {})
            for fid, series in fields.items():
                if fid in by_id and len(series) and not getattr(series[-1], "isBlank", False):
                    values[by_id[fid]] = as_ratio(float(series[-1].value))
        known = {gpu.uuid for gpu in getattr(self._nvml, "gpus", ())}
        self.results = self._readings(gpus, known, "DCGM host engine")
        self.health = CollectorHealth(True, time.perf_counter() - started)
        self._log.clear("dcgm")



# exporter/sources.py SOURCES: DCGM profiling holds the GPU's profiling counters while it serves the GPU.
HOLDS_PROFILER = True
PAUSE_PROFILER = "dcgmi profile --pause"


def add_arguments(parser) -> None:
    g = parser.add_argument_group("dcgm")
    g.add_argument("--dcgm-exporter-url", default=None,
                   help="read DCGM profiling fields from this dcgm-exporter /metrics (e.g. http://dcgm-exporter:9400/metrics)")
    g.add_argument("--dcgm-hostengine", default=None,
                   help="read DCGM profiling fields through DCGM's Python bindings from this nv-hostengine (e.g. localhost)")
    g.add_argument("--dcgm-timeout", type=duration, default=2.0, help="timeout of one dcgm-exporter scrape")
    g.add_argument("--dcgm-frozen-after", type=duration, default=30.0,
                   help="time of exactly repeated non-zero DCGM values after which they count as frozen "
                        "(dcgm-exporter repeats its last values when its host engine restarts or hangs)")
    g.add_argument("--dcgm-window", type=duration, default=1.0,
                   help="GPU time a DCGM value describes (dcgm-exporter's collect interval)")


def build(args, nvml, built=None):
    """The DCGM source (the host engine's bindings, else dcgm-exporter), or (None, why)."""
    if not (args.dcgm_hostengine or args.dcgm_exporter_url):
        return None, "not configured: pass --dcgm-exporter-url or --dcgm-hostengine"
    if args.dcgm_hostengine:
        try:
            return DcgmBindingsSource(args.dcgm_hostengine, args.dcgm_window, args.interval, nvml,
                                      args.dcgm_frozen_after), None
        except ImportError:
            if not args.dcgm_exporter_url:
                return None, SourceResult(ERROR, "DCGM's Python bindings (pydcgm) are not importable: install DCGM, "
                                                 "or use --dcgm-exporter-url")
            log.warning("DCGM bindings not importable: reading dcgm-exporter at %s instead", args.dcgm_exporter_url)
        except Exception as exc:  # noqa: BLE001 - the host engine refused: say so, serve the rest
            if not args.dcgm_exporter_url:
                return None, SourceResult(ERROR, f"DCGM host engine {args.dcgm_hostengine}: {exc}")
    return DcgmExporterSource(args.dcgm_exporter_url, args.dcgm_timeout, args.dcgm_window,
                              max(args.interval, 1.0), nvml, args.dcgm_frozen_after), None
