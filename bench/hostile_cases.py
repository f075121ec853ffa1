"""What each hostile export costs: the bounds tests/test_hostile.py asserts, before and after a change.

    python3 bench/hostile_cases.py --out bench/results/hostile_cases.json
    python3 bench/hostile_cases.py --code /tmp/before --out bench/results/hostile_cases_before.json

Every file of tests/fixtures/hostile (tools/make_hostile_corpus.py CASES) and the GENERATED ones at
full size (a 4 MB file of values on a self-linked overflow page, 10 M rows at one timestamp; built in
a temporary directory). Per case: the five nsys_ingest commands in one fresh process (the slowest
command's seconds, the process's peak RSS, the exit codes), and an upload to a real exporter (seconds
to its answer, the status, the exporter's peak RSS (VmHWM) after it, which only grows, so a case's
cost is its step over the previous one, and what it holds after it (VmRSS)). `--code DIR` measures
another source tree (e.g. a `git worktree` of an older commit) on the same files, so two runs back to
back compare code, not inputs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench.ingest_bench import write_result
from make_hostile_corpus import CASES, build_generated
from tests.helpers import Exporter
from tests.test_hostile import CHILD, CORPUS, peak_rss_mb, post

UPLOAD_TIMEOUT_S = 600


def rss_mb(pid: int) -> float:
    """What the exporter holds now (VmRSS): memory kept after an upload, where VmHWM is its peak."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in text.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--code", type=Path, default=ROOT, help="the source tree to measure (default: this one)")
    parser.add_argument("--only", nargs="*", help="only these cases")
    args = parser.parse_args()
    code = args.code.resolve()
    cases = {}
    with tempfile.TemporaryDirectory() as work:
        files = {case: CORPUS / f"{case}.sqlite" for case in CASES}
        files.update({path.stem: path for path in build_generated(Path(work) / "generated")})
        if args.only:
            files = {case: path for case, path in files.items() if case in args.only}
        for case, path in sorted(files.items()):
            done = subprocess.run([sys.executable, "-c", CHILD.format(root=str(code)), str(path), work],
                                  capture_output=True, text=True, check=True,
                                  env={**os.environ, "NSYS_INGEST_NO_PROGRESS": "1"})
            result = json.loads(done.stdout)
            rss = result.pop("peak_rss_mb")
            cases[case] = {"bytes": path.stat().st_size,
                           "cli_slowest_s": round(max(r["seconds"] for r in result.values()), 2),
                           "cli_peak_rss_mb": round(rss, 1),
                           "cli_exit_codes": {command: r["code"] for command, r in result.items()},
                           "cli_first_line": next((r["stderr"].strip().splitlines()[0][:160] for r in result.values()
                                                   if r["stderr"].strip()), "")}
        spool = Path(work) / "spool"
        exporter = Exporter("--no-nvml", "--no-mps", "--nsys-upload-token", "s3cret", "--nsys-spool-dir", str(spool),
                            "--interval", "0.5", "--nsys-upload-max-bytes", "1G")
        exporter.cwd = code
        with exporter:
            started_rss = peak_rss_mb(exporter.proc.pid)
            for case, path in sorted(files.items()):
                try:
                    status, _, seconds = post(exporter.url + "/api/v1/nsys", path.read_bytes(),
                                              timeout=UPLOAD_TIMEOUT_S)
                except OSError as exc:  # the exporter died or did not answer
                    status, seconds = repr(exc)[:80], None
                cases[case].update(upload_status=status, upload_s=None if seconds is None else round(seconds, 3),
                                   exporter_peak_rss_mb_after=round(peak_rss_mb(exporter.proc.pid), 1),
                                   exporter_rss_mb_after=round(rss_mb(exporter.proc.pid), 1))
            exporter_rss = peak_rss_mb(exporter.proc.pid)
    result = {"code": str(code), "cases": cases,
              "cli_slowest_s": max(c["cli_slowest_s"] for c in cases.values()),
              "cli_peak_rss_mb": max(c["cli_peak_rss_mb"] for c in cases.values()),
              "upload_slowest_s": max(c["upload_s"] or 0 for c in cases.values()),
              "exporter_start_rss_mb": round(started_rss, 1),
              "exporter_peak_rss_mb": round(exporter_rss, 1)}
    return write_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
