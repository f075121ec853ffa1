"""Fleet simulation for `gpu-spatial report`: what the workload series cost a Prometheus at N nodes x 8 GPUs,
and how long the report and a dashboard fleet table take with and without the recording rules.

    python3 bench/fleet_sim.py --nodes 100 --hours 24 --step 60 --out /tmp/fleet100

Holders are drawn from a realistic mix (exclusive, time-sliced with 2-4 replica holders, MPS with 2-4
clients, MIG slices 3g/2g/1g/1g, holders that idle), 20 namespaces, a quarter of the exclusive GPUs held
by Slurm jobs. Busy and SM-active wander per sample, so the counters compress like real ones. Steps:
OpenMetrics -> `promtool tsdb create-blocks-from openmetrics` -> Prometheus -> `promtool tsdb
create-blocks-from rules` (the project's gpu-workload-recording group) -> Prometheus restarted on both ->
timings. Prints one JSON object (and writes it to OUT/result.json).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import RULES, free_port, http_get, wait_for
from tests.workload_scenario import Holder, series

MIG_SLICES = (3 / 7, 2 / 7, 1 / 7, 1 / 7)


def fleet(nodes: int, hours: float, seed: int = 1) -> list[Holder]:
    rng = random.Random(seed)
    holders, end = [], hours * 3600
    for n in range(nodes):
        instance = f"gpu-node-{n:04d}"
        model = "NVIDIA H100 80GB HBM3" if n % 4 else "NVIDIA A100-SXM4-80GB"
        for gpu in range(8):
            kind = rng.choices(["exclusive", "time_sliced", "mps", "mig", "idle"], [50, 20, 10, 10, 10])[0]

            def holder(i, held, **kw):
                team = f"team-{rng.randrange(20):02d}"
                job = {"hpc_job": str(100000 + rng.randrange(10 ** 5))} if kw.pop("slurm", False) else \
                    {"namespace": team, "pod": f"{team}-{kind}-{n}-{gpu}-{i}", "container": "main"}
                return Holder(instance, str(gpu), 0.0, end, held, model=model, **job, **kw)

            if kind == "exclusive":
                busy = rng.uniform(0.3, 1.0)
                holders.append(holder(0, 1.0, busy=busy, sm=busy * rng.uniform(0.2, 0.9), slurm=rng.random() < 0.25))
            elif kind == "time_sliced":
                for i in range(k := rng.randint(2, 4)):
                    busy = rng.uniform(0.0, 1.0 / k)
                    holders.append(holder(i, 1 / k, busy=busy, sm=busy * rng.uniform(0.1, 0.6), basis="time_share",
                                          idle=busy < 0.01))
            elif kind == "mps":
                k = rng.randint(2, 4)
                holders += [holder(i, 1 / k) for i in range(k)]
            elif kind == "mig":
                holders += [holder(i, share, sm=share * rng.uniform(0.2, 0.9)) for i, share in enumerate(MIG_SLICES)]
            else:
                holders.append(holder(0, 1.0, busy=0.0, sm=0.0, idle=True))
    return holders


def write_openmetrics(holders, t0: float, hours: float, step: float, path: Path, seed: int = 2) -> int:
    """Counters whose per-step increments wander +-20% around each holder's rates (numpy; tens of
    millions of lines)."""
    rng = np.random.default_rng(seed)
    times = t0 + np.arange(0, hours * 3600 + step / 2, step)
    stamps = [f" {t:.0f}\n" for t in times]
    count, last = 0, None
    with open(path, "w", buffering=1 << 22) as fh:
        for family, labels, holder in series(holders):
            name = f"gpu_workload_{family}_gpu_seconds"
            if family != last:
                fh.write(f"# TYPE {name} counter\n")
                last = family
            rate = holder.rates()[family]
            increments = rate * step * rng.uniform(0.8, 1.2, len(times) - 1) if rate else np.zeros(len(times) - 1)
            values = np.concatenate(([0.0], np.cumsum(increments)))
            prefix = f"{name}_total{{{labels}}} "
            fh.write("".join(prefix + f"{v:.3f}" + s for v, s in zip(values, stamps)))
            count += len(times)
        fh.write("# EOF\n")
    return count


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Prom:
    def __init__(self, data: Path, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = data.parent / "prometheus.yaml"
        config.write_text("global: {scrape_interval: 15s}\n")
        self.proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                                      f"--web.listen-address=127.0.0.1:{self.port}",
                                      "--storage.tsdb.retention.time=30d"],  # query limits: the defaults
                                     stdout=open(log, "a"), stderr=subprocess.STDOUT)
        wait_for(lambda: http_get(self.url + "/-/ready", timeout=2)[0] == 200, 600, interval=0.5, what="prometheus")

    def query_seconds(self, expr: str, at: float, start: float | None = None, step: float = 60) -> float:
        import urllib.parse

        if start is None:
            path = "/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": at})
        else:
            path = "/api/v1/query_range?" + urllib.parse.urlencode({"query": expr, "start": start, "end": at,
                                                                    "step": step})
        began = time.perf_counter()
        status, body = http_get(self.url + path, timeout=600)
        assert status == 200, body[:300]
        return time.perf_counter() - began

    def peak_rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def report_seconds(url: str, start: float, end: float, source: str, by: str = "namespace") -> tuple[float, dict]:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gpu_spatial", "report", "--prometheus", url, "--start", str(start),
                           "--end", str(end), "--by", by, "--source", source, "--format", "json",
                           "--timeout", "600"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    elapsed = time.perf_counter() - began
    if done.returncode:
        raise RuntimeError(done.stderr)
    return elapsed, json.loads(done.stdout)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--step", type=float, default=60.0, help="seconds between samples (a scrape interval)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--keep", action="store_true", help="keep the OpenMetrics file and the TSDB")
    args = p.parse_args(argv)
    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    result = {"nodes": args.nodes, "gpus": args.nodes * 8, "hours": args.hours, "step_s": args.step}
    t0 = (time.time() // 7200) * 7200 - 7200 - args.hours * 3600  # whole 2 h blocks, all in the past
    end = t0 + args.hours * 3600

    began = time.perf_counter()
    holders = fleet(args.nodes, args.hours)
    samples = write_openmetrics(holders, t0, args.hours, args.step, out / "fleet.om")
    result["series"] = sum(1 for _ in series(holders))
    result["series_per_node"] = result["series"] / args.nodes
    result["holders"] = len(holders)
    result["samples"] = samples
    result["openmetrics_bytes"] = (out / "fleet.om").stat().st_size
    result["write_openmetrics_s"] = round(time.perf_counter() - began, 1)

    began = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(out / "fleet.om"),
                    str(out / "tsdb")], check=True)
    result["create_blocks_openmetrics_s"] = round(time.perf_counter() - began, 1)
    result["tsdb_bytes_raw"] = du(out / "tsdb")
    gpu_days = args.nodes * 8 * args.hours / 24
    result["tsdb_bytes_per_gpu_day"] = round(result["tsdb_bytes_raw"] / gpu_days)
    result["tsdb_bytes_per_sample"] = round(result["tsdb_bytes_raw"] / samples, 2)
    if not args.keep:
        (out / "fleet.om").unlink()

    prom = Prom(out / "tsdb", out / "prometheus.log")
    rules = out / "recording.rules.yaml"
    import yaml

    groups = [g for g in yaml.safe_load(RULES.read_text())["groups"] if g["name"] == "gpu-workload-recording"]
    rules.write_text(yaml.safe_dump({"groups": groups}))
    began = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", "-q", f"--start={int(t0)}", f"--end={int(end)}",
                    f"--url={prom.url}", f"--output-dir={out / 'rule-blocks'}", str(rules)], check=True)
    result["create_blocks_rules_s"] = round(time.perf_counter() - began, 1)
    prom.stop()
    result["tsdb_bytes_rules"] = du(out / "rule-blocks")
    for block in (out / "rule-blocks").iterdir():
        shutil.move(str(block), out / "tsdb" / block.name)

    prom = Prom(out / "tsdb", out / "prometheus.log")
    try:
        for source in ("counters", "rules"):  # the first run reads blocks from disk, the second from page cache
            seconds, _ = report_seconds(prom.url, t0, end, source)
            result[f"report_{source}_cold_s"] = round(seconds, 2)
            seconds, document = report_seconds(prom.url, t0, end, source)
            result[f"report_{source}_s"] = round(seconds, 2)
            result[f"report_{source}_queries"] = document["source"]["queries"]
            result[f"report_{source}_held_gpu_hours"] = document["total"]["held"]["gpu_hours"]
        seconds, _ = report_seconds(prom.url, t0, end, "counters", by="pod")
        result["report_by_pod_counters_s"] = round(seconds, 2)
        # The Workloads dashboard's fleet table: namespaces ranked by held-idle GPU-hours over the dashboard's
        # range (6 h, or the whole range where shorter), and the graph of held-idle GPUs over that range.
        span = int(min(6 * 3600, end - t0))
        raw, rolled = "gpu_workload_held_idle_gpu_seconds_total", "namespace:gpu_workload_held_idle_gpu_seconds:rate5m"
        queries = {
            "fleet_table_raw": f"topk(20, sum by (namespace) (increase({raw}[{span}s])))",
            "fleet_table_rules": f"topk(20, sum_over_time({rolled}[{span}s]) * 60)",
            "fleet_graph_raw": f"topk(20, sum by (namespace) (rate({raw}[5m])))",
            "fleet_graph_rules": f"topk(20, {rolled})",
        }
        result["fleet_span_s"] = span
        for name, expr in queries.items():
            began = None if "table" in name else end - span
            result[f"{name}_s"] = round(min(prom.query_seconds(expr, end, start=began) for _ in range(3)), 3)
        result["prometheus_peak_rss_bytes"] = prom.peak_rss()
    finally:
        prom.stop()
    if not args.keep:
        shutil.rmtree(out / "tsdb", ignore_errors=True)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
