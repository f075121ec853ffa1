"""The report `--by pod` over many pods: peak memory and time of the report process against Debian's
VictoriaMetrics (issue 28: under 300 MB for 70,000 groups).

    python3 bench/report_by_pod.py --pods 70000 --out /tmp/bypod

Each pod holds a quarter of a GPU for an hour (every workload family, SM and hidden-idle with a basis,
busy with basis nvml), imported through VictoriaMetrics' import API with a sample every 5 minutes: the
report's memory grows with the groups and the series of one answer, not with the samples, so few samples
per series measure the part that matters here. The report runs in its own process (`gpu-spatial report
--by pod --source counters --format json|csv --output FILE`); its peak RSS is /proc's VmHWM, read by
GNU time (`/usr/bin/time -f %M`). Writes OUT/result.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.fleet_vm import report, start_victoria_metrics, stop_victoria_metrics
from bench.ingest_bench import write_result
from tests.helpers import http_get

STEP = 300
HOUR = 3600


def lines(pods: int, t0: float):
    rates = {"held": 0.25, "busy": 0.2, "sm_active": 0.1, "hidden_idle": 0.1, "held_idle": 0.0}
    basis = {"busy": "nvml", "sm_active": "time_share", "hidden_idle": "time_share"}
    out = []
    for p in range(pods):
        node, gpu = divmod(p // 4, 8)
        base = (f'instance="node-{node:05d}",gpu="{gpu}",uuid="GPU-{node}-{gpu}",namespace="team-{p % 20:02d}",'
                f'pod="pod-{p:06d}",container="main",job="gpu-spatial-exporter"')
        for family, rate in rates.items():
            labels = base + (f',basis="{basis[family]}"' if family in basis else "")
            for k in range(HOUR // STEP + 1):
                out.append(f"gpu_workload_{family}_gpu_seconds_total{{{labels}}} {rate * k * STEP:.3f} "
                           f"{int((t0 + k * STEP) * 1000)}\n")
        if len(out) > 50000:
            yield "".join(out)
            out = []
    if out:
        yield "".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=70000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    t0 = (time.time() // HOUR) * HOUR - 3 * HOUR
    vm, url = start_victoria_metrics(args.out)
    result = {"pods": args.pods, "series": args.pods * 5, "samples_per_series": HOUR // STEP + 1}
    try:
        began = time.perf_counter()
        for body in lines(args.pods, t0):
            request = urllib.request.Request(url + "/api/v1/import/prometheus", data=body.encode(), method="POST")
            with urllib.request.urlopen(request, timeout=600):
                pass
        http_get(url + "/internal/force_flush", timeout=120)
        result["import_s"] = round(time.perf_counter() - began, 1)
        time.sleep(2)  # the flushed parts become searchable
        for fmt in ("json", "csv"):
            elapsed, rss, output = report(url, t0 - 60, t0 + HOUR, "pod", "counters", args.out, fmt)
            result[f"{fmt}_s"] = round(elapsed, 1)
            result[f"{fmt}_peak_rss_mb"] = round(rss, 1)
            result[f"{fmt}_output_mb"] = round(output.stat().st_size / 2 ** 20, 1)
            if fmt == "json":
                document = json.loads(output.read_text())
                result["groups"] = len(document["groups"])
                result["held_gpu_hours"] = document["total"]["held"]["gpu_hours"]
                del document
    finally:
        stop_victoria_metrics(vm, args.out)
    return write_result(result, args.out / "result.json")


if __name__ == "__main__":
    sys.exit(main())
