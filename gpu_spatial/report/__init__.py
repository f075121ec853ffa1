"""gpu-spatial report: who held, used and wasted GPUs over a range, from any Prometheus-compatible API.

    gpu-spatial report --prometheus http://prometheus:9090 --last 7d --by namespace
    gpu-spatial report --prometheus URL --start 2026-11-01 --end 2026-11-08 --by pod \\
        --match 'namespace=~"team-.*"' --format html --output account.html

Bad input (flags, URL, credentials, a range without data) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import time
from datetime import datetime, timezone

from exporter.vocabulary import HELD
from nsys_ingest.commandline import missing_extra

from .promapi import BASIC_AUTH_ENV, TOKEN_ENV, PrometheusAPI, ReportError, auth_header

PROG = "gpu-spatial report"
MAX_RANGE_DAYS = 400
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
CHART_STEPS = (60, 300, 900, 1800, 3600, 7200, 21600, 86400)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as every other bad input
        raise ReportError(f"{message} (see {PROG} --help)")


def parser() -> Parser:
    from .account import group_labels

    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog=f"Credentials: --bearer-token-file or ${TOKEN_ENV}; --basic-auth-file (USER:PASSWORD) or "
                      f"${BASIC_AUTH_ENV}.")
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="base URL of a Prometheus-compatible query API (Prometheus, Thanos, Mimir's "
                        "/prometheus prefix, VictoriaMetrics)")
    p.add_argument("--start", help="RFC3339 time, a date (UTC) or a Unix timestamp")
    p.add_argument("--end", help="as --start; default now")
    p.add_argument("--last", help="a duration ending at --end, e.g. 7d, 12h, 1w2d (default 7d)")
    p.add_argument("--by", default="namespace", choices=list(group_labels()),
                   help="group by this (node is the instance label; gpu: instance and uuid, with each GPU's ledger; "
                        "user: Unix users on hosts without a scheduler; claim: DRA claims; the holder kinds' labels: "
                        "exporter/holders.py KINDS); default namespace")
    p.add_argument("--match", action="append", default=[], metavar="MATCHER",
                   help='label matcher(s) on the workload series, e.g. \'namespace=~"team-.*"\' (repeatable)')
    p.add_argument("--format", default="text", choices=["text", "markdown", "csv", "json", "html"])
    p.add_argument("--output", "-o", metavar="FILE", help="write the report here instead of stdout")
    p.add_argument("--source", default="auto", choices=["auto", "rules", "counters"],
                   help="auto: the recording rules where their samples cover the range, the raw counters elsewhere; "
                        "rules: the same, with a note of how much came from the counters; counters: only them")
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a terminal")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per HTTP request (default 60)")
    p.add_argument("--max-response-mib", type=int, default=64, help="largest answer accepted (default 64)")
    p.add_argument("--bearer-token-file", metavar="FILE")
    p.add_argument("--basic-auth-file", metavar="FILE", help="a file holding USER:PASSWORD")
    return p


def parse_duration(text: str, flag: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", text)
    if not text or "".join(n + u for n, u in parts) != text.strip():
        raise ReportError(f"{flag} {text!r}: expected a duration such as 7d, 12h, 30m or 1w2d")
    return sum(float(n) * UNITS[u] for n, u in parts)


def parse_time(text: str, flag: str, now: float) -> float:
    if text == "now":
        return now
    try:
        value = float(text)
        if math.isfinite(value):
            return value
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(f"{flag} {text!r}: expected RFC3339 (2026-11-16T00:00:00Z), a date (2026-11-16, UTC) "
                          f"or a Unix timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def time_range(args, now: float) -> tuple[float, float]:
    if args.last and args.start:
        raise ReportError("give --start or --last, not both")
    end = parse_time(args.end, "--end", now) if args.end else now
    if args.start:
        start = parse_time(args.start, "--start", now)
    else:
        length = parse_duration(args.last or "7d", "--last")
        if length <= 0:
            raise ReportError("--last must be longer than 0 s")
        start = end - length
    from .render import iso

    if start == end:
        raise ReportError(f"--start and --end are the same time ({iso(start)}): a date is its midnight (UTC), so "
                          f"a whole day is --start {_day(start)} --end {_day(start + 86400)}; or use --last")
    if start > end:
        raise ReportError(f"--start ({iso(start)}) is after --end ({iso(end)}): swap them, or use --last")
    if end - start > MAX_RANGE_DAYS * 86400:
        raise ReportError(f"the range is longer than {MAX_RANGE_DAYS} days: report on a shorter one")
    return start, end


def progress_reporter(enabled: bool):
    """A tqdm bar on a terminal, a line per part (a day, or a span of rollups) with --progress elsewhere, nothing otherwise."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = None

        def update(done, total, _t):
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, desc="report", unit="part", leave=False, file=sys.stderr)
            bar.update(1)
            if done == total:
                bar.close()
        return update
    if enabled:
        from .render import iso

        def line(done, total, t):
            print(f"{PROG}: part {done}/{total} read (to {iso(t)})", file=sys.stderr, flush=True)
        return line
    return None


def chart_step(length: float) -> float:
    return next((s for s in CHART_STEPS if s >= length / 150), CHART_STEPS[-1])


def build(args, now: float):
    from exporter.vocabulary import WASTE_CELLS

    from . import account, empty, summary
    from .render import Report

    start, end = time_range(args, now)
    missing = args.format == "html" and missing_extra(f"{PROG} --format html", "matplotlib", "plots")
    if missing:
        raise ReportError(missing.removeprefix(f"{PROG} "))
    plan = account.Plan(args.by, account.parse_matchers(args.match), args.source)
    if args.timeout <= 0 or args.max_response_mib <= 0:
        raise ReportError("--timeout and --max-response-mib must be positive")
    api = PrometheusAPI(args.prometheus, auth_header(args.bearer_token_file, args.basic_auth_file),
                        timeout=args.timeout, max_bytes=args.max_response_mib << 20)
    collected = account.collect(api, plan, start, end, progress_reporter(args.progress))
    if not any(q == HELD for row in collected.totals.values() for q, _b in row):
        raise empty.diagnose_empty(api, plan, start, end, now)
    if all(not any(group) for group in collected.totals):
        collected.notes.append(account.other_groupings(api, plan, start, end))
    table = summary.summarize(collected.totals, plan.labels)
    collected.totals = {}  # the table has it all now
    report = Report(api.url, start, end, args.by, plan.labels, args.match, table, collected)
    if args.format == "html":
        from . import charts

        step = chart_step(end - start)
        wasters = summary.top_wasters(table, list(plan.labels), charts.MAX_GROUPS)
        charted = {tuple(row[label] for label in plan.labels) for _, row in wasters.iterrows()}
        waste = account.timeline(api, plan, collected, WASTE_CELLS, step, charted)
        report.charts = {"Waste by group over time": charts.waste_over_time(waste, plan.labels, step),
                         "Time vs spatial per group": charts.time_vs_spatial(table, plan.labels)}
        collected.queries = api.requests
    return report


def main(argv=None) -> int:
    from .render import FORMATS

    try:
        args = parser().parse_args(argv)
        report = build(args, time.time())
        text = FORMATS[args.format](report)
        chunks = [text] if isinstance(text, str) else text  # csv and json come as chunks: rows streamed
        if args.output:
            try:
                with open(args.output, "w", encoding="utf-8") as fh:
                    for chunk in chunks:
                        fh.write(chunk)
            except OSError as exc:
                raise ReportError(f"cannot write --output {args.output}: {exc.strerror or exc}") from None
        else:
            for chunk in chunks:
                sys.stdout.write(chunk)
        return 0
    except ReportError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
