"""gpu-spatial trace [--socket PATH] -- COMMAND ...: run COMMAND with per-client tracing on.

Sets CUDA_INJECTION64_PATH to the native library (gpu_trace/native: any CUDA program, Python or not,
then traces itself from its own C thread, without slowing down), GPU_SPATIAL_TRACE=1 and
gpu_trace/autostart first on PYTHONPATH (Python processes: the same library through ctypes, or
cupti-python where the library is not built, which slows the process inside each window), then replaces
itself with COMMAND. Every process it starts (and their children) connects to the exporter's socket and
traces its own kernels when the exporter asks (docs/mps-clients.md).
"""
from __future__ import annotations

import argparse
import os
import sys

from gpu_trace import protocol

# What a traced run needs, one line each (docs/mps-clients.md)
NEEDS = """needs:
  in the traced process: gpu_trace's native library (built by `pip install .` with the system C compiler,
    loads libcupti at run time), or else cupti-python (pip install cupti-python); with neither it runs untraced
  the exporter: --workload-cupti, listening on the same socket (--cupti-socket)"""

AUTOSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autostart")


def environment(env: dict, socket_path: str | None, library=None) -> dict:
    out = dict(env)
    out[protocol.ENABLE_ENV] = "1"
    if library is not None:
        out["CUDA_INJECTION64_PATH"] = str(library)
    out["PYTHONPATH"] = os.pathsep.join([AUTOSTART, os.path.dirname(os.path.dirname(AUTOSTART))]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if socket_path:
        out[protocol.SOCKET_ENV] = socket_path
    return out


def native_library(prog: str):
    """The native library's path, or None (said in one line: the fallback perturbs)."""
    from gpu_trace import native

    path = native.library_path()
    if path is None:
        print(f"{prog}: the native tracer is not built here (pip install . with a C compiler builds it): only "
              "Python processes are traced, through cupti-python, which slows them inside each window",
              file=sys.stderr)
    return path


def main(argv=None, prog: str = "gpu-spatial trace") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=NEEDS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", default=None, help=f"the exporter's socket (default ${protocol.SOCKET_ENV} "
                        f"or {protocol.DEFAULT_SOCKET})")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print(f"{prog}: give the command to run after --", file=sys.stderr)
        return 2
    try:
        os.execvpe(command[0], command, environment(dict(os.environ), args.socket, native_library(prog)))
    except OSError as exc:
        print(f"{prog}: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
