"""A stand-in for the NVML library under the live `Nvml` wrapper, counting every NVML entry point it reaches.

NVML cannot exist here (no GPU, no driver), so this follows its documented contract at pynvml's level: each
`nvml*` function of pynvml is one call of libnvidia-ml's function of that name, except where pynvml's own
wrapper makes two (the process lists ask for the count first when there are processes, as pynvml does),
and the two calls the wrapper makes through `_nvmlGetFunctionPointer` into a buffer of its own
(`nvmlDeviceGetSamples`, `nvmlDeviceGetProcessUtilization`). Types, constants and errors are pynvml's
own. Values are plain and steady (an idle or busy GPU, N processes): this counts calls, it does not
replay readings (exporter/nvml_replay.py does that).

    library = NvmlLibrary(gpus=2, processes={0: 6})
    with library.installed():
        nvml = Nvml()      # the real wrapper, over this library
    library.calls          # [(function name, GPU index or None), ...] in call order

`python3 -m tests.nvml_library [--source-dir DIR]` prints the calls per tick and GPU of a tree's sampler
(bench/RESULTS.md, "Cost per GPU": before and after).
"""
from __future__ import annotations

import contextlib
import sys
import types
from types import SimpleNamespace

import pynvml as _real

GPM_SUPPORTED = 1
SAMPLE_PERIOD_US = 200_000  # H100 and H200 sample utilization every 0.2 s (recordings in tests/fixtures)
BUFFERED_SAMPLES = 71  # what NVML keeps of each kind on the H200 (bench/RESULTS.md, issue 47): 14 s


class Handle:
    def __init__(self, index: int):
        self.index = index


class GpmSample:
    pass


class MetricsRequest:
    """pynvml's c_nvmlGpmMetricsGet_t as the wrapper fills and reads it."""

    def __init__(self):
        self.version = 0
        self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(98)]


class NvmlLibrary:
    def __init__(self, gpus: int = 1, processes: dict[int, int] | None = None, busy: float = 0.0, clock=None,
                 lost: set[int] = frozenset()):
        self.gpus = gpus
        # GPUs that fell off the bus: NVML still counts them, and answers GPU_IS_LOST to every call naming one,
        # nvmlDeviceGetHandleByIndex included (nvidia-smi: "Unable to determine the device handle for GPU
        # 0000:3B:00.0: GPU is lost"). A test may move a GPU in or out of this set while it runs.
        self.lost = set(lost)
        self.processes = dict(processes or {})  # GPU index -> how many time-sliced compute processes
        self.busy = busy  # percent, every sample
        self.samples_at = None  # or: wall seconds -> percent of the buffered utilization sample taken then
        self.clock = clock  # an object with time() (wall seconds); the real clock when None
        self.calls: list[tuple[str, int | None]] = []

    # -- bookkeeping --------------------------------------------------------------------------------
    def _now_us(self) -> int:
        import time

        return int((self.clock or time).time() * 1e6)

    def _count(self, name: str, handle=None) -> None:
        index = handle.index if isinstance(handle, Handle) else handle
        self.calls.append((name, index))
        if name != "nvmlSystemGetProcessName" and index in self.lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)

    def _pids(self, index: int) -> list[int]:
        return [1000 * (index + 1) + n for n in range(self.processes.get(index, 0))]

    def per_gpu(self, since: int = 0) -> dict[int | None, int]:
        out: dict[int | None, int] = {}
        for _, index in self.calls[since:]:
            out[index] = out.get(index, 0) + 1
        return out

    # -- the module ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def installed(self):
        """`import pynvml` answers this library meanwhile."""
        saved = sys.modules.get("pynvml")
        sys.modules["pynvml"] = self.module()
        try:
            yield self
        finally:
            if saved is not None:
                sys.modules["pynvml"] = saved
            else:
                sys.modules.pop("pynvml", None)

    def module(self) -> types.ModuleType:
        library = self

        class Module(types.ModuleType):
            def __getattr__(self, name):
                fake = getattr(library, f"_fn_{name}", None)
                if fake is not None:
                    return fake
                if name.startswith("nvml") and callable(getattr(_real, name, None)):
                    raise AttributeError(f"{name}: not in the stand-in NVML library (add it to tests/nvml_library.py)")
                return getattr(_real, name)

        module = Module("pynvml")
        module.c_nvmlGpmMetricsGet_t = MetricsRequest
        module.NVML_GPM_METRICS_GET_VERSION = getattr(_real, "NVML_GPM_METRICS_GET_VERSION", 1)
        return module

    def _fn__nvmlGetFunctionPointer(self, name: str):
        """The two calls the wrapper makes into a buffer of its own."""
        if name == "nvmlDeviceGetSamples":
            return self._samples
        if name == "nvmlDeviceGetProcessUtilization":
            return self._process_samples
        raise AttributeError(name)

    def _samples(self, handle, kind, since_us, value_type, count, buffer):
        try:
            self._count("nvmlDeviceGetSamples", handle)
        except _real.NVMLError as exc:  # a C function: its error is its return code
            return exc.value
        now, since = self._now_us(), since_us.value
        newest = now - now % SAMPLE_PERIOD_US
        stamps = [t for t in range(newest - (BUFFERED_SAMPLES - 1) * SAMPLE_PERIOD_US, now + 1, SAMPLE_PERIOD_US)
                  if t > since]
        if not stamps:
            return _real.NVML_ERROR_NOT_FOUND
        stamps = stamps[-len(buffer):]
        for slot, stamp in enumerate(stamps):
            buffer[slot].timeStamp = stamp
            buffer[slot].sampleValue.uiVal = int(self.busy if self.samples_at is None else self.samples_at(stamp / 1e6))
        count._obj.value = len(stamps)
        return _real.NVML_SUCCESS

    def _process_samples(self, handle, buffer, count, since_us):
        try:
            self._count("nvmlDeviceGetProcessUtilization", handle)
        except _real.NVMLError as exc:
            return exc.value
        pids = self._pids(handle.index)
        if not pids:
            return _real.NVML_ERROR_NOT_FOUND
        now = self._now_us()
        for slot, pid in enumerate(pids):
            buffer[slot].pid, buffer[slot].timeStamp = pid, now - 100_000
            buffer[slot].smUtil, buffer[slot].memUtil = int(self.busy) // len(pids), 0
        count._obj.value = len(pids)
        return _real.NVML_SUCCESS

    # One method per NVML function the wrapper calls (pynvml's name), each counted once (twice where
    # pynvml's wrapper makes two calls).
    def _fn_nvmlInit(self):
        self._count("nvmlInit")

    def _fn_nvmlShutdown(self):
        self._count("nvmlShutdown")

    def _fn_nvmlDeviceGetCount(self):
        self._count("nvmlDeviceGetCount")
        return self.gpus

    def _fn_nvmlDeviceGetHandleByIndex(self, index):
        self._count("nvmlDeviceGetHandleByIndex", index)
        return Handle(index)

    def _fn_nvmlDeviceGetUUID(self, handle):
        self._count("nvmlDeviceGetUUID", handle)
        return f"GPU-00000000-0000-0000-0000-{handle.index:012d}"

    def _fn_nvmlDeviceGetName(self, handle):
        self._count("nvmlDeviceGetName", handle)
        return "NVIDIA H100 80GB HBM3"

    def _fn_nvmlDeviceGetPciInfo(self, handle):
        self._count("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=pci_bus_id(handle.index).encode())

    # XID events: a set every answering GPU registers with (no event comes: nvmlEventSetWait is not stood in)
    def _fn_nvmlEventSetCreate(self):
        self._count("nvmlEventSetCreate")
        return SimpleNamespace(registered=[])

    def _fn_nvmlDeviceRegisterEvents(self, handle, event_types, event_set):
        self._count("nvmlDeviceRegisterEvents", handle)
        event_set.registered.append(handle.index)

    def _fn_nvmlDeviceGetMinorNumber(self, handle):
        self._count("nvmlDeviceGetMinorNumber", handle)
        return handle.index

    def _fn_nvmlGpmQueryDeviceSupport(self, handle):
        self._count("nvmlGpmQueryDeviceSupport", handle)
        return SimpleNamespace(isSupportedDevice=GPM_SUPPORTED)

    def _fn_nvmlGpmSampleAlloc(self):
        self._count("nvmlGpmSampleAlloc")
        return GpmSample()

    def _fn_nvmlGpmSampleFree(self, sample):
        self._count("nvmlGpmSampleFree")

    def _fn_nvmlGpmSampleGet(self, handle, sample):
        self._count("nvmlGpmSampleGet", handle)

    def _fn_nvmlGpmMigSampleGet(self, handle, gpu_instance, sample):
        self._count("nvmlGpmMigSampleGet", handle)

    def _fn_nvmlGpmMetricsGet(self, request):
        self._count("nvmlGpmMetricsGet", None)  # the request names no device: counted per GPU by the caller's order
        for slot in range(request.numMetrics):
            request.metrics[slot].nvmlReturn = _real.NVML_SUCCESS
            request.metrics[slot].value = self.busy if request.metrics[slot].metricId in (1, 2) else 0.0
        return request

    def _fn_nvmlDeviceGetUtilizationRates(self, handle):
        self._count("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=int(self.busy), memory=0)

    def _fn_nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self._count("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=80 << 30, free=79 << 30, used=1 << 30, reserved=512 << 20)

    def _fn_nvmlDeviceGetPowerUsage(self, handle):
        self._count("nvmlDeviceGetPowerUsage", handle)
        return 70_000

    def _fn_nvmlDeviceGetClockInfo(self, handle, kind):
        self._count("nvmlDeviceGetClockInfo", handle)
        return 1980

    def _fn_nvmlDeviceGetMaxClockInfo(self, handle, kind):
        self._count("nvmlDeviceGetMaxClockInfo", handle)
        return 1980

    def _fn_nvmlDeviceGetTemperature(self, handle, sensor):
        self._count("nvmlDeviceGetTemperature", handle)
        return 30

    def _fn_nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        self._count("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return 0x1

    def _process_list(self, name: str, handle, pids: list[int]):
        self._count(name, handle)
        if pids:  # pynvml asks for the count, then for the list
            self._count(name, handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in pids]

    def _fn_nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._process_list("nvmlDeviceGetComputeRunningProcesses", handle, self._pids(handle.index))

    def _fn_nvmlDeviceGetMPSComputeRunningProcesses(self, handle):
        return self._process_list("nvmlDeviceGetMPSComputeRunningProcesses", handle, [])

    def _fn_nvmlSystemGetProcessName(self, pid):
        self._count("nvmlSystemGetProcessName", pid // 1000 - 1)  # the GPU whose process it is
        return "python3"

    def _fn_nvmlDeviceGetMigMode(self, handle):
        self._count("nvmlDeviceGetMigMode", handle)
        return [0, 0]

    def _fn_nvmlSystemGetDriverVersion(self):
        self._count("nvmlSystemGetDriverVersion")
        return "580.159.04"

    def _fn_nvmlDeviceGetFieldValues(self, handle, field_ids):
        self._count("nvmlDeviceGetFieldValues", handle)
        return [SimpleNamespace(fieldId=f if isinstance(f, int) else f[0], nvmlReturn=_real.NVML_SUCCESS, valueType=3,
                                value=SimpleNamespace(ullVal=0, dVal=0.0, uiVal=0)) for f in field_ids]

    def _fn_nvmlDeviceGetEncoderUtilization(self, handle):
        self._count("nvmlDeviceGetEncoderUtilization", handle)
        return [0, 167000]

    def _fn_nvmlDeviceGetDecoderUtilization(self, handle):
        self._count("nvmlDeviceGetDecoderUtilization", handle)
        return [0, 167000]

    def _fn_nvmlDeviceGetPcieThroughput(self, handle, counter):
        self._count("nvmlDeviceGetPcieThroughput", handle)
        return 0


def pci_bus_id(index: int) -> str:
    """GPU `index`'s PCI address in NVML's form (an H100 HGX board's order: 0x19, 0x3B, 0x4C, ...)."""
    return f"00000000:{0x19 + 0x11 * index:02X}:00.0"


def driver_gpus_dir(path, gpus: int):
    """A directory shaped as the driver's /proc/driver/nvidia/gpus for `gpus` GPUs (what exporter.nvml reads
    to name a lost GPU): one directory per GPU, named by its PCI address in the kernel's form."""
    from pathlib import Path

    for index in range(gpus):
        domain, bus, rest = pci_bus_id(index).split(":")
        (Path(path) / f"{domain[-4:]}:{bus.lower()}:{rest}").mkdir(parents=True)
    return str(path)


class Clock:
    """time() and monotonic() that move only when told (the sampler's cadences without waiting)."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def calls_per_tick(gpus: int = 2, processes: dict[int, int] | None = None, ticks: int = 60, interval: float = 1.0,
                   gpm: bool = True, busy: float = 0.0, others: dict | None = None) -> dict:
    """The sampler's NVML calls over `ticks` steady ticks (after two warm-up ticks), per GPU: the mean
    per tick, the most in one tick, and by function. nvmlGpmMetricsGet names no device: it is given
    to the GPU whose GPM sample preceded it. `others`: more spatial sources by name (dcgm, nsys)."""
    import exporter.nvml as nvml_module
    import exporter.samplers.gpm as gpm_module
    import exporter.samplers.nvml as sampler_module
    from exporter.nvml import Nvml
    from exporter.samplers.gpm import GpmSource
    from exporter.samplers.nvml import NvmlSampler
    from exporter.samplers.xid import XidWatcher

    clock = Clock()
    library = NvmlLibrary(gpus, processes, busy, clock)
    saved = {m: m.time for m in (nvml_module, gpm_module, sampler_module)}
    try:
        for module in saved:
            module.time = clock
        with library.installed():
            backend = Nvml()
            sampler = NvmlSampler(backend, interval=interval)
            sampler.xid = XidWatcher(backend)  # its own thread's waits are no tick's calls: not started
            source = GpmSource() if gpm else None
            if hasattr(sampler, "spatial"):  # a tree from before issue 37 reads every sample anyway
                sampler.spatial = {**({"gpm": source} if source is not None else {}), **(others or {})}

            def tick():
                if source is not None:
                    getattr(source, "sample", source.tick)(backend, sampler.gpus, sampler.telemetry)  # before the contract: tick
                sampler.tick()
                clock.advance(interval)

            for _ in range(3):  # NVML lists the GPUs, GPM takes its first two samples
                tick()
            start = len(library.calls)
            worst: dict[int, int] = {}
            for _ in range(ticks):
                before = len(library.calls)
                tick()
                for index, n in _by_gpu(library.calls[before:]).items():
                    worst[index] = max(worst.get(index, 0), n)
            steady = library.calls[start:]
    finally:
        for module, original in saved.items():
            module.time = original
    total = _by_gpu(steady)
    functions: dict[str, int] = {}
    for name, _ in steady:
        functions[name] = functions.get(name, 0) + 1
    return {"gpus": gpus, "ticks": ticks, "processes": dict(processes or {}),
            "per_tick": {index: round(n / ticks, 3) for index, n in sorted(total.items(), key=lambda kv: str(kv[0]))},
            "most_in_one_tick": dict(sorted(worst.items(), key=lambda kv: str(kv[0]))),
            "by_function_per_tick": {name: round(n / ticks / gpus, 3) for name, n in sorted(functions.items())}}


def _by_gpu(calls) -> dict:
    out: dict = {}
    last = None
    for name, index in calls:
        if name == "nvmlGpmMetricsGet":
            index = last
        if index is not None:
            last = index
        out[index] = out.get(index, 0) + 1
    return out


def main(argv=None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(description="NVML calls per tick and GPU of the sampler, on the stand-in library")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--processes", type=int, default=6, help="time-sliced processes per GPU in the loaded case")
    p.add_argument("--ticks", type=int, default=60)
    p.add_argument("--source-dir", help="the tree whose exporter/ is counted (another checkout: before and after)")
    args = p.parse_args(argv)
    if args.source_dir:
        sys.path.insert(0, args.source_dir)
    out = {"idle": calls_per_tick(args.gpus, {}, args.ticks),
           "loaded": calls_per_tick(args.gpus, {i: args.processes for i in range(args.gpus)}, args.ticks, busy=99.0)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
