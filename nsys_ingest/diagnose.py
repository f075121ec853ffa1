"""A verdict per GPU, with its evidence: GPU metrics and the CUDA kernel trace of one window.

The rules are nsys_ingest/verdicts.py, the same the exporter applies to live metrics; the kernel
trace adds what live metrics cannot say: which processes, how long and how wide their kernels are,
and whether the GPU waits between them.
"""
from __future__ import annotations

from nsys_ingest.analysis import bucket_means
from nsys_ingest.kernels import NO_KERNEL_TRACE, GpuKernels, has_kernel_trace, kernel_stats
from nsys_ingest.phases import describe as describe_phase
from nsys_ingest.phases import judge_phases
from nsys_ingest.phases import split as split_phases
from nsys_ingest.reader import DEFAULT_CHUNK_ROWS, Export
from nsys_ingest.verdicts import (CONCURRENT_KERNELS, EXCLUSIVE, IDLE, LONG_GAP_S, MIN_SHORT_KERNELS, MPS,
                                  SHORT_KERNEL_S, TIME_SLICED, Evidence, judge)

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
    seconds = k.window_ns / 1e9
    durations = k.durations
    return {
        "kernels": k.kernels,
        "kernels_per_s": round(k.kernels / seconds, 1) if seconds else None,
        "median_us": _us(durations.quantile(0.5)),
        "p90_us": _us(durations.quantile(0.9)),
        "median_grid_blocks": _blocks(k.grids.quantile(0.5)),
        "sm_footprint": _ratio(k.footprint_ns, k.kernel_ns),
        "busy_share": _ratio(k.kernel_busy.busy_ns, k.window_ns),
        # Idle: neither a kernel nor a copy runs.
        "idle_gaps": k.work.gaps,
        "long_gap_idle_share": _ratio(k.work.long_idle_ns, k.work.idle_ns),
        # Kernel time over busy time: above 1 only when kernels overlap (MPS, one process's streams, or
        # long kernels switched out around other contexts' time slices).
        "overlap": _overlap(k.kernel_busy),
        "short_kernels": k.short_busy.count,
        "short_kernel_overlap": _overlap(k.short_busy),  # kernels under SHORT_KERNEL_S: only MPS overlaps them
    }


def _overlap(busy) -> float | None:
    return round(busy.work_ns / busy.busy_ns, 3) if busy.busy_ns > 0 else None


def _copy_summary(k: GpuKernels) -> dict | None:
    """Copies and memsets: GPU work that is no kernel (a copy loop launches none)."""
    if k.copies is None:
        return None
    return {"copies": k.copies.count, "bytes": k.copies.bytes,
            "busy_s": round(k.copies.busy.busy_ns / 1e9, 9), "busy_share": _ratio(k.copies.busy.busy_ns, k.window_ns),
            "kinds": {kind: {"count": c, "bytes": b, "seconds": round(ns / 1e9, 9)}
                      for kind, (c, b, ns) in sorted(k.copies.kinds.items())}}


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


def _sharing(summary: dict, processes: int) -> str | None:
    """Sharing seen in the trace: kernels of time-sliced contexts run one at a time, MPS clients' side by
    side. Only short kernels tell (SHORT_KERNEL_S): a long kernel switched out at the end of its time
    slice spans the other contexts' slices. None where the trace cannot tell."""
    if processes == 0:
        return IDLE
    if processes == 1:
        return EXCLUSIVE
    if summary["short_kernels"] >= MIN_SHORT_KERNELS and summary["short_kernel_overlap"] is not None:
        return MPS if summary["short_kernel_overlap"] >= CONCURRENT_KERNELS else TIME_SLICED
    # Too few short kernels: no overlap at all still rules MPS' concurrency out; overlap proves nothing.
    return TIME_SLICED if (summary["overlap"] or 0.0) < CONCURRENT_KERNELS else None


def _evidence(means: dict, k: GpuKernels | None, summary: dict | None, copies: dict | None,
              sm_count) -> tuple[Evidence, bool]:
    """Evidence for the rules, and whether SM activity is an estimate from grid sizes."""
    busy = None if k is None else _ratio(k.window_ns - k.work.idle_ns, k.window_ns)  # kernels or copies
    time = means.get("gr_active", busy)
    sm = means.get("sm_active")
    estimated = sm is None and k is not None and k.window_ns > 0
    if estimated:  # no GPU metrics: the share of SMs the kernels' grids can occupy, over the window
        sm = round(min(k.footprint_ns / k.window_ns, 1.0), 6)
    mode = processes = None
    if k is not None:  # processes with kernels or copies on this GPU
        processes = len(set(k.processes) | (k.copies.gpids if k.copies else set()))
        mode = _sharing(summary, processes)
    return Evidence(
        time_utilization=time, sm_active=sm, dram_active=means.get("dram_active"), sharing_mode=mode,
        processes=processes,
        long_gap_idle_share=summary["long_gap_idle_share"] if summary else None,
        median_kernel_s=None if not summary or summary["median_us"] is None else summary["median_us"] / 1e6,
        median_grid_blocks=summary["median_grid_blocks"] if summary else None,
        sm_count=sm_count, sm_footprint=summary["sm_footprint"] if summary else None,
        kernel_trace=True if k is not None else None,
        kernel_busy_share=summary["busy_share"] if summary else None,
        copy_busy_share=copies["busy_share"] if copies else None,
    ), estimated


def diagnose(export: Export, start_ns=None, end_ns=None, chunk_rows=DEFAULT_CHUNK_ROWS, progress=None,
             phases: bool = True) -> dict:
    """Per GPU the verdict over the window (default: the kernel trace's span), and with `phases` the
    verdict of each phase of the window (default: the whole capture) where the activity changes."""
    notes = []
    kernels, window = {}, (start_ns, end_ns)
    traced = has_kernel_trace(export)
    if traced:
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
        copies = _copy_summary(k) if k else None
        evidence, estimated = _evidence(means.get(index, {}), k, summary, copies, info.sm_count if info else None)
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
            "copies": copies,
            "processes": _processes(k) if k else None,
        })
    if phases:
        found = split_phases(export, start_ns, end_ns, chunk_rows, progress)
        judged = judge_phases(found, lambda lo, hi: diagnose(export, lo, hi, chunk_rows, progress, phases=False), traced)
        for gpu in gpus:
            gpu["phases"] = judged.get(gpu["gpu"], [])
    low, high = window
    return {
        "file": str(export.source_path),
        "window_s": [None if low is None else low / 1e9, None if high is None else high / 1e9],
        "coverage": _coverage(export, window) if traced and start_ns is None and end_ns is None else None,
        "notes": notes,
        "gpus": gpus,
    }


def _coverage(export: Export, trace_window) -> dict | None:
    """What the kernel trace covers of the capture (its GPU metrics): a verdict from a 9 s trace says
    nothing of the other 50 s of a 59 s capture."""
    if export.era is None or trace_window[0] is None:
        return None
    first, last = export.time_range()
    low, high = min(first, trace_window[0]), max(last, trace_window[1])
    return {"capture_s": [round(low / 1e9, 6), round(high / 1e9, 6)],
            "kernel_trace_s": [round(trace_window[0] / 1e9, 6), round(trace_window[1] / 1e9, 6)]}


METRIC_LABELS = {"gr_active": "GR active (time utilization)", "sm_active": "SM active", "sm_occupancy": "SM occupancy",
                 "tensor_active": "tensor active", "dram_active": "DRAM active"}


def print_diagnosis(result: dict) -> None:
    low, high = result["window_s"]
    span = "the whole capture" if low is None else f"{low:.3f} to {high:.3f} s ({high - low:.3f} s)"
    print(f"{result['file']}: {span}")
    coverage = result.get("coverage")
    if coverage:
        (c_low, c_high), (t_low, t_high) = coverage["capture_s"], coverage["kernel_trace_s"]
        phased = any(gpu.get("phases") for gpu in result["gpus"])
        print(f"kernel trace covers {t_high - t_low:.3f} s of the {c_high - c_low:.3f} s capture "
              f"(trace {t_low:.3f} to {t_high:.3f} s, GPU metrics {c_low:.3f} to {c_high:.3f} s): the verdicts "
              f"below are for the trace's window{', the phases for the whole capture' if phased else ''}")
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
            print("  GPU metrics (means): " + ", ".join(f"{METRIC_LABELS.get(q, q)} {v:.3f}"
                                                      for q, v in gpu["gpu_metrics"].items()))
        if gpu["kernels"]:
            _print_kernels(gpu["kernels"], gpu["processes"])
        if gpu["copies"]:
            _print_copies(gpu["copies"])
        if gpu.get("phases"):
            print("  phases (split where the activity changes, each judged on its own window):")
            for phase in gpu["phases"]:
                print(f"    {describe_phase(phase)}")


def _print_kernels(k: dict, processes: list[dict]) -> None:
    if k["kernels"]:
        print(f"  kernels: {k['kernels']} ({_show(k['kernels_per_s'], '.1f')}/s), median {_show(k['median_us'], '.2f')} us, "
              f"p90 {_show(k['p90_us'], '.2f')} us, median grid {_show(k['median_grid_blocks'])} blocks, "
              f"SM footprint {_show(k['sm_footprint'], '.1%')}")
        # Not the time utilization above: GR active also counts context switches and waits as busy.
        print(f"  kernels running: {_show(k['busy_share'], '.1%')} of the window; kernel overlap "
              f"{_times(k['overlap'])}, {k['short_kernels']} short kernels (< {SHORT_KERNEL_S * 1e6:g} us)"
              + ("" if k["short_kernel_overlap"] is None else f" overlap {_times(k['short_kernel_overlap'])}"))
    else:
        print("  kernels: none in this window")
    print(f"  idle (no kernel, no copy): {k['idle_gaps']} gaps, {_show(k['long_gap_idle_share'], '.1%')} of the idle time "
          f"in gaps >= {LONG_GAP_S * 1e3:g} ms")
    if processes:
        print(f"  {'pid':>8} {'process':16} {'kernels/s':>10} {'median us':>10} {'p90 us':>10} {'grid':>6} "
              f"{'footprint':>9} {'kernels running':>15}")
    for p in processes:
        print(f"  {p['pid']:>8} {p['name'][:16]:16} {_show(p['kernels_per_s'], '.1f'):>10} "
              f"{_show(p['median_us'], '.2f'):>10} {_show(p['p90_us'], '.2f'):>10} {_show(p['median_grid_blocks']):>6} "
              f"{_show(p['sm_footprint'], '.1%'):>9} {_show(p['busy_share'], '.1%'):>15}")


def _print_copies(c: dict) -> None:
    kinds = "; ".join(f"{kind} {v['count']} ({_bytes(v['bytes'])}, {v['seconds'] * 1e3:.3f} ms)" for kind, v in c["kinds"].items())
    print(f"  copies and memsets: {c['copies']} ({_bytes(c['bytes'])}), running {_show(c['busy_share'], '.1%')} of the "
          f"window{': ' + kinds if kinds else ''}")


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _times(value) -> str:
    """An overlap factor (1.42x), or n/a without the unit where the window gives none."""
    return "n/a" if value is None else f"{value:.2f}x"


def _show(value, spec: str = "") -> str:
    """A number for the text report; n/a where the window gives none (e.g. zero-length kernels)."""
    return "n/a" if value is None else format(value, spec)
