"""The native record path (gputrace.c): where the library is, how to build it, and its Python face.

`pip install .` builds the library with the system C compiler (setup.py; optional: without a compiler the
install still succeeds and the tracer falls back to cupti-python, which perturbs what it measures). The
same file serves Python processes (ctypes, `NativeTracer`) and any other CUDA program
(CUDA_INJECTION64_PATH=library_path(): `gpu-spatial trace` sets it).
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "gputrace.c"
LIBRARY_ENV = "GPU_SPATIAL_TRACE_LIBRARY"  # a library built elsewhere (a container's mount)
REPORT_BYTES = 16384  # gpu_trace.protocol.MAX_REPORT_BYTES: what one window's body may take
COMPILE = ["-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall"]


class NativeUnavailable(Exception):
    """The library is not built here or cannot be loaded: the one line that says so."""


def library_path() -> Path | None:
    """The built library: $GPU_SPATIAL_TRACE_LIBRARY, else the extension that `pip install .` built here."""
    given = os.environ.get(LIBRARY_ENV)
    if given:
        return Path(given) if Path(given).is_file() else None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = HERE / f"_gputrace{suffix}"
        if candidate.is_file():
            return candidate
    return None


def build(out_dir: str | os.PathLike, compiler: str | None = None, source: os.PathLike = SOURCE) -> Path:
    """Compiles gputrace.c (or a mutant of it: bench/native_mutations.py) into out_dir/libgputrace.so with
    the system C compiler (tests, the device)."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeUnavailable("no C compiler to build the native tracer")
    out = Path(out_dir) / "libgputrace.so"
    subprocess.run([cc, *COMPILE, "-o", str(out), str(source), "-ldl", "-lpthread"], check=True,
                   capture_output=True, text=True)
    return out


def cupti_library() -> str | None:
    """libcupti where the library's own search (the loader's path, CUDA's folder) would miss it: the
    nvidia-cuda-cupti wheel that PyTorch installs (site-packages/nvidia/*/lib). None: let it search."""
    if os.environ.get("GPU_SPATIAL_CUPTI_LIBRARY"):
        return None  # the library reads it itself
    for folder in sys.path:
        for found in sorted(Path(folder or ".").glob("nvidia/*/lib/libcupti.so*")):
            return str(found)
    return None


def load(path: os.PathLike | None = None) -> ctypes.CDLL:
    """The library with its functions' signatures declared."""
    path = path or library_path()
    if path is None:
        raise NativeUnavailable("the native tracer is not built here (pip install . builds it with a C compiler)")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeUnavailable(f"the native tracer {path} does not load: {exc}") from None
    lib.gt_last_error.restype = ctypes.c_char_p
    lib.gt_load.argtypes = [ctypes.c_char_p]
    lib.gt_trace.argtypes = [ctypes.c_double, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t]
    lib.gt_blocks_per_sm.argtypes = [ctypes.c_int] * 7
    lib.gt_sms_occupied.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int]
    lib.gt_sms_occupied.restype = ctypes.c_double
    lib.gt_test_devices.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.gt_test_open.argtypes = [ctypes.c_int64, ctypes.c_size_t]
    lib.gt_test_feed.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.gt_test_feed.restype = ctypes.c_size_t
    lib.gt_test_summary.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
    lib.gt_test_counts.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_uint64)]
    lib.gt_test_counts.restype = ctypes.c_size_t
    return lib


def last_error(lib) -> str:
    return (lib.gt_last_error() or b"").decode(errors="replace")


class NativeTracer:
    """gpu_trace.tracer.Tracer's interface over the library: `trace()` is called by the answering thread
    (gpu_trace.client); the window runs in C on a worker thread, the GIL released all along."""

    native = True

    def __init__(self, lib=None, close_wait_s: float = 4.5):
        self.lib = lib if lib is not None else load()
        cupti = cupti_library()
        if self.lib.gt_load(cupti.encode() if cupti else None) != 0:  # libcupti and the driver: said once if missing
            raise NativeUnavailable(last_error(self.lib))
        self.close_wait_s = close_wait_s  # past the window's end: disable, settle, flush and summary are done
        self._stop = ctypes.c_int(0)
        self._worker: threading.Thread | None = None

    def trace(self, seconds: float, stop: threading.Event | None = None) -> dict:
        from gpu_trace.tracer import WindowLate

        if self._worker is not None and self._worker.is_alive():
            raise WindowLate("the last window's CUPTI calls have not returned yet")
        out = ctypes.create_string_buffer(REPORT_BYTES)
        result: dict = {}
        self._stop.value = 0

        def run():
            result["rc"] = self.lib.gt_trace(float(seconds), ctypes.byref(self._stop), out, REPORT_BYTES)

        self._worker = threading.Thread(target=run, name="gpu_trace-native", daemon=True)
        self._worker.start()
        deadline = time.monotonic() + seconds + self.close_wait_s
        while self._worker.is_alive() and time.monotonic() < deadline:
            self._worker.join(0.1)
            if stop is not None and stop.is_set():
                self._stop.value = 1
        if self._worker.is_alive():
            raise WindowLate(f"CUPTI had not returned {self.close_wait_s:g} s after the window's end")
        if result.get("rc") != 0:
            raise RuntimeError(last_error(self.lib) or "the native window failed")
        return json.loads(out.value)
