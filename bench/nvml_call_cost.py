"""CPU cost of each NVML call the exporter makes, on this host's GPU 0.

    python3 bench/nvml_call_cost.py --calls 200 [--out FILE]
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from exporter.nvml import Nvml, NvmlError


_SAMPLE = []


def spatial_gpm_metrics(nvml):
    """gpm_metrics asking only the 5 spatial metrics (what the exporter falls back to), not the interconnect's 4."""
    from exporter.nvml import SPATIAL_GPM_METRICS

    wanted, nvml._gpm_wanted = nvml._gpm_wanted, SPATIAL_GPM_METRICS
    try:
        return nvml.gpm_metrics(0)
    finally:
        nvml._gpm_wanted = wanted


def gpm_sample_get(nvml) -> None:
    """nvmlGpmSampleGet into one buffer kept between calls (no metrics computed)."""
    if not _SAMPLE:
        _SAMPLE.append(nvml._nv.nvmlGpmSampleAlloc())
    nvml._nv.nvmlGpmSampleGet(nvml._handle(0), _SAMPLE[0])


def samples_kept(nvml) -> dict:
    """What NVML's sample buffer holds (not timed): every utilization sample of each kind it answers with
    lastSeenTimeStamp 0, their count and the span they cover. nvml.h says only "samples maintained in the
    buffer by the driver": this is what decides how long the exporter may wait between two reads."""
    from exporter.nvml import GPU_UTILIZATION_SAMPLES, MEMORY_UTILIZATION_SAMPLES

    out = {}
    for name, kind in (("gpu", GPU_UTILIZATION_SAMPLES), ("memory", MEMORY_UTILIZATION_SAMPLES)):
        stamps = sorted(s.timeStamp for s in nvml._samples(nvml._handle(0), kind, 0))
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        out[name] = {"count": len(stamps), "span_s": round((stamps[-1] - stamps[0]) / 1e6, 3) if stamps else None,
                     "median_period_s": round(sorted(gaps)[len(gaps) // 2] / 1e6, 3) if gaps else None}
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    nvml = Nvml()
    calls = {
        "utilization_samples(gpu only)": lambda: nvml.utilization_samples(0, 2.0, False),
        "utilization_samples(gpu+memory)": lambda: nvml.utilization_samples(0, 2.0, True),
        "utilization_samples(memory only)": lambda: nvml.utilization_samples(0, 2.0, True, False),  # issue 37: with GPM
        "utilization_rates": lambda: nvml.utilization_rates(0),
        "memory": lambda: nvml.memory(0),
        "power_watts": lambda: nvml.power_watts(0),
        "sm_clock_hz": lambda: nvml.sm_clock_hz(0),
        "temperature_celsius": lambda: nvml.temperature_celsius(0),
        "process_utilization": lambda: nvml.process_utilization(0, 2.0),
        "process_utilization(pynvml, two calls)": lambda: nvml._nv.nvmlDeviceGetProcessUtilization(nvml._handle(0), 0),
        "compute_processes": lambda: nvml.compute_processes(0),
        "gpm_metrics": lambda: nvml.gpm_metrics(0),
        "gpm_sample_get(alone)": lambda: gpm_sample_get(nvml),  # where GPM's time goes: the sample or the metrics
        # issue 37: does GPM's metrics call cost by metric? The 5 spatial metrics alone against all 9
        "gpm_metrics(spatial only)": lambda: spatial_gpm_metrics(nvml),
        # issue 30: per tick the first two, every 30 s health_counters, every 60 s memory_errors, once the rest;
        # nvml_throughput only on GPUs without GPM
        "memory_clock_hz": lambda: nvml.memory_clock_hz(0),
        "clock_event_reasons": lambda: nvml.clock_event_reasons(0),
        "health_counters": lambda: nvml.health_counters(0),
        "memory_errors": lambda: nvml.memory_errors(0),
        "nvml_throughput": lambda: nvml.nvml_throughput(0),
        "max_clocks": lambda: nvml.max_clocks(0),
        "driver_version": lambda: nvml.driver_version(),
        "xid_wait(0 ms)": lambda: nvml.xid_wait(0),
    }
    nvml.xid_open()
    out = {}
    for name, call in calls.items():
        try:
            call()
        except (NvmlError, Exception) as exc:  # noqa: BLE001 - pynvml's own errors too
            out[name] = f"error: {exc}"
            continue
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.calls):
            call()
            if name.startswith("gpm_"):
                time.sleep(0.002)
        out[name] = {"cpu_ms": round(1000 * (time.process_time() - cpu0) / args.calls, 3),
                     "wall_ms": round(1000 * (time.perf_counter() - wall0) / args.calls, 3)}
    try:
        out["samples_kept"] = samples_kept(nvml)
    except Exception as exc:  # noqa: BLE001 - a probe: its error is its answer
        out["samples_kept"] = f"error: {exc}"
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    nvml.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
