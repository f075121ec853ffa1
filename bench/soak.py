"""Soak: the exporter for a long run at a short interval under steady scraping; RSS and CPU over time.

    python3 bench/soak.py --out soak.json                      # replayed exports, no GPU (default 1 h)
    python3 bench/soak.py --live --out soak_live.json --seconds 480   # live NVML on a GPU host

Starts `python -m exporter` (replay: two exporter sources at once, an nsys export and an NVML
recording, so both replay paths run), scrapes /metrics from --scrapers threads at --rate scrapes per
second in all, and every --sample-every seconds writes RSS and the CPU share of one core since the
previous sample. The result file is rewritten at each sample, so a run cut short still reports.
At the end: the RSS slope (least squares, MB per hour, over the second half, after warm-up) and the
scrape errors. Never asserts: it reports.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.helpers import free_port, http_get, wait_for

TICKS = os.sysconf("SC_CLK_TCK")
FIXTURES = ROOT / "tests" / "fixtures"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def slope_mb_per_hour(points) -> float | None:
    """Least-squares slope of (seconds, bytes), in MB per hour."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return None if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var * 3600 / 2**20


def scraper(url, period, stop, counts):
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            status, _ = http_get(url, timeout=5)
            counts["ok" if status == 200 else "errors"] += 1
        except OSError:
            counts["errors"] += 1
        next_at += period
        stop.wait(max(0.0, next_at - time.monotonic()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3600)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--rate", type=float, default=20, help="scrapes per second, all scrapers together")
    p.add_argument("--scrapers", type=int, default=4)
    p.add_argument("--sample-every", type=float, default=30)
    p.add_argument("--live", action="store_true", help="live NVML and GPM (a GPU host) instead of the replays")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    port = free_port()
    sources = [] if args.live else ["--nvml-replay", str(FIXTURES / "nvml_h100_phases.json"),
                                    "--replay", str(FIXTURES / "h100_phases_100hz.sqlite")]
    cmd = [sys.executable, "-m", "exporter", "--port", str(port), "--interval", str(args.interval), *sources]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    counts = {"ok": 0, "errors": 0}
    try:
        wait_for(lambda: http_get(url + "/healthz", 1)[0] == 200, 60, 0.2, "exporter up")
        threads = [threading.Thread(target=scraper, args=(url + "/metrics", args.scrapers / args.rate, stop, counts),
                                    daemon=True) for _ in range(args.scrapers)]
        for t in threads:
            t.start()
        began = time.monotonic()
        last_t, last_cpu = began, cpu_seconds(proc.pid)
        samples = []
        while time.monotonic() - began < args.seconds and proc.poll() is None:
            time.sleep(min(args.sample_every, max(0.0, args.seconds - (time.monotonic() - began))))
            now, cpu = time.monotonic(), cpu_seconds(proc.pid)
            samples.append({"t_s": round(now - began, 1), "rss_bytes": rss_bytes(proc.pid),
                            "cpu_share_of_core": round((cpu - last_cpu) / (now - last_t), 5),
                            "scrapes_ok": counts["ok"], "scrape_errors": counts["errors"]})
            last_t, last_cpu = now, cpu
            half = [(s["t_s"], s["rss_bytes"]) for s in samples if s["t_s"] >= samples[-1]["t_s"] / 2]
            cpus = [s["cpu_share_of_core"] for s in samples]
            report = {
                "command": " ".join(sys.argv), "exporter": " ".join(cmd[1:]), "live": args.live,
                "interval_s": args.interval, "target_scrapes_per_s": args.rate, "elapsed_s": samples[-1]["t_s"],
                "rss_mb_first": round(samples[0]["rss_bytes"] / 2**20, 1),
                "rss_mb_last": round(samples[-1]["rss_bytes"] / 2**20, 1),
                "rss_mb_max": round(max(s["rss_bytes"] for s in samples) / 2**20, 1),
                "rss_slope_mb_per_hour_second_half": slope_mb_per_hour(half),
                "cpu_share_mean": round(sum(cpus) / len(cpus), 4),
                "scrapes_per_s": round(counts["ok"] / samples[-1]["t_s"], 1),
                "scrape_errors": counts["errors"], "exporter_alive": proc.poll() is None, "samples": samples,
            }
            args.out.write_text(json.dumps(report, indent=1) + "\n")
            print(f"{report['elapsed_s']:7.0f} s  RSS {report['rss_mb_last']:6.1f} MB  CPU {cpus[-1]:.3f}  "
                  f"scrapes {counts['ok']}  errors {counts['errors']}", flush=True)
    finally:
        stop.set()
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            err = ""
        if "Traceback" in (err or ""):
            print(err, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
