"""`gpu-spatial top`: NVML time utilization next to SM activity in the terminal, per GPU and process.

    gpu-spatial top                                  the exporter's samplers, in this process
    gpu-spatial top --url http://host:9478           a running exporter, through /api/v1/gpus
    gpu-spatial top --no-nvml --replay tests/fixtures/h100_quarter_sms_steady_50hz.sqlite    no GPU needed

Every flag of the exporter's sources (--replay, --nvml-replay, --dcgm-exporter-url, --no-mps, ...) is
accepted for the in-process mode; see `gpu-spatial exporter --help`.
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import signal
import sys
import time

from exporter.config import _interval  # the exporter's: the same suffixes and bounds

LOG_LINES = 50  # the in-process engine's recent log lines, shown under `w` (stderr would tear the screen)


class _Keep(logging.Handler):
    def __init__(self, lines: collections.deque):
        super().__init__(logging.INFO)
        self.lines = lines
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))

    def emit(self, record):
        self.lines.append(self.format(record))


def _quit(_signum, _frame):
    """SIGTERM quits like q: curses.wrapper restores the terminal on the way out."""
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-spatial top", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="read a running exporter's JSON API (e.g. http://host:9478) "
                                               "instead of sampling in this process")
    p.add_argument("--interval", type=_interval, default=1.0,
                   help="refresh (and in-process sampling) interval, 0.1 s to 60 s: 1, 2s, 1m (default 1 s)")
    p.add_argument("--no-color", action="store_true", help="plain mode, no colour (also when NO_COLOR is set)")
    p.add_argument("--once", action="store_true", help="print one screen as plain text and exit (scripts)")
    p.add_argument("--size", default=None, metavar="COLSxROWS", help="screen size for --once (default: the terminal's)")
    return p


def _size(text: str | None) -> tuple[int, int]:
    if text is None:
        size = os.get_terminal_size(sys.stdout.fileno()) if sys.stdout.isatty() else os.terminal_size((120, 40))
        return size.columns, size.lines
    cols, _, rows = text.lower().partition("x")
    if not (cols.isdigit() and rows.isdigit() and 20 <= int(cols) <= 1000 and 5 <= int(rows) <= 1000):
        raise ValueError(f"--size {text!r}: want COLSxROWS, e.g. 80x24")
    return int(cols), int(rows)


def make_feed(args, rest: list[str]):
    if args.url:
        if rest:
            raise ValueError(f"{' '.join(rest)}: source flags are for the in-process mode, not with --url")
        from gpu_spatial.endpoints import with_scheme
        from gpu_spatial.top.feeds import HttpFeed

        url = with_scheme(args.url)  # 127.0.0.1:9478, as curl takes it
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url {args.url!r}: want http://host:port, e.g. http://127.0.0.1:9478")
        return HttpFeed(url, args.interval, timeout=min(2.0, max(args.interval, 0.5)))
    from exporter.config import build_parser as exporter_parser
    from gpu_spatial.top.feeds import InProcessFeed

    parser = exporter_parser()
    parser.prog = "gpu-spatial top"
    return InProcessFeed(parser.parse_args([*rest, "--interval", str(args.interval)]))


def once(feed, args) -> int:
    """One screen on stdout: 0 with values, 1 without (the exporter not answering, stale); a URL that no
    retry helps is bad input, one line on stderr and 2."""
    from gpu_spatial.top.render import View, plain, render

    width, height = _size(args.size)
    deadline = time.monotonic() + max(5.0, 3 * args.interval)
    state = feed.state()
    while state.version is None and not state.refused and time.monotonic() < deadline:
        time.sleep(0.05)
        state = feed.state()
    if state.refused:
        print(f"gpu-spatial top: {state.problem}", file=sys.stderr)
        return 2
    if state.version is not None:  # one more interval: sources that need two samples (GPM) report
        time.sleep(args.interval)
        state = feed.state()
    print(plain(render(state, View(), width, height, cut=args.size is not None or sys.stdout.isatty())))
    return 0 if state.version is not None and not state.problem else 1


def main(argv=None) -> int:
    args, rest = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    lines: collections.deque = collections.deque(maxlen=LOG_LINES)
    root = logging.getLogger()
    root.handlers[:] = [_Keep(lines)]
    root.setLevel(logging.INFO)
    try:
        if args.once:
            _size(args.size)  # a bad --size fails before the samplers start
        feed = make_feed(args, rest)
    except ValueError as exc:
        print(f"gpu-spatial top: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # the exporter's flags refused (argparse printed why) or a bad replay file
        if isinstance(exc.code, str):
            print(f"gpu-spatial top: {exc.code}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _quit)
    feed.start()
    try:
        if args.once:
            return once(feed, args)
        from gpu_spatial.top.tui import Refused, run

        colour = not args.no_color and not os.environ.get("NO_COLOR")
        try:
            return run(feed, args.interval, colour, lines)
        except Refused as refused:
            print(f"gpu-spatial top: {refused}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        return 0
    finally:
        feed.stop()
