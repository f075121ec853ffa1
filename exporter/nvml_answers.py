"""What the NVML wrapper (exporter/nvml.py) answers, as typed records: read by field, never by key.

Plain dicts exist only at the replay boundary (exporter/nvml_replay.py): `to_json` gives an answer's form in a
recording and `from_json(method, data)` makes the record again, so a recording from before these types
replays unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from exporter.snapshot import MigDevice


class DeviceIdentity(NamedTuple):
    """nvmlDeviceGetUUID, nvmlDeviceGetName, nvmlDeviceGetMinorNumber (None where NVML cannot say)."""

    uuid: str
    model: str
    minor: int | None = None


class GpmSupport(NamedTuple):
    supported: bool
    reason: str


class UtilizationSamples(NamedTuple):
    """nvmlDeviceGetSamples of each kind not returned before, as (age in seconds from the call, percent)."""

    gpu: tuple[tuple[float, float], ...] = ()
    memory: tuple[tuple[float, float], ...] = ()


class UtilizationRates(NamedTuple):
    """nvmlDeviceGetUtilizationRates, percent."""

    gpu: float
    memory: float


class MemoryInfo(NamedTuple):
    """nvmlDeviceGetMemoryInfo(_v2), bytes; `reserved` None before R510 (no v2), `free` None in recordings made
    before it was read."""

    used: int | None
    total: int | None
    free: int | None = None
    reserved: int | None = None


class ProcessSample(NamedTuple):
    """One process's newest nvmlDeviceGetProcessUtilization sample, percent."""

    pid: int
    command: str
    sm: float
    memory: float


class ProcessRef(NamedTuple):
    pid: int
    command: str


class ProcessLists(NamedTuple):
    """nvmlDeviceGetComputeRunningProcesses and nvmlDeviceGetMPSComputeRunningProcesses."""

    compute: tuple[ProcessRef, ...] = ()
    mps: tuple[ProcessRef, ...] = ()


class MigLayout(NamedTuple):
    """MIG mode and devices of a GPU; `sm_count`: SMs of the whole GPU in MIG mode (its largest profile)."""

    enabled: bool
    devices: tuple[MigDevice, ...] = ()
    sm_count: int | None = None


class GpmMetrics(NamedTuple):
    """nvmlGpmMetricsGet between two samples `window_s` apart: percent, the interconnect in MiB/s; None where
    NVML answered that metric with an error (or the driver was not asked it: exporter.nvml.GPM_METRICS)."""

    window_s: float
    graphics_engine_active: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    pcie_tx: float | None = None
    pcie_rx: float | None = None
    nvlink_rx: float | None = None
    nvlink_tx: float | None = None


class MaxClocks(NamedTuple):
    """nvmlDeviceGetMaxClockInfo, hertz."""

    sm_hz: float | None = None
    memory_hz: float | None = None


class HealthCounters(NamedTuple):
    """Energy (joules since the driver loaded), memory temperature, time the clocks were held down by reason
    (seconds since the driver loaded), encoder and decoder utilization (percent)."""

    energy_joules: float | None = None
    memory_temperature_celsius: float | None = None
    throttle_seconds: dict[str, float] | None = None
    encoder_percent: float | None = None
    decoder_percent: float | None = None


class RemappedRows(NamedTuple):
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


class MemoryErrors(NamedTuple):
    """ECC counts by "corrected_volatile"... (error and scope), remapped rows, PCIe replays."""

    pcie_replays: int | None = None
    ecc: dict[str, int] | None = None
    remapped_rows: RemappedRows | None = None


class LinkCounters(NamedTuple):
    """PCIe throughput (bytes/s, NVML's 20 ms sample) and NVLink data counters (bytes since driver load)."""

    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes: float | None = None
    nvlink_rx_bytes: float | None = None


class XidEvent(NamedTuple):
    index: int
    xid: int


class PciBusId(NamedTuple):
    """nvmlDeviceGetPciInfo's busId of one GPU NVML counts, as nvidia-smi shows it; None where neither NVML nor
    the driver's list can say."""

    index: int
    bus_id: str | None


class XidRegistration(NamedTuple):
    """nvmlDeviceRegisterEvents of one GPU for XID events: `refused` None where it is registered, else why not."""

    index: int
    refused: str | None = None


def _record(cls, data: dict):
    """A record from its recorded dict: fields it lacks take their defaults, keys it does not know are left."""
    names = cls._fields if hasattr(cls, "_fields") else [f.name for f in dataclasses.fields(cls)]
    return cls(**{name: data[name] for name in names if name in data})


def _per_gpu(cls):
    """Records of every GPU from their recorded form: a list of records, or (recordings from before these types)
    a mapping of index (a string) -> the record's one other field."""
    def read(data) -> tuple:
        if isinstance(data, dict):
            return tuple(cls(int(index), value) for index, value in data.items())
        return tuple(_record(cls, item) for item in data)
    return read


def _pairs(samples) -> tuple[tuple[float, float], ...]:
    return tuple((float(age), float(percent)) for age, percent in samples)


# How each method's recorded value becomes its record again (methods not named here answer plain values:
# numbers, strings). The health reads' records come inside an exporter.nvml.PartialAnswer.
FROM_JSON = {
    "identity": lambda data: _record(DeviceIdentity, data),
    "gpm_support": lambda data: _record(GpmSupport, data),
    "utilization_samples": lambda data: UtilizationSamples(_pairs(data.get("gpu", ())), _pairs(data.get("memory", ()))),
    "utilization_rates": lambda data: _record(UtilizationRates, data),
    "memory": lambda data: _record(MemoryInfo, data),
    "process_utilization": lambda data: [_record(ProcessSample, p) for p in data],
    "compute_processes": lambda data: ProcessLists(*(tuple(_record(ProcessRef, p) for p in data.get(key, ()))
                                                     for key in ProcessLists._fields)),
    "gpm_metrics": lambda data: _record(GpmMetrics, data),
    "gpm_mig_metrics": lambda data: _record(GpmMetrics, data),
    "max_clocks": lambda data: _record(MaxClocks, data),
    "health_counters": lambda data: _record(HealthCounters, data),
    "memory_errors": lambda data: MemoryErrors(data.get("pcie_replays"), data.get("ecc"),
                                               None if data.get("remapped_rows") is None
                                               else _record(RemappedRows, data["remapped_rows"])),
    "nvml_throughput": lambda data: _record(LinkCounters, data),
    "pci_bus_ids": _per_gpu(PciBusId),
    "xid_open": _per_gpu(XidRegistration),
    "mig_devices": lambda data: MigLayout(bool(data["enabled"]), tuple(_record(MigDevice, d)
                                                                       for d in data.get("devices", ())),
                                          data.get("sm_count")),
}


def from_json(method: str, data):
    """The answer of `method` from its form in a recording."""
    convert = FROM_JSON.get(method)
    return data if convert is None or data is None else convert(data)


def to_json(value):
    """An answer's form in a recording: records as dicts by field name, all the way down."""
    if hasattr(value, "_asdict"):
        return {name: to_json(item) for name, item in value._asdict().items()}
    if dataclasses.is_dataclass(value):
        return to_json(dataclasses.asdict(value))
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    return value
