"""NVML GPM spatial source (Hopper and newer): SM activity and occupancy between two GPM samples."""
from __future__ import annotations

import logging
import time

from exporter.nvml import NvmlError
from exporter.nvml_answers import GpmMetrics, GpmSupport
from exporter.sampler import SamplerDefaults
from exporter.snapshot import (
    ERROR,
    OK,
    PENDING,
    SPATIAL_FIELDS,
    UNSUPPORTED,
    CollectorHealth,
    LinkThroughput,
    LogOnce,
    SourceResult,
    SpatialReading,
    as_ratio,
)

log = logging.getLogger(__name__)
MIN_WINDOW_S = 0.1  # NVML wants GPM samples at least 100 ms apart
MIB = 2**20  # GPM's PCIe and NVLink metrics are MiB/s


class GpmSource(SamplerDefaults):
    """Ticked in the NVML sampler's loop, right before it reads utilization samples, so that the
    time utilization of the same tick can be averaged over exactly this window."""

    name = "gpm"
    in_nvml_loop = True

    def __init__(self, nvml=None):
        self._nvml = nvml  # NvmlSampler: its backend, GPUs and their telemetry
        self.interval = getattr(nvml, "interval", 1.0)
        self.results: dict[str, SourceResult] = {}
        # (GPU UUID, MIG GPU instance id) -> that instance's reading: the SM activity of its own SMs
        self.instances: dict[tuple[str, int], SpatialReading] = {}
        self.health = CollectorHealth(False, 0.0, "not sampled yet")
        self._support: dict[str, tuple[bool, str]] = {}
        self._log = LogOnce(log)

    def tick(self) -> None:
        self.sample(self._nvml.backend, self._nvml.gpus, self._nvml.telemetry)

    def sample(self, backend, gpus, telemetry=None) -> None:
        started = time.perf_counter()
        if backend is None:
            self.results, self.instances = {}, {}
            self.health = CollectorHealth(False, 0.0, "NVML unavailable")
            return
        results, errors, instances = {}, [], {}
        for gpu in gpus:
            results[gpu.uuid] = self._sample(backend, gpu)
            if results[gpu.uuid].state == ERROR:
                errors.append(f"GPU {gpu.index}: {results[gpu.uuid].reason}")
            tel = (telemetry or {}).get(gpu.uuid)
            if tel is not None and tel.mig_enabled and not tel.lost and self._support.get(gpu.uuid, (False,))[0]:
                instances.update(self._sample_instances(backend, gpu, {m.gpu_instance for m in tel.mig_devices}))
        self.results, self.instances = results, instances
        self.health = CollectorHealth(not errors, time.perf_counter() - started, "; ".join(errors))

    def _sample(self, backend, gpu) -> SourceResult:
        support = self._support.get(gpu.uuid)
        if support is None:
            try:
                answer = backend.gpm_support(gpu.index)
            except NvmlError as exc:
                answer = GpmSupport(False, f"GPM support query failed: {exc.reason}")
            support = self._support[gpu.uuid] = (answer.supported, answer.reason)
            if not support[0]:
                log.info("GPU %d (%s): GPM not used: %s", gpu.index, gpu.uuid, support[1])
        if not support[0]:
            return SourceResult(UNSUPPORTED, support[1])
        key = f"gpm GPU {gpu.index} ({gpu.uuid})"
        try:
            metrics = backend.gpm_metrics(gpu.index)
        except NvmlError as exc:
            self._log.problem(key, str(exc))
            return SourceResult(ERROR, f"GPM sampling failed: {exc.reason}")
        self._log.clear(key)
        if metrics is None:
            return SourceResult(PENDING, "waiting for a second GPM sample")
        reading = self._reading(metrics)
        if reading.sm_active is None:
            return SourceResult(ERROR, "GPM answered without SM activity")
        window = reading.window_end - reading.window_start
        return SourceResult(OK, f"GPM sample over {window:.2f} s", reading, links=links(metrics))


    def _sample_instances(self, backend, gpu, gpu_instances) -> dict[tuple[str, int], SpatialReading]:
        """Per MIG GPU instance of one GPU: GPM between this tick and the last (nvmlGpmMigSampleGet)."""
        out = {}
        for gi in sorted(gpu_instances):
            key = f"gpm GPU {gpu.index} ({gpu.uuid}) MIG instance {gi}"
            try:
                metrics = backend.gpm_mig_metrics(gpu.index, gi)
            except NvmlError as exc:
                if not exc.unsupported:
                    self._log.problem(key, str(exc))
                continue  # no value for this instance: its holders get no SM activity, never an old one
            self._log.clear(key)
            if metrics is None or metrics.sm_active is None:
                continue
            out[(gpu.uuid, gi)] = self._reading(metrics)
        return out

    def _reading(self, metrics: GpmMetrics) -> SpatialReading:
        """GPM's metrics over the window that ends now. Its GRAPHICS_UTIL ("percentage of time any
        compute/graphics app was active", nvml.h) is the GPU's busy time over the same window as its SM
        activity: the time side of hidden idle, and the GPU's time utilization, in place of NVML's
        utilization samples (which then are not read: exporter/samplers/nvml.py)."""
        end = time.time()
        window = max(float(metrics.window_s), MIN_WINDOW_S)
        values = {name: as_ratio(getattr(metrics, name), per=100.0) for name in SPATIAL_FIELDS}
        return SpatialReading(self.name, end - window, end, **values, time_utilization=values["graphics_engine_active"])


def engine_busy(gpm: SourceResult | None) -> SpatialReading | None:
    """GPM's reading of a GPU when it measured the busy time (GRAPHICS_UTIL) this tick, else None."""
    if gpm is None or gpm.state != OK or gpm.reading is None or gpm.reading.time_utilization is None:
        return None
    return gpm.reading


def links(metrics: GpmMetrics) -> LinkThroughput | None:
    """PCIe and NVLink throughput (bytes/s) over the GPM window; None where GPM measured neither (a
    recording from before these metrics, a driver without them)."""
    rates = {name: getattr(metrics, name) for name in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")}
    if all(v is None for v in rates.values()):
        return None
    return LinkThroughput("gpm", **{k: None if v is None else float(v) * MIB for k, v in rates.items()})


def add_arguments(parser) -> None:
    """GPM has no flags of its own (exporter/sources.py SOURCES): it reads NVML's GPUs."""


def build(args, nvml, built=None):
    """GPM reads through NVML: nothing to build without it. It ticks in NVML's loop, over NVML's window."""
    if args.no_nvml:
        return None, "NVML switched off (--no-nvml)"
    return GpmSource(nvml), None
