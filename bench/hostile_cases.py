"""What each hostile export (tests/fixtures/hostile) costs: the bounds tests/test_hostile.py asserts.

    python3 bench/hostile_cases.py --out bench/results/hostile_cases.json

Per case: the five nsys_ingest commands in one fresh process (the slowest command's seconds, the
process's peak RSS), and an upload to a real exporter (seconds to its answer, and the status);
then the exporter's own peak RSS (VmHWM) after all of them.
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

from bench.ingest_bench import write_result  # noqa: E402
from tests.helpers import Exporter  # noqa: E402
from tests.test_hostile import CASES, CHILD, CORPUS, peak_rss_mb, post  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cases = {}
    with tempfile.TemporaryDirectory() as work:
        for case in sorted(CASES):
            done = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT)), str(CORPUS / f"{case}.sqlite"),
                                   work], capture_output=True, text=True, check=True,
                                  env={**os.environ, "NSYS_INGEST_NO_PROGRESS": "1"})
            result = json.loads(done.stdout)
            rss = result.pop("peak_rss_mb")
            cases[case] = {"cli_slowest_s": round(max(r["seconds"] for r in result.values()), 2),
                           "cli_peak_rss_mb": round(rss, 1),
                           "cli_exit_codes": {command: r["code"] for command, r in result.items()}}
        spool = Path(work) / "spool"
        with Exporter("--no-nvml", "--no-mps", "--nsys-upload-token", "s3cret", "--nsys-spool-dir", str(spool),
                      "--interval", "0.5") as exporter:
            for case in sorted(CASES):
                status, _, seconds = post(exporter.url + "/api/v1/nsys", (CORPUS / f"{case}.sqlite").read_bytes())
                cases[case].update(upload_status=status, upload_s=round(seconds, 3))
            exporter_rss = peak_rss_mb(exporter.proc.pid)
    result = {"cases": cases,
              "cli_slowest_s": max(c["cli_slowest_s"] for c in cases.values()),
              "cli_peak_rss_mb": max(c["cli_peak_rss_mb"] for c in cases.values()),
              "upload_slowest_s": max(c["upload_s"] for c in cases.values()),
              "exporter_peak_rss_mb": round(exporter_rss, 1)}
    return write_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
