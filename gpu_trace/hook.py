"""Start the tracer's thread in this process (what GPU_SPATIAL_TRACE=1 and `gpu-spatial trace` do).

Cheap at start: no CUPTI, no CUDA, one thread waiting on a socket. A forked child does not inherit
the connection (the socket's peer would be the parent's pid): it starts its own thread.
"""
from __future__ import annotations

import importlib.util
import os
import sys

_client = None


def start(path: str | None = None):
    """The running client (started once per process), or None when this process cannot be traced.

    The native library records without perturbing the process; where it is not built, cupti-python does,
    at a cost to the process inside each window (said once). Where the library was injected by the CUDA
    driver (CUDA_INJECTION64_PATH), its own thread already serves this process: no second client."""
    global _client
    if _client is not None and _client.is_alive():
        return _client
    from gpu_trace import native
    from gpu_trace.client import Client

    try:
        lib = native.load()
    except native.NativeUnavailable as exc:
        if importlib.util.find_spec("cupti") is None:
            print(f"gpu_trace: {exc}, and cupti-python is not installed: this process is not traced",
                  file=sys.stderr, flush=True)
            return None
        print(f"gpu_trace: {exc}: tracing through cupti-python, which slows this process inside each window",
              file=sys.stderr, flush=True)
        _client = Client(path)
    else:
        if not lib.gt_claim():
            return None  # the injected library's thread traces this process
        lib.gt_prepare()  # before CUDA initialises: queued timestamps (work queued before a window counts)
        _client = Client(path, tracer_factory=lambda: native.NativeTracer(lib))
    _client.start()
    return _client


def _restart_in_child() -> None:
    global _client
    _client = None
    if os.environ.get("GPU_SPATIAL_TRACE") == "1":
        start()


os.register_at_fork(after_in_child=_restart_in_child)
