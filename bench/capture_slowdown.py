"""How much a capture slows a workload, from one long run cut into seconds with and without a capture.

Separate runs under the same condition differed by up to 56 % on the power-capped lent H200, which
swamps a 1 % effect. Here one process runs throughout and logs its progress ("time done" lines, every
0.2 s: bench/ctxsw_jobs.py --progress); a poller records every 0.2 s whether a capture's `sleep WINDOW`
runs (the capture proper) and whether any nsys process lives (start, finish, export). Each one-second bin
is "on" when the capture ran for all of it (with a poll interval of margin on both sides), "off" when no
nsys process lived within 2 s of it, else left out (nsys starting or exporting). Each capture window's on
bins are compared with the off bins within --neighbourhood seconds before and after it, which cancels the
slow drift of a power-capped clock; the slowdown is 1 - on/off per window, then its mean and the spread.

    python3 bench/capture_slowdown.py PROGRESS_FILE TIMELINE_JSONL [--neighbourhood 30]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.capture_slowdown import read_progress, read_timeline, slowdown


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("progress", type=Path)
    p.add_argument("timeline", type=Path)
    p.add_argument("--neighbourhood", type=float, default=30.0, help="seconds around a window whose off bins it is "
                                                                       "compared with")
    args = p.parse_args(argv)
    result = slowdown(read_progress(args.progress), read_timeline(args.timeline), args.neighbourhood)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
