"""`gpu-spatial report` and `gpu-spatial top --url` against a hostile API (issue 39, attack 8), measured from outside.

    python3 bench/report_attacks.py --out bench/results/report_attacks_after.json
    python3 bench/report_attacks.py --code /tmp/before --out bench/results/report_attacks_before.json

The hostile server is tests/test_report_hostile.py's (real HTTP on 127.0.0.1); each case runs the command in a
fresh process from `--code` (default: this tree): wall seconds, peak RSS (VmRSS every 0.1 s from /proc), exit
status, stderr lines, whether it printed a traceback; killed at --timeout. Reports, never asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.http_load import run_measured
from tests.test_report_hostile import HostilePrometheus

REPORT = ["-m", "gpu_spatial", "report", "--last", "1h", "--prometheus"]
# name -> (arguments after the URL's path, the path): the cases and sizes
CASES = {
    "nested_json": (REPORT, "nested", []),
    "label_that_is_a_list": (REPORT, "list-label", []),
    "timeline_value_error": (REPORT, "timeline", ["--format", "html"]),
    "header_drip_timeout_5": (REPORT, "header-drip", ["--timeout", "5"]),
    "60_mib_of_distinct_groups": (REPORT, "groups=1000000", []),
    "60_mib_of_label_less_series": (REPORT, "labelless=1700000", []),
    "100001_distinct_groups": (REPORT, "groups=100001", []),  # within the values cap: the groups cap
    "300000_label_less_series": (REPORT, "labelless=300000", []),  # within the values cap: a series twice
    "top_url_nested_json": (["-m", "gpu_spatial", "top", "--once", "--url"], "nested", []),
    # issue 42, item 9: 60 MiB on the wire in 1-byte chunks (10 MiB of body: 280,000 label-less series of 39 bytes), the
    # same body in 64 KiB chunks; 60 MiB of body in either (past the 64 MiB cap once framed in 1-byte chunks)
    "60_mib_framed_in_1_byte_chunks": (REPORT, "chunks1=280000", []),
    "the_same_in_64_kib_chunks": (REPORT, "chunks65536=280000", []),
    "60_mib_in_1_byte_chunks": (REPORT, "chunks1=1700000", []),
    "60_mib_in_64_kib_chunks": (REPORT, "chunks65536=1700000", []),
}


def run(code: Path, argv: list[str], timeout: float) -> dict:
    done = run_measured([sys.executable, *argv], code, {**os.environ, "PYTHONPATH": str(code)}, timeout)
    text, shown = done.pop("stderr"), done.pop("stdout").decode(errors="replace")
    lines = text.strip().splitlines()
    return {**done, "stderr_lines": len(lines), "traceback": "Traceback" in text,
            "last_line": (lines[-1] if lines else next((l for l in shown.splitlines() if "not answering" in l), ""))[:300]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--code", type=Path, default=ROOT)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), HostilePrometheus)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    results = {"code": str(args.code.resolve()), "cases": {}}
    for name, (command, path, more) in CASES.items():
        if args.only and name not in args.only:
            continue
        results["cases"][name] = run(args.code.resolve(), [*command, f"{url}/{path}", *more], args.timeout)
        print(name, json.dumps(results["cases"][name]), flush=True)
    server.shutdown()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
