"""Resident memory of the exporter at two git revisions, the way a user meets it: each revision
unpacked fresh (`git archive`, no __pycache__), started with `python3 -m exporter` from its own
directory, read at --at seconds (VmRSS, the RSS column of `ps`, split into anonymous, file-backed and
shared memory, and private against shared pages from smaps_rollup), then once more after one
GET /api/v1/gpus.

    python3 bench/rss_compare.py --out rss.json [--revs 09a7b4f HEAD] [--runs 3] [--at 8 60] [-- EXPORTER FLAGS]

A --revs item may also be a directory (a tree unpacked elsewhere, `.`): it is copied without bytecode.

Run 1 of each revision starts from a tree without bytecode (Python compiles every module and writes
__pycache__), runs 2.. reuse it. Revisions alternate run by run, so a drift of the machine hits both.
Never asserts: it reports. Sizes are MiB (2**20 bytes, what bench/RESULTS.md has always called MB).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.helpers import free_port, http_get, wait_for

STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
ROLLUP_FIELDS = ("Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty")


def kib_fields(path: Path, names) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in names:
            out[key] = int(rest.split()[0])
    return out


def memory(pid: int) -> dict[str, float]:
    """MiB of the process now: VmRSS and its parts, and its private and shared pages."""
    status = kib_fields(Path(f"/proc/{pid}/status"), STATUS_FIELDS)
    rollup = kib_fields(Path(f"/proc/{pid}/smaps_rollup"), ROLLUP_FIELDS)
    mib = {key: round(value / 1024, 1) for key, value in status.items()}
    mib["private"] = round((rollup["Private_Clean"] + rollup["Private_Dirty"]) / 1024, 1)
    mib["shared"] = round((rollup["Shared_Clean"] + rollup["Shared_Dirty"]) / 1024, 1)
    mib["VmRSS_MB_decimal"] = round(status["VmRSS"] * 1024 / 1e6, 1)
    return mib


def unpack(rev: str, into: Path) -> Path:
    """A fresh tree of `rev`: a git revision, or a directory (where no .git came along), copied
    without its bytecode."""
    import shutil

    tree = into / f"tree{len(list(into.iterdir()))}"
    if Path(rev).is_dir():
        shutil.copytree(rev, tree, ignore=shutil.ignore_patterns("__pycache__", ".git"))
        return tree
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def one_run(tree: Path, at: list[float], flags: list[str]) -> dict:
    port = free_port()
    # The tree comes first (python -m puts the working directory first); PYTHONPATH stays for
    # packages carried outside site-packages (the device: /tmp/site).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--port", str(port), *flags], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.monotonic()
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz", 1)[0] in (200, 503), 60, 0.2, "exporter up")
        readings = {}
        for seconds in sorted(at):
            time.sleep(max(0.0, started + seconds - time.monotonic()))
            readings[f"{seconds:g}s"] = memory(proc.pid)
        http_get(f"http://127.0.0.1:{port}/api/v1/gpus")  # where the JSON API loads on first use
        readings["after_api_request"] = memory(proc.pid)
        return readings
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--revs", nargs="+", default=["09a7b4f", "HEAD"])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--at", type=float, nargs="+", default=[8.0, 60.0], help="seconds after start to read memory")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("exporter_flags", nargs="*", help="exporter flags, after --")
    args = p.parse_args()
    report = {"python": sys.version.split()[0], "flags": args.exporter_flags, "at_s": args.at,
              "runs": {rev: [] for rev in args.revs}}
    with tempfile.TemporaryDirectory(prefix="rss-compare-") as tmp:
        trees = {rev: unpack(rev, Path(tmp)) for rev in args.revs}
        for run in range(args.runs):
            for rev, tree in trees.items():
                reading = one_run(tree, args.at, args.exporter_flags)
                report["runs"][rev].append(reading)
                print(json.dumps({"rev": rev, "run": run + 1, **{at: r["VmRSS"] for at, r in reading.items()}}))
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
