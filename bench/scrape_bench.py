"""Scrape latency and CPU cost of this exporter against nvitop-exporter, on the same GPU.

    python3 bench/scrape_bench.py --out bench_results.json
    python3 bench/scrape_bench.py --exporters ours --latency-only --source-dir DIR -- --nvml-replay FILE

For each exporter: /metrics latency p50/p99 with 1 and 50 concurrent scrapers (keep-alive HTTP/1.1
clients in threads, each scraping back to back for --seconds), then the exporter's CPU time as a
share of one core while it only samples (no scrapers) at 1 s and 0.1 s interval. Never asserts on
time: it reports. `--source-dir` runs `python -m exporter` from another checkout (a before/after
comparison in one session), flags after `--` go to it; `--latency-only` skips the CPU windows.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.helpers import free_port, http_get, wait_for

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start(kind: str, interval: float, source_dir: Path = ROOT, extra=()) -> tuple[subprocess.Popen, int]:
    port = free_port()
    if kind == "ours":
        cmd = [sys.executable, "-m", "exporter", "--port", str(port), "--interval", str(interval), *extra]
    else:
        cmd = [sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", str(port),
               "--interval", str(interval)]
    # the checkout first, then whatever PYTHONPATH brings (packages carried to a machine without them)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(source_dir), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(cmd, cwd=source_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics", 1)[0] == 200, 30, what=f"{kind} up")
    time.sleep(2 * interval + 1)  # past the first samples
    return proc, port


def _scraper(port: int, seconds: float, gzipped: bool = False) -> tuple[list[float], int, int]:
    """One scraper: a keep-alive connection scraping back to back (its own process: no shared GIL); gzipped:
    asking for gzip, as Prometheus does."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    latencies, failures, size = [], 0, 0
    headers = {"Accept-Encoding": "gzip"} if gzipped else {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        try:
            conn.request("GET", "/metrics", headers=headers)
            size = len(conn.getresponse().read())
        except (OSError, http.client.HTTPException):  # a timed-out scrape counts, then reconnect
            failures += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            continue
        latencies.append(time.perf_counter() - t0)
    return latencies, failures, size


def scrape_latencies(port: int, clients: int, seconds: float, pid: int | None = None, gzipped: bool = False) -> dict:
    """Latencies, and the exporter's CPU time per scrape (less sensitive than latency to other load
    on the machine)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=clients) as pool:
        list(pool.map(abs, range(clients)))  # the workers started before the clock and CPU count do
        cpu0 = cpu_seconds(pid) if pid else 0.0
        results = list(pool.map(_scraper, [port] * clients, [seconds] * clients, [gzipped] * clients))
        cpu = cpu_seconds(pid) - cpu0 if pid else None
    latencies = [x for r in results for x in r[0]]
    failures = sum(r[1] for r in results)
    if len(latencies) < 2:
        return {"clients": clients, "scrapes": len(latencies), "failed_scrapes": failures}
    q = statistics.quantiles(latencies, n=100)
    return {"clients": clients, "gzip": gzipped, "scrapes": len(latencies), "failed_scrapes": failures,
            "p50_ms": round(q[49] * 1e3, 3), "p99_ms": round(q[98] * 1e3, 3),
            "scrapes_per_s": round(len(latencies) / seconds, 1), "body_bytes": max(r[2] for r in results),
            **({"server_cpu_us_per_scrape": round(1e6 * cpu / len(latencies), 1)} if cpu is not None else {})}


def cpu_share(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return round(100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0), 3)


def bench(kind: str, seconds: float, cpu_window: float, source_dir: Path = ROOT, extra=(),
          latency_only: bool = False) -> dict:
    """Each measurement on its own: one that fails is recorded as failed, the others still run."""
    result = {"exporter": kind, "source_dir": str(source_dir), "flags": list(extra)}
    for interval in ((1.0,) if latency_only else (1.0, 0.1)):
        try:
            proc, port = start(kind, interval, source_dir, extra)
        except (TimeoutError, RuntimeError) as exc:
            result[f"start_interval_{interval}s"] = f"failed: {exc}"
            continue
        try:
            if not latency_only:
                result[f"cpu_percent_of_core_interval_{interval}s"] = cpu_share(proc.pid, cpu_window)
            if interval == 1.0:
                result["latency"] = [scrape_latencies(port, n, seconds, proc.pid) for n in (1, 50)]
                result["cpu_percent_of_core_under_50_scrapers"] = None
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(json.dumps(result), flush=True)
    result.pop("cpu_percent_of_core_under_50_scrapers", None)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--seconds", type=float, default=10.0, help="scraping time per concurrency level")
    parser.add_argument("--cpu-window", type=float, default=30.0, help="seconds over which CPU time is measured")
    parser.add_argument("--exporters", default="ours,nvitop")
    parser.add_argument("--source-dir", type=Path, default=ROOT, help="the checkout `ours` runs from")
    parser.add_argument("--latency-only", action="store_true", help="skip the CPU measurements")
    parser.add_argument("flags", nargs="*", help="after --: flags for our exporter")
    args = parser.parse_args()
    results = [bench(kind, args.seconds, args.cpu_window, args.source_dir.resolve(), args.flags, args.latency_only)
               for kind in args.exporters.split(",")]
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
