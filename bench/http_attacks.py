"""Two attacks on the exporter's HTTP server without a token (issue 25, items 1 and 2), measured from outside.

    python3 bench/http_attacks.py --out bench/results/http_attacks_after.json
    python3 bench/http_attacks.py --source-dir /tmp/before --out bench/results/http_attacks_before.json

- pipelining: CONNECTIONS sockets each send REQUESTS `GET /metrics` in one stream and never read.
- query strings: CLIENTS clients request `GET /api/v1/gpus?a=1&a=1&...` (QUERY_BYTES long) back to back.
- api_first_load: resident memory before and after the first /api/v1/gpus (FastAPI loads), and with --no-api.
For each: the exporter's resident memory (VmRSS from /proc, sampled every 0.1 s: before, peak, and after
the clients left), the latency of a separate scraper (one keep-alive connection scraping /metrics every
50 ms, 5 s timeout: p50, p99, max, failures), and the tracebacks in the exporter's log. `--source-dir`
runs `python -m exporter` from another checkout (the before figure). Reports, never asserts on time;
tests/test_exposure.py asserts what holds on any machine (memory bounds, scrapes keep succeeding).
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
from tests.http_load import MB, RssWatch, Scraper, pipelining, query_strings, rss


class Exporter:
    """`python -m exporter --no-nvml --no-mps` from `source_dir` on a free port, its log in a file."""

    def __init__(self, source_dir: Path = ROOT, *extra: str):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="exporter-", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONPATH": str(source_dir), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter", "--no-nvml", "--no-mps", "--port",
                                      str(self.port), *extra], cwd=source_dir, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: http_get(f"http://127.0.0.1:{self.port}/healthz", 1)[0] == 200, 30, what="exporter up")

    def tracebacks(self) -> int:
        return Path(self.log.name).read_text(errors="replace").count("Traceback")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        Path(self.log.name).unlink(missing_ok=True)


def measure(source_dir: Path, attack, preload_api: bool, **kwargs) -> dict:
    exporter = Exporter(source_dir)
    try:
        if preload_api:  # FastAPI's one-time load is not the attack's cost
            http_get(f"http://127.0.0.1:{exporter.port}/api/v1/gpus", 10)
        time.sleep(2)
        before = rss(exporter.proc.pid)
        with RssWatch(exporter.proc.pid) as watch, Scraper(exporter.port) as scraper:
            time.sleep(1)
            what = attack(exporter.port, **kwargs)
        time.sleep(3)  # the clients are gone: what is kept
        after = rss(exporter.proc.pid)
        return {**what, "rss_before_mb": round(before / MB, 1), "rss_peak_mb": round(watch.peak / MB, 1),
                "rss_after_mb": round(after / MB, 1), "rss_kept_mb": round((after - before) / MB, 1),
                "scrapes_during": scraper.figures(), "tracebacks_in_log": exporter.tracebacks(),
                "exporter_alive": exporter.proc.poll() is None}
    finally:
        exporter.stop()


def api_first_load(source_dir: Path) -> dict:
    """Resident memory before and after the first JSON API request (FastAPI and pydantic load then),
    and the same request with --no-api."""
    out = {}
    for name, extra in (("api_on", ()), ("no_api", ("--no-api",))):
        exporter = Exporter(source_dir, *extra)
        try:
            for _ in range(3):
                http_get(f"http://127.0.0.1:{exporter.port}/metrics", 5)
            time.sleep(2)
            before = rss(exporter.proc.pid)
            status = http_get(f"http://127.0.0.1:{exporter.port}/api/v1/gpus", 30)[0]
            time.sleep(1)
            out[name] = {"status": status, "rss_before_mb": round(before / MB, 1),
                         "rss_after_mb": round(rss(exporter.proc.pid) / MB, 1),
                         "grown_mb": round((rss(exporter.proc.pid) - before) / MB, 1)}
        finally:
            exporter.stop()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 bench/http_attacks.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--source-dir", type=Path, default=ROOT, help="checkout whose exporter is attacked")
    p.add_argument("--out", type=Path, help="JSON file to write (printed too)")
    p.add_argument("--seconds", type=float, default=15.0, help="how long each attack lasts")
    p.add_argument("--connections", type=int, default=40)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--query-bytes", type=int, default=60_000)
    p.add_argument("--attacks", default="pipelining,query_strings,api_first_load",
                   help="which to run, comma-separated (api_first_load: FastAPI's one-time cost, and --no-api)")
    p.add_argument("--label", default="", help="what is measured, e.g. the commit of --source-dir")
    args = p.parse_args(argv)
    attacks = {"pipelining": (pipelining, False, dict(connections=args.connections, requests=args.requests)),
               "query_strings": (query_strings, True, dict(clients=args.clients, query_bytes=args.query_bytes))}
    commit = subprocess.run(["git", "-C", str(args.source_dir), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {"source_dir": str(args.source_dir), "label": args.label, "commit": commit or "unknown",
              "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    for name in args.attacks.split(","):
        if name == "api_first_load":
            result[name] = api_first_load(args.source_dir)
            continue
        attack, preload_api, kwargs = attacks[name]
        result[name] = measure(args.source_dir, attack, preload_api, seconds=args.seconds, **kwargs)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
