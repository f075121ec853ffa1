"""A thin NVML wrapper: plain Python values in, plain JSON-able values out.

Everything the exporter asks of NVML goes through `Nvml`, so this is the one boundary that a
recorded replay (exporter/nvml_replay.py) stands in for on hosts without a GPU. Failures become
`NvmlError` with a reason a person can act on; a caller treats one failing call as N/A for that
value, not as a failed device.
"""
from __future__ import annotations

import threading
import time

# GPM metric ids (nvml.h nvmlGpmMetricId_t), mapped onto the metric contract's quantities.
GPM_METRICS = {
    "graphics_engine_active": 1,  # NVML_GPM_METRIC_GRAPHICS_UTIL
    "sm_active": 2,  # NVML_GPM_METRIC_SM_UTIL
    "sm_occupancy": 3,  # NVML_GPM_METRIC_SM_OCCUPANCY
    "tensor_active": 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "dram_active": 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL
}
GPU_UTILIZATION_SAMPLES = 1  # NVML_GPU_UTILIZATION_SAMPLES
MEMORY_UTILIZATION_SAMPLES = 2  # NVML_MEMORY_UTILIZATION_SAMPLES
SAMPLE_BUFFER = 256  # utilization samples read in one call (NVML keeps about 100 per kind)
PROCESS_BUFFER = 512  # per-process samples read in one call; more falls back to pynvml's two calls
SM_CLOCK = 1  # NVML_CLOCK_SM
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU


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

    def __init__(self):
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
            mine = lambda key: key == index or (isinstance(key, tuple) and key[0] == index)  # noqa: E731
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
        for sample in [s for s, _ in self._gpm_previous.values()] + list(self._gpm_spare.values()):
            try:
                self._nv.nvmlGpmSampleFree(sample)
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        self._gpm_previous.clear()
        self._gpm_spare.clear()
        try:
            self._nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount", self._nv.nvmlDeviceGetCount))

    def identity(self, index: int) -> dict:
        h = self._handle(index)
        nv = self._nv
        return {
            "uuid": self._text(self._call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, h)),
            "model": self._text(self._call("nvmlDeviceGetName", nv.nvmlDeviceGetName, h)),
            "minor": self._minor(h),
        }

    def _minor(self, handle) -> int | None:
        """The /dev/nvidia<minor> number: what DRA drivers name a GPU by (gpu-<minor>); None where NVML
        cannot say (not on Windows, nor for MIG devices)."""
        try:
            return int(self._nv.nvmlDeviceGetMinorNumber(handle))
        except Exception:  # noqa: BLE001 - N/A, not a failure: DRA names then resolve through the API server
            return None

    def gpm_support(self, index: int) -> dict:
        """Whether GPM serves this GPU, with the reason when not (GPM exists from Hopper on)."""
        nv = self._nv
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            return {"supported": False, "reason": "nvidia-ml-py too old for GPM: pip install -U nvidia-ml-py"}
        try:
            support = self._call("nvmlGpmQueryDeviceSupport", nv.nvmlGpmQueryDeviceSupport, self._handle(index))
        except NvmlError as exc:
            return {"supported": False, "reason": f"GPM query failed: {exc.reason} (driver older than R520?)"}
        if not support.isSupportedDevice:
            return {"supported": False, "reason": "GPM is not supported on this GPU (needs Hopper or newer)"}
        return {"supported": True, "reason": "GPM supported"}

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

    def utilization_samples(self, index: int, window_s: float, memory: bool = True) -> dict:
        """NVML's utilization samples of the last window_s not returned before, as [age_s, percent]
        (age from this call). memory=False leaves the memory samples for a later call: NVML keeps
        them, and each kind costs a few milliseconds of driver time on an H100."""
        h = self._handle(index)
        now_us = time.time() * 1e6
        oldest_us = int(now_us - window_s * 1e6)
        out = {"gpu": [], "memory": []}
        kinds = (("gpu", GPU_UTILIZATION_SAMPLES), ("memory", MEMORY_UTILIZATION_SAMPLES))
        for key, kind in kinds if memory else kinds[:1]:
            since_us = max(oldest_us, self._last_sample_us.get((index, kind), 0))
            samples = [s for s in self._samples(h, kind, since_us) if s.timeStamp > since_us]
            if samples:
                self._last_sample_us[(index, kind)] = max(s.timeStamp for s in samples)
            out[key] = [[round((now_us - s.timeStamp) / 1e6, 6), float(s.sampleValue.uiVal)] for s in samples]
        return out

    def utilization_rates(self, index: int) -> dict:
        rates = self._call("nvmlDeviceGetUtilizationRates", self._nv.nvmlDeviceGetUtilizationRates, self._handle(index))
        return {"gpu": float(rates.gpu), "memory": float(rates.memory)}

    def memory(self, index: int) -> dict:
        info = self._call("nvmlDeviceGetMemoryInfo", self._nv.nvmlDeviceGetMemoryInfo, self._handle(index))
        return {"used": int(info.used), "total": int(info.total)}

    def power_watts(self, index: int) -> float:
        return self._call("nvmlDeviceGetPowerUsage", self._nv.nvmlDeviceGetPowerUsage, self._handle(index)) / 1000.0

    def sm_clock_hz(self, index: int) -> float:
        mhz = self._call("nvmlDeviceGetClockInfo", self._nv.nvmlDeviceGetClockInfo, self._handle(index), SM_CLOCK)
        return float(mhz) * 1e6

    def temperature_celsius(self, index: int) -> float:
        fn = self._nv.nvmlDeviceGetTemperature
        return float(self._call("nvmlDeviceGetTemperature", fn, self._handle(index), TEMPERATURE_GPU))

    def process_utilization(self, index: int, window_s: float) -> list[dict]:
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
        return [
            {"pid": int(pid), "command": self._process_name(pid), "sm": float(s.smUtil), "memory": float(s.memUtil)}
            for pid, s in sorted(newest.items())
        ]

    def compute_processes(self, index: int) -> dict:
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
        # MPS clients stand in both lists: one driver call per process for its name, not two.
        names = {pid: self._process_name(pid) for pid in {*pids["compute"], *pids["mps"]}}
        return {key: [{"pid": pid, "command": names[pid]} for pid in listed] for key, listed in pids.items()}

    def mig_devices(self, index: int) -> dict:
        """MIG mode and the MIG devices of a GPU: {"enabled", "devices": [{"uuid", "gpu_instance",
        "compute_instance"}]}. The device plugin hands MIG devices out by these UUIDs."""
        nv = self._nv
        h = self._handle(index)
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", nv.nvmlDeviceGetMigMode, h)
        except NvmlError as exc:
            if exc.unsupported:  # no MIG on this GPU
                return {"enabled": False, "devices": []}
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
                devices.append({
                    "uuid": self._text(self._call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, mig)),
                    "gpu_instance": gpu_instance,
                    "compute_instance": int(self._call("nvmlDeviceGetComputeInstanceId",
                                                       nv.nvmlDeviceGetComputeInstanceId, mig)),
                    "sm_count": self._sm_count(mig),
                    **self._gpu_instance_placement(h, gpu_instance),
                })
        return {"enabled": enabled, "devices": devices, "sm_count": self._full_gpu_instance_sms(h) if enabled else None}

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

    def gpm_metrics(self, index: int) -> dict | None:
        """GPM metrics (percent) of the whole GPU between the previous call and this one; None on the
        first call."""
        return self._gpm_between(index, index, self._nv.nvmlGpmSampleGet)

    def gpm_mig_metrics(self, index: int, gpu_instance: int) -> dict | None:
        """GPM metrics (percent) of one MIG GPU instance (nvmlGpmMigSampleGet), as gpm_metrics: the
        SM activity of that instance's own SMs."""
        return self._gpm_between((index, gpu_instance), index,
                                 lambda handle, sample: self._nv.nvmlGpmMigSampleGet(handle, gpu_instance, sample))

    def _gpm_between(self, key, index: int, take) -> dict | None:
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
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1 = old
            request.sample2 = sample
            for slot, metric_id in enumerate(GPM_METRICS.values()):
                request.metrics[slot].metricId = metric_id
            self._call("nvmlGpmMetricsGet", nv.nvmlGpmMetricsGet, request)
        finally:
            with self._lock:
                self._gpm_spare[key] = old
        values: dict = {"window_s": round(taken - old_taken, 6)}
        for slot, name in enumerate(GPM_METRICS):
            metric = request.metrics[slot]
            values[name] = float(metric.value) if metric.nvmlReturn == nv.NVML_SUCCESS else None
        return values
