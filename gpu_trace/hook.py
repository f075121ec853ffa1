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
    """The running client (started once per process), or None when CUPTI's bindings are absent."""
    global _client
    if _client is not None and _client.is_alive():
        return _client
    if importlib.util.find_spec("cupti") is None:
        print("gpu_trace: cupti-python is not installed (pip install cupti-python): this process is not traced",
              file=sys.stderr, flush=True)
        return None
    from gpu_trace.client import Client

    _client = Client(path)
    _client.start()
    return _client


def _restart_in_child() -> None:
    global _client
    _client = None
    if os.environ.get("GPU_SPATIAL_TRACE") == "1":
        start()


os.register_at_fork(after_in_child=_restart_in_child)
