"""The GPU account at fleet scale on VictoriaMetrics: the report from the rollups and from the counters,
by namespace and by pod (issue 28's fleet target).

    python3 bench/fleet_vm.py --nodes 100 --days 7 --step 300 --out /tmp/fleetvm

The fleet of bench/fleet_sim.py (N nodes x 8 GPUs, the same holder mix, counters wandering +-20% per
sample; each GPU's ledger counters, gpu_lost and each node's up beside them), written as Prometheus text with
millisecond timestamps and pushed through VictoriaMetrics'
import API (`/api/v1/import/prometheus`), then Debian's vmalert replays the project's gpu-workload-recording
group over the whole range (`-replay.timeFrom/-replay.timeTo`) at --rule-interval, writing the rollups
back. Each report runs in its own process (`gpu-spatial report ... --format json --output FILE`) under GNU
time (peak RSS), twice: the first reads from disk, the second from the page cache. Writes OUT/result.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.fleet_sim import fleet
from bench.ingest_bench import write_result
from tests.helpers import RULES, free_port, http_get, wait_for
from tests.workload_scenario import series

ROOT = Path(__file__).resolve().parent.parent


def push(url: str, holders, t0: float, seconds: float, step: float, seed: int = 2) -> int:
    """Every counter of the fleet, a series at a time, in bodies of ~8 MB; returns the samples sent."""
    rng = np.random.default_rng(seed)
    elapsed = np.arange(0, seconds + step / 2, step)

    def counters():
        for family, labels, holder in series(holders):
            rate = holder.rates()[family]
            increments = rate * step * rng.uniform(0.8, 1.2, len(elapsed) - 1) if rate else np.zeros(len(elapsed) - 1)
            yield f"gpu_workload_{family}_gpu_seconds_total{{{labels}}} ", np.concatenate(([0.0], np.cumsum(increments)))
    return send(url, counters(), t0 + elapsed)


# Every GPU's ledger as an exporter publishes it (docs/ledger.md): its cells (sum 1 per second), the observed
# clock and gpu_lost; a node's `up`. The per-GPU series the report's GPU ledger reads from the raw counters.
GPU_CELLS = {"sm_active_work": 0.3, "hidden_idle": 0.2, "time_idle": 0.3, "unheld": 0.2}


def push_gpu_ledgers(url: str, holders, t0: float, seconds: float, step: float) -> int:
    """Each GPU's ledger counters, gpu_lost (0) and each node's up (1) at every step; returns the samples."""
    elapsed = np.arange(0, seconds + step / 2, step)

    def gauges_and_counters():
        for instance, gpu, model in sorted({(h.instance, h.gpu, h.model) for h in holders}):
            labels = f'gpu="{gpu}",instance="{instance}",job="gpu-spatial-exporter",model="{model}",uuid="GPU-{instance}-{gpu}"'
            for cell, rate in GPU_CELLS.items():
                yield f'gpu_ledger_gpu_seconds_total{{cell="{cell}",{labels}}} ', elapsed * rate
            yield f"gpu_ledger_observed_seconds_total{{{labels}}} ", elapsed
            yield f"gpu_lost{{{labels}}} ", elapsed * 0
            if gpu == "0":
                yield f'up{{instance="{instance}",job="gpu-spatial-exporter"}} ', elapsed * 0 + 1
    return send(url, gauges_and_counters(), t0 + elapsed)


def send(url: str, series, times) -> int:
    """(line prefix, values at `times`) of each series, as Prometheus text in bodies of ~8 MB; the samples sent."""
    stamps = [f" {int(t * 1000)}\n" for t in times]
    body, size, count = [], 0, 0
    for prefix, values in series:
        text = "".join(prefix + f"{v:.3f}" + stamp for v, stamp in zip(values, stamps))
        body.append(text)
        size += len(text)
        count += len(times)
        if size > 8 << 20:
            _post(url, "".join(body))
            body, size = [], 0
    if body:
        _post(url, "".join(body))
    return count


def _post(url: str, text: str):
    request = urllib.request.Request(url + "/api/v1/import/prometheus", data=text.encode(), method="POST")
    with urllib.request.urlopen(request, timeout=600):
        pass


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def start_victoria_metrics(out: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    vm = subprocess.Popen(["victoria-metrics", f"-storageDataPath={out / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}",
                           "-retentionPeriod=1", "-search.latencyOffset=0s", "-search.maxUniqueTimeseries=5000000",
                           "-search.maxSamplesPerQuery=10000000000",
                           # vmalert's replay writes a range query's answer in one request: above the default
                           # 32 MiB VictoriaMetrics refuses it and vmalert drops those rollups (the ledger's)
                           "-maxInsertRequestSize=1073741824"],
                          stdout=open(out / "vm.log", "w"), stderr=subprocess.STDOUT)
    wait_for(lambda: http_get(url + "/health", timeout=1)[0] == 200, 60, what="victoria-metrics")
    return vm, url


def stop_victoria_metrics(vm: subprocess.Popen, out: Path):
    vm.terminate()
    vm.wait(120)
    shutil.rmtree(out / "vm", ignore_errors=True)


def report(url: str, start: float, end: float, by: str, source: str, out: Path,
           fmt: str = "json") -> tuple[float, float, Path]:
    """(seconds, peak RSS in MiB, output file) of one report in its own process."""
    output = out / f"report-{by}-{source}.{fmt}"
    began = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "gpu_spatial", "report",
                           "--prometheus", url, "--start", str(start), "--end", str(end), "--by", by,
                           "--source", source, "--format", fmt, "--output", str(output), "--timeout", "600",
                           "--max-response-mib", "1024"], capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - began
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return elapsed, int(done.stderr.strip().splitlines()[-1]) / 1024, output


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--step", type=float, default=300.0, help="seconds between samples (a scrape interval)")
    p.add_argument("--rule-interval", default="5m", help="vmalert's evaluation interval for the rollups")
    p.add_argument("--replay-points", type=int, default=5000,
                   help="vmalert -replay.maxDatapointsPerQuery: below the evaluations in the range, vmalert "
                        "splits its range queries and stores each one's edge twice (the report then reads the "
                        "counters around them)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    seconds = args.days * 86400
    t0 = (time.time() // 3600) * 3600 - 3600 - seconds
    end = t0 + seconds
    vm, url = start_victoria_metrics(args.out)
    result = {"nodes": args.nodes, "gpus": args.nodes * 8, "days": args.days, "step_s": args.step,
              "rule_interval": args.rule_interval, "replay_points": args.replay_points}
    try:
        holders = fleet(args.nodes, seconds / 3600)
        result["holders"] = len(holders)
        result["series"] = sum(1 for _ in series(holders))
        began = time.perf_counter()
        result["samples"] = push(url, holders, t0, seconds, args.step)
        result["gpu_ledger_samples"] = push_gpu_ledgers(url, holders, t0, seconds, args.step)
        http_get(url + "/internal/force_flush", timeout=600)
        result["import_s"] = round(time.perf_counter() - began, 1)
        group = [dict(g, interval=args.rule_interval) for g in yaml.safe_load(RULES.read_text())["groups"]
                 if g["name"] == "gpu-workload-recording"]
        rules = args.out / "recording.rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": group}))
        began = time.perf_counter()
        subprocess.run(["vmalert", f"-rule={rules}", f"-datasource.url={url}", f"-remoteWrite.url={url}",
                        f"-replay.timeFrom={rfc3339(t0)}", f"-replay.timeTo={rfc3339(end)}", "-replay.rulesDelay=0s",
                        "-replay.disableProgressBar", "-httpListenAddr=127.0.0.1:0",
                        f"-replay.maxDatapointsPerQuery={args.replay_points}"],
                       check=True, capture_output=True, timeout=7200)
        http_get(url + "/internal/force_flush", timeout=600)
        result["vmalert_replay_s"] = round(time.perf_counter() - began, 1)
        status, body = http_get(url + "/api/v1/query?" + urllib.parse.urlencode(
            {"query": "count_over_time(gpu_workload:rollup_window_seconds[30d])", "time": end}), timeout=60)
        result["rollup_evaluations"] = float(json.loads(body)["data"]["result"][0]["value"][1])
        start = t0 + 3600  # the rollups' first window inside the range
        for by, source in (("namespace", "auto"), ("namespace", "counters"), ("pod", "counters")):
            for run in ("cold", "warm"):
                elapsed, rss, output = report(url, start, end, by, source, args.out)
                result[f"report_{by}_{source}_{run}_s"] = round(elapsed, 2)
                result[f"report_{by}_{source}_peak_rss_mb"] = round(rss, 1)
            document = json.loads(output.read_text())
            result[f"report_{by}_{source}_groups"] = len(document["groups"])
            result[f"report_{by}_{source}_queries"] = document["source"]["queries"]
            result[f"report_{by}_{source}_held_gpu_hours"] = document["total"]["held"]["gpu_hours"]
            result[f"report_{by}_{source}_sources"] = document["source"]["hours"]
            result[f"report_{by}_{source}_gpu_ledger"] = {k: document["gpu_ledger"][k] for k in (
                "gpus", "existed_gpu_hours", "observed_gpu_hours", "unobserved_gpu_hours", "cells_sum_gpu_hours")}
        result["held_gpu_hours_by_construction"] = round(sum(h.held for h in holders) * (end - start) / 3600, 3)
    finally:
        stop_victoria_metrics(vm, args.out)
    return write_result(result, args.out / "result.json")


if __name__ == "__main__":
    sys.exit(main())
