"""Summarise, diagnose, plot, convert and scrub Nsight Systems GPU-metrics exports, and split time-sliced
GPUs per process from their context switches (workloads). Installed as nsys-ingest and gpu-spatial nsys."""
from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from datetime import datetime

from nsys_ingest.commandline import add_version, missing_extra, prog_name, quiet_on_closed_pipe
from nsys_ingest.ctxsw import DEFAULT_ESTIMATOR, ESTIMATORS
from nsys_ingest.reader import DEFAULT_CHUNK_ROWS, Export, IngestError, progress_bar


def _time_arg(text: str):
    """Seconds from capture start ('12.5'), or a wall-clock time ('2026-11-22T05:56:10Z')."""
    try:
        return ("relative", float(text))
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want seconds from capture start or an ISO time") from None
    if stamp.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give a time zone (e.g. Z or +00:00)")
    return ("wall", stamp.timestamp())


def _window(export: Export, args):
    bounds = []
    for arg in (args.start, args.end):
        if arg is None:
            bounds.append(None)
        elif arg[0] == "relative":
            bounds.append(int(arg[1] * 1e9))
        else:
            bounds.append(export.to_ns(arg[1]))
    if None not in bounds and bounds[1] < bounds[0]:
        raise IngestError("--end is before --start")
    return bounds


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog or prog_name("nsys_ingest"), description=__doc__)
    parser.set_defaults(prog=parser.prog)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name, help_text, window=True):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(command_parser=p)
        add_version(p)
        p.add_argument("file", help="an Nsight Systems export (.sqlite), or a .nsys-rep where nsys is on the PATH "
                                    "(exported to .sqlite first)")
        if window:
            p.add_argument("--start", type=_time_arg, help="window start: seconds from capture start, or ISO time")
            p.add_argument("--end", type=_time_arg, help="window end: seconds from capture start, or ISO time")
            p.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS, help="rows read at a time")
        return p

    p = command("summary", "per GPU: mean, p50, p95 of time and spatial utilization, hidden idle, busy-but-idle share")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command("plot", "time and spatial utilization over time, one panel per GPU")
    p.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
    p = command("openmetrics", "OpenMetrics for `promtool tsdb create-blocks-from openmetrics`")
    p.add_argument("-o", "--output", required=True,
                   help="OpenMetrics text file to write (overwritten), e.g. run.om; then: promtool tsdb "
                        "create-blocks-from openmetrics run.om DATA_DIR")
    p = command("diagnose", "per GPU: a verdict (what limits it, what to change) from the kernel trace and GPU metrics")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command("workloads", "per GPU and process: resident time share and the SM activity (occupancy, tensor, DRAM, "
                             "GR) of its own slices, from the GPU's context switches (nsys profile --gpuctxsw=true)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--estimator", choices=ESTIMATORS, default=DEFAULT_ESTIMATOR,
                   help="how a GPU metrics sample is given to the slices: at (the slice at its timestamp), overlap "
                        "(split by the time each slice covers of it), fit (least-squares density per process)")
    p = command("scrub", "copy without environment, command lines, paths and host names", window=False)
    p.add_argument("-o", "--output", required=True,
                   help="the scrubbed copy to write (.sqlite, overwritten; never the input)")
    return parser


def _print_summary(summary: dict) -> None:
    rate = f"sampled at {summary['sampling_hz']:g} Hz" if summary["sampling_hz"] else "sampling rate not recorded"
    print(f"{summary['file']}: schema {summary['schema']}, {rate}")
    for gpu in summary["gpus"]:
        print(f"GPU {gpu['gpu']} {gpu['name']} ({gpu['uuid'] or 'no uuid'}): {gpu['samples']} samples, "
              f"{gpu['start_s']:.2f} to {gpu['end_s']:.2f} s")
        rows = [("time: GR active", gpu["time"]["gr_active"])]
        rows += [(f"space: {name.replace('_', ' ')}", stats) for name, stats in gpu["spatial"].items()]
        rows.append(("hidden idle SMs", gpu["hidden_idle"]))
        print(f"  {'':22} {'mean':>7} {'p50':>7} {'p95':>7}")
        for label, stats in rows:
            if stats:
                print(f"  {label:22} {stats['mean']:7.3f} {stats['p50']:7.3f} {stats['p95']:7.3f}")
            else:
                print(f"  {label:22} {'n/a':>7}")
        share = gpu["busy_but_idle_share"]
        print(f"  busy in time but idle in space ({summary['busy_but_idle_rule']}): "
              f"{'n/a' if share is None else f'{share:.1%}'} of samples")


def run(args) -> int:
    if args.command == "scrub":
        from nsys_ingest.scrub import describe, scrub

        print(describe(args.output, scrub(args.file, args.output)))
        return 0
    if args.command == "plot":  # a wrong output is the output's fault, said before the export is read
        missing = missing_extra(f"{args.prog} plot", "matplotlib", "plots")
        if missing:
            raise IngestError(missing)
        from nsys_ingest.plot import check_output

        check_output(args.output)
    with Export(args.file, require_metrics=args.command not in ("diagnose", "workloads")) as export:
        try:
            return _run_on(export, args)
        except sqlite3.DatabaseError as exc:  # part-way through a read: corruption, a limit, a type
            raise export.explain(exc) from None


def _run_on(export: Export, args) -> int:
    start_ns, end_ns = _window(export, args)
    rows = export.row_estimate
    if args.command == "diagnose":
        from nsys_ingest.kernels import kernel_row_estimate

        rows += kernel_row_estimate(export)
    update, close = progress_bar(rows, args.command)
    try:
        if args.command == "summary":
            from nsys_ingest.analysis import summarise

            summary = summarise(export, start_ns, end_ns, args.chunk_rows, update)
            close()
            if not summary["gpus"]:
                raise export.empty_window(start_ns, end_ns)
            if args.json:
                print(json.dumps(summary, indent=1))
            else:
                _print_summary(summary)
        elif args.command == "diagnose":
            from nsys_ingest.diagnose import diagnose, print_diagnosis

            result = diagnose(export, start_ns, end_ns, args.chunk_rows, update)
            close()
            if args.json:
                print(json.dumps(result, indent=1))
            else:
                print_diagnosis(result)
        elif args.command == "workloads":
            from nsys_ingest.ctxsw import attribute, print_workloads

            result = attribute(export, start_ns, end_ns, args.estimator, args.chunk_rows)
            close()
            if args.json:
                print(json.dumps(result.to_json(), indent=1))
            else:
                print_workloads(result)
        elif args.command == "plot":
            from nsys_ingest.plot import plot

            plot(export, args.output, start_ns, end_ns, args.chunk_rows, update)
            print(f"wrote {args.output}")
        elif args.command == "openmetrics":
            from nsys_ingest.openmetrics import write_openmetrics

            n = write_openmetrics(export, args.output, start_ns, end_ns, args.chunk_rows, update)
            if n == 0:
                raise export.empty_window(start_ns, end_ns)
            print(f"wrote {n} samples to {args.output}")
    finally:
        close()
    return 0


def main(argv=None, prog: str | None = None) -> int:
    """Exit codes: 0 done (also when the reader of the output left: `| head`), 2 bad input (one line
    on stderr, as the exporter), 130 interrupted."""
    parser = build_parser(prog)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand's parser, with its usage, not the parent's
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return quiet_on_closed_pipe(lambda: _run_reporting(args))


def _run_reporting(args) -> int:
    try:
        return run(args)
    except BrokenPipeError:
        raise  # the reader left: quiet_on_closed_pipe's
    except IngestError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except sqlite3.DatabaseError as exc:  # scrub's copy, corrupt part-way through
        print(f"error: {args.file} is truncated or corrupt ({exc}): export it again", file=sys.stderr)
    except OSError as exc:
        print(f"error: {exc.filename or args.file}: {exc.strerror or exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - an export nothing above foresaw: still one line, never a traceback
        print(f"error: {args.file} could not be read ({type(exc).__name__}: {str(exc)[:200]}): it is not an export "
              "nsys wrote, or nsys_ingest does not know this form of it (please report it)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
