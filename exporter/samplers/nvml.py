"""NVML sampler: time utilization samples and device telemetry, once per tick, off the scrape path."""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from exporter.nvml import NvmlError, PartialAnswer
from exporter.nvml_answers import (
    DeviceIdentity,
    HealthCounters,
    LinkCounters,
    MaxClocks,
    MemoryErrors,
    MemoryInfo,
    MigLayout,
    ProcessLists,
    UtilizationSamples,
)
from exporter.sampler import SamplerDefaults, serves
from exporter.samplers.xid import XidWatcher
from exporter import vocabulary
from exporter.snapshot import (
    CollectorHealth,
    ComputeProcess,
    DeviceTelemetry,
    GpuHealth,
    GpuIdentity,
    LinkThroughput,
    LogOnce,
    ProcessUtilization,
    as_ratio,
)

log = logging.getLogger(__name__)
SAMPLE_HISTORY_S = 120.0  # long enough for any source's window (nsys live windows included)
REINIT_AFTER_S = 30.0
# Driver time per call on the device's H100: per-process utilization ~2.3 ms, each utilization-sample
# kind ~2.5 ms, GPM ~2 ms. Memory samples and the process lists are read every 2 s (NVML keeps the
# samples meanwhile); GPU utilization samples only where GPM does not measure the same busy time.
SLOW_EVERY_S = 2.0
# NVML refreshes a running process's utilization sample every ~200 ms, every ~600 ms under contention;
# a process that stopped launching keeps its last sample: older than this, it counts as not running.
PROCESS_SAMPLE_MAX_AGE_S = 5.0
MIG_EVERY_S = 30.0  # MIG layouts change only when an administrator repartitions the GPU
MPS_SERVER = "nvidia-cuda-mps-server"
STALE_SAMPLE_S = 5.0  # NVML samples every 1/6 to 1 s: an older one says nothing about the window
# NVML keeps about 14 s of utilization samples (71 on the H200, 0.2 s apart; ~100 on the H100, 1/6 s apart): a
# tick reads every sample since the previous one as long as they are at most this far apart.
NVML_BUFFER_S = 14.0
LOST_RETRY_S = 10.0  # a lost GPU is asked who it is this often: after a reset it answers again
# Off the per-tick path: energy, throttle time, encoder/decoder and memory temperature (and NVML's
# PCIe/NVLink throughput where GPM does not measure them) every HEALTH_EVERY_S; ECC counts, remapped
# rows and PCIe replays, which change rarely, every ERRORS_EVERY_S; driver version and maximum clocks
# once. Per tick only the memory clock and the clock event reasons (the throttle verdict's inputs):
# NVML has no field value for the current clocks, temperature or memory info to batch them into.
# Every cadence goes through one schedule per GPU (NvmlSampler._due). 30 s is dcgm-exporter's default
# collection interval for the same fields (--collect-interval 30000 ms, pkg/cmd/app.go): the health read
# costs ~5 ms of driver time on the H200 (bench/RESULTS.md, "Cost per GPU").
HEALTH_EVERY_S = 30.0
ERRORS_EVERY_S = 60.0
POWER_THERMAL_VIOLATIONS = ("power", "thermal")  # the throttle counters behind GpuHealth.throttle_share


@dataclass
class _SlowReads:
    """What one GPU's slow reads last answered, kept between reads, and their errors (so that a failing
    slow read stays one logged problem instead of coming and going between its reads)."""

    errors: dict = field(default_factory=dict)  # read name -> its errors at its last read
    static_done: bool = False
    driver: str | None = None
    max_clocks: MaxClocks = MaxClocks()
    health: HealthCounters = HealthCounters()
    memory_errors: MemoryErrors = MemoryErrors()
    gpm: bool | None = None
    links: LinkThroughput | None = None
    nvlink_before: tuple | None = None  # (monotonic time, tx bytes, rx bytes)
    throttle_before: tuple | None = None  # (monotonic time, {reason: seconds})
    throttle_share: float | None = None


class NvmlSampler(SamplerDefaults):
    """Keeps the newest telemetry per GPU and a history of NVML utilization samples.

    `backend` is an `Nvml` or a `ReplayNvml`; or give `factory`, a callable that makes one, retried
    while it fails (an exporter started before the driver came up finds the GPUs later). Neither:
    NVML is switched off (--no-nvml).
    """

    name = "nvml"

    def __init__(self, backend=None, interval: float = 1.0, factory=None):
        self._factory = factory
        self.backend = backend
        self.interval = interval
        self.gpus: tuple[GpuIdentity, ...] = ()
        self.telemetry: dict[str, DeviceTelemetry] = {}
        self.health = CollectorHealth(False, 0.0, "not sampled yet")
        self._history: dict[str, tuple[deque, deque]] = {}
        self._lost: dict[int, float] = {}  # index -> monotonic time of the last probe
        self._read_at: dict[tuple[str, str], float] = {}  # (GPU UUID, read) -> monotonic time of its last read
        self.slow_every_s = SLOW_EVERY_S
        self.health_every_s = HEALTH_EVERY_S
        self.errors_every_s = ERRORS_EVERY_S
        self.mig_every_s = MIG_EVERY_S
        # Spatial sources by name (gpm, dcgm, nsys; set by whoever builds the engine): where GPM measured
        # this tick's busy time and no other source needs NVML's samples, those are not read.
        self.spatial: dict = {}
        self._slow: dict[str, _SlowReads] = {}
        self._unsupported: set[tuple[str, str]] = set()
        self.xid: XidWatcher | None = None
        self._last_init_try = -REINIT_AFTER_S
        self._unavailable = "NVML unavailable"  # why, once an attempt failed
        self._log = LogOnce(log)

    @property
    def enabled(self) -> bool:
        """False with --no-nvml: no GPU is then what was asked for."""
        return self.backend is not None or self._factory is not None

    # -- discovery ------------------------------------------------------------------------------
    def _ensure_backend(self) -> bool:
        if self.backend is not None:
            return True
        if self._factory is None:
            return False
        now = time.monotonic()
        if now - self._last_init_try < REINIT_AFTER_S:
            return False
        self._last_init_try = now
        try:
            self.backend = self._factory()
        except NvmlError as exc:
            self._unavailable = f"NVML unavailable: {exc.reason}"
            self._log.problem("nvml", f"{self._unavailable}; serving everything else (no GPU here? pass --no-nvml)")
            return False
        self._log.clear("nvml", "NVML initialised")
        return True

    def _discover(self) -> None:
        """Lists the GPUs once. One that cannot be asked who it is (lost before this exporter started) is
        that GPU's problem: it is listed as lost, named by its index and PCI bus id, and the others are served."""
        if self.gpus:
            return
        gpus, unreachable = [], {}
        for index in range(self.backend.device_count()):
            try:
                gpus.append(identity(index, self.backend.identity(index)))
            except NvmlError as exc:
                unreachable[index] = exc
        if unreachable:
            bus_ids = self._pci_bus_ids()
            for index, exc in unreachable.items():
                gpu = unnamed_identity(index, bus_ids.get(index))
                gpus.append(gpu)
                self._lost[index] = time.monotonic()
                self._report_lost(gpu, exc.reason)
        if not gpus:
            self._log.problem("nvml", "NVML found no GPU on this host")
        self.gpus = tuple(sorted(gpus, key=lambda gpu: gpu.index))

    def _pci_bus_ids(self) -> dict[int, str | None]:
        """GPU index -> its PCI bus id, where NVML or the driver can say."""
        try:
            return {gpu.index: gpu.bus_id for gpu in self.backend.pci_bus_ids()}
        except NvmlError:  # an unnamed GPU is then named by its index alone
            return {}

    def _report_lost(self, gpu: GpuIdentity, why: str) -> None:
        self._log.problem(_log_key(gpu), f"GPU lost (fell off the bus?): {why}; its series stop and gpu_lost is 1; "
                          f"asked again every {LOST_RETRY_S:.0f} s", logging.ERROR)

    # -- one tick -------------------------------------------------------------------------------
    def tick(self) -> None:
        started = time.perf_counter()
        if not self._ensure_backend():
            why = "NVML switched off (--no-nvml)" if self._factory is None else self._unavailable
            self.health = CollectorHealth(self._factory is None, time.perf_counter() - started, why)
            return
        try:
            self._discover()
        except NvmlError as exc:
            self._log.problem("nvml", f"cannot list GPUs: {exc}")
            self.health = CollectorHealth(False, time.perf_counter() - started, str(exc))
            return
        if self.xid is None and self.gpus:
            self.xid = XidWatcher(self.backend)
            self.xid.start()
        errors = []
        telemetry = {}
        for gpu in self.gpus:
            reading = self._read(gpu)
            telemetry[gpu.uuid] = reading
            errors.extend(f"GPU {gpu.index}: {e}" for e in reading.errors)
        self.telemetry = telemetry
        self.health = CollectorHealth(not errors, time.perf_counter() - started, "; ".join(errors))

    def close(self) -> None:
        """Stops the XID watcher, then shuts NVML down (the engine closes NVML last)."""
        if self.xid is not None:
            self.xid.stop()
        closer = getattr(self.backend, "shutdown", None)
        if closer:
            closer()

    def _xid(self, gpu: GpuIdentity) -> dict:
        counts, last = self.xid.events(gpu.index) if self.xid is not None else ((), None)
        return {"xid_counts": counts, "last_xid": last}

    def _call(self, gpu: GpuIdentity, fn, *args):
        """(answer or None, error or None) of one backend call. Unsupported on this GPU is no error and
        is logged once; a lost GPU is marked lost."""
        try:
            return fn(gpu.index, *args), None
        except NvmlError as exc:
            if exc.gpu_lost:
                self._lost[gpu.index] = time.monotonic()
            if exc.unsupported:
                self._note_unsupported(gpu, exc.call, exc.reason)
                return None, None
            return None, str(exc)

    def _note_unsupported(self, gpu: GpuIdentity, call: str, reason: str) -> None:
        if (gpu.uuid, call) not in self._unsupported:
            self._unsupported.add((gpu.uuid, call))
            log.info("nvml GPU %d (%s): %s: %s; its values are not published", gpu.index, gpu.uuid, call, reason)

    def _still_lost(self, gpu: GpuIdentity, key: str) -> bool:
        """True while the GPU stays lost; every LOST_RETRY_S it is asked for its UUID, and a GPU that
        answers with its own UUID (reset, driver reloaded) is served again."""
        if gpu.index not in self._lost:
            return False
        if time.monotonic() - self._lost[gpu.index] < LOST_RETRY_S:
            return True
        self._lost[gpu.index] = time.monotonic()
        forget = getattr(self.backend, "forget", None)
        if forget:
            forget(gpu.index)  # a handle from before the loss may not work after a reset
        try:
            answer = self.backend.identity(gpu.index)
        except NvmlError:
            return True
        if is_unnamed(gpu):
            # Lost since before this exporter started, it says who it is at last: served under its own name
            # from the next tick on (this tick's views were made under the placeholder).
            self.gpus = tuple(identity(gpu.index, answer) if g == gpu else g for g in self.gpus)
        elif answer.uuid != gpu.uuid:
            return True
        del self._lost[gpu.index]
        if self.xid is not None:
            self.xid.reregister(gpu.index)  # the event set holds the old handle, which reports nothing now
        self._history.pop(gpu.uuid, None)  # samples from before the loss describe nothing now
        self._log.clear(key, "GPU answers again: serving it")
        return is_unnamed(gpu)

    def _read(self, gpu: GpuIdentity) -> DeviceTelemetry:
        key = _log_key(gpu)
        if self._still_lost(gpu, key):
            return DeviceTelemetry(gpu, time.time(), lost=True, errors=("GPU is lost",), **self._xid(gpu))
        b = self.backend
        errors: list[str] = []
        values: dict = {}

        def read(name, fn, *args):
            values[name], error = self._call(gpu, fn, *args)  # N/A on this GPU is normal, not a failure
            if error:
                errors.append(error)

        taken_at = time.time()
        previous = self.telemetry.get(gpu.uuid)
        # The tick's samples describe the time since the GPU's previous tick, whatever the loop's cadence;
        # never more than NVML keeps.
        window_start = max(previous.taken_at, taken_at - NVML_BUFFER_S) if previous else taken_at - self.interval
        window = max(2 * self.interval, 1.0, taken_at - window_start + 1.0)
        slow = self._due(gpu, "slow", self.slow_every_s)
        gpu_samples = not self._engine_busy_measured(gpu)
        if gpu_samples or slow:
            read("samples", b.utilization_samples, max(window, SLOW_EVERY_S + 1.0), slow, gpu_samples)
        read("memory", b.memory)
        read("power", b.power_watts)
        read("clock", b.sm_clock_hz)
        read("temperature", b.temperature_celsius)
        read("memory_clock", b.memory_clock_hz)
        read("reasons", b.clock_event_reasons)
        health = self._health(gpu, values["reasons"])
        errors.extend(e for slow_errors in self._slow[gpu.uuid].errors.values() for e in slow_errors)
        processes = previous.processes if previous else ()
        compute = previous.compute_processes if previous else None
        if slow:
            read("compute", b.compute_processes)
            compute = compute_processes(values["compute"])
        # Per-process utilization costs ~2.3 ms of driver time, the process lists ~0.02 ms: a GPU
        # without compute processes has no per-process utilization to read. Read every tick, so the
        # workloads' time shares describe the same tick as the GPU's time utilization.
        if compute is None or compute:
            read("processes", b.process_utilization, PROCESS_SAMPLE_MAX_AGE_S)
            processes = tuple(ProcessUtilization(p.pid, p.command, p.sm / 100.0, p.memory / 100.0)
                              for p in values.get("processes") or ())
        else:
            processes = ()
        mig_enabled, mig_devices, mig_sms = ((previous.mig_enabled, previous.mig_devices, previous.mig_sm_count)
                                             if previous else (None, (), None))
        if self._due(gpu, "mig", self.mig_every_s):
            read("mig", b.mig_devices)
            mig = values["mig"] or MigLayout(None)  # None: unknown
            mig_enabled = mig.enabled
            mig_devices = mig.devices
            mig_sms = mig.sm_count
        if gpu.index in self._lost:
            self._report_lost(gpu, "; ".join(errors))
            return DeviceTelemetry(gpu, taken_at, lost=True, errors=tuple(errors), **self._xid(gpu))
        if errors:
            self._log.problem(key, "; ".join(errors))
        else:
            self._log.clear(key)
        gpu_history, memory_history = self._history.setdefault(gpu.uuid, (deque(), deque()))
        samples = values.get("samples") or UtilizationSamples()
        if gpu_samples:
            self._remember(gpu_history, taken_at, samples.gpu)
        else:  # GPM's busy time stands in: no older sample may pass for this tick's
            gpu_history.clear()
        if slow:
            self._remember(memory_history, taken_at, samples.memory)
        fresh = values.get("samples", {}) is not None  # not read this tick (GPM measures the time): fresh
        if gpu_samples and not gpu_history:  # no sample yet (fresh driver): take the instant rate
            fresh = True
            try:
                rates = b.utilization_rates(gpu.index)
                gpu_history.append((taken_at, rates.gpu / 100.0))
                memory_history.append((taken_at, rates.memory / 100.0))
            except NvmlError as exc:
                errors.append(str(exc))
        memory = values["memory"] or MemoryInfo(None, None)
        # Samples that could not be read this tick leave no time utilization: the history would
        # otherwise repeat an older sample as this tick's value.
        return DeviceTelemetry(
            identity=gpu,
            taken_at=taken_at,
            gpu_samples=tuple(gpu_history) if fresh else (),
            memory_samples=tuple(memory_history) if fresh else (),
            memory_used_bytes=memory.used,
            memory_total_bytes=memory.total,
            power_watts=values["power"],
            sm_clock_hertz=values["clock"],
            temperature_celsius=values["temperature"],
            processes=processes,
            compute_processes=compute,
            mig_enabled=mig_enabled,
            mig_devices=mig_devices,
            mig_sm_count=mig_sms,
            memory_free_bytes=memory.free,
            memory_reserved_bytes=memory.reserved,
            memory_clock_hertz=values["memory_clock"],
            health=health,
            **self._xid(gpu),
            errors=tuple(errors),
            window_start=window_start,
        )

    # -- the slow reads: off the per-tick path -----------------------------------------------------
    def _due(self, gpu: GpuIdentity, name: str, every: float) -> bool:
        """The one schedule of every read made less often than each tick: True (and the read counted as
        made now) once `every` seconds have passed since the GPU's last `name` read."""
        now = time.monotonic()
        if now - self._read_at.get((gpu.uuid, name), float("-inf")) < every:
            return False
        self._read_at[(gpu.uuid, name)] = now
        return True

    def _engine_busy_measured(self, gpu: GpuIdentity) -> bool:
        """GPM measured this tick's busy time of the GPU (GRAPHICS_UTIL, over its own window: the same
        as its SM activity's), and no other spatial source publishes the GPU (DCGM's or nsys' hidden
        idle is NVML's samples over their windows): then NVML's GPU utilization samples are not read."""
        from exporter.samplers.gpm import engine_busy

        gpm = self.spatial.get("gpm")
        if gpm is None or engine_busy(gpm.results.get(gpu.uuid)) is None:
            return False
        return not any(serves(self.spatial, name, gpu.uuid) for name in self.spatial if name != "gpm")

    def _partial_read(self, gpu: GpuIdentity, slow: _SlowReads, name: str, fn, nothing):
        """A read of several NVML calls (an exporter.nvml.PartialAnswer): its record (`nothing` where the read
        failed whole), and its errors kept until its next read."""
        answer, error = self._call(gpu, fn)
        answer = answer or PartialAnswer()
        slow.errors[name] = ([error] if error else []) + list(answer.errors)
        return nothing if answer.values is None else answer.values

    def _health(self, gpu: GpuIdentity, reasons: int | None) -> GpuHealth:
        slow = self._slow.setdefault(gpu.uuid, _SlowReads())
        b = self.backend
        if not slow.static_done and self._due(gpu, "static", self.errors_every_s):  # until it worked once
            slow.driver, driver_error = self._call(gpu, lambda _index: b.driver_version())
            slow.max_clocks = self._partial_read(gpu, slow, "static", b.max_clocks, MaxClocks())
            slow.errors["static"] += [driver_error] if driver_error else []
            slow.static_done = not slow.errors["static"]
        if slow.gpm is None:
            support, _error = self._call(gpu, b.gpm_support)
            slow.gpm = bool(support and support.supported)
        if self._due(gpu, "health", self.health_every_s):
            slow.health = self._partial_read(gpu, slow, "health", b.health_counters, HealthCounters())
            slow.throttle_share, slow.throttle_before = throttle_share(
                slow.throttle_before, slow.health.throttle_seconds or {}, time.monotonic())
            if not slow.gpm:
                slow.links, slow.nvlink_before = self._nvml_links(gpu, slow)
        if self._due(gpu, "memory_errors", self.errors_every_s):
            slow.memory_errors = self._partial_read(gpu, slow, "memory_errors", b.memory_errors, MemoryErrors())
        h, e = slow.health, slow.memory_errors
        rows = e.remapped_rows
        return GpuHealth(
            driver_version=slow.driver,
            sm_clock_max_hertz=slow.max_clocks.sm_hz,
            memory_clock_max_hertz=slow.max_clocks.memory_hz,
            clock_event_reasons=reasons,
            memory_temperature_celsius=h.memory_temperature_celsius,
            energy_joules=h.energy_joules,
            encoder_utilization=as_ratio(h.encoder_percent, per=100.0),
            decoder_utilization=as_ratio(h.decoder_percent, per=100.0),
            throttle_seconds=tuple(sorted((h.throttle_seconds or {}).items())),
            throttle_share=slow.throttle_share,
            pcie_replays=e.pcie_replays,
            ecc_errors=tuple((*key.split("_", 1), count) for key, count in sorted((e.ecc or {}).items())),
            remapped_rows=(("correctable", rows.correctable), ("uncorrectable", rows.uncorrectable)) if rows else (),
            row_remap_pending=rows.pending if rows else None,
            row_remap_failure=rows.failure if rows else None,
            links=slow.links,
        )

    def _nvml_links(self, gpu: GpuIdentity, slow: _SlowReads):
        """NVML's PCIe throughput and NVLink rates (from its byte counters between two reads), for a GPU
        GPM does not serve."""
        answer = self._partial_read(gpu, slow, "links", self.backend.nvml_throughput, LinkCounters())
        now = time.monotonic()
        counters = (now, answer.nvlink_tx_bytes, answer.nvlink_rx_bytes)
        before = slow.nvlink_before

        def rate(i):
            if before is None or counters[i] is None or before[i] is None or counters[i] < before[i] or now <= before[0]:
                return None
            return (counters[i] - before[i]) / (now - before[0])

        pcie_tx, pcie_rx = answer.pcie_tx_bytes_per_second, answer.pcie_rx_bytes_per_second
        links = LinkThroughput("nvml", pcie_tx, pcie_rx, rate(1), rate(2))
        known = any(v is not None for v in (pcie_tx, pcie_rx, links.nvlink_tx, links.nvlink_rx))
        return (links if known else None), counters

    @staticmethod
    def _remember(history: deque, taken_at: float, samples) -> None:
        """Adds samples (age, percent) as (wall time, ratio), skipping ones seen in an earlier call."""
        newest = history[-1][0] if history else float("-inf")
        for age, percent in sorted(samples, key=lambda s: -s[0]):
            stamp = taken_at - age
            if stamp > newest + 1e-3:
                history.append((stamp, percent / 100.0))
                newest = stamp
        while history and history[0][0] < taken_at - SAMPLE_HISTORY_S:
            history.popleft()


UNNAMED_MODEL = "unknown"  # the model label of a GPU lost before it could be asked who it is


def identity(index: int, answer: DeviceIdentity) -> GpuIdentity:
    """A GPU's identity from the backend's identity() answer."""
    return GpuIdentity(index, answer.uuid, answer.model, answer.minor)


def unnamed_identity(index: int, pci_bus_id: str | None) -> GpuIdentity:
    """What names a GPU lost before it said who it is: its PCI bus id where known (the address nvidia-smi
    and the kernel log show for it), else its index, in place of the UUID."""
    return GpuIdentity(index, f"unknown-pci-{pci_bus_id}" if pci_bus_id else f"unknown-gpu-{index}", UNNAMED_MODEL)


def is_unnamed(gpu: GpuIdentity) -> bool:
    return gpu.model == UNNAMED_MODEL and gpu.uuid.startswith("unknown-")


def _log_key(gpu: GpuIdentity) -> str:
    return f"nvml GPU {gpu.index} ({gpu.uuid})"


def throttle_share(before: tuple | None, seconds: dict, now: float) -> tuple[float | None, tuple | None]:
    """Share of the time since the last read during which power or thermal limits held the clocks down
    (the larger of the two violation counters' growth), and what to compare the next read with."""
    if not seconds:
        return None, None
    share = None
    if before is not None and now > before[0]:
        grown = [seconds[r] - before[1][r] for r in POWER_THERMAL_VIOLATIONS if r in seconds and r in before[1]]
        if grown:
            share = round(min(max(max(grown) / (now - before[0]), 0.0), 1.0), 6)
    return share, (now, dict(seconds))


def compute_processes(answer: ProcessLists | None) -> tuple[ComputeProcess, ...] | None:
    """NVML's compute and MPS process lists as one list with a kind each; None when unknown."""
    if answer is None:
        return None
    clients = {p.pid: p for p in answer.mps}
    everyone = {p.pid: p for p in answer.compute} | clients
    out = []
    for pid, p in sorted(everyone.items()):
        kind = vocabulary.MPS_SERVER if p.command == MPS_SERVER else vocabulary.MPS_CLIENT if pid in clients \
            else vocabulary.TIME_SLICED
        out.append(ComputeProcess(pid, p.command, kind))
    return tuple(out)


def window_mean(samples, start: float, end: float) -> float | None:
    """Mean of the utilization samples whose period ends inside (start, end].

    When the window is shorter than NVML's sample period no sample ends inside it; then the first
    sample after the window (its period covers the window) is used, else the newest before it.
    """
    inside = [v for t, v in samples if start < t <= end]
    if inside:
        return round(sum(inside) / len(inside), 6)
    after = [v for t, v in samples if end < t <= end + STALE_SAMPLE_S]
    if after:
        return after[0]
    before = [(t, v) for t, v in samples if t <= start]
    if before and start - before[-1][0] <= STALE_SAMPLE_S:
        return before[-1][1]
    return None  # the history does not reach this window
