"""The verdict table of bench/RESULTS.md: every H100 recording x (live verdict, offline verdict), with
the evidence behind each.

    python3 bench/verdict_table.py          # markdown table on stdout

Offline: `nsys_ingest diagnose` on tests/fixtures/h100_diag_NAME.sqlite. Live: the exporter's
/api/v1/gpus recorded on the H100 while the workload ran (bench/results/verdicts/live_NAME.jsonl every
0.5 s, bench/results/diagnosis_recordings.json mid-run), each snapshot's recorded evidence judged again
with today's rules; the verdict the exporter published then is shown beside it.
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nsys_ingest.diagnose import diagnose  # noqa: E402
from nsys_ingest.reader import Export  # noqa: E402
from nsys_ingest.verdicts import Evidence, judge  # noqa: E402

RESULTS = ROOT / "bench" / "results"
FIXTURES = ROOT / "tests" / "fixtures"
SETTLE_S = 1.0  # live snapshots this soon after a phase starts still average the idle before it

# name, what ran, the right verdict (live, offline): what a user should be told
RECORDINGS = (
    ("time_sliced", "6 small trainers, time-sliced", "time_sliced_small_kernels", "time_sliced_small_kernels"),
    ("mps", "the same 6 trainers under MPS", "mps_shared", "mps_shared"),
    ("matmul", "8192x8192 bf16 matmuls", "saturated", "saturated"),
    ("input_bound", "1 trainer making each batch on the host (8 ms)", "input_bound", "input_bound"),
    ("membound", "a = b + 2c over 1.5 GiB fp32 tensors", "memory_bound", "memory_bound"),
    ("copy", "device-to-device copies of 3 GiB fp16 tensors", "memory_bound", "memory_bound"),
    ("launch", "1 process adding to a 16-element tensor in a loop", "host_bound", "launch_bound"),
    ("oneblock", "one block spinning 50 ms kernels on one SM", "small_kernels", "small_grid"),
    ("ts_long", "3 time-sliced: spin on 8 SMs, 4096 bf16 matmuls at 50% duty, a launch loop; 1 idle holder",
     "time_sliced_small_kernels", "time_sliced_small_kernels"),
)


def _phase_window(name: str) -> tuple[float, float] | None:
    phases = RESULTS / "verdicts" / f"{name}.json"
    if phases.exists():
        last = json.loads(phases.read_text())["phases"][-1]
        return last["start"] + SETTLE_S, last["end"]
    probe = RESULTS / "verdicts" / f"{name}_nvml.json"
    if probe.exists():
        start, end = json.loads(probe.read_text())["window"]
        return start + SETTLE_S, end
    return None


def live_diagnoses(name: str) -> list[dict]:
    """The exporter's recorded diagnoses ({verdict, evidence, ...}) of GPU 0 while `name` ran."""
    mid_run = json.loads((RESULTS / "diagnosis_recordings.json").read_text())["live_exporter_mid_run"]
    if name in mid_run:
        return [mid_run[name]["diagnosis"]] if "diagnosis" in mid_run[name] else []
    window, path = _phase_window(name), RESULTS / "verdicts" / f"live_{name}.jsonl"
    if window is None or not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        if line.strip():
            snapshot = json.loads(line)
            if window[0] <= snapshot["snapshot_time"] <= window[1] and snapshot["gpus"][0]["diagnosis"]:
                found.append(snapshot["gpus"][0]["diagnosis"])
    return found


def rejudge(diagnosis: dict) -> str:
    verdict = judge(Evidence(**diagnosis["evidence"]))
    return verdict.verdict if verdict else "none"


def offline(name: str) -> dict:
    with Export(FIXTURES / f"h100_diag_{name}.sqlite", require_metrics=False) as export:
        (gpu,) = diagnose(export)["gpus"]
    return gpu


def _most(counter: Counter) -> str:
    (top, n), total = counter.most_common(1)[0], sum(counter.values())
    return top if n == total else f"{top} ({n}/{total})"


def _live_cell(diagnoses: list[dict]) -> tuple[str, str, str]:
    if not diagnoses:
        return "not recorded", "", ""
    ev = [d["evidence"] for d in diagnoses]

    def median(key):
        values = [e[key] for e in ev if e.get(key) is not None]
        return f"{statistics.median(values):.2f}" if values else "?"

    modes = Counter(e.get("sharing_mode") for e in ev)
    evidence = (f"{median('time_utilization')} / {median('sm_active')} / {median('dram_active')}, "
                f"{_most(modes)}, n={len(ev)}")
    return evidence, _most(Counter(rejudge(d) for d in diagnoses)), _most(Counter(d["verdict"] for d in diagnoses))


def _offline_cell(gpu: dict) -> str:
    m, k, c = gpu["gpu_metrics"] or {}, gpu["kernels"], gpu["copies"]
    parts = [f"{m.get('gr_active', 0):.2f} / {m.get('sm_active', 0):.2f} / {m.get('dram_active', 0):.2f}"]
    if k["kernels"]:
        parts.append(f"{k['kernels']} kernels, median {k['median_us']:.1f} us, grid {k['median_grid_blocks']}, "
                     f"running {k['busy_share']:.0%}, overlap {k['overlap']:.2f} (short {_num(k['short_kernel_overlap'])})")
    else:
        parts.append("no kernels")
    if k["long_gap_idle_share"] is not None:
        parts.append(f"idle in gaps >= 1 ms {k['long_gap_idle_share']:.0%}")
    if c and c["busy_share"]:
        parts.append(f"copies running {c['busy_share']:.0%}")
    parts.append(f"{gpu['verdict']['evidence'].get('sharing_mode')}")
    return "; ".join(parts)


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _mark(got: str, right: str) -> str:
    verdict = got.split(" (")[0]
    return f"`{got}`" if verdict == right else f"**`{got}` (wrong: {right})**"


def table() -> str:
    lines = ["| recording | workload | live: time / SM / DRAM, mode | live verdict, today's rules (published then) "
             "| offline: GR / SM / DRAM active; kernels; copies; mode | offline verdict |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, what, right_live, right_offline in RECORDINGS:
        evidence, live_now, live_then = _live_cell(live_diagnoses(name))
        live = _mark(live_now, right_live) + (f" (`{live_then}`)" if live_then else "") if live_now else ""
        gpu = offline(name)
        lines.append(f"| h100_diag_{name} | {what} | {evidence} | {live} | {_offline_cell(gpu)} "
                     f"| {_mark(gpu['verdict']['verdict'], right_offline)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
