"""What every command of this distribution shares (nsys-ingest, gpu-spatial, gpu-spatial-exporter):
--version from the package metadata, the program name as it was typed, and a quiet end when the
reader of its output leaves (`| head -1`). Here because nsys_ingest is the package the others import."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

DISTRIBUTION = "gpu-spatial-exporter"
SCRIPTS = ("gpu-spatial", "gpu-spatial-exporter", "nsys-ingest")  # pyproject.toml, [project.scripts]


def missing_extra(command: str, package: str, extra: str) -> str | None:
    """None when `package` is installed, else the one line saying which extra brings it: what only
    plots, reports or dashboards need stays out of the exporter node's `pip install .`."""
    try:
        importlib.import_module(package)
        return None
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] != package:
            raise  # the package is there, something it needs is not: not ours to explain
    return f"{command} needs {package}, which `pip install .` leaves out: pip install '.[{extra}]'"


def version() -> str:
    from importlib import metadata  # here, not at import: ~2-4 MB resident in every exporter that never asks

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install .)"


class _Version(argparse.Action):
    """--version, read from the package metadata only when given (argparse's own action wants the text
    when the parser is built)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(f"{parser.prog} {version()}\n")
        parser.exit()


def add_version(parser) -> None:
    parser.add_argument("--version", action=_Version, help="print the version and exit")


def prog_name(module: str) -> str:
    """The command as typed: the console script's name, else `python3 -m MODULE`."""
    typed = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return typed if typed in SCRIPTS else f"python3 -m {module}"


def quiet_on_closed_pipe(run) -> int:
    """run()'s exit code; 0 when whoever read the output went away (`| head -1`): that reader has
    what it wanted, so no error and no traceback. stdout then points at /dev/null, so that the
    interpreter's last flush does not fail too."""
    try:
        code = run()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
