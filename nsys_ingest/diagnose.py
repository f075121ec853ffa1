"""A verdict per GPU, with its evidence: GPU metrics and the CUDA kernel trace of one window.

The rules are nsys_ingest/verdicts.py, the same the exporter applies to live metrics; the kernel
trace adds what live metrics cannot say: which processes, how long and how wide their kernels are,
and whether the GPU waits between them.
"""
from __future__ import annotations

from nsys_ingest.analysis import bucket_means
from nsys_ingest.kernels import NO_KERNEL_TRACE, GpuKernels, has_kernel_trace, kernel_stats
from nsys_ingest.reader import DEFAULT_CHUNK_ROWS, Export
from nsys_ingest.verdicts import CONCURRENT_KERNELS, Evidence, judge

NO_GPU_METRICS = ("this export has no GPU metrics: add --gpu-metrics-devices=all to the nsys command to measure "
                  "SM activity; until then SM activity is estimated from the kernels' grid sizes")
MEANS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active")


def _metric_means(export: Export, start_ns, end_ns, chunk_rows, progress) -> dict[int, dict[str, float]]:
    if export.era is None:
        return {}
    last = export.time_range()[1] if end_ns is None else end_ns
    frame = bucket_means(export, (last + 1) / 1e9, start_ns=start_ns, end_ns=end_ns, chunk_rows=chunk_rows,
                         progress=progress)  # one bucket: the whole window
    means = {}
    for row in frame.to_dict("records"):
        means[int(row["gpu"])] = {q: round(float(row[q]), 6) for q in MEANS if q in row and row[q] == row[q]}
    return means


def _ratio(part, whole) -> float | None:
    return round(min(part / whole, 1.0), 6) if whole else None


def _kernel_summary(k: GpuKernels) -> dict:
    busy = k.window_ns - k.idle_ns
    seconds = k.window_ns / 1e9
    durations = k.durations
    return {
        "kernels": k.kernels,
        "kernels_per_s": round(k.kernels / seconds, 1) if seconds else None,
        "median_us": _us(durations.quantile(0.5)),
        "p90_us": _us(durations.quantile(0.9)),
        "median_grid_blocks": _blocks(k.grids.quantile(0.5)),
        "sm_footprint": _ratio(k.footprint_ns, k.kernel_ns),
        "busy_share": _ratio(busy, k.window_ns),
        "idle_gaps": k.gaps,
        "long_gap_idle_share": _ratio(k.long_idle_ns, k.idle_ns),
        # Kernel time over busy time: above 1 only when kernels overlap (MPS, or one process's streams).
        "overlap": round(k.kernel_ns / busy, 3) if busy > 0 else None,
    }


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 3)


def _blocks(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def _processes(k: GpuKernels) -> list[dict]:
    seconds = k.window_ns / 1e9
    out = []
    for p in sorted(k.processes.values(), key=lambda p: -p.kernel_ns):
        out.append({"pid": p.pid, "name": p.name, "kernels": p.kernels,
                    "kernels_per_s": round(p.kernels / seconds, 1) if seconds else None,
                    "median_us": _us(p.durations.quantile(0.5)), "p90_us": _us(p.durations.quantile(0.9)),
                    "median_grid_blocks": _blocks(p.grids.quantile(0.5)),
                    "sm_footprint": _ratio(p.footprint_ns, p.kernel_ns),
                    "busy_share": _ratio(p.kernel_ns, k.window_ns)})
    return out


def _sharing(summary: dict, processes: int) -> str:
    """Sharing seen in the trace: kernels of different contexts never overlap unless under MPS."""
    if processes == 0:
        return "idle"
    if processes == 1:
        return "exclusive"
    overlap = summary["overlap"] or 0.0
    return "mps" if overlap >= CONCURRENT_KERNELS else "time_sliced"


def _evidence(means: dict, k: GpuKernels | None, summary: dict | None, sm_count) -> tuple[Evidence, bool]:
    """Evidence for the rules, and whether SM activity is an estimate from grid sizes."""
    time = means.get("gr_active", summary["busy_share"] if summary else None)
    sm = means.get("sm_active")
    estimated = sm is None and k is not None and k.window_ns > 0
    if estimated:  # no GPU metrics: the share of SMs the kernels' grids can occupy, over the window
        sm = round(min(k.footprint_ns / k.window_ns, 1.0), 6)
    mode = processes = None
    if k is not None:
        processes = len(k.processes)
        mode = _sharing(summary, processes)
    return Evidence(
        time_utilization=time, sm_active=sm, dram_active=means.get("dram_active"), sharing_mode=mode,
        processes=processes,
        long_gap_idle_share=summary["long_gap_idle_share"] if summary else None,
        median_kernel_s=None if not summary or summary["median_us"] is None else summary["median_us"] / 1e6,
        median_grid_blocks=summary["median_grid_blocks"] if summary else None,
        sm_count=sm_count, sm_footprint=summary["sm_footprint"] if summary else None,
    ), estimated


def diagnose(export: Export, start_ns=None, end_ns=None, chunk_rows=DEFAULT_CHUNK_ROWS, progress=None) -> dict:
    notes = []
    kernels, window = {}, (start_ns, end_ns)
    if has_kernel_trace(export):
        kernels, window = kernel_stats(export, start_ns, end_ns, chunk_rows, progress)
    else:
        notes.append(NO_KERNEL_TRACE)
    if export.era is None:
        notes.append(NO_GPU_METRICS)
    means = _metric_means(export, *window, chunk_rows, progress)
    if not kernels and not means:
        raise export.empty_window(start_ns, end_ns, "kernels and no GPU metric samples")
    gpus = []
    for index in sorted(set(kernels) | set(means)):
        info = export.gpus.get(index) or export.described_gpus.get(index)
        k = kernels.get(index)
        summary = _kernel_summary(k) if k else None
        evidence, estimated = _evidence(means.get(index, {}), k, summary, info.sm_count if info else None)
        verdict = judge(evidence)
        gpus.append({
            "gpu": index,
            "name": info.name if info else f"GPU {index}",
            "uuid": info.uuid if info else None,
            "sm_count": info.sm_count if info else None,
            "verdict": verdict.to_json(evidence) if verdict else None,
            "sm_active_estimated_from_grids": estimated,
            "gpu_metrics": means.get(index),
            "kernels": summary,
            "processes": _processes(k) if k else None,
        })
    low, high = window
    return {
        "file": str(export.source_path),
        "window_s": [None if low is None else low / 1e9, None if high is None else high / 1e9],
        "notes": notes,
        "gpus": gpus,
    }


def print_diagnosis(result: dict) -> None:
    low, high = result["window_s"]
    span = "the whole capture" if low is None else f"{low:.3f}-{high:.3f} s ({high - low:.3f} s)"
    print(f"{result['file']}: {span}")
    for note in result["notes"]:
        print(f"note: {note}")
    for gpu in result["gpus"]:
        print(f"\nGPU {gpu['gpu']} {gpu['name']} ({gpu['uuid'] or 'no uuid'}, {gpu['sm_count'] or '?'} SMs)")
        verdict = gpu["verdict"]
        if verdict:
            print(f"  verdict: {verdict['verdict']}: {verdict['reason']}")
            print(f"  change:  {verdict['advice']}")
        else:
            print("  verdict: none (too little evidence in this window)")
        if gpu["gpu_metrics"]:
            print("  GPU metrics (means): " + ", ".join(f"{q.replace('_', ' ')} {v:.3f}" for q, v in gpu["gpu_metrics"].items()))
        k = gpu["kernels"]
        if k:
            print(f"  kernels: {k['kernels']} ({_show(k['kernels_per_s'], 'g')}/s), median {_show(k['median_us'], 'g')} us, "
                  f"p90 {_show(k['p90_us'], 'g')} us, median grid {_show(k['median_grid_blocks'])} blocks, "
                  f"SM footprint {_show(k['sm_footprint'], '.0%')}")
            print(f"  GPU busy {_show(k['busy_share'], '.1%')} of the window; {k['idle_gaps']} idle gaps, "
                  f"{_show(k['long_gap_idle_share'], '.0%')} of the idle time in gaps >= 1 ms; "
                  f"kernel overlap {_show(k['overlap'], '.2f')}x")
            print(f"  {'pid':>8} {'process':16} {'kernels/s':>10} {'median us':>10} {'p90 us':>9} {'grid':>6} "
                  f"{'footprint':>9} {'busy':>6}")
            for p in gpu["processes"]:
                print(f"  {p['pid']:>8} {p['name'][:16]:16} {_show(p['kernels_per_s'], 'g'):>10} "
                      f"{_show(p['median_us'], 'g'):>10} {_show(p['p90_us'], 'g'):>9} {_show(p['median_grid_blocks']):>6} "
                      f"{_show(p['sm_footprint'], '.0%'):>9} {_show(p['busy_share'], '.1%'):>6}")


def _show(value, spec: str = "") -> str:
    """A number for the text report; n/a where the window gives none (e.g. zero-length kernels)."""
    return "n/a" if value is None else format(value, spec)
