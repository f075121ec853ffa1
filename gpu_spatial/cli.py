"""gpu-spatial SUBCOMMAND ...: one entry point for people.

    gpu-spatial exporter [flags]   the Prometheus exporter (same as gpu-spatial-exporter / python3 -m exporter)
    gpu-spatial top [flags]        time next to space in the terminal
    gpu-spatial report [flags]     who held, used and wasted GPUs, from a Prometheus-compatible API
    gpu-spatial nsys CMD [flags]   the Nsight Systems tools (summary, diagnose, workloads, plot, openmetrics, scrub)
    gpu-spatial trace -- CMD       CMD's Python processes trace their own kernels when the exporter asks (MPS clients)

Each subcommand is imported only when asked for, so `top` costs no report dependencies and the other
way round. Errors are one line; bad input exits 2 (docs/operations.md, "Exit codes"); `--version` works on every
subcommand; output cut short by its reader (`| head -1`) ends quietly with 0.
"""
from __future__ import annotations

import importlib
import inspect
import sys

from nsys_ingest.commandline import quiet_on_closed_pipe, version

SUBCOMMANDS = {
    "exporter": ("exporter.__main__", "the Prometheus exporter"),
    "top": ("gpu_spatial.top", "time next to space in the terminal"),
    "report": ("gpu_spatial.report", "who held, used and wasted GPUs (from Prometheus)"),
    "nsys": ("nsys_ingest.__main__", "Nsight Systems exports: summary, diagnose, workloads, plot, openmetrics, scrub"),
    "trace": ("gpu_trace.__main__", "run a command whose Python processes trace their kernels for the exporter (MPS)"),
}


def usage() -> str:
    lines = ["usage: gpu-spatial SUBCOMMAND [--help] [--version] ...", "", "subcommands:"]
    lines += [f"  {name:<10} {what}" for name, (_module, what) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return quiet_on_closed_pipe(lambda: _dispatch(argv))


def _dispatch(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"], ["help"]):
        print(usage())
        return 0
    if not argv:  # nothing asked: the usage, as an error (a script that forgot the subcommand fails)
        print(usage(), file=sys.stderr)
        return 2
    if argv[0] == "--version":
        print(f"gpu-spatial {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"gpu-spatial: unknown subcommand {name!r}\n{usage()}", file=sys.stderr)
        return 2
    prog = f"gpu-spatial {name}"
    if "--version" in rest[:rest.index("--") if "--" in rest else None]:
        print(f"{prog} {version()}")
        return 0
    module = importlib.import_module(SUBCOMMANDS[name][0])
    takes_prog = "prog" in inspect.signature(module.main).parameters  # the usage line names what was typed
    return module.main(rest, prog=prog) if takes_prog else module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
