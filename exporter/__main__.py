"""python -m exporter: bind the port, build the samplers from the flags, serve them (exporter/server.py).

Exit codes: 0 after SIGTERM/SIGINT (one log line, no traceback), 2 for bad input (a flag, a file, a port
in use), one line on stderr."""
from __future__ import annotations

import contextlib
import logging
import signal
import sys

from exporter.config import parse_args

log = logging.getLogger("exporter")


def build_engine(args):
    """The engine and the optional upload spool for parsed flags. Raises SystemExit on bad input."""
    from exporter.engine import Engine
    from exporter.holders import build_holders
    from exporter.nvml import Nvml, NvmlError
    from exporter.nvml_replay import ReplayNvml
    from exporter.samplers.mps import MpsSampler
    from exporter.samplers.nvml import NvmlSampler
    from exporter.sources import build_spatial_sources
    from exporter.workload_sources import build_sources

    backend = factory = None
    if args.nvml_replay:
        try:
            backend = ReplayNvml(args.nvml_replay)
        except NvmlError as exc:
            raise SystemExit(f"error: {exc.reason}") from None
    elif not args.no_nvml:
        factory = Nvml  # retried while the driver is missing
    nvml = NvmlSampler(backend, interval=args.interval, factory=factory)
    spatial, disabled = build_spatial_sources(args, nvml)
    nvml.spatial = spatial  # GPM's busy time saves NVML's samples
    # those ticked in NVML's loop (GPM) first; an upload spool comes with the source that publishes it (nsys)
    samplers = sorted(spatial.values(), key=lambda source: not source.in_nvml_loop)
    upload = next((s.upload for s in samplers if getattr(s, "upload", None) is not None), None)
    if not args.no_mps:
        samplers.append(MpsSampler(args.proc_root, args.mps_pipe_dir, args.mps_control_binary, args.mps_timeout,
                                   interval=max(args.interval, 1.0)))
    holders = build_holders(args, nvml)
    samplers += holders
    if upload is not None:
        samplers.append(upload.retention)
    sources = build_sources(args, nvml, spatial)
    workloads = None
    if holders:  # with no holder kind, no holder is known: no workload families
        from exporter.workloads import WorkloadAccountant

        workloads = WorkloadAccountant(held_idle_after=args.held_idle_after, series_limit=args.holder_series_limit,
                                       sources=sources)
        samplers += sources
    elif sources:
        log.warning("%s: no holders are known here (--holders none): nothing to attribute to, so none of them "
                    "runs", ", ".join(source.name for source in sources))
    engine = Engine(nvml, samplers, order=args.spatial_sources, disabled_reasons=disabled, interval=args.interval,
                    process_series=(args.process_series, args.process_series_limit), workloads=workloads)
    # A source with a loop and windows of its own (DCGM, nsys) or a workload source (ctxsw, cupti) needs NVML's
    # samples as its windows end; GPM, ticked in NVML's loop, shares its window.
    if args.unwatched_interval > 0 and all(s.in_nvml_loop for s in spatial.values()) and not sources:
        engine.unwatched_interval = args.unwatched_interval
    return engine, upload


class HeldLogs(logging.Handler):
    """Keeps the records logged while starting; deliver() logs them through the handlers they were meant for."""

    def __init__(self, handlers: list[logging.Handler]):
        super().__init__()
        self.handlers, self.records = handlers, []

    def emit(self, record):
        self.records.append(record)

    def deliver(self) -> None:
        for record in self.records:
            for handler in self.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
        self.records = []


@contextlib.contextmanager
def held_logs():
    """The root logger's records held until deliver(); those not delivered by the end (a port in use) are
    dropped, those of bad input (SystemExit) logged before its line."""
    root = logging.getLogger()
    held = HeldLogs(root.handlers[:])
    root.handlers[:] = [held]
    try:
        yield held
    except SystemExit:
        held.deliver()
        raise
    finally:
        root.handlers[:] = held.handlers


class Stopped(Exception):
    """SIGTERM before the server took the signals over."""


def _stop_on_sigterm(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def main(argv=None, prog: str | None = None) -> int:
    from exporter.heap import limit_arenas

    limit_arenas()
    # Until the server handles the signals itself: a stop while starting is a normal stop too.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    args = parse_args(argv, prog)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from exporter.server import BindError, Limits, bind, serve

    try:
        # The inputs first (a bad --replay is the mistake to name even when the port is taken too), then the
        # port; a port in use is the one thing said: what building the samplers logged is dropped with it.
        with held_logs() as held:
            engine, upload = build_engine(args)
            sock = bind(args.listen_address, args.port)
            held.deliver()
        from exporter.app import create_app

        app = create_app(engine, upload, api_on=not args.no_api)
        port = sock.getsockname()[1]  # the port bound, also where --port 0 chose one
        unwatched = (f", NVML every {engine.unwatched_interval:g} s while no API reader watches"
                     if engine.unwatched_interval else "")
        log.info("serving on http://%s:%d/metrics (interval %.2f s%s, spatial sources %s%s)", args.listen_address,
                 port, args.interval, unwatched, ",".join(args.spatial_sources), "; JSON API off" if args.no_api else "")
        serve(app, sock, Limits.from_args(args))
    except BindError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # bad input found while building the samplers: its one line
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        raise
    except (KeyboardInterrupt, Stopped) as exc:
        log.info("stopped by %s while starting", exc.args[0] if exc.args else "SIGINT")
    return 0


if __name__ == "__main__":
    sys.exit(main())
