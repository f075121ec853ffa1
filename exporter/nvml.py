"""A thin NVML wrapper: plain Python values in, typed records out (exporter/nvml_answers.py).

Everything the exporter asks of NVML goes through `Nvml`, so this is the one boundary that a
recorded replay (exporter/nvml_replay.py) stands in for on hosts without a GPU. Failures become
`NvmlError` with a reason a person can act on; a caller treats one failing call as N/A for that
value, not as a failed device.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass

from exporter.nvml_answers import (
    DeviceIdentity,
    GpmMetrics,
    GpmSupport,
    HealthCounters,
    LinkCounters,
    MaxClocks,
    MemoryErrors,
    MemoryInfo,
    MigLayout,
    PciBusId,
    ProcessLists,
    ProcessRef,
    ProcessSample,
    RemappedRows,
    UtilizationRates,
    UtilizationSamples,
    XidEvent,
    XidRegistration,
    from_json,
    to_json,
)
from exporter.snapshot import MigDevice

# GPM metric ids (nvml.h nvmlGpmMetricId_t), mapped onto the metric contract's quantities.
GPM_METRICS = {
    "graphics_engine_active": 1,  # NVML_GPM_METRIC_GRAPHICS_UTIL
    "sm_active": 2,  # NVML_GPM_METRIC_SM_UTIL
    "sm_occupancy": 3,  # NVML_GPM_METRIC_SM_OCCUPANCY
    "tensor_active": 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "dram_active": 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL
    # Interconnect throughput in MiB/s (not spatial: exporter/samplers/gpm.py keeps them apart).
    "pcie_tx": 20,  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    "pcie_rx": 21,  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
    "nvlink_rx": 60,  # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    "nvlink_tx": 61,  # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
}
SPATIAL_GPM_METRICS = ("graphics_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active")
GPU_UTILIZATION_SAMPLES = 1  # NVML_GPU_UTILIZATION_SAMPLES
MEMORY_UTILIZATION_SAMPLES = 2  # NVML_MEMORY_UTILIZATION_SAMPLES
SAMPLE_BUFFER = 256  # utilization samples read in one call (NVML keeps about 100 per kind)
PROCESS_BUFFER = 512  # per-process samples read in one call; more falls back to pynvml's two calls
SM_CLOCK = 1  # NVML_CLOCK_SM
MEM_CLOCK = 2  # NVML_CLOCK_MEM
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
# Field values (nvml.h NVML_FI_DEV_*), read many at a time with nvmlDeviceGetFieldValues. The perf policy
# counters are what nvmlDeviceGetViolationStatus (deprecated for them) answers: time the clocks were held
# down, by reason, in ns since the driver loaded.
VIOLATION_FIELDS = {"power": 74, "thermal": 75, "sync_boost": 76, "board_limit": 77, "low_utilization": 78,
                    "reliability": 79}
FIELD_TOTAL_ENERGY_MJ = 83  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ since the driver loaded
FIELD_PCIE_REPLAYS = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
ECC_FIELDS = {"corrected_volatile": 3, "uncorrected_volatile": 4, "corrected_aggregate": 5,
              "uncorrected_aggregate": 6}  # NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL
REMAPPED_ROW_FIELDS = {"correctable": 142, "uncorrectable": 143, "pending": 144, "failure": 145}  # NVML_FI_DEV_REMAPPED_*
# nvmlDeviceGetCurrentClocksEventReasons bits (nvmlClocksEventReason*): why the clocks are below their maximum now.
CLOCK_EVENT_REASONS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
                       "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
                       "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}
FIELD_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP
FIELD_NVLINK_DATA_TX_KIB = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: KiB since driver load
FIELD_NVLINK_DATA_RX_KIB = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
ALL_LINKS = 0xFFFFFFFF  # a field's scopeId for the sum over every NVLink
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError: eventData is the XID
# The driver's own list of the GPUs it probed, one directory per GPU named by its PCI address: it still
# names a GPU that fell off the bus, when NVML answers GPU_IS_LOST for it even to nvmlDeviceGetHandleByIndex.
DRIVER_GPUS_DIR = "/proc/driver/nvidia/gpus"
MAX_DRIVER_GPUS = 64  # more than any host holds: a bound on what is read, not a limit in practice


@dataclass(frozen=True)
class PartialAnswer:
    """Several NVML calls answered together (the health reads): the values that answered (a record of
    exporter/nvml_answers.py: MaxClocks, HealthCounters, MemoryErrors, LinkCounters; None: nothing read), and
    one line per call that failed otherwise than "not supported on this GPU" (that one is no error)."""

    values: object = None
    errors: tuple[str, ...] = ()

    RECORDED_ERRORS = "_errors"  # where a recording (exporter/nvml_replay.py) keeps the errors beside the values

    def to_json(self) -> dict:
        """Its form in a recording."""
        return {**(to_json(self.values) or {}), **({self.RECORDED_ERRORS: list(self.errors)} if self.errors else {})}

    @classmethod
    def from_json(cls, data: dict, method: str | None = None) -> "PartialAnswer":
        """From its form in a recording; `method` makes its values that method's record again."""
        values = dict(data)
        errors = tuple(values.pop(cls.RECORDED_ERRORS, ()))
        return cls(values if method is None else from_json(method, values), errors)


def pci_address(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI address in NVML's form (00000000:3B:00.0) or the kernel's
    (0000:3b:00.0); None for anything else."""
    try:
        domain, bus, rest = text.split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


class NvmlError(Exception):
    """An NVML call failed. `gpu_lost` marks errors after which the device is gone until restart."""

    def __init__(self, call: str, reason: str, gpu_lost: bool = False, unsupported: bool = False):
        super().__init__(f"{call}: {reason}")
        self.call = call
        self.reason = reason
        self.gpu_lost = gpu_lost
        self.unsupported = unsupported

    def to_json(self) -> dict:
        return {"error": self.reason, "call": self.call, "gpu_lost": self.gpu_lost, "unsupported": self.unsupported}

    @classmethod
    def from_json(cls, data: dict) -> "NvmlError":
        return cls(data["call"], data["error"], data.get("gpu_lost", False), data.get("unsupported", False))


class Nvml:
    """The live NVML backend. Methods take a device index; each keeps what it needs between calls."""

    def __init__(self, driver_gpus_dir: str = DRIVER_GPUS_DIR):
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlError("import pynvml", f"nvidia-ml-py is not installed ({exc}): pip install nvidia-ml-py")
        self._nv = pynvml
        self._lock = threading.Lock()
        self._handles: dict[int, object] = {}
        self._gpm_previous: dict[int, tuple[object, float]] = {}
        self._gpm_spare: dict[int, object] = {}
        self._last_sample_us: dict[tuple[int, int], int] = {}
        self._names: dict[int, dict[int, str]] = {}  # index -> {pid: name} of its last process lists
        self._xid_lock = threading.Lock()  # held while waiting: the set is never freed under a waiter
        self._xid_set = None
        self._gpm_wanted = tuple(GPM_METRICS)  # SPATIAL_GPM_METRICS once a driver refused the others
        self._driver_gpus_dir = driver_gpus_dir
        self._call("nvmlInit", pynvml.nvmlInit)

    # -- plumbing -------------------------------------------------------------------------------
    def _call(self, name, fn, *args):
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise self._error(name, exc) from None

    def _error(self, name: str, exc) -> NvmlError:
        nv = self._nv
        code = getattr(exc, "value", None)
        lost = code in (nv.NVML_ERROR_GPU_IS_LOST, getattr(nv, "NVML_ERROR_GPU_NOT_FOUND", -1))
        unsupported = code in (nv.NVML_ERROR_NOT_SUPPORTED, getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", -1))
        reason = str(exc)
        if code == nv.NVML_ERROR_LIBRARY_NOT_FOUND:
            reason = "libnvidia-ml.so.1 not found: no NVIDIA driver on this host (or not mounted into the container)"
        elif code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", -1):
            reason = "NVIDIA driver not loaded"
        return NvmlError(name, reason, gpu_lost=lost, unsupported=unsupported)

    def _handle(self, index: int):
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call("nvmlDeviceGetHandleByIndex", self._nv.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
        return handle

    def forget(self, index: int) -> None:
        """Drops what is kept of a device (handle, GPM sample): after a reset it is a new device."""
        with self._lock:
            self._handles.pop(index, None)
            self._names.pop(index, None)
            def mine(key) -> bool:
                return key == index or (isinstance(key, tuple) and key[0] == index)

            previous = [self._gpm_previous.pop(k)[0] for k in [k for k in self._gpm_previous if mine(k)]]
            spare = [self._gpm_spare.pop(k) for k in [k for k in self._gpm_spare if mine(k)]]
        for sample in (*previous, *spare):
            if sample is not None:
                try:
                    self._nv.nvmlGpmSampleFree(sample)
                except Exception:  # noqa: BLE001 - a sample of a lost device may not free cleanly
                    pass

    @staticmethod
    def _text(value) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    # -- the interface --------------------------------------------------------------------------
    def shutdown(self) -> None:
        self.xid_close()
        for sample in [s for s, _ in self._gpm_previous.values()] + list(self._gpm_spare.values()):
            try:
                self._nv.nvmlGpmSampleFree(sample)
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        self._gpm_previous.clear()
        self._gpm_spare.clear()
        try:
            self._nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down: nothing NVML answers then changes what follows
            pass

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount", self._nv.nvmlDeviceGetCount))

    def identity(self, index: int) -> DeviceIdentity:
        h = self._handle(index)
        nv = self._nv
        return DeviceIdentity(self._text(self._call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, h)),
                              self._text(self._call("nvmlDeviceGetName", nv.nvmlDeviceGetName, h)), self._minor(h))

    def pci_bus_ids(self) -> tuple[PciBusId, ...]:
        """The PCI bus id, as nvidia-smi shows it, of every GPU NVML counts; what names a GPU that was
        lost before it could be asked who it is (`nvidia-smi -q` shows the same address for it). GPUs that
        answer say it (nvmlDeviceGetPciInfo); the others are the driver's GPUs (DRIVER_GPUS_DIR) that no
        answering GPU claims, in NVML's order, which is PCI order; None where the two lists do not add up."""
        out: dict[int, str | None] = {}
        for index in range(self.device_count()):
            try:
                info = self._call("nvmlDeviceGetPciInfo", self._nv.nvmlDeviceGetPciInfo, self._handle(index))
                out[index] = self._text(info.busId)
            except NvmlError:
                out[index] = None
        unclaimed = sorted(set(self._driver_gpus()) - {pci_address(bus) for bus in out.values() if bus})
        silent = [index for index, bus in out.items() if bus is None]
        if len(unclaimed) == len(silent):
            for index, address in zip(silent, unclaimed):
                out[index] = "{:08X}:{:02X}:{:02X}.{:X}".format(*address)
        return tuple(PciBusId(index, bus) for index, bus in out.items())

    def _driver_gpus(self) -> list[tuple[int, int, int, int]]:
        """PCI addresses of the GPUs the driver probed; none where its list cannot be read."""
        try:
            with os.scandir(self._driver_gpus_dir) as entries:
                names = [entry.name for entry in itertools.islice(entries, MAX_DRIVER_GPUS)]
        except OSError:
            return []
        return [address for address in map(pci_address, names) if address is not None]

    def _minor(self, handle) -> int | None:
        """The /dev/nvidia<minor> number: what DRA drivers name a GPU by (gpu-<minor>); None where NVML
        cannot say (not on Windows, nor for MIG devices)."""
        try:
            return int(self._nv.nvmlDeviceGetMinorNumber(handle))
        except Exception:  # noqa: BLE001 - N/A, not a failure: DRA names then resolve through the API server
            return None

    def gpm_support(self, index: int) -> GpmSupport:
        """Whether GPM serves this GPU, with the reason when not (GPM exists from Hopper on)."""
        nv = self._nv
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            return GpmSupport(False, "nvidia-ml-py too old for GPM: pip install -U nvidia-ml-py")
        try:
            support = self._call("nvmlGpmQueryDeviceSupport", nv.nvmlGpmQueryDeviceSupport, self._handle(index))
        except NvmlError as exc:
            return GpmSupport(False, f"GPM query failed: {exc.reason} (driver older than R520?)")
        if not support.isSupportedDevice:
            return GpmSupport(False, "GPM is not supported on this GPU (needs Hopper or newer)")
        return GpmSupport(True, "GPM supported")

    def _samples(self, handle, kind: int, since_us: int) -> list:
        """nvmlDeviceGetSamples in one call into a fixed buffer: pynvml's wrapper calls twice (size,
        then data), and each call costs about a millisecond of driver time on an H100."""
        import ctypes

        nv = self._nv
        fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        count = ctypes.c_uint(SAMPLE_BUFFER)
        value_type = nv._nvmlValueType_t()
        buffer = (nv.c_nvmlSample_t * SAMPLE_BUFFER)()
        ret = fn(handle, nv._nvmlSamplingType_t(kind), ctypes.c_ulonglong(since_us), ctypes.byref(value_type),
                 ctypes.byref(count), buffer)
        if ret == nv.NVML_ERROR_NOT_FOUND:  # no sample newer than since_us yet
            return []
        if ret == nv.NVML_ERROR_INSUFFICIENT_SIZE:
            return self._call("nvmlDeviceGetSamples", nv.nvmlDeviceGetSamples, handle, kind, since_us)[1]
        if ret != nv.NVML_SUCCESS:
            raise self._error("nvmlDeviceGetSamples", nv.NVMLError(ret))
        return buffer[: count.value]

    def _process_samples(self, handle, since_us: int) -> list:
        """nvmlDeviceGetProcessUtilization in one call into a fixed buffer (pynvml's wrapper asks
        for the size first: two calls of ~1.2 ms driver time each on an H100)."""
        import ctypes

        nv = self._nv
        fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
        count = ctypes.c_uint(PROCESS_BUFFER)
        buffer = (nv.c_nvmlProcessUtilizationSample_t * PROCESS_BUFFER)()
        ret = fn(handle, buffer, ctypes.byref(count), ctypes.c_ulonglong(since_us))
        if ret == nv.NVML_ERROR_INSUFFICIENT_SIZE:
            return self._call("nvmlDeviceGetProcessUtilization", nv.nvmlDeviceGetProcessUtilization, handle, since_us)
        if ret != nv.NVML_SUCCESS:
            raise self._error("nvmlDeviceGetProcessUtilization", nv.NVMLError(ret))
        return buffer[: count.value]

    def utilization_samples(self, index: int, window_s: float, memory: bool = True,
                            gpu: bool = True) -> UtilizationSamples:
        """NVML's utilization samples of the last window_s not returned before, as (age_s, percent)
        (age from this call). memory=False (gpu=False) leaves that kind for a later call: NVML keeps
        the samples, and each kind costs a few milliseconds of driver time on an H100."""
        h = self._handle(index)
        now_us = time.time() * 1e6
        oldest_us = int(now_us - window_s * 1e6)
        out = {"gpu": (), "memory": ()}
        kinds = (("gpu", GPU_UTILIZATION_SAMPLES),) * gpu + (("memory", MEMORY_UTILIZATION_SAMPLES),) * memory
        for key, kind in kinds:
            since_us = max(oldest_us, self._last_sample_us.get((index, kind), 0))
            samples = [s for s in self._samples(h, kind, since_us) if s.timeStamp > since_us]
            if samples:
                self._last_sample_us[(index, kind)] = max(s.timeStamp for s in samples)
            out[key] = tuple((round((now_us - s.timeStamp) / 1e6, 6), float(s.sampleValue.uiVal)) for s in samples)
        return UtilizationSamples(**out)

    def utilization_rates(self, index: int) -> UtilizationRates:
        rates = self._call("nvmlDeviceGetUtilizationRates", self._nv.nvmlDeviceGetUtilizationRates, self._handle(index))
        return UtilizationRates(float(rates.gpu), float(rates.memory))

    def memory(self, index: int) -> MemoryInfo:
        """Device memory in bytes. `used` is total - free as it always was (the driver's reserved memory
        included); `reserved` apart where the driver has nvmlDeviceGetMemoryInfo_v2 (R510 and newer)."""
        nv, h = self._nv, self._handle(index)
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = self._call("nvmlDeviceGetMemoryInfo_v2", nv.nvmlDeviceGetMemoryInfo, h, version)
                return MemoryInfo(int(info.total - info.free), int(info.total), int(info.free), int(info.reserved))
            except NvmlError as exc:
                if not exc.unsupported:
                    raise
        info = self._call("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo, h)
        return MemoryInfo(int(info.used), int(info.total), int(info.free))

    def power_watts(self, index: int) -> float:
        return self._call("nvmlDeviceGetPowerUsage", self._nv.nvmlDeviceGetPowerUsage, self._handle(index)) / 1000.0

    def sm_clock_hz(self, index: int) -> float:
        mhz = self._call("nvmlDeviceGetClockInfo", self._nv.nvmlDeviceGetClockInfo, self._handle(index), SM_CLOCK)
        return float(mhz) * 1e6

    def temperature_celsius(self, index: int) -> float:
        fn = self._nv.nvmlDeviceGetTemperature
        return float(self._call("nvmlDeviceGetTemperature", fn, self._handle(index), TEMPERATURE_GPU))

    def process_utilization(self, index: int, window_s: float) -> list[ProcessSample]:
        """Per-process SM and memory time utilization: each process's newest sample, if it is younger
        than window_s. Asked with lastSeenTimeStamp 0, NVML answers each process's latest sample (a
        smoothed value, refreshed every ~200 ms while it runs kernels); asked with a later timestamp it
        answered values that matched neither nsys nor the GPU total on the H100 (bench/RESULTS.md,
        per-workload time shares). A process that stopped launching keeps its last sample forever:
        the age filter drops it."""
        now_us = time.time() * 1e6
        try:
            samples = self._process_samples(self._handle(index), 0)
        except NvmlError as exc:
            if "Not Found" in exc.reason:  # no process ran recently
                return []
            raise
        newest: dict[int, object] = {}
        for s in samples:
            if now_us - s.timeStamp <= window_s * 1e6 and (s.pid not in newest or s.timeStamp > newest[s.pid].timeStamp):
                newest[s.pid] = s
        names = self._names.get(index, {})
        return [ProcessSample(int(pid), names.get(pid) or self._process_name(pid), float(s.smUtil), float(s.memUtil))
                for pid, s in sorted(newest.items())]

    def compute_processes(self, index: int) -> ProcessLists:
        """Processes with a compute context on the GPU, {"compute": [...], "mps": [...]} of
        {"pid", "command"}: NVML lists MPS clients apart (nvmlDeviceGetMPSComputeRunningProcesses),
        and the MPS server itself among the compute processes."""
        nv = self._nv
        h = self._handle(index)
        pids = {}
        for key, name in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                          ("mps", "nvmlDeviceGetMPSComputeRunningProcesses")):
            try:
                infos = self._call(name, getattr(nv, name), h)
            except NvmlError as exc:
                if key == "mps" and exc.unsupported:  # no MPS support in this driver: no MPS clients
                    infos = []
                else:
                    raise
            pids[key] = sorted({int(info.pid) for info in infos})
        # MPS clients stand in both lists: one driver call per process for its name, not two. Per-process
        # utilization, read every tick, names its processes from here (a name cannot change under its pid).
        names = {pid: self._process_name(pid) for pid in {*pids["compute"], *pids["mps"]}}
        self._names[index] = names
        return ProcessLists(*(tuple(ProcessRef(pid, names[pid]) for pid in pids[key]) for key in ProcessLists._fields))

    def mig_devices(self, index: int) -> MigLayout:
        """MIG mode and the MIG devices of a GPU: {"enabled", "devices": [{"uuid", "gpu_instance",
        "compute_instance"}]}. The device plugin hands MIG devices out by these UUIDs."""
        nv = self._nv
        h = self._handle(index)
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", nv.nvmlDeviceGetMigMode, h)
        except NvmlError as exc:
            if exc.unsupported:  # no MIG on this GPU
                return MigLayout(False)
            raise
        enabled = current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        devices = []
        if enabled:
            count = self._call("nvmlDeviceGetMaxMigDeviceCount", nv.nvmlDeviceGetMaxMigDeviceCount, h)
            for slot in range(int(count)):
                try:
                    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
                except nv.NVMLError:  # an empty slot
                    continue
                gpu_instance = int(self._call("nvmlDeviceGetGpuInstanceId", nv.nvmlDeviceGetGpuInstanceId, mig))
                devices.append(MigDevice(
                    self._text(self._call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, mig)),
                    gpu_instance,
                    int(self._call("nvmlDeviceGetComputeInstanceId", nv.nvmlDeviceGetComputeInstanceId, mig)),
                    self._sm_count(mig),
                    **self._gpu_instance_placement(h, gpu_instance),
                ))
        return MigLayout(enabled, tuple(devices), self._full_gpu_instance_sms(h) if enabled else None)

    def _gpu_instance_placement(self, handle, gpu_instance: int) -> dict:
        """The GPU instance's profile ID and placement (start, size in memory slices): with the parent's
        minor, the name DRA drivers give a MIG device. Empty where NVML cannot say."""
        try:
            info = self._nv.nvmlGpuInstanceGetInfo(self._nv.nvmlDeviceGetGpuInstanceById(handle, gpu_instance))
            return {"profile_id": int(info.profileId), "placement_start": int(info.placement.start),
                    "placement_size": int(info.placement.size)}
        except Exception:  # noqa: BLE001 - N/A (an unprivileged reader): MIG claims then resolve by UUID only
            return {}

    def _sm_count(self, handle) -> int | None:
        """SMs of a MIG device (NVML device attributes); None where NVML cannot say (a whole GPU
        answered Not Supported on the H100)."""
        try:
            return int(self._nv.nvmlDeviceGetAttributes(handle).multiprocessorCount)
        except Exception:  # noqa: BLE001 - N/A, not a failure: the held share is then unknown
            return None

    def _full_gpu_instance_sms(self, handle) -> int | None:
        """SMs of the whole GPU in MIG mode: those of its largest GPU instance profile (7 slices), the
        denominator of a MIG device's share."""
        nv = self._nv
        best = None
        for profile in range(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 8)):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
            except Exception:  # noqa: BLE001 - a profile this GPU does not offer
                continue
            best = max(best or 0, int(info.multiprocessorCount))
        return best

    def _process_name(self, pid: int) -> str:
        try:
            name = self._text(self._nv.nvmlSystemGetProcessName(pid))
        except Exception:  # noqa: BLE001 - the process may be gone already
            return ""
        return name.rsplit("/", 1)[-1]

    def gpm_metrics(self, index: int) -> GpmMetrics | None:
        """GPM metrics (percent) of the whole GPU between the previous call and this one; None on the
        first call."""
        return self._gpm_between(index, index, self._nv.nvmlGpmSampleGet)

    def gpm_mig_metrics(self, index: int, gpu_instance: int) -> GpmMetrics | None:
        """GPM metrics (percent) of one MIG GPU instance (nvmlGpmMigSampleGet), as gpm_metrics: the
        SM activity of that instance's own SMs."""
        return self._gpm_between((index, gpu_instance), index,
                                 lambda handle, sample: self._nv.nvmlGpmMigSampleGet(handle, gpu_instance, sample))

    def _gpm_between(self, key, index: int, take) -> GpmMetrics | None:
        nv = self._nv
        h = self._handle(index)
        with self._lock:
            # Two sample buffers per GPU (or instance), taken in turn: allocating and freeing one per
            # tick left glibc holding the freed buffers as resident memory.
            sample = self._gpm_spare.pop(key, None) or self._call("nvmlGpmSampleAlloc", nv.nvmlGpmSampleAlloc)
            try:
                self._call("nvmlGpmSampleGet", take, h, sample)
            except NvmlError:
                self._gpm_spare[key] = sample
                raise
            taken = time.monotonic()
            previous = self._gpm_previous.get(key)
            self._gpm_previous[key] = (sample, taken)
        if previous is None:
            return None
        old, old_taken = previous
        try:
            try:
                names, request = self._gpm_get(old, sample, self._gpm_wanted)
            except NvmlError as exc:
                # NVML answers an unsupported metric in its own slot; should a driver refuse the whole
                # request instead, the interconnect metrics go and the spatial ones stay.
                if exc.gpu_lost or self._gpm_wanted == SPATIAL_GPM_METRICS:
                    raise
                self._gpm_wanted = SPATIAL_GPM_METRICS
                names, request = self._gpm_get(old, sample, self._gpm_wanted)
        finally:
            with self._lock:
                self._gpm_spare[key] = old
        values = {}
        for slot, name in enumerate(names):
            metric = request.metrics[slot]
            values[name] = float(metric.value) if metric.nvmlReturn == nv.NVML_SUCCESS else None
        return GpmMetrics(round(taken - old_taken, 6), **values)

    def _gpm_get(self, old, sample, names: tuple):
        nv = self._nv
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(names)
        request.sample1 = old
        request.sample2 = sample
        for slot, name in enumerate(names):
            request.metrics[slot].metricId = GPM_METRICS[name]
        self._call("nvmlGpmMetricsGet", nv.nvmlGpmMetricsGet, request)
        return names, request

    # -- health: what dcgm-exporter's default set shows, read at the sampler's slower cadences -----
    def _parts(self, calls: dict) -> PartialAnswer:
        """Several NVML calls answered together: a call the GPU does not support leaves its key out,
        another failure leaves it out too and is named in the errors; a lost GPU fails the whole read."""
        out: dict = {}
        errors = []
        for key, (name, fn, *args) in calls.items():
            try:
                out[key] = self._call(name, fn, *args)
            except NvmlError as exc:
                if exc.gpu_lost:
                    raise
                if not exc.unsupported:
                    errors.append(str(exc))
        return PartialAnswer(out, tuple(errors))

    def driver_version(self) -> str:
        return self._text(self._call("nvmlSystemGetDriverVersion", self._nv.nvmlSystemGetDriverVersion))

    def max_clocks(self, index: int) -> PartialAnswer:
        """Maximum SM and memory clocks in hertz (the denominators of a throttled clock)."""
        nv, h = self._nv, self._handle(index)
        mhz = self._parts({"sm_hz": ("nvmlDeviceGetMaxClockInfo", nv.nvmlDeviceGetMaxClockInfo, h, SM_CLOCK),
                           "memory_hz": ("nvmlDeviceGetMaxClockInfo", nv.nvmlDeviceGetMaxClockInfo, h, MEM_CLOCK)})
        return PartialAnswer(MaxClocks(**{k: float(v) * 1e6 for k, v in mhz.values.items()}), mhz.errors)

    def memory_clock_hz(self, index: int) -> float:
        mhz = self._call("nvmlDeviceGetClockInfo", self._nv.nvmlDeviceGetClockInfo, self._handle(index), MEM_CLOCK)
        return float(mhz) * 1e6

    def clock_event_reasons(self, index: int) -> int:
        """Bitmask of why the clocks are below their maximum now (CLOCK_EVENT_REASONS); drivers before
        R535 only have the older name of the same call."""
        nv, h = self._nv, self._handle(index)
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None:
            try:
                return int(self._call("nvmlDeviceGetCurrentClocksEventReasons", fn, h))
            except NvmlError as exc:
                if not exc.unsupported:
                    raise
        return int(self._call("nvmlDeviceGetCurrentClocksThrottleReasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons, h))

    def _fields(self, handle, fields: dict) -> PartialAnswer:
        """nvmlDeviceGetFieldValues: many values in one driver call. {key: value} of the fields that
        answered; a field this GPU does not support is left out, another failure is named in the errors."""
        nv = self._nv
        answers = self._call("nvmlDeviceGetFieldValues", nv.nvmlDeviceGetFieldValues, handle, list(fields.values()))
        out: dict = {}
        errors = []
        for key, value in zip(fields, answers):
            if value.nvmlReturn == nv.NVML_SUCCESS:
                out[key] = self._field_value(value)
            elif value.nvmlReturn != nv.NVML_ERROR_NOT_SUPPORTED:
                errors.append(f"nvmlDeviceGetFieldValues field {value.fieldId}: {nv.NVMLError(value.nvmlReturn)}")
        return PartialAnswer(out, tuple(errors))

    @staticmethod
    def _field_value(field):
        kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
        return getattr(field.value, kind.get(field.valueType, "ullVal"))

    def health_counters(self, index: int) -> PartialAnswer:
        """What changes slowly or only grows, read every few seconds: energy (joules since the driver
        loaded), throttle time by reason (seconds), memory temperature (one field-values call), encoder
        and decoder utilization (percent)."""
        nv, h = self._nv, self._handle(index)
        fields = {"energy_mj": FIELD_TOTAL_ENERGY_MJ, "memory_temperature_celsius": FIELD_MEMORY_TEMP,
                  **{f"violation_{reason}": field for reason, field in VIOLATION_FIELDS.items()}}
        raw = self._parts({"fields": ("nvmlDeviceGetFieldValues", self._fields, h, fields),
                           "encoder": ("nvmlDeviceGetEncoderUtilization", nv.nvmlDeviceGetEncoderUtilization, h),
                           "decoder": ("nvmlDeviceGetDecoderUtilization", nv.nvmlDeviceGetDecoderUtilization, h)})
        fields_answer = raw.values.get("fields", PartialAnswer())
        values = fields_answer.values
        out: dict = {"throttle_seconds": {}}
        if "energy_mj" in values:
            out["energy_joules"] = values["energy_mj"] / 1000.0
        if "memory_temperature_celsius" in values:
            out["memory_temperature_celsius"] = float(values["memory_temperature_celsius"])
        for reason in VIOLATION_FIELDS:
            if f"violation_{reason}" in values:
                out["throttle_seconds"][reason] = values[f"violation_{reason}"] / 1e9  # ns
        for engine in ("encoder", "decoder"):
            if engine in raw.values:
                out[f"{engine}_percent"] = float(raw.values[engine][0])
        return PartialAnswer(HealthCounters(**out), raw.errors + fields_answer.errors)

    def nvml_throughput(self, index: int) -> PartialAnswer:
        """PCIe throughput (bytes/s, NVML's 20 ms sample) and NVLink data counters (bytes since driver
        load, all links): for GPUs without GPM, which measures both over the tick's window."""
        nv, h = self._nv, self._handle(index)
        raw = self._parts({
            "pcie_tx": ("nvmlDeviceGetPcieThroughput", nv.nvmlDeviceGetPcieThroughput, h, 0),  # NVML_PCIE_UTIL_TX_BYTES
            "pcie_rx": ("nvmlDeviceGetPcieThroughput", nv.nvmlDeviceGetPcieThroughput, h, 1),
            "fields": ("nvmlDeviceGetFieldValues", nv.nvmlDeviceGetFieldValues, h,
                       [(FIELD_NVLINK_DATA_TX_KIB, ALL_LINKS), (FIELD_NVLINK_DATA_RX_KIB, ALL_LINKS)])})
        out = {}
        for key in ("pcie_tx", "pcie_rx"):
            if key in raw.values:
                out[f"{key}_bytes_per_second"] = float(raw.values[key]) * 1024.0  # KB/s
        for key, value in zip(("nvlink_tx_bytes", "nvlink_rx_bytes"), raw.values.get("fields", ())):
            if value.nvmlReturn == nv.NVML_SUCCESS:
                out[key] = float(self._field_value(value)) * 1024.0  # KiB
        return PartialAnswer(LinkCounters(**out), raw.errors)

    def memory_errors(self, index: int) -> PartialAnswer:
        """ECC error counts (corrected/uncorrected, volatile since the driver loaded / aggregate over the
        GPU's life), remapped rows and the PCIe replay counter, in one field-values call: they change
        rarely and are read every minute."""
        h = self._handle(index)
        fields = {"pcie_replays": FIELD_PCIE_REPLAYS, **{f"ecc_{k}": v for k, v in ECC_FIELDS.items()},
                  **{f"rows_{k}": v for k, v in REMAPPED_ROW_FIELDS.items()}}
        answer = self._fields(h, fields)
        values = answer.values
        rows = None
        if all(f"rows_{k}" in values for k in REMAPPED_ROW_FIELDS):
            rows = RemappedRows(int(values["rows_correctable"]), int(values["rows_uncorrectable"]),
                                bool(values["rows_pending"]), bool(values["rows_failure"]))
        return PartialAnswer(MemoryErrors(int(values["pcie_replays"]) if "pcie_replays" in values else None,
                                          {k[4:]: int(v) for k, v in values.items() if k.startswith("ecc_")}, rows),
                             answer.errors)

    # -- XID events: one event set for every GPU, waited on by exporter/samplers/xid.py's own thread --
    def xid_open(self) -> tuple[XidRegistration, ...]:
        """Registers every GPU for XID events; per GPU whether it is registered, or why not."""
        nv = self._nv
        with self._xid_lock:
            if self._xid_set is None:
                self._xid_set = self._call("nvmlEventSetCreate", nv.nvmlEventSetCreate)
            out = []
            for index in range(self.device_count()):
                try:
                    self._call("nvmlDeviceRegisterEvents", nv.nvmlDeviceRegisterEvents, self._handle(index), XID_EVENT,
                               self._xid_set)
                    out.append(XidRegistration(index))
                except NvmlError as exc:
                    out.append(XidRegistration(index, exc.reason))
            return tuple(out)

    def xid_register(self, index: int) -> str | None:
        """Registers one GPU again (after a reset its old handle no longer reports): None, or why not."""
        with self._xid_lock:
            if self._xid_set is None:
                return "XID events are not open"
            try:
                self._call("nvmlDeviceRegisterEvents", self._nv.nvmlDeviceRegisterEvents, self._handle(index), XID_EVENT,
                           self._xid_set)
            except NvmlError as exc:
                return exc.reason
            return None

    def xid_wait(self, timeout_ms: int) -> XidEvent | None:
        """The next XID event, or None when none came within timeout_ms (or the set is closed)."""
        nv = self._nv
        with self._xid_lock:
            if self._xid_set is None:
                return None
            try:
                data = nv.nvmlEventSetWait(self._xid_set, timeout_ms)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    return None
                raise self._error("nvmlEventSetWait", exc) from None
        if not data.eventType & XID_EVENT:
            return None
        index = int(self._call("nvmlDeviceGetIndex", nv.nvmlDeviceGetIndex, data.device))
        return XidEvent(index, int(data.eventData))

    def xid_close(self) -> None:
        with self._xid_lock:  # waits for a waiter's timeout at most
            if self._xid_set is not None:
                try:
                    self._nv.nvmlEventSetFree(self._xid_set)
                except Exception:  # noqa: BLE001 - best effort at exit
                    pass
                self._xid_set = None
