"""Immutable snapshots: what the samplers measured, and the per-GPU view the scrape and API serve."""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field

from exporter.vocabulary import ACTIVE, DISABLED, ERROR, OK, PENDING, PUBLISHED_STATES, STANDBY, UNSUPPORTED  # noqa: F401 - re-exported
from exporter.vocabulary import PROCESS_KINDS, SOURCE_STATES, check

SPATIAL_FIELDS = ("sm_active", "sm_occupancy", "graphics_engine_active", "tensor_active", "dram_active")


def as_ratio(value, per: float = 1.0) -> float | None:
    """A source's value as a contract ratio: divided by `per` (100 for percent), clamped to 0..1;
    missing or NaN is no value (never published as NaN)."""
    if value is None or value != value:
        return None
    return min(max(float(value) / per, 0.0), 1.0)


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    model: str
    minor: int | None = field(default=None, compare=False)  # /dev/nvidia<minor>; None: NVML could not say


@dataclass(frozen=True)
class SpatialReading:
    """Spatial utilization (ratios 0..1) of one GPU over [window_start, window_end] (wall seconds)."""

    source: str
    window_start: float
    window_end: float
    sm_active: float | None = None
    sm_occupancy: float | None = None
    graphics_engine_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    # The source's own share of busy time (nsys "GR Active") over the same window: the time side of
    # hidden-idle when NVML has no samples of this window (replayed or old exports, no NVML GPU).
    time_utilization: float | None = None

    def values(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in SPATIAL_FIELDS if getattr(self, name) is not None}


@dataclass(frozen=True)
class SourceResult:
    """What one spatial source says about one GPU: a state, why, and a reading when it has one."""

    state: str  # exporter.vocabulary.SOURCE_STATES
    reason: str
    reading: SpatialReading | None = None
    links: "LinkThroughput | None" = None  # interconnect throughput measured by the same source (GPM)

    def __post_init__(self):
        check(self.state, SOURCE_STATES, "source state")


@dataclass(frozen=True)
class ProcessUtilization:
    pid: int
    command: str
    sm: float  # ratio
    memory: float  # ratio


@dataclass(frozen=True)
class ComputeProcess:
    """A process with a compute context on the GPU. kind: "mps" (an MPS client), "time_sliced" (its
    own context, sharing the GPU by time slices) or "mps_server" (not a workload: never counted)."""

    pid: int
    command: str
    kind: str  # exporter.vocabulary.PROCESS_KINDS

    def __post_init__(self):
        check(self.kind, PROCESS_KINDS, "process kind")


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    gpu_instance: int
    compute_instance: int
    sm_count: int | None = None  # None: NVML could not say
    # Its GPU instance's profile ID and placement (memory slices): what DRA drivers name it by; None: unknown
    profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None


@dataclass(frozen=True)
class LinkThroughput:
    """PCIe and NVLink throughput in bytes per second (GPM over the tick's window, or NVML)."""

    source: str  # "gpm" or "nvml"
    pcie_tx: float | None = None
    pcie_rx: float | None = None
    nvlink_tx: float | None = None
    nvlink_rx: float | None = None


@dataclass(frozen=True)
class GpuHealth:
    """What dcgm-exporter's default set shows beyond utilization: clocks against their maximum and why
    they are held down, energy, engines, memory errors. None where NVML cannot say on this GPU."""

    driver_version: str | None = None
    sm_clock_max_hertz: float | None = None
    memory_clock_max_hertz: float | None = None
    clock_event_reasons: int | None = None  # exporter.nvml.CLOCK_EVENT_REASONS bits, this tick
    memory_temperature_celsius: float | None = None
    energy_joules: float | None = None  # since the driver loaded
    encoder_utilization: float | None = None  # ratio
    decoder_utilization: float | None = None
    throttle_seconds: tuple[tuple[str, float], ...] = ()  # (reason, seconds since the driver loaded)
    # Share of the last health window during which power or thermal limits held the clocks down.
    throttle_share: float | None = None
    pcie_replays: int | None = None
    ecc_errors: tuple[tuple[str, str, int], ...] = ()  # (corrected|uncorrected, volatile|aggregate, count)
    remapped_rows: tuple[tuple[str, int], ...] = ()  # (correctable|uncorrectable, rows)
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    links: LinkThroughput | None = None  # NVML's, for a GPU without GPM


@dataclass(frozen=True)
class DeviceTelemetry:
    """One NVML tick of one GPU. Samples are (wall time at the end of the sample period, ratio)."""

    identity: GpuIdentity
    taken_at: float
    gpu_samples: tuple[tuple[float, float], ...] = ()
    memory_samples: tuple[tuple[float, float], ...] = ()
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    sm_clock_hertz: float | None = None
    temperature_celsius: float | None = None
    processes: tuple[ProcessUtilization, ...] = ()
    compute_processes: tuple[ComputeProcess, ...] | None = None  # None: NVML could not say
    mig_enabled: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    mig_sm_count: int | None = None  # SMs of the whole GPU in MIG mode: the denominator of a MIG device's share
    memory_free_bytes: float | None = None
    memory_reserved_bytes: float | None = None
    memory_clock_hertz: float | None = None
    health: GpuHealth | None = None
    # XID events since the exporter started, (xid, count), and the last XID: kept for a lost GPU too
    # (XID 79 is what says why it was lost).
    xid_counts: tuple[tuple[int, int], ...] = ()
    last_xid: int | None = None
    lost: bool = False
    errors: tuple[str, ...] = ()
    # Start of the time this tick's samples describe: the GPU's previous tick, however long ago (NVML's
    # loop slows down while no reader watches). None: one interval before taken_at.
    window_start: float | None = None


@dataclass(frozen=True)
class SourceStatus:
    source: str
    state: str  # exporter.vocabulary.PUBLISHED_STATES
    reason: str

    def __post_init__(self):
        check(self.state, PUBLISHED_STATES, "published source state")


@dataclass(frozen=True)
class GpuView:
    """Everything published for one GPU, derived once per update from the latest sampler snapshots."""

    identity: GpuIdentity
    telemetry: DeviceTelemetry | None
    time_utilization: float | None
    memory_time_utilization: float | None
    time_window: tuple[float, float] | None
    spatial: SpatialReading | None
    hidden_idle: float | None
    sources: tuple[SourceStatus, ...]
    sharing_mode: str | None = None  # nsys_ingest.verdicts.SHARING_MODES; None: NVML could not say
    diagnosis: object = None  # (nsys_ingest.verdicts.Verdict, Evidence), or None with too little evidence
    links: LinkThroughput | None = None  # GPM's where it measures them, else NVML's


@dataclass(frozen=True)
class CollectorHealth:
    success: bool
    duration_seconds: float
    error: str = ""


@dataclass(frozen=True)
class Snapshot:
    version: int
    created: float
    gpus: tuple[GpuView, ...] = ()
    published: dict = field(default_factory=dict)  # sampler name -> its snapshot (exporter.sampler.Sampler)
    holdings: dict = field(default_factory=dict)  # holder sampler name -> its exporter.holders.Holdings
    owners: dict = field(default_factory=dict)  # host pid -> exporter.holders.Holder: the one owners map
    workloads: tuple = ()  # exporter.workloads.WorkloadView per (holder, GPU)
    health: dict[str, CollectorHealth] = field(default_factory=dict)

    @property
    def mps(self):
        """exporter.samplers.mps.MpsSnapshot; None: MPS not watched."""
        return self.published.get("mps")

    @property
    def spool(self):
        """exporter.spool.SpoolStats; None: no upload spool."""
        return self.published.get("spool")

    @property
    def kubelet(self):
        """exporter.samplers.kubelet.KubeletSnapshot; None: pod attribution off."""
        return self.published.get("kubelet")

    @property
    def slurm(self):
        """exporter.samplers.slurm.SlurmSnapshot; None: no job mapping."""
        return self.published.get("slurm")


MAX_LOGGED_CHARS = 2000  # of one logged message: what it quotes (a path, a kubelet's device IDs) may be huge
# Characters that would end or rewrite a log line (newlines, escapes, Unicode line separators).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def loggable(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """`text` as one log line: control characters escaped (a path holding a newline cannot forge a
    line), and at most about `limit` characters: a longer one keeps its start and its end (where a
    message usually says what is wrong) around a fixed note, so two messages alike but for the middle
    read the same."""
    text = str(text)
    if len(text) <= limit:
        escaped = _escaped(text)
        if len(escaped) <= limit:
            return escaped
    tail = limit // 4
    head = _escaped(text[:limit])[:limit - tail]
    end = _escaped(text[-tail:])[-tail:]
    return f"{head} [... cut to {limit} characters ...] {end}"


def _escaped(text: str) -> str:
    return _CONTROL.sub(lambda m: _ESCAPES.get(m.group(), f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                                                else f"\\u{ord(m.group()):04x}"), text)


class LogOnce:
    """Logs a condition when it starts or changes, and when it clears: never once per tick. Every
    line is loggable(): escaped and capped, and two messages alike up to the cap are one problem."""

    def __init__(self, logger: logging.Logger):
        self._logger = logger
        self._current: dict[str, str] = {}
        self._lock = threading.Lock()

    def problem(self, key: str, message: str, level: int = logging.WARNING, kind: str | None = None) -> None:
        """`kind`: what makes two messages the same problem when their details vary (an error code)."""
        key, message = loggable(key, 200), loggable(message)
        with self._lock:
            if self._current.get(key) == (kind or message):
                return
            self._current[key] = kind or message
        self._logger.log(level, "%s: %s", key, message)

    def clear(self, key: str, message: str = "recovered") -> None:
        key = loggable(key, 200)
        with self._lock:
            if self._current.pop(key, None) is None:
                return
        self._logger.info("%s: %s", key, loggable(message))
