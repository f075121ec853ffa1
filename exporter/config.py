"""Command-line flags; every flag can also be set by an environment variable GPU_EXPORTER_<FLAG>."""
from __future__ import annotations

import argparse
import os

from exporter import holders, sources, workload_sources
from nsys_ingest.commandline import add_version, prog_name

ENV_PREFIX = "GPU_EXPORTER_"
DEFAULT_PORT = 9478  # 9400 is dcgm-exporter's and 9100 node-exporter's


def _env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def _source_list(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    known = sources.default_order()
    unknown = [n for n in names if n not in known]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"want a list of distinct sources from {','.join(known)}, got {text!r}")
    return names


def _holder_kinds(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    if names in (("auto",), ("none",)):
        return names
    unknown = [n for n in names if n not in holders.KINDS]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"want auto, none or a list of distinct kinds from {','.join(holders.KINDS)}, "
                                         f"got {text!r}")
    return names


def _api_server(text: str) -> str:
    if text in ("auto", "off") or text.startswith(("http://", "https://")):
        return text
    raise argparse.ArgumentTypeError(f"want auto, off or an http(s):// URL, got {text!r}")


def _scaled(text: str, units: dict, what: str) -> float:
    text = str(text).strip()
    factor = units.get(text[-1:].lower(), None)
    try:
        value = float(text[:-1] if factor else text) * (factor or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want a {what}, e.g. 1{next(iter(units))}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want a {what} of at least 0")
    return value


def _size(text: str) -> int:
    return int(_scaled(text, {"g": 1024**3, "m": 1024**2, "k": 1024}, "size in bytes"))


def _duration(text: str) -> float:
    return _scaled(text, {"d": 86400, "h": 3600, "m": 60, "s": 1}, "duration in seconds")


def _at_least(convert, minimum, what: str, maximum=None):
    """`convert`, refusing values under `minimum` (timeouts of 0, a bound of no connections) or over
    `maximum`."""
    def checked(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: want {what}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{text!r}: want {what} of at least {minimum}" if maximum is None
                                             else f"{text!r}: want {what} from {minimum} to {maximum}")
        return value
    checked.__name__ = convert.__name__  # the help shows defaults by the converter's name
    return checked


# For the modules that declare their own flags (holder kinds, workload sources): add_arguments(parser).
duration, size, at_least, api_server, env_name = _duration, _size, _at_least, _api_server, _env_name
_port = _at_least(int, 0, "a port number", 65535)  # 0: any free port (the log names the one bound)
_interval = _at_least(_duration, 0.1, "an interval", 60)
# Prometheus scrapes every 15 s or more seldom: reading NVML every 10 s then costs a tenth of reading it every
# second (bench/RESULTS.md, "Cost per GPU, issue 47"), and 10 s stays within the ~14 s of samples NVML keeps.
UNWATCHED_INTERVAL_S = 10.0
_unwatched_interval = _at_least(_duration, 0.0, "an interval", UNWATCHED_INTERVAL_S)


def _bool(text: str) -> bool:
    return str(text).lower() in ("1", "true", "yes", "on")


def _human(value, kind) -> str:
    """A default as a user would type it: 10G, 7d, dcgm,gpm,nsys."""
    name = getattr(kind, "__name__", "")
    units = {"_size": (("G", 1024**3), ("M", 1024**2), ("K", 1024)),
             "_duration": (("d", 86400), ("h", 3600), ("m", 60))}.get(name)
    if units:
        for unit, factor in units:
            if value >= factor and value % factor == 0:
                return f"{value / factor:g}{unit}"
        return f"{value:g}" + ("s" if name == "_duration" else "")
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


SUFFIXES = {"_size": "suffixes K, M, G", "_duration": "suffixes s, m, h, d"}


class _HelpFormatter(argparse.HelpFormatter):
    """Each flag's default (from the environment where set) in the form it is typed, and the
    suffixes it takes; secrets and unset defaults are not shown."""

    def _get_help_string(self, action):
        text = action.help or ""
        kind = getattr(action.type, "__name__", "")
        shown = [] if action.default in (None, False, "", argparse.SUPPRESS) or "token" in action.dest \
            else [f"default: {_human(action.default, action.type)}"]
        if kind in SUFFIXES:
            shown.append(SUFFIXES[kind])
        if shown:
            words, env, tail = text.rpartition(" [env ")
            text = (words or tail) + " (" + "; ".join(shown) + ")" + (env + tail if words else "")
        return text.replace("%", "%%")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """Bad input: one line naming the problem, exit 2 (no usage dump)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _apply_environment(parser: argparse.ArgumentParser) -> None:
    """Takes each flag's default from its environment variable, and says so in --help."""
    for action in parser._actions:
        flag = next((n for n in action.option_strings if n.startswith("--")), None)
        if flag is None or flag in ("--help", "--version"):
            continue
        env = _env_name(flag)
        action.help = f"{action.help or ''} [env {env}]".strip()
        if env not in os.environ:
            continue
        raw = os.environ[env]
        try:
            if isinstance(action, argparse._StoreTrueAction):
                action.default = _bool(raw)
            else:
                action.default = (action.type or str)(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            parser.error(f"{env}={raw!r}: {exc}")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog or prog_name("exporter"),
        description="GPU utilization exporter: NVML time utilization next to spatial utilization "
                    "(DCGM profiling, NVML GPM or Nsight Systems GPU metrics), and CUDA MPS daemons.",
        formatter_class=_HelpFormatter,
    )
    add_version(p)
    g = p.add_argument_group("serving")
    g.add_argument("--listen-address", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    g.add_argument("--port", type=_port, default=DEFAULT_PORT,
                   help="port of /metrics, /healthz and /api/v1 (0: any free port, named in the log)")
    g.add_argument("--interval", type=_interval, default=1.0,
                   help="sampling interval (0.1 s to 60 s); NVML and GPM: while a reader of the JSON API watches")
    g.add_argument("--unwatched-interval", type=_unwatched_interval, default=UNWATCHED_INTERVAL_S,
                   help="how often NVML and GPM are read while no reader of the JSON API (top, a polling client) "
                        "came in the last 30 s: every value then describes the whole time since the last read, no "
                        "NVML sample lost (NVML keeps ~14 s of them: at most 10 s). 0: always --interval. Applies "
                        "where GPM is the only spatial source and no workload source runs (DCGM's and nsys' windows "
                        "need NVML's samples as they end)")
    g.add_argument("--no-api", action="store_true",
                   help="switch the JSON API off (/api/*, /docs: 404): a node that is only scraped never loads "
                        "FastAPI (19 MB); /metrics and /healthz answer as ever")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level")
    # HTTP limits (exporter/server.py): what one client can cost the exporter.
    g.add_argument("--http-max-connections", type=_at_least(int, 2, "a bound"), default=512,
                   help="connections served at once; one more closes an idle or slow connection of the client "
                        "address holding the most, so scrapes and probes get in while an attacker holds the rest")
    g.add_argument("--http-max-header-bytes", type=_at_least(_size, 1024, "a size"), default=64 * 1024,
                   help="largest request line plus headers; a larger one is answered 431 and closed")
    g.add_argument("--http-header-timeout", type=_at_least(_duration, 0.1, "a timeout"), default=10.0,
                   help="seconds a request line and headers may take from their first byte (slow clients)")
    g.add_argument("--http-idle-timeout", type=_at_least(_duration, 0.1, "a timeout"), default=5.0,
                   help="seconds a connection may wait for its first or next (keep-alive) request")
    g.add_argument("--http-body-timeout", type=_at_least(_duration, 0.1, "a timeout"), default=30.0,
                   help="seconds a request body may take beyond one second per --http-body-min-rate bytes; "
                        "also how long a response may wait for a client that does not read")
    g.add_argument("--http-body-min-rate", type=_at_least(_size, 1, "a rate"), default=64 * 1024,
                   help="bytes per second a request body must keep up (see --http-body-timeout)")

    g = p.add_argument_group("sources")
    g.add_argument("--spatial-sources", type=_source_list, default=sources.default_order(),
                   help="spatial sources in order of preference; per GPU the first that works is published")
    g.add_argument("--no-nvml", action="store_true", help="do not load NVML (a host without GPUs, replay only)")
    g.add_argument("--nvml-replay", metavar="FILE", default=None,
                   help="replay NVML answers recorded with `python -m exporter.nvml_replay record` instead of NVML")

    sources.add_arguments(p)

    g = p.add_argument_group("mps")
    g.add_argument("--no-mps", action="store_true", help="do not watch CUDA MPS daemons")
    g.add_argument("--proc-root", default="/proc", help="proc filesystem to scan (the host's /proc mounted into a container)")
    g.add_argument("--mps-pipe-dir", default=os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
                   help="MPS control pipe directory (CUDA_MPS_PIPE_DIRECTORY)")
    g.add_argument("--mps-control-binary", default="nvidia-cuda-mps-control", help="the MPS control program")
    g.add_argument("--mps-timeout", type=_duration, default=2.0, help="timeout of one MPS control query")
    g = p.add_argument_group("process series")
    g.add_argument("--process-series", choices=["container", "pid", "off"], default="container",
                   help="per-process utilization series: summed per container (pod) or command, per pid "
                        "(a new series per process), or none")
    g.add_argument("--process-series-limit", type=int, default=20,
                   help="at most this many per-process series per GPU; the rest are summed as command=\"other\"")
    g = p.add_argument_group("workloads")
    g.add_argument("--holders", type=_holder_kinds, default=("auto",),
                   help="kinds of GPU holders: auto (the kubelet where its socket exists, Slurm jobs with "
                        "--hpc-job-mapping-dir, and Unix users where neither is configured), none, or a list of "
                        f"{', '.join(holders.KINDS)}")
    g.add_argument("--holder-series-limit", type=_at_least(int, 1, "a limit"), default=64,
                   help="at most this many holders published per GPU (workload series and gpu_pod_info); the least "
                        "busy of the rest are summed as one holder pod=\"other\", counters included")
    g.add_argument("--held-idle-after", type=_duration, default=1800.0,
                   help="a holder with no CUDA process on its GPU, or under 1% of its time, for this long is held "
                        "idle (gpu_workload_held_idle)")
    holders.add_arguments(p)
    workload_sources.add_arguments(p)
    _apply_environment(p)
    return p


def parse_args(argv=None, prog: str | None = None) -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    for why in (*workload_sources.check_arguments(args), *sources.check_arguments(args)):
        parser.error(why)
    return args
