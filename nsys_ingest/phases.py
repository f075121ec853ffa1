"""Phases of a capture: where its activity changes, each window judged on its own.

One verdict for a capture that loads data, then trains, then evaluates says little about any of them.
The GPU metrics are cut into BUCKET_S buckets; each bucket gets the verdict its own means reach
(time, SM and DRAM activity: the rules of nsys_ingest/verdicts.py without a trace), consecutive
buckets with the same verdict make a phase, and phases shorter than MIN_PHASE_S (a bucket astride a
change, a blip) join their longer neighbour. Each phase is then diagnosed as a window of its own, with
the kernel trace where it covers the phase.
"""
from __future__ import annotations

from nsys_ingest.analysis import bucket_means
from nsys_ingest.reader import Export, IngestError
from nsys_ingest.verdicts import Evidence, judge

BUCKET_S = 0.5  # resolution of a phase's edges
MIN_PHASE_S = 2.0  # a shorter run of buckets is a transition, not a phase
MAX_PHASES = 8  # each phase is one more read of the window: the shortest merge first beyond this
QUANTITIES = ("gr_active", "sm_active", "dram_read", "dram_write")


def activity(means: dict) -> str:
    """The verdict a bucket's GPU-metric means reach alone ('unknown' where they reach none)."""
    time = means.get("gr_active")
    if time is None or time != time:
        return "unknown"
    value = {q: means[q] for q in ("sm_active", "dram_active") if q in means and means[q] == means[q]}
    verdict = judge(Evidence(time_utilization=time, sm_active=value.get("sm_active"),
                             dram_active=value.get("dram_active")))
    return verdict.verdict if verdict else "unknown"


def split(export: Export, start_ns=None, end_ns=None, chunk_rows=None, progress=None) -> dict[int, list[dict]]:
    """Per GPU, its phases ({activity, start_ns, end_ns}, edges on buckets, clipped to the samples and
    the window); a GPU whose activity does not change has none."""
    if export.era is None:
        return {}
    kwargs = {"chunk_rows": chunk_rows} if chunk_rows else {}
    frame = bucket_means(export, BUCKET_S, QUANTITIES, start_ns=start_ns, end_ns=end_ns, progress=progress, **kwargs)
    first, last = export.time_range()
    low = first if start_ns is None else max(first, start_ns)
    high = last if end_ns is None else min(last, end_ns)
    step_ns = int(BUCKET_S * 1e9)
    phases = {}
    for gpu, rows in frame.groupby("gpu"):
        runs: list[list] = []  # [activity, first bucket start ns, buckets]
        for row in rows.to_dict("records"):
            kind, begin = activity(row), int(round(row["bucket"] * 1e9))
            if runs and runs[-1][0] == kind and runs[-1][1] + runs[-1][2] * step_ns == begin:
                runs[-1][2] += 1
            else:
                runs.append([kind, begin, 1])
        runs = _merge_short(runs)
        if len(runs) < 2:
            continue
        edges = [max(low, begin) for _kind, begin, _n in runs] + [high + 1]
        phases[int(gpu)] = [{"activity": kind, "start_ns": edges[i], "end_ns": edges[i + 1] - 1}
                            for i, (kind, _begin, _n) in enumerate(runs)]
    return phases


def _merge_short(runs: list[list]) -> list[list]:
    """Joins each run shorter than MIN_PHASE_S (the shortest first) to its longer neighbour, then the
    shortest beyond MAX_PHASES; neighbours left with the same activity become one."""
    min_buckets = MIN_PHASE_S / BUCKET_S
    while len(runs) > 1:
        i = min(range(len(runs)), key=lambda j: runs[j][2])
        if runs[i][2] >= min_buckets and len(runs) <= MAX_PHASES:
            break
        neighbours = [j for j in (i - 1, i + 1) if 0 <= j < len(runs)]
        into = max(neighbours, key=lambda j: runs[j][2])
        short = runs.pop(i)
        into = into if into < i else into - 1
        runs[into][1] = min(runs[into][1], short[1])
        runs[into][2] += short[2]
        runs = _coalesce(runs)
    return runs


def _coalesce(runs: list[list]) -> list[list]:
    out: list[list] = []
    for run in runs:
        if out and out[-1][0] == run[0]:
            out[-1][2] += run[2]
        else:
            out.append(list(run))
    return out


def judge_phases(phases: dict[int, list[dict]], diagnose_window, traced: bool) -> dict[int, list[dict]]:
    """Each phase's diagnosis on its own window: `diagnose_window(start_ns, end_ns)` is the diagnose
    result of that window (GPUs with the same edges share one read); `traced`: the export has a kernel
    trace, so a phase without kernels had none (0), not an unknown number (None)."""
    done: dict[tuple, dict | None] = {}
    out = {}
    for gpu, windows in phases.items():
        out[gpu] = []
        for phase in windows:
            key = (phase["start_ns"], phase["end_ns"])
            if key not in done:
                try:
                    done[key] = diagnose_window(*key)
                except IngestError:  # nothing in that window after all
                    done[key] = None
            entry = next((g for g in (done[key] or {}).get("gpus", []) if g["gpu"] == gpu), None)
            out[gpu].append({
                "window_s": [round(phase["start_ns"] / 1e9, 6), round((phase["end_ns"] + 1) / 1e9, 6)],
                "activity": phase["activity"],
                "verdict": entry["verdict"] if entry else None,
                "gpu_metrics": entry["gpu_metrics"] if entry else None,
                "kernels": entry["kernels"]["kernels"] if entry and entry["kernels"] else (0 if traced else None),
            })
    return out


def describe(phase: dict) -> str:
    """One line of the text report."""
    low, high = phase["window_s"]
    verdict = phase["verdict"]
    said = f"{verdict['verdict']}: {verdict['reason']}" if verdict else "no verdict (too little evidence)"
    kernels = "" if phase["kernels"] is None else f", {phase['kernels']} kernels"
    return f"{low:.3f} to {high:.3f} s ({high - low:.3f} s{kernels}): {said}"
