"""Put this folder on PYTHONPATH and set GPU_SPATIAL_TRACE=1: every Python process started so opts into
per-client tracing (gpu_trace.hook). Any other sitecustomize on the path still runs after this one."""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("GPU_SPATIAL_TRACE") == "1":
    try:
        import gpu_trace  # noqa: F401 - only whether it imports
    except ImportError:  # mounted beside the application (a hostPath): the package is two folders up
        sys.path.append(os.path.dirname(os.path.dirname(_here)))
    try:
        from gpu_trace.hook import start

        start()
    except Exception as exc:  # noqa: BLE001 - never stop the application for the tracer
        print(f"gpu_trace: not started: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

_next = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
