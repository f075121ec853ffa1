"""One traced window of this process's own GPU work, through CUPTI's activity API.

The CUPTI boundary is `CuptiApi` (NVIDIA's cupti-python, module `cupti`, plus the driver's device
list from cuda-bindings, a dependency of cupti-python). Tests pass a replay of records recorded on
the device instead (tests/fixtures/cupti_*.json).

A window: enable kernels (CONCURRENT_KERNEL: it does not serialise them), memcpy and memset; sleep on
this thread; disable; wait a moment for kernels running across the end to finish; flush. CUPTI hands
filled buffers to a callback on its own thread (or the flushing one), which keeps five numbers per
record (summary.Records, bounded: a full store ends the window early); the application's threads do
nothing beyond CUPTI's own launch hooks. Outside windows nothing is enabled and nothing is kept.
Kernels already running when the window opens are not recorded (CUPTI records launches): each window
edge can miss up to one kernel per stream.
"""
from __future__ import annotations

import threading
import time

from gpu_trace.occupancy import DeviceLimits, sm_fraction
from gpu_trace.summary import COPY, KERNEL, Records, summarise

BUFFER_BYTES = 4 << 20  # one CUPTI activity buffer; ~40k kernel records
MAX_RECORDS = 1_000_000  # per window: ~21 MB of arrays at most, freed when the window ends
SETTLE_S = 0.1  # after disabling: kernels running across the window's end complete before the flush


class CuptiUnavailable(Exception):
    """cupti-python or libcupti is missing, or CUPTI refused: the process runs untraced."""


def uuid_text(raw: bytes) -> str:
    """A CUuuid's 16 bytes in NVML's spelling: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class CuptiApi:
    """The few calls the tracer makes, on the real cupti-python and cuda-bindings."""

    def __init__(self):
        try:
            import cupti.cupti as cupti  # noqa: PLC0415 - loaded only when a window is asked for
            from cuda.bindings import driver
        except Exception as exc:  # ImportError, or OSError from a missing libcupti
            raise CuptiUnavailable(f"cupti-python is not importable ({type(exc).__name__}: {exc})") from None
        self._cupti, self._driver = cupti, driver
        kinds = cupti.ActivityKind
        self.kernel_kind, self.copy_kinds = int(kinds.CONCURRENT_KERNEL), (int(kinds.MEMCPY), int(kinds.MEMSET))
        self.kinds = (self.kernel_kind, *self.copy_kinds)

    def register(self, requested, completed) -> None:
        self._cupti.activity_register_callbacks(requested, completed)

    def enable(self) -> None:
        for kind in self.kinds:
            self._cupti.activity_enable(kind)

    def disable(self) -> None:
        for kind in self.kinds:
            self._cupti.activity_disable(kind)

    def flush(self) -> None:
        self._cupti.activity_flush_all(1)  # forced: buffers not yet full too

    def detach(self) -> None:
        """cuptiFinalize: CUPTI leaves the process until the next window (its launch hooks cost even
        with every activity disabled); the callbacks are registered again before the next enable."""
        self._cupti.finalize()

    def timestamp(self) -> int:
        return int(self._cupti.get_timestamp())

    def devices(self) -> dict[int, tuple[str, DeviceLimits]]:
        """CUDA ordinal -> (UUID, SM limits) of every GPU this process sees."""
        d = self._driver
        attr = d.CUdevice_attribute

        def call(result):
            err, *values = result
            if err != d.CUresult.CUDA_SUCCESS:
                raise CuptiUnavailable(f"CUDA driver call failed: {err}")
            return values[0] if len(values) == 1 else values

        call((d.cuInit(0)[0], None))
        out = {}
        for ordinal in range(call(d.cuDeviceGetCount())):
            dev = call(d.cuDeviceGet(ordinal))
            get = lambda a: int(call(d.cuDeviceGetAttribute(a, dev)))  # noqa: E731
            limits = DeviceLimits(
                sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                max_warps_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) // 32,
                max_blocks_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR),
                registers_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
                shared_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR))
            out[ordinal] = (uuid_text(call(d.cuDeviceGetUuid(dev)).bytes), limits)
        return out


class Tracer:
    """Windows of this process's kernels; `trace()` runs on the caller's (the client's) thread."""

    def __init__(self, api=None, max_records: int = MAX_RECORDS, settle_s: float = SETTLE_S, clock=time.time,
                 detach: bool = True):
        self.api = api if api is not None else CuptiApi()
        self.max_records = max_records
        self.settle_s = settle_s
        self.clock = clock
        self._records: Records | None = None  # only while a window is open
        self._limits: dict[int, DeviceLimits] = {}
        self._fractions: dict[tuple, float] = {}  # launch shape -> SM share: kernels repeat their shapes
        self._full = threading.Event()
        self.late = 0  # records that arrived outside a window
        self.detach = detach and hasattr(self.api, "detach")
        self._registered = False

    def _requested(self):
        return BUFFER_BYTES, 0

    def _completed(self, activities) -> None:
        """CUPTI's buffer thread: five numbers per record, nothing more."""
        records = self._records
        if records is None:
            self.late += len(activities)
            return
        kernel = self.api.kernel_kind
        for a in activities:
            if not a.end or a.end < a.start:
                continue  # incomplete (a forced flush of a kernel still running)
            if a.kind == kernel:
                shape = (a.device_id, a.grid_x * a.grid_y * a.grid_z, a.block_x * a.block_y * a.block_z,
                         a.registers_per_thread, a.static_shared_memory + a.dynamic_shared_memory)
                fraction = self._fractions.get(shape)
                if fraction is None:
                    limits = self._limits.get(a.device_id)
                    fraction = self._fractions[shape] = sm_fraction(limits, *shape[1:]) if limits else 0.0
                kept = records.add(KERNEL, a.device_id, a.start, a.end, fraction)
            elif a.kind in self.api.copy_kinds:
                kept = records.add(COPY, a.device_id, a.start, a.end, 0.0)
            else:
                continue
            if not kept:
                self._full.set()
                return

    def trace(self, seconds: float, stop: threading.Event | None = None) -> dict:
        """One window of `seconds` (shorter if the store fills or `stop` is set): the report's body."""
        devices = self.api.devices()
        self._limits = {ordinal: limits for ordinal, (_uuid, limits) in devices.items()}
        self._fractions.clear()
        self._full.clear()
        records = self._records = Records(self.max_records)
        if not self._registered:
            self.api.register(self._requested, self._completed)
            self._registered = True
        host_start, lo = self.clock(), self.api.timestamp()
        self.api.enable()
        try:
            deadline = time.monotonic() + seconds
            while not self._full.is_set() and not (stop is not None and stop.is_set()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._full.wait(min(left, 0.5))
        finally:
            self.api.disable()
            hi = self.api.timestamp()
        time.sleep(self.settle_s)
        self.api.flush()
        self._records = None
        if self.detach:
            self.api.detach()
            self._registered = False
        if self._full.is_set() and len(records):  # ends where the complete part of the record ends
            hi = min(hi, int(max(records.end)))
        summary = summarise(records, lo, hi, {o: uuid for o, (uuid, _l) in devices.items()})
        # the window's length on CUPTI's clock, the one its kernels were timed with; its start on the host's
        return {"start": round(host_start, 6), "end": round(host_start + (hi - lo) / 1e9, 6), "devices": summary,
                "records": len(records), "refused": records.refused, "buffer_bytes": records.nbytes}
