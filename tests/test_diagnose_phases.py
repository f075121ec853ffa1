"""diagnose on a capture with several phases: what the kernel trace covers, and a verdict per phase
with its exact window, on small synthetic exports whose phases are known by construction.

Mutations these catch (bench/mutations.py): MIN_PHASE_S 2.0 -> 1.5, `>=` -> `>` in the short-run test,
the phase window's end off by one (the next phase's first sample counted twice), a short run joining its
shorter neighbour, coverage given for an explicit window too.
"""
from __future__ import annotations

import json
import subprocess
import sys

import tests.synthetic_exports as synth
from nsys_ingest.diagnose import diagnose
from nsys_ingest.reader import Export
from tests.helpers import FIXTURES, ROOT

MATMUL = FIXTURES / "h100_diag_matmul.sqlite"
PHASES = FIXTURES / "h100_phases_100hz.sqlite"
PID = 281514067623936  # the matmul capture's process: the trace names it
IDLE, SMALL, FULL = {"GR Active": 0, "SMs Active": 0}, {"GR Active": 100, "SMs Active": 25}, \
    {"GR Active": 100, "SMs Active": 95}


def three_phases(tmp_path):
    """Idle 0-4 s, 6000 kernels of 32 blocks (999 us each, 1 us apart) at SM active 25% 4-10 s, SM active
    95% with no trace 10-16 s; GPU metrics every 0.1 s (the last at 15.9 s)."""
    kernels = [(4_000_000_000 + i * 1_000_000, 4_000_000_000 + i * 1_000_000 + 999_000, PID, 32) for i in range(6000)]
    traced = synth.with_activities(MATMUL, tmp_path / "trace.sqlite", kernels)
    return synth.metric_phases(traced, tmp_path / "phases.sqlite", [(0, 4, IDLE), (4, 10, SMALL), (10, 16, FULL)])


def cli(*args):
    return subprocess.run([sys.executable, "-m", "nsys_ingest", "diagnose", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_each_phase_gets_its_verdict_and_exact_window(tmp_path):
    with Export(three_phases(tmp_path), require_metrics=False) as export:
        result = diagnose(export)
    assert result["window_s"] == [4.0, 9.999999]  # the verdict's window: the trace's
    assert result["coverage"] == {"capture_s": [0.0, 15.9], "kernel_trace_s": [4.0, 9.999999]}
    (gpu,) = result["gpus"]
    assert gpu["verdict"]["verdict"] == "small_grid"
    assert [(p["window_s"], p["activity"], p["verdict"]["verdict"], p["kernels"]) for p in gpu["phases"]] == [
        ([0.0, 4.0], "idle", "idle", 0),
        ([4.0, 10.0], "small_kernels", "small_grid", 6000),
        ([10.0, 15.9], "saturated", "saturated", 0),
    ]
    assert gpu["phases"][2]["gpu_metrics"] == {"gr_active": 1.0, "sm_active": 0.95}


def test_text_says_what_the_trace_covers_and_lists_the_phases(tmp_path):
    done = cli(three_phases(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == ("kernel trace covers 6.000 s of the 15.900 s capture (trace 4.000 to 10.000 s, GPU metrics "
                        "0.000 to 15.900 s): the verdicts below are for the trace's window, the phases for the whole "
                        "capture")
    at = lines.index("  phases (split where the activity changes, each judged on its own window):")
    assert lines[at + 1] == "    0.000 to 4.000 s (4.000 s, 0 kernels): idle: time utilization 0% (< 5%)"
    assert lines[at + 2].startswith("    4.000 to 10.000 s (6.000 s, 6000 kernels): small_grid: median grid 32 blocks "
                                    "on 132 SMs")
    assert lines[at + 3] == ("    10.000 to 15.900 s (5.900 s, 0 kernels): saturated: SM active 95% (>= 80%): "
                             "compute-bound")
    as_json = json.loads(cli(three_phases(tmp_path), "--json").stdout)
    assert [p["window_s"] for p in as_json["gpus"][0]["phases"]] == [[0.0, 4.0], [4.0, 10.0], [10.0, 15.9]]


def test_a_phase_is_at_least_two_seconds(tmp_path):
    """A saturated run of exactly MIN_PHASE_S (2 s) is a phase; 1.5 s of it is a blip inside the idle."""
    def phases(busy_until):
        out = synth.metric_phases(MATMUL, tmp_path / f"p{busy_until}.sqlite",
                                  [(0, 4, IDLE), (4, busy_until, FULL), (busy_until, 10, IDLE)])
        with Export(out, require_metrics=False) as export:
            return [(p["window_s"], p["activity"]) for p in diagnose(export)["gpus"][0]["phases"]]

    assert phases(6) == [([0.0, 4.0], "idle"), ([4.0, 6.0], "saturated"), ([6.0, 9.9], "idle")]
    assert phases(5.5) == []


def test_one_activity_gives_no_phases_and_a_window_keeps_them_inside_it(tmp_path):
    with Export(MATMUL) as export:
        assert diagnose(export)["gpus"][0]["phases"] == []
    with Export(three_phases(tmp_path), require_metrics=False) as export:
        result = diagnose(export, 2_000_000_000, 12_000_000_000)
    assert result["coverage"] is None  # a window was asked for: the verdict is for it
    assert [p["window_s"] for p in result["gpus"][0]["phases"]] == [[2.0, 4.0], [4.0, 10.0], [10.0, 12.0]]


def test_recorded_phases_capture_split_where_its_activity_changes():
    """The H100 recording: idle with short input bursts, a quarter of the SMs busy, then a saturating
    training loop, then idle (tools/record_fixtures.sh)."""
    with Export(PHASES) as export:
        (gpu,) = diagnose(export)["gpus"]
    assert [([round(t, 2) for t in p["window_s"]], p["verdict"]["verdict"]) for p in gpu["phases"]] == [
        ([0.01, 9.0], "input_bound"), ([9.0, 14.0], "small_grid"), ([14.0, 22.5], "saturated"), ([22.5, 25.13], "idle")]
