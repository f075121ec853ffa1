"""The verdict rules (nsys_ingest/verdicts.py) at every threshold and in every order, the kernel and
copy statistics they rest on in exact figures, MPS told from time slicing, and each H100 recording's
verdict, live and offline (bench/verdict_table.py, the table in bench/RESULTS.md).

Mutations made by hand, each failing the test named (then restored):
- `sm_active >= SATURATED_SM` -> `>`: test_threshold_boundaries[saturated at]; likewise every other
  `<`/`>=` of a threshold: its "at" case.
- any two adjacent rules of RULES swapped: test_adjacent_rules_hold_together_and_the_first_wins (for
  the three pairs no evidence satisfies together, test_rules_that_never_hold_together says so).
- the running maximum of kernel ends dropped from Busy.add (busy_before = the previous row's end):
  test_exact_gaps_busy_and_overlap (idle 2,000,999 -> 2,002,499 ns, overlap 1.004 -> 1.011).
- overlap of all kernels instead of short kernels for the sharing mode:
  test_long_kernels_switched_out_do_not_read_as_mps.
- copies left out of the GPU's idle gaps: test_copies_are_gpu_work_shown_apart_from_kernels.
- `ratio >= THROTTLED_CLOCK` -> `>`: test_threshold_boundaries[throttled (THROTTLED_CLOCK 90%) at];
  `time_utilization < BUSY_TIME` -> `<=` in _throttled: its "at" case; "gpu_idle" counted as a power or
  thermal reason: test_clock_reasons_that_are_not_limits_are_not_throttling; the live path reading the
  current clock against itself instead of the maximum: test_live_throttled_verdict_from_the_h200_recording.
"""
import itertools
import subprocess
import sys

import pytest

import tests.synthetic_exports as synth
from tests.verdict_recordings import RECORDINGS, live_diagnoses, offline, rejudge
from exporter.chain import diagnose as diagnose_live
from exporter.nvml import CLOCK_EVENT_REASONS
from exporter.nvml_replay import ReplayNvml
from exporter.snapshot import ComputeProcess, DeviceTelemetry, GpuHealth, GpuIdentity, SpatialReading
from nsys_ingest.diagnose import _sharing
from nsys_ingest.kernels import kernel_stats
from nsys_ingest.reader import Export
from nsys_ingest.verdicts import RULES, VERDICTS, Evidence, judge, sharing_mode
from tests.helpers import FIXTURES
from tests.test_diagnose import MPS, TIME_SLICED, only_gpu, run

TS_LONG = FIXTURES / "h100_diag_ts_long.sqlite"
PHASES = FIXTURES / "h100_phases_100hz.sqlite"
EPS = 1e-4
TRACE = dict(kernel_trace=True, processes=1, sharing_mode="exclusive", long_gap_idle_share=0.0,
             median_kernel_s=1e-3, median_grid_blocks=132, sm_count=132)  # a trace of long, wide kernels
H200 = FIXTURES / "nvml_h200_health.json"
# Live NVML clocks held at 1500 of 1980 MHz by the power cap (76%).
THROTTLE = dict(sm_clock_hertz=1500e6, sm_clock_max_hertz=1980e6, clock_event_reasons=("sw_power_cap",))


# -- thresholds: just below, at, just above ----------------------------------------------------------
BOUNDARIES = {
    "idle (IDLE_BELOW 5%)": (lambda x: Evidence(x, 0.0, processes=1), 0.05, ("idle", "host_bound", "host_bound")),
    "memory_bound (MEMORY_BOUND_DRAM 60%)": (lambda x: Evidence(0.99, 0.95, dram_active=x), 0.6,
                                             ("saturated", "memory_bound", "memory_bound")),
    "saturated (SATURATED_SM 80%)": (lambda x: Evidence(0.99, x), 0.8, ("no_finding", "saturated", "saturated")),
    "host_bound (BUSY_TIME 50%)": (lambda x: Evidence(x, 0.0, processes=1), 0.5,
                                   ("host_bound", "small_kernels", "small_kernels")),
    "input_bound (BUSY_TIME 50%)": (lambda x: Evidence(x, 0.45, processes=1), 0.5,
                                    ("input_bound", "small_kernels", "small_kernels")),
    # SM active per busy time against LOW_SM: 0.2 / 0.4 is 0.5 exactly.
    "host_bound (fill LOW_SM 50%)": (lambda x: Evidence(0.4, x, processes=1), 0.2,
                                     ("host_bound", "input_bound", "input_bound")),
    "hidden idle (LOW_SM 50%)": (lambda x: Evidence(0.99, x), 0.5, ("small_kernels", "no_finding", "no_finding")),
    "input_bound (INPUT_BOUND_LONG_GAPS 50%)": (
        lambda x: Evidence(0.3, 0.25, **{**TRACE, "long_gap_idle_share": x}), 0.5,
        ("underused_sms", "input_bound", "input_bound")),
    # Busy 75%: idle 25% against the SMs' idle while busy, 0.75 - SM active (equal at 0.5, exactly).
    "input_bound (idle vs hidden idle)": (
        lambda x: Evidence(0.75, x, **{**TRACE, "long_gap_idle_share": 0.9}), 0.5,
        ("underused_sms", "no_finding", "input_bound")),
    "launch_bound (LAUNCH_BOUND_KERNEL_S 20 us)": (
        lambda x: Evidence(0.99, 0.25, **{**TRACE, "median_kernel_s": x}), 20e-6,
        ("launch_bound", "underused_sms", "underused_sms")),
    "small_grid (median grid vs SM count)": (
        lambda x: Evidence(0.99, 0.25, **{**TRACE, "median_grid_blocks": round(x)}), 132,
        ("small_grid", "underused_sms", "underused_sms")),
    # Busy in time at 50% with the clocks held: throttled; under it, the GPU waits on its host.
    "throttled (BUSY_TIME 50%)": (lambda x: Evidence(x, None, processes=1, **THROTTLE), 0.5,
                                  ("host_bound", "throttled", "throttled")),
    # 1782 of 1980 MHz is 0.9 exactly.
    "throttled (THROTTLED_CLOCK 90%)": (
        lambda x: Evidence(0.99, 0.95, **{**THROTTLE, "sm_clock_hertz": x * 1980e6}), 0.9,
        ("throttled", "saturated", "saturated")),
    "mps_server_paging (MPS_STALL_FAULTS_PER_S 1/s)": (
        lambda x: Evidence(0.99, 0.3, sharing_mode="mps", processes=2, mps_server_faults_per_s=x), 1.0,
        ("mps_shared", "mps_server_paging", "mps_server_paging")),
}


@pytest.mark.parametrize("rule", BOUNDARIES)
@pytest.mark.parametrize("where", ["below", "at", "above"])
def test_threshold_boundaries(rule, where):
    evidence_at, threshold, expected = BOUNDARIES[rule]
    step = 1 if rule.startswith("small_grid") else EPS * threshold
    value = {"below": threshold - step, "at": threshold, "above": threshold + step}[where]
    found = judge(evidence_at(value))
    assert found.verdict == expected[("below", "at", "above").index(where)], (value, found)


def _summary(short_kernels, short_overlap, overlap):
    return {"short_kernels": short_kernels, "short_kernel_overlap": short_overlap, "overlap": overlap}


@pytest.mark.parametrize("summary, mode", [
    (_summary(1000, 1.2 - EPS, 3.0), "time_sliced"),  # CONCURRENT_KERNELS: below
    (_summary(1000, 1.2, 1.0), "mps"),  # at
    (_summary(1000, 1.2 + EPS, 1.0), "mps"),  # above
    (_summary(99, 1.5, 1.5), None),  # MIN_SHORT_KERNELS: below, long kernels overlap: cannot tell
    (_summary(99, 1.5, 1.0), "time_sliced"),  # below, and nothing overlaps at all
    (_summary(100, 1.5, 1.5), "mps"),  # at
    (_summary(0, None, 1.2 - EPS), "time_sliced"),
])
def test_sharing_mode_from_a_trace(summary, mode):
    assert _sharing(summary, 3) == mode
    assert _sharing(summary, 1) == "exclusive" and _sharing(summary, 0) == "idle"


# -- rule order -------------------------------------------------------------------------------------
# For each adjacent pair of RULES: evidence on which both rules hold; the first must win.
BOTH_HOLD = {
    ("mps_server_paging", "idle"): Evidence(0.01, 0.0, sharing_mode="mps", processes=2, mps_server_faults_per_s=5.0),
    ("throttled", "memory_bound"): Evidence(0.99, 0.95, dram_active=0.85, **THROTTLE),
    ("memory_bound", "saturated"): Evidence(0.99, 0.95, dram_active=0.85),
    ("host_bound", "input_bound"): Evidence(0.3, 0.0, processes=1),
    ("input_bound", "time_sliced_small_kernels"): Evidence(0.3, 0.2, sharing_mode="time_sliced", processes=2),
    ("mps_shared", "launch_bound"): Evidence(0.99, 0.3, **{**TRACE, "sharing_mode": "mps", "median_kernel_s": 5e-6}),
    ("launch_bound", "small_grid"): Evidence(0.99, 0.3, **{**TRACE, "median_kernel_s": 5e-6, "median_grid_blocks": 33}),
    ("small_grid", "underused_sms"): Evidence(0.99, 0.3, **{**TRACE, "median_grid_blocks": 33}),
    ("small_kernels", "no_finding"): Evidence(0.99, 0.25),
}
# Pairs that exclude each other: SM active >= 80% is never under half the time figure when that is
# under 50% (SM active <= time); a GPU is time-sliced or under MPS; a trace is there or it is not.
# A throttled GPU is busy (>= 50%), an idle one is not (< 5%).
NEVER_TOGETHER = {("saturated", "host_bound"), ("time_sliced_small_kernels", "mps_shared"),
                  ("underused_sms", "small_kernels"), ("idle", "throttled")}
RULE = dict(RULES)


def test_every_adjacent_pair_is_covered():
    assert set(BOTH_HOLD) | NEVER_TOGETHER == set(zip(VERDICTS, VERDICTS[1:]))


@pytest.mark.parametrize("pair", BOTH_HOLD)
def test_adjacent_rules_hold_together_and_the_first_wins(pair):
    first, second = pair
    evidence = BOTH_HOLD[pair]
    assert RULE[first](evidence) and RULE[second](evidence)
    assert judge(evidence).verdict == first


def _evidence_grid():
    """Evidence over a grid of values where SM active never exceeds time utilization."""
    levels = (0.0, 0.02, 0.3, 0.45, 0.6, 0.85, 0.99)
    for time, sm, dram, mode, trace, clocks in itertools.product(
            levels, levels, (None, 0.7), ("time_sliced", "mps", None), (False, True), ({}, THROTTLE)):
        if sm <= time:
            extra = {**TRACE, "sharing_mode": mode, "median_kernel_s": 5e-6} if trace else {"sharing_mode": mode}
            yield Evidence(time, sm, dram_active=dram, **{**extra, **clocks, "processes": 2 if mode else 1})


def test_rules_that_never_hold_together():
    for first, second in NEVER_TOGETHER:
        together = [e for e in _evidence_grid() if RULE[first](e) and RULE[second](e)]
        assert not together, (first, second, together[:1])


# -- exact figures on a small synthetic trace --------------------------------------------------------
P1, P2 = 101 << 24, 202 << 24  # globalPid: the pid sits in bits 24-47
# ns from the base; two processes; k2 overlaps k1 and holds k3 whole; k4 (100 us) is not short, k5
# (99.999 us) is; the gap before k5 is 1 ms exactly (long), the one before k6 1 ns less (not long).
KERNELS = [(0, 1000, P1, 132), (500, 3000, P2, 66), (1200, 1500, P1, 132), (4000, 104_000, P1, 132),
           (1_104_000, 1_203_999, P2, 132), (2_203_998, 2_204_998, P1, 33)]
COPIES = [(3200, 3800, P2, 1000, 8)]  # device to device, in the gap between k2 and k4: splits it in two
MEMSETS = [(50_000, 60_000, P1, 64)]  # inside k4: no gap changes


def _trace(tmp_path, copies=True):
    base = int(Export(MPS, require_metrics=False).con.execute(
        "select min(start) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0])

    def shift(rows):
        return [(base + s, base + e, *rest) for s, e, *rest in rows]

    return synth.with_activities(MPS, tmp_path / f"trace_{copies}.sqlite", shift(KERNELS), shift(COPIES),
                                 shift(MEMSETS) if copies else None), base


@pytest.mark.parametrize("chunk_rows", [1, 2, 5, 1000])
def test_exact_gaps_busy_and_overlap(tmp_path, chunk_rows):
    path, base = _trace(tmp_path, copies=False)
    with Export(path, require_metrics=False) as export:
        (gpu,), window = (lambda g, w: (list(g.values()), w))(*kernel_stats(export, chunk_rows=chunk_rows))
    assert window == (base, base + 2_204_998) and gpu.window_ns == 2_204_998 and gpu.copies is None
    assert gpu.work.idle_ns == 1000 + 1_000_000 + 999_999 and gpu.work.gaps == 3
    assert gpu.work.long_idle_ns == 1_000_000  # 1 ms exactly is long; 1 ns less is not
    assert gpu.kernel_busy.busy_ns == 3000 + 100_000 + 99_999 + 1000
    assert gpu.kernel_busy.work_ns == gpu.kernel_ns == 1000 + 2500 + 300 + 100_000 + 99_999 + 1000
    assert gpu.short_busy.count == 5 and gpu.short_busy.work_ns == 104_799 and gpu.short_busy.busy_ns == 103_999
    k = only_gpu(run(path, chunk_rows=chunk_rows))["kernels"]
    assert k["busy_share"] == round(203_999 / 2_204_998, 6) and k["idle_gaps"] == 3
    assert k["overlap"] == round(204_799 / 203_999, 3) == 1.004
    assert k["long_gap_idle_share"] == round(1_000_000 / 2_000_999, 6)
    assert k["short_kernels"] == 5 and k["short_kernel_overlap"] == round(104_799 / 103_999, 3)


def test_copies_are_gpu_work_shown_apart_from_kernels(tmp_path):
    path, _base = _trace(tmp_path)
    gpu = only_gpu(run(path, chunk_rows=2))
    k, c = gpu["kernels"], gpu["copies"]
    assert k["idle_gaps"] == 4 and k["busy_share"] == round(203_999 / 2_204_998, 6)  # kernels alone: unchanged
    assert k["long_gap_idle_share"] == round(1_000_000 / (2_000_999 - 600), 6)  # the copy ran in a gap
    assert c == {"copies": 2, "bytes": 1064, "busy_s": 10.6e-6, "busy_share": round(10_600 / 2_204_998, 6),
                 "kinds": {"Device-to-Device": {"count": 1, "bytes": 1000, "seconds": 0.6e-6},
                           "memset": {"count": 1, "bytes": 64, "seconds": 10e-6}}}


def test_a_window_of_copies_only_is_memory_work(tmp_path):
    gpu = only_gpu(run(FIXTURES / "h100_diag_copy.sqlite"))
    assert gpu["kernels"]["kernels"] == 0 and gpu["copies"]["kinds"]["Device-to-Device"]["count"] > 100
    assert gpu["copies"]["busy_share"] > 0.95
    assert gpu["verdict"]["verdict"] == "memory_bound" and "copies" in gpu["verdict"]["reason"]
    assert gpu["verdict"]["evidence"]["processes"] == 1 and gpu["verdict"]["evidence"]["sharing_mode"] == "exclusive"


def test_the_command_line_shows_copies_and_labels_time_against_kernels():
    done = subprocess.run([sys.executable, "-m", "nsys_ingest", "diagnose", str(TIME_SLICED)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "GR active (time utilization) 0.990" in done.stdout and "kernels running: 32.8% of the window" in done.stdout
    assert "time utilization 99% but SM active 15%" in done.stdout
    assert "copies and memsets: 2519" in done.stdout and "Device-to-Host 630" in done.stdout
    # Even decimals in the per-process table: one for rates and shares, two for microseconds.
    assert "11082.0       1.95      16.60     32     58.4%            5.8%" in done.stdout


# -- MPS or time slicing -------------------------------------------------------------------------------
def test_long_kernels_switched_out_do_not_read_as_mps(tmp_path):
    """Three time-sliced processes (one running 170 us matmuls) with every kernel in flight at a switch
    spanning the other contexts' slices: all kernels overlap 3x, short ones not at all."""
    gpu = only_gpu(run(synth.preempted(TS_LONG, tmp_path / "preempted.sqlite")))
    assert gpu["kernels"]["overlap"] > 2.5 and gpu["kernels"]["short_kernel_overlap"] < 1.01
    assert gpu["verdict"]["evidence"]["sharing_mode"] == "time_sliced"
    assert gpu["verdict"]["verdict"] == "time_sliced_small_kernels"


@pytest.mark.parametrize("path, mode, low, high", [
    (MPS, "mps", 1.4, 1.45), (TIME_SLICED, "time_sliced", 1.0, 1.001), (TS_LONG, "time_sliced", 1.0, 1.001)])
def test_short_kernels_overlap_only_under_mps(path, mode, low, high):
    gpu = only_gpu(run(path))
    assert low <= gpu["kernels"]["short_kernel_overlap"] <= high
    assert gpu["verdict"]["evidence"]["sharing_mode"] == mode


# -- advice that agrees with what the export holds -----------------------------------------------------
@pytest.mark.parametrize("path", sorted(FIXTURES.glob("h100_*.sqlite")), ids=lambda p: p.stem)
def test_an_export_with_a_trace_is_never_told_to_trace(path):
    verdict = only_gpu(run(path))["verdict"]
    assert "--trace=cuda" not in verdict["advice"] + verdict["reason"], verdict
    assert verdict["verdict"] != "small_kernels"  # the trace says which kind of small


def test_phases_verdict_agrees_with_its_kernels():
    """Long (1.6 ms median), full-grid kernels and 39% of the window idle in gaps >= 1 ms: the GPU waits."""
    gpu = only_gpu(run(PHASES))
    assert gpu["kernels"]["median_us"] > 1000 and gpu["kernels"]["median_grid_blocks"] == 132
    assert gpu["verdict"]["verdict"] == "input_bound" and "idles 39%" in gpu["verdict"]["reason"]


def test_without_a_trace_it_may_ask_for_one(tmp_path):
    gpu = only_gpu(run(synth.without_kernel_trace(TIME_SLICED, tmp_path / "bare.sqlite")))
    assert gpu["verdict"]["verdict"] == "small_kernels" and "--trace=cuda" in gpu["verdict"]["advice"]
    phases = only_gpu(run(synth.without_kernel_trace(PHASES, tmp_path / "phases.sqlite")))["verdict"]
    assert phases["verdict"] == "input_bound" and "kernels run 49.9% (< 50%) of the time, kernels fill 73% of the SMs" in phases["reason"]


# -- each H100 recording, live and offline -------------------------------------------------------------
@pytest.mark.parametrize("name, right_live, right_offline", [(n, live, off) for n, _w, live, off in RECORDINGS])
def test_each_recording_gets_the_right_verdict_live_and_offline(name, right_live, right_offline):
    assert offline(name)["verdict"]["verdict"] == right_offline
    recorded = live_diagnoses(name)
    if recorded:  # the exporter's recorded evidence, judged by today's rules: (nearly) every snapshot
        verdicts = [rejudge(d) for d in recorded]
        assert verdicts.count(right_live) >= 0.9 * len(verdicts), verdicts


def test_live_launch_loop_is_host_bound_and_says_what_needs_a_trace():
    """Live evidence of the launch loop (bench/results/verdicts/live_launch.jsonl): time 0.19, SM 0.00."""
    identity = GpuIdentity(0, "GPU-x", "H100")
    telemetry = DeviceTelemetry(identity, 0.0, compute_processes=(ComputeProcess(11, "python3", "time_sliced"),))
    mode, (verdict, evidence) = diagnose_live(telemetry, SpatialReading("gpm", 0.0, 1.0, sm_active=0.0008), 0.19, None)
    assert mode == "exclusive" and verdict.verdict == "host_bound"
    assert "certain: the GPU waits on the host" in verdict.advice and "--trace=cuda" in verdict.advice
    starved = diagnose_live(telemetry, SpatialReading("gpm", 0.0, 1.0, sm_active=0.10), 0.12, None)[1][0]
    assert starved.verdict == "input_bound" and "fill 83% of the SMs" in starved.reason


# -- the rules on their own ------------------------------------------------------------------------------
@pytest.mark.parametrize("time_sliced, mps, mig, mode", [
    (0, 0, False, "idle"), (1, 0, False, "exclusive"), (4, 0, False, "time_sliced"), (0, 4, False, "mps"),
    (1, 3, False, "time_sliced"), (0, 0, True, "mig"), (2, 0, None, "time_sliced"),
])
def test_sharing_mode_live(time_sliced, mps, mig, mode):
    assert sharing_mode(time_sliced, mps, mig) == mode


@pytest.mark.parametrize("evidence, verdict", [
    (Evidence(0.99, 0.2, mps_server_faults_per_s=5.0, sharing_mode="mps"), "mps_server_paging"),
    (Evidence(0.01, 0.0, processes=0), "idle"),
    (Evidence(0.99, 0.95, **THROTTLE), "throttled"),
    (Evidence(0.99, 0.95, dram_active=0.85, kernel_trace=True, kernel_busy_share=0.0, copy_busy_share=0.99),
     "memory_bound"),
    (Evidence(0.99, 0.95), "saturated"),
    (Evidence(0.3, None, processes=1), "host_bound"),
    (Evidence(0.3, 0.25, processes=1), "input_bound"),
    (Evidence(0.3, 0.02, **{**TRACE, "long_gap_idle_share": 0.95}), "input_bound"),
    (Evidence(0.3, 0.2, **{**TRACE, "median_kernel_s": 5e-6}), "launch_bound"),
    (Evidence(0.99, 0.15, sharing_mode="time_sliced", processes=6), "time_sliced_small_kernels"),
    (Evidence(0.99, 0.6, sharing_mode="mps", processes=6), "mps_shared"),
    (Evidence(0.99, 0.25, **{**TRACE, "median_grid_blocks": 33}), "small_grid"),
    (Evidence(0.99, 0.25, **TRACE), "underused_sms"),
    (Evidence(0.99, 0.25), "small_kernels"),
    (Evidence(0.99, 0.6, sharing_mode="exclusive"), "no_finding"),
])
def test_each_rule(evidence, verdict):
    found = judge(evidence)
    assert found.verdict == verdict and found.verdict in VERDICTS and found.reason and found.advice


def test_memory_bound_names_copies_only_when_they_are_the_work():
    kernels = judge(Evidence(0.99, 0.95, dram_active=0.85, kernel_trace=True, kernel_busy_share=0.98,
                             copy_busy_share=0.01))
    assert kernels.verdict == "memory_bound" and "fuse kernels" in kernels.advice and "copies" not in kernels.reason


def test_too_little_evidence_is_no_verdict():
    assert judge(Evidence(None, 0.5)) is None
    assert judge(Evidence(0.99, None)) is None  # busy in time, nothing to compare it to


# -- throttling ------------------------------------------------------------------------------------------
def test_clock_reasons_that_are_not_limits_are_not_throttling():
    """Idle clocks, application clocks and sync boost hold the clock below its maximum too: no limit to fix."""
    for reason in ("gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"):
        found = judge(Evidence(0.99, 0.95, **{**THROTTLE, "clock_event_reasons": (reason,)}))
        assert found.verdict == "saturated", reason
    assert judge(Evidence(0.99, 0.95, **{**THROTTLE, "sm_clock_max_hertz": None})).verdict == "saturated"


def test_throttled_says_what_held_the_clock_and_what_to_change():
    found = judge(Evidence(0.99, 0.95, **{**THROTTLE, "clock_event_reasons": ("gpu_idle", "sw_power_cap",
                                                                             "hw_thermal_slowdown")},
                           throttle_share=0.42))
    assert found.reason == ("SM clock 1500 MHz of 1980 MHz (76% (< 90%)) while busy 99% of the time, held down by "
                            "the board's power limit (software power cap); a hardware thermal slowdown (the GPU or "
                            "its memory too hot); held down 42% of the last window")
    assert found.advice.startswith("cooling: ") and "; power: " in found.advice and "nvidia-smi -pl" in found.advice
    power_only = judge(Evidence(0.99, 0.95, **THROTTLE))
    assert power_only.advice.startswith("power: ") and "cooling" not in power_only.advice


def _h200_frame() -> dict:
    """One frame of the H200 recording: what NVML answered, call by call (the test's figures come from it)."""
    nvml = ReplayNvml(H200)
    return {"max": nvml.max_clocks(0), "clock": nvml.sm_clock_hz(0), "health": nvml.health_counters(0)}


def test_live_throttled_verdict_from_the_h200_recording():
    """The recording's own maximum SM clock; the clock and reasons of a power-capped H200 declared
    against it (the lent GPU's clocks and power limit cannot be changed: throttling cannot be forced)."""
    frame = _h200_frame()
    assert frame["max"].errors == ()  # max_clocks answers a PartialAnswer: every clock answered here
    peak = frame["max"].values.sm_hz
    held = round(0.8 * peak / 15e6) * 15e6  # NVML reports clocks in whole MHz steps
    identity = GpuIdentity(0, "GPU-x", "NVIDIA H200")
    processes = (ComputeProcess(11, "python3", "time_sliced"),)
    bits = CLOCK_EVENT_REASONS["sw_power_cap"] | CLOCK_EVENT_REASONS["hw_thermal_slowdown"]
    health = GpuHealth(sm_clock_max_hertz=peak, clock_event_reasons=bits, throttle_share=0.5)
    telemetry = DeviceTelemetry(identity, 0.0, sm_clock_hertz=held, compute_processes=processes, health=health)
    mode, (verdict, evidence) = diagnose_live(telemetry, SpatialReading("gpm", 0.0, 1.0, sm_active=0.95), 0.99, None)
    assert verdict.verdict == "throttled" and mode == "exclusive"
    assert evidence.sm_clock_hertz == held and evidence.sm_clock_max_hertz == peak
    assert evidence.clock_event_reasons == ("sw_power_cap", "hw_thermal_slowdown") and evidence.throttle_share == 0.5
    assert f"SM clock {held / 1e6:.0f} MHz of {peak / 1e6:.0f} MHz" in verdict.reason
    # The same GPU at its recorded clock and reasons is not throttled.
    recorded = DeviceTelemetry(identity, 0.0, sm_clock_hertz=frame["clock"], compute_processes=processes,
                               health=GpuHealth(sm_clock_max_hertz=peak, clock_event_reasons=0))
    assert diagnose_live(recorded, SpatialReading("gpm", 0.0, 1.0, sm_active=0.95), 0.99, None)[1][0].verdict != "throttled"


# -- nsys_ingest/verdicts.py ---------------------------------------------------------------------------
def test_a_hardware_slowdown_asks_for_both_cooling_and_power():
    """Mutants: hw_slowdown dropped from the cooling advice, or from the power advice."""
    found = judge(Evidence(0.99, 0.95, sm_clock_hertz=1000e6, sm_clock_max_hertz=1980e6,
                           clock_event_reasons=("hw_slowdown",)))
    assert found.verdict == "throttled"
    assert found.advice.startswith("cooling: ") and "; power: " in found.advice


def test_copies_as_long_as_kernels_are_the_work():
    """Mutant: `copy_busy_share >= kernel_busy_share` -> `>` (copies running exactly as long as kernels
    read as kernels' memory traffic)."""
    even = judge(Evidence(0.99, 0.95, dram_active=0.85, kernel_trace=True, kernel_busy_share=0.5, copy_busy_share=0.5))
    assert even.verdict == "memory_bound" and "memory copies run 50% of the window" in even.reason
    less = judge(Evidence(0.99, 0.95, dram_active=0.85, kernel_trace=True, kernel_busy_share=0.5, copy_busy_share=0.49))
    assert "copies" not in less.reason
