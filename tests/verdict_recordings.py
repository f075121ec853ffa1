"""The H100 recordings of the verdicts (tests/fixtures/h100_diag_NAME.sqlite, bench/results/verdicts/ and
bench/results/diagnosis_recordings.json), each with the verdict a user should be told, live and offline; read
by tests/test_verdicts.py and bench/verdict_table.py (the table in bench/RESULTS.md)."""
from __future__ import annotations

import json
from pathlib import Path

from nsys_ingest.diagnose import diagnose
from nsys_ingest.reader import Export
from nsys_ingest.verdicts import Evidence, judge

ROOT = Path(__file__).resolve().parent.parent
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
