"""One traced window of this process's own GPU work, through CUPTI's activity API.

The CUPTI boundary is `CuptiApi` (NVIDIA's cupti-python, module `cupti`, plus the driver's device
list from cuda-bindings, a dependency of cupti-python). Tests pass a replay of records recorded on
the device instead (tests/fixtures/cupti_*.json).

A window: enable kernels (CONCURRENT_KERNEL: it does not serialise them), memcpy and memset; wait;
disable; wait a moment for kernels running across the end to finish; flush. CUPTI hands filled buffers to
a callback on its own thread (or the flushing one), which keeps five numbers per record (summary.Records,
bounded: a full store ends the window early); the application's threads do nothing beyond CUPTI's own
launch hooks. Outside windows nothing is enabled and nothing is kept. Kernels already running when the
window opens are not recorded (CUPTI records launches): each window edge can miss up to one kernel per stream.

Every CUPTI call runs on a worker thread of its own; the thread that answers the exporter only waits for
it, and for a bounded time. cupti-python turns each buffer into Python objects while holding the GIL (a
launch-bound loop whose callback only counted records ran at 14,800 launches a second on the H200), so a
job whose kernels are launched off the GIL (a trainer's autograd thread) can make records faster than they
are converted, and the final flush drains what is left: 1.2-1.4 s for a trainer alone on the H200. So
the answer never waits for the flush past `flush_wait_s`: it reports the
part of the window whose records were delivered (up to the last delivered kernel's end), and the records
still arriving are dropped. A window is never started while the last one's flush still runs.
"""
from __future__ import annotations

import threading
import time

from gpu_trace.occupancy import DeviceLimits, sm_fraction
from gpu_trace.summary import COPY, KERNEL, Records, summarise

BUFFER_BYTES = 1 << 20  # one CUPTI activity buffer, ~10k kernel records: cupti-python holds the GIL per buffer
MAX_RECORDS = 1_000_000  # per window: ~21 MB of arrays at most, freed when the window ends
SETTLE_S = 0.1  # after disabling: kernels running across the window's end complete before the flush
MAX_NS = 1 << 62
CLOSE_WAIT_S = 2.0  # past the window's end: CUPTI's disable must have returned by then
FLUSH_WAIT_S = 2.0  # after the disable and settle: the flush's records arrive until then, the answer goes


class CuptiUnavailable(Exception):
    """cupti-python or libcupti is missing, or CUPTI refused: the process runs untraced."""


class WindowLate(Exception):
    """A CUPTI call of the window did not return in time and nothing complete can be reported (or the
    last window's flush still runs): the exporter is answered with the reason, on time."""


class _Window:
    """One window's state, shared by the worker (CUPTI calls) and the answering thread."""

    def __init__(self, records: Records):
        self.records = records
        self.phase = "start"  # the CUPTI step the worker is in: named when it is late
        self.host_start = self.lo = self.hi = None
        self.devices: dict = {}  # CUDA ordinal -> (UUID, SM limits)
        self.closed = threading.Event()  # disabled (or failed): the window's end is known
        self.done = threading.Event()  # flushed (or failed)
        self.error: BaseException | None = None
        self.took: dict[str, float] = {}  # CUPTI step -> seconds it took (bench/cupti_models.py --probe reads it)

    def step(self, name: str, call) -> None:
        self.phase, began = name, time.monotonic()
        call()
        self.took[name] = round(time.monotonic() - began, 6)


def uuid_text(raw: bytes) -> str:
    """A CUuuid's 16 bytes in NVML's spelling: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class CuptiApi:
    """The few calls the tracer makes, on the real cupti-python and cuda-bindings."""

    def __init__(self):
        try:
            import cupti.cupti as cupti
            from cuda.bindings import driver
        except Exception as exc:  # noqa: BLE001 - ImportError, or OSError from a missing libcupti
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
            get = lambda a: int(call(d.cuDeviceGetAttribute(a, dev)))  # noqa: E731 - bound to this device's loop turn
            limits = DeviceLimits(
                sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                max_warps_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) // 32,
                max_blocks_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR),
                registers_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
                shared_per_sm=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR))
            out[ordinal] = (uuid_text(call(d.cuDeviceGetUuid(dev)).bytes), limits)
        return out


class Tracer:
    """Windows of this process's kernels; `trace()` is called by the answering thread (gpu_trace.client),
    the CUPTI calls run on a worker thread per window."""

    def __init__(self, api=None, max_records: int = MAX_RECORDS, settle_s: float = SETTLE_S, clock=time.time,
                 detach: bool = True, close_wait_s: float = CLOSE_WAIT_S, flush_wait_s: float = FLUSH_WAIT_S):
        self.api = api if api is not None else CuptiApi()
        self.max_records = max_records
        self.settle_s = settle_s
        self.close_wait_s = close_wait_s
        self.flush_wait_s = flush_wait_s
        self.clock = clock
        self._records: Records | None = None  # only while a window takes records
        self._lock = threading.Lock()  # a buffer is kept whole or not at all
        self._limits: dict[int, DeviceLimits] = {}
        self._fractions: dict[tuple, float] = {}  # launch shape -> SM share: kernels repeat their shapes
        self._full = threading.Event()
        self._worker: threading.Thread | None = None
        self._window: _Window | None = None
        self.late = 0  # records that arrived outside a window
        self.cut = 0  # windows answered before their flush returned
        self.detach = detach and hasattr(self.api, "detach")
        self._registered = False

    def _requested(self):
        return BUFFER_BYTES, 0

    def _completed(self, activities) -> None:
        """CUPTI's buffer thread: five numbers per record, nothing more."""
        with self._lock:
            records = self._records
            if records is None:
                self.late += len(activities)
                return
            self._keep(records, activities)

    def _keep(self, records: Records, activities) -> None:
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

    def _run(self, window: _Window, seconds: float, stop: threading.Event | None) -> None:
        """The worker: every CUPTI call of one window, however long each takes."""
        try:
            window.phase = "device query"
            window.devices = self.api.devices()
            self._limits = {ordinal: limits for ordinal, (_uuid, limits) in window.devices.items()}
            if not self._registered:
                window.step("registration", lambda: self.api.register(self._requested, self._completed))
                self._registered = True
            window.host_start, window.lo = self.clock(), self.api.timestamp()
            window.step("enable", self.api.enable)
            try:
                window.phase = "window"
                deadline = time.monotonic() + seconds
                while not self._full.is_set() and not (stop is not None and stop.is_set()):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._full.wait(min(left, 0.5))
                window.took["window"] = round(time.monotonic() - deadline + seconds, 6)
            finally:
                window.step("disable", self.api.disable)
                window.hi = self.api.timestamp()
                window.closed.set()
            time.sleep(self.settle_s)
            window.step("flush", self.api.flush)
        except Exception as exc:  # noqa: BLE001 - a CUPTI call failed: the answering thread says so
            window.error = exc
        finally:
            window.closed.set()
            window.done.set()
            with self._lock:
                self._records = None
            if self.detach:
                try:
                    window.step("detach", self.api.detach)
                except Exception:  # noqa: BLE001 - the next window registers again either way
                    pass
                self._registered = False
            window.phase = "finished"

    @property
    def took(self) -> dict[str, float]:
        """The last window's CUPTI steps and the seconds each took (so far)."""
        return dict(self._window.took) if self._window is not None else {}

    def idle(self, timeout: float | None = None) -> bool:
        """Waits for the last window's worker (its flush and detach) to end; True once it has."""
        if self._worker is not None:
            self._worker.join(timeout)
        return self._worker is None or not self._worker.is_alive()

    def trace(self, seconds: float, stop: threading.Event | None = None) -> dict:
        """One window of `seconds` (shorter if the store fills or `stop` is set): the report's body, returned
        at most `close_wait_s` + settle + `flush_wait_s` after the window's end, whatever CUPTI does."""
        if self._worker is not None and self._worker.is_alive():
            raise WindowLate(f"the last window's CUPTI {self._window.phase} has not returned yet")
        self._fractions.clear()
        self._full.clear()
        records = Records(self.max_records)
        window = self._window = _Window(records)
        with self._lock:
            self._records = records
        self._worker = threading.Thread(target=self._run, args=(window, seconds, stop), name="gpu_trace-window",
                                        daemon=True)
        self._worker.start()
        window.closed.wait(seconds + self.close_wait_s)
        if window.closed.is_set():
            window.done.wait(self.settle_s + self.flush_wait_s)
        with self._lock:  # the answer is made of what has arrived: later buffers are dropped
            self._records = None
            complete = window.done.is_set()  # the flush returned: every buffer was kept before it did
        if window.error is not None:
            raise window.error
        waited = (f"{self.settle_s + self.flush_wait_s:g} s after the window closed" if window.hi is not None
                  else f"{self.close_wait_s:g} s after the window's end")
        late = WindowLate(f"CUPTI's {window.phase} had not returned {waited}: nothing complete to report")
        if not complete:  # the flush still delivers: the part whose records arrived, if any did
            if not len(records):
                raise late
            self.cut += 1
            hi = min(window.hi or MAX_NS, int(max(records.end)))
        else:
            hi = window.hi
            if self._full.is_set() and len(records):  # ends where the complete part of the record ends
                hi = min(hi, int(max(records.end)))
        if window.lo is None or hi is None or hi <= window.lo:
            raise late
        lo = window.lo
        summary = summarise(records, lo, hi, {o: uuid for o, (uuid, _l) in window.devices.items()})
        # the window's length on CUPTI's clock, the one its kernels were timed with; its start on the host's
        return {"start": round(window.host_start, 6), "end": round(window.host_start + max(hi - lo, 0) / 1e9, 6),
                "devices": summary, "records": len(records), "refused": records.refused,
                "buffer_bytes": records.nbytes, "complete": complete, "native": False}

