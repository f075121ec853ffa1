"""Per-process attribution from GPU context switches (nsys_ingest/ctxsw.py): exact figures on small
synthetic exports whose attribution is computed by hand, the edges of the trace (windows, unmatched
and unknown events, order), and the hostile ones (a 2.5 M-row switch table)."""
import json
import sqlite3
import subprocess
import sys

import pytest

from nsys_ingest.ctxsw import MAX_OTHER_TAGS, NO_SWITCHES, OTHER_TAGS, attribute
from nsys_ingest.reader import Budget, Export, IngestError
from tests import synthetic_exports as synth
from tests.helpers import FIXTURES, ROOT

A, B = 100, 200  # GPU 0: A 0-2.5 ms and 7.5-10 ms, gap, B 2.8-7.0 ms, gap; 1 kHz samples
GPU0_SLICES = [(0, 0.0, 2.5, A, 1), (0, 2.8, 7.0, B, 2), (0, 7.5, 10.0, A, 1)]
# What each 1 ms interval reads when A's slices run at SM active 0.8, B's at 0.2, the gaps at 0, keyed by
# its end: (2,3]: 0.5 ms of A, 0.3 of gap, 0.2 of B = 0.44; (7,8]: 0.5 gap, 0.5 A = 0.4. A sample is
# stamped at the start of the interval it describes (nsys_ingest/ctxsw.py).
GPU0_SM = {1: 0.8, 2: 0.8, 3: 0.44, 4: 0.2, 5: 0.2, 6: 0.2, 7: 0.2, 8: 0.4, 9: 0.8, 10: 0.8}
# GPU 1: C 0-5, D 5-8, E's RESTORE_START at 8.2 followed by D's SAVE_END at 8.5 (another context: both
# unmatched), an unmatched RESTORE_START (E) at 9, D 9.5-10;
# an unknown tag and a RESTORE_END (ignored); SM active 0.6 throughout.
C, D, E = 400, 500, 600
GPU1_SLICES = [(1, 0.0, 5.0, C, 5), (1, 5.0, 8.0, D, 6), (1, 9.5, 10.0, D, 6)]
GPU1_EVENTS = [(1, 8.2, "RESTORE_START", 7, E), (1, 8.5, "SAVE_END", 6, D), (1, 9.0, "RESTORE_START", 7, E), (1, 2.0, 99, 5, C),
               (1, 0.1, "RESTORE_END", 5, C)]
def approx(value, abs=1e-6):  # the output is rounded to 6 digits
    return pytest.approx(value, abs=abs)


PROCESSES = {A: "python3 train.py", B: "spin", C: "matmul", D: "launch", E: "never-ran", 700: "no-gpu"}


def build(tmp_path, name="ctxsw.sqlite", **kw):
    samples = [(0, ms - 1, {"sm_active": v, "gr_active": 1.0, "tensor_active": v / 2}) for ms, v in GPU0_SM.items()]
    samples += [(1, ms, {"sm_active": 0.6, "gr_active": 1.0}) for ms in range(0, 10)]
    args = dict(slices=GPU0_SLICES + GPU1_SLICES, events=GPU1_EVENTS, samples=samples, processes=PROCESSES)
    return synth.ctxsw_export(tmp_path / name, **{**args, **kw})


def edited(tmp_path, script: str):
    """build(), then the SQL `script` run on it."""
    path = build(tmp_path)
    con = sqlite3.connect(path)
    con.executescript(script)
    con.close()
    return path


def run(path, **kw):
    with Export(path, require_metrics=False) as export:
        return attribute(export, **kw).to_json()


def procs(result, gpu=0):
    return {p["pid"]: p for p in result["gpus"][gpu]["processes"]}


def test_switch_overhead_is_the_gaps_between_slices_not_the_windows_idle_edges(tmp_path):
    """Issue 35: A 2-4 ms, B 4.5-8 ms in a 10 ms window: 0.5 ms between the slices is switch overhead (0.05);
    the 4.5 ms without any context (before A, after B) is not."""
    samples = [(0, ms, {"sm_active": 0.5}) for ms in range(10)]
    g0 = run(synth.ctxsw_export(tmp_path / "edges.sqlite", slices=[(0, 2.0, 4.0, A, 1), (0, 4.5, 8.0, B, 2)],
                                samples=samples, processes=PROCESSES))["gpus"][0]
    assert g0["switch_gap_share"] == approx(0.45) and g0["switch_between_share"] == approx(0.05)
    # the same slices read in chunks of one: a gap across two chunks counts once
    g0 = run(synth.ctxsw_export(tmp_path / "edges.sqlite", slices=[(0, 2.0, 4.0, A, 1), (0, 4.5, 8.0, B, 2)],
                                samples=samples, processes=PROCESSES), chunk_rows=1)["gpus"][0]
    assert g0["switch_between_share"] == approx(0.05)


def test_overlap_splits_straddling_samples_by_the_time_each_slice_covers(tmp_path):
    result = run(build(tmp_path), estimator="overlap")
    g0 = result["gpus"][0]
    assert result["estimator"] == "overlap" and result["window_s"] == [0.0, 0.01]
    assert (g0["gpu"], g0["slices"], g0["samples"], g0["uuid"]) == (0, 3, 10, "GPU-00000000-0000-4000-8000-000000000000")
    a, b = procs(result)[A], procs(result)[B]
    assert (a["command"], a["slices"], a["resident_s"], a["time_share"]) == ("python3 train.py", 2, 0.005, 0.5)
    assert (b["resident_s"], b["time_share"]) == (0.0042, 0.42)
    assert g0["switch_gap_s"] == approx(0.0008) and g0["switch_gap_share"] == approx(0.08)
    assert g0["switch_between_share"] == approx(0.08)  # every gap lies between two slices
    # A: 4 whole samples at 0.8, half of (2,3] at 0.44, half of (7,8] at 0.4 -> 3.62 / 5
    assert a["while_resident"]["sm_active"] == approx(0.724)
    assert a["of_gpu"]["sm_active"] == approx(0.724 * 0.5)
    assert a["while_resident"]["tensor_active"] == approx(0.362)
    assert a["while_resident"]["gr_active"] == approx(1.0)
    # B: 0.2 ms of (2,3] at 0.44, 4 whole samples at 0.2 -> 0.888 / 4.2
    assert b["while_resident"]["sm_active"] == approx(0.888 / 4.2)
    # the gaps: 0.3 ms at 0.44, 0.5 ms at 0.4
    assert g0["gap_means"]["sm_active"] == approx((0.3 * 0.44 + 0.5 * 0.4) / 0.8)
    assert g0["gpu_means"]["sm_active"] == approx(sum(GPU0_SM.values()) / 10)
    assert set(procs(result)) == {A, B}  # the processes without slices are not there


def test_at_gives_each_sample_to_the_slice_at_its_timestamp(tmp_path):
    result = run(build(tmp_path), estimator="at")
    a, b = procs(result)[A], procs(result)[B]
    # (2,3] is stamped 2 ms, inside A's first slice; (7,8] 7 ms, in the gap after B's
    assert a["while_resident"]["sm_active"] == approx((4 * 0.8 + 0.44) / 5)
    assert b["while_resident"]["sm_active"] == approx(0.2)
    assert result["gpus"][0]["gap_means"]["sm_active"] == approx(0.4)
    assert (a["time_share"], b["time_share"]) == (0.5, 0.42)  # time shares do not depend on the estimator


def test_fit_recovers_each_processes_density(tmp_path):
    result = run(build(tmp_path))
    assert result["estimator"] == "fit"  # the default
    a, b = procs(result)[A], procs(result)[B]
    assert a["while_resident"]["sm_active"] == approx(0.8, abs=1e-9)
    assert b["while_resident"]["sm_active"] == approx(0.2, abs=1e-9)
    assert result["gpus"][0]["gap_means"]["sm_active"] == approx(0.0, abs=1e-9)


def test_unmatched_and_unknown_events_count_as_gap_and_are_reported(tmp_path):
    g1 = run(build(tmp_path))["gpus"][1]
    c, d = (p for p in g1["processes"])
    assert (c["pid"], c["time_share"], d["pid"], d["time_share"], d["slices"]) == (C, 0.5, D, 0.35, 2)
    assert g1["switch_gap_share"] == approx(0.15)  # 8-9.5 ms: the unmatched events' time
    assert g1["unmatched_events"] == 3
    assert g1["other_events"] == {"RESTORE_END": 1, "unknown tag 99": 1}
    assert c["while_resident"]["sm_active"] == approx(0.6) and E not in {p["pid"] for p in g1["processes"]}


@pytest.mark.parametrize("chunk_rows", [1, 2, 3, 7])
def test_chunk_size_and_row_order_change_nothing(tmp_path, chunk_rows):
    whole = run(build(tmp_path))
    assert run(build(tmp_path, "small.sqlite"), chunk_rows=chunk_rows)["gpus"] == whole["gpus"]
    assert run(build(tmp_path, "reversed.sqlite", reverse=True), chunk_rows=chunk_rows)["gpus"] == whole["gpus"]


def test_windows_cut_slices_at_their_edges(tmp_path):
    # 1-9 ms: A's first slice is seen by its SAVE_END alone (resident since the window opened), its last by
    # its RESTORE_START alone (resident until the window closed)
    result = run(build(tmp_path), start_ns=1 * synth.MS, end_ns=9 * synth.MS, estimator="overlap")
    a, b = procs(result)[A], procs(result)[B]
    assert result["window_s"] == [0.001, 0.009]
    assert a["resident_s"] == approx(0.003) and a["time_share"] == approx(0.375)
    assert b["time_share"] == approx(4.2 / 8)
    assert result["gpus"][0]["samples"] == 8
    assert a["while_resident"]["sm_active"] == approx((0.8 + 0.5 * 0.44 + 0.5 * 0.4 + 0.8) / 3)


def test_tags_are_read_by_name_and_default_to_the_devices_numbers(tmp_path):
    renumbered = {1: "RESTORE_START", 2: "SAVE_END", 3: "RESTORE_END"}
    whole = run(build(tmp_path))["gpus"]
    assert run(build(tmp_path, "renumbered.sqlite", enum=renumbered))["gpus"][0] == whole[0]
    assert run(build(tmp_path, "no-enum.sqlite", enum=None))["gpus"][0] == whole[0]
    with pytest.raises(IngestError, match="names no RESTORE_START"):
        run(build(tmp_path, "bad-enum.sqlite", enum={1: "SOMETHING", 2: "ELSE"}, slices=[], events=[(0, 1.0, 1, 1, A)]))


def test_switches_without_gpu_metrics_give_time_shares_only(tmp_path):
    result = run(build(tmp_path, samples=[]))
    a = procs(result)[A]
    assert a["time_share"] == 0.5 and a["while_resident"] == {} and result["quantities"] == []


def test_combining_samples_averages_consecutive_ones(tmp_path):
    # every 2 samples -> one 2 ms sample stamped at its first: (0,2] 0.8, (2,4] 0.32, (4,6] 0.2, (6,8] 0.3, (8,10] 0.8
    result = run(build(tmp_path), combine=2, estimator="overlap")
    a = procs(result)[A]
    # A: (0,2] whole, 0.5 ms of (2,4], 0.5 ms of (6,8], (8,10] whole
    assert a["while_resident"]["sm_active"] == approx((2 * 0.8 + 0.5 * 0.32 + 0.5 * 0.3 + 2 * 0.8) / 5)
    assert result["gpus"][0]["samples"] == 5


def cli(*args):
    return subprocess.run([sys.executable, "-m", "nsys_ingest", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={"NSYS_INGEST_NO_PROGRESS": "1", "PATH": "/usr/bin:/bin"})


def test_cli_text_json_and_windows(tmp_path):
    path = build(tmp_path)
    done = cli("workloads", path)
    assert done.returncode == 0, done.stderr
    assert "python3 train.py" in done.stdout and "(switch gaps)" in done.stdout and "estimator fit" in done.stdout
    done = cli("workloads", path, "--json", "--start", "0.001", "--end", "0.009", "--estimator", "overlap")
    result = json.loads(done.stdout)
    assert result["window_s"] == [0.001, 0.009] and result["estimator"] == "overlap"
    assert procs(result)[A]["while_resident"]["sm_active"] == approx((0.8 + 0.5 * 0.44 + 0.5 * 0.4 + 0.8) / 3)
    gpu_spatial = subprocess.run([sys.executable, "-m", "gpu_spatial", "nsys", "workloads", path, "--json"], cwd=ROOT,
                                 capture_output=True, text=True, env={"NSYS_INGEST_NO_PROGRESS": "1", "PATH": "/usr/bin:/bin"})
    assert json.loads(gpu_spatial.stdout)["gpus"] == json.loads(cli("workloads", path, "--json").stdout)["gpus"]


def test_an_export_without_context_switches_names_the_flag(tmp_path):
    done = cli("workloads", edited(tmp_path, "drop table GPU_CONTEXT_SWITCH_EVENTS"))
    assert done.returncode == 2 and done.stderr.strip() == f"error: {NO_SWITCHES}" and "--gpuctxsw=true" in done.stderr
    empty = synth.ctxsw_export(tmp_path / "empty.sqlite", samples=[(0, 1, {"sm_active": 0.5})])  # MPS: no events
    done = cli("workloads", empty)
    assert done.returncode == 2 and done.stderr.strip() == f"error: {NO_SWITCHES}"


# -- hostile exports --------------------------------------------------------------------------------
# Bounded memory is shown by what the read adds to the child's imports staying under GROWTH_MB: a 200,000-row
# chunk adds ~70 MB at 2.5 M events as at 10 M (141 MB peak both), a 600,000-row chunk 190 MB. 2.5 M events
# (1.25 M slices) are more than the 1 M slices pending ever allowed, so a read that held them all is refused,
# and 2.5 M rows held as Python rows would add ~400 MB. 10 M rows proved no more and cost 25 s more.
SWITCH_EVENTS = 2_500_000
GROWTH_MB = 150
ATTRIBUTE_AND_MEASURE = """
import json, resource, sys
from nsys_ingest.ctxsw import attribute
from nsys_ingest.reader import Export
imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with Export(sys.argv[1], require_metrics=False) as export:
    result = attribute(export).to_json()
print(json.dumps({"result": result, "imported_rss_kb": imported,
                  "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


@pytest.fixture(scope="module")
def millions_of_switches(tmp_path_factory):
    """2.5 M switch events (5 us slices and gaps, two processes taking turns, 12.5 s) under 60 ms of samples."""
    path = synth.ctxsw_export(tmp_path_factory.mktemp("big") / "big.sqlite", slices=[(0, 0.0, 1.0, A, 1)],
                              samples=[(0, ms, {"sm_active": 0.5}) for ms in range(1, 61)])
    con = sqlite3.connect(path)
    con.execute(f"""insert into GPU_CONTEXT_SWITCH_EVENTS
        with recursive i(k) as (select 0 union all select k + 1 from i where k < {SWITCH_EVENTS} - 1)
        select case when k % 2 = 0 then 8 else 7 end, 0, k + 10, (k / 2) % 2 + 10, 2000000 + k * 5000,
               {synth.global_pid(300)} + ((k / 2) % 2) * 16777216, 0 from i""")
    con.commit()
    con.close()
    return path


def test_millions_of_switch_events_are_read_in_bounded_memory(millions_of_switches):
    done = subprocess.run([sys.executable, "-c", ATTRIBUTE_AND_MEASURE, millions_of_switches], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    g0 = answer["result"]["gpus"][0]
    window_ns = 2_000_000 + (SWITCH_EVENTS - 1) * 5000
    assert g0["slices"] == SWITCH_EVENTS // 2 + 1 and g0["unmatched_events"] == 0
    shares = {p["pid"]: p["time_share"] for p in g0["processes"]}
    assert shares == {300: approx(SWITCH_EVENTS // 4 * 5000 / window_ns),
                      301: approx(SWITCH_EVENTS // 4 * 5000 / window_ns), A: approx(1e6 / window_ns)}
    # the whole table is ~85 MB on disk and 1.25 M slices would be 30 MB as arrays: neither is held
    assert answer["max_rss_kb"] - answer["imported_rss_kb"] < GROWTH_MB * 1024, answer


def test_reading_switches_stops_at_the_budget(millions_of_switches):
    # the budget runs from its creation: on a busy machine it may already be spent while the export opens
    with pytest.raises(IngestError, match="longer than its budget"):
        with Export(millions_of_switches, require_metrics=False, budget=Budget(0.5)) as export:
            try:
                attribute(export)
            except sqlite3.DatabaseError as exc:  # SQLite stopped mid-statement: explained as the CLI does
                raise export.explain(exc) from None


# -- the estimators on a time-sliced GPU (bench/ctxsw_estimators.py) ------------------------------------
def test_estimator_bench_against_the_10khz_truth(tmp_path):
    """Constant densities: at 1 kHz the fit finds each process's own (1 ms samples straddle ~half the
    switches); the overlap split leans each toward its neighbours'; at (whole samples) more so."""
    path, real = synth.time_sliced(tmp_path / "s10k.sqlite", {1: 0.5, 2: 0.9, 3: 0.06}, duration_ms=400)
    done = subprocess.run([sys.executable, "bench/ctxsw_estimators.py", path, tmp_path / "out", "--truth", "within"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out" / "ctxsw_estimators.json").read_text())
    assert (result["sampling_hz"], result["candidate_hz"], result["combined_samples"]) == (10000, 1000, 10)
    worst = {name: found["max_abs_error"]["sm_active_while_resident_error"] for name, found in result["estimators"].items()}
    assert worst["fit"] < 0.005 < 0.03 < worst["overlap"] < worst["at"], worst
    assert all(found["max_abs_error"]["time_share_error"] == 0 for found in result["estimators"].values())
    truth = {r["pid"]: r["sm_active_while_resident"] for r in result["estimators"]["fit"]["processes"]}
    assert truth == {pid: approx(value, abs=0.003) for pid, value in real.items()}  # 'within' at 10 kHz is the truth


def test_the_fit_keeps_every_density_within_0_and_1():
    import numpy as np

    from nsys_ingest.ctxsw import bounded_least_squares

    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (40, 3))
    y = x @ np.array([0.5, -0.3, 0.8])  # unconstrained, the second density is negative
    fitted = bounded_least_squares(x.T @ x, x.T @ y).densities
    assert fitted[1] == 0.0
    kept = np.linalg.lstsq(x[:, [0, 2]], y, rcond=None)[0]  # the best fit with that density at its bound
    assert fitted[[0, 2]] == pytest.approx(kept, abs=1e-9)
    assert bounded_least_squares(x.T @ x, x.T @ (x @ np.array([0.2, 1.4, 0.1]))).densities[1] == 1.0


# -- the H200 captures (tools/record_ctxsw.sh): jobs whose SM footprint is known by construction ------------
# 516 spins 4 ms kernels on 66 of 132 SMs, 515 2 ms kernels on 8 SMs (100 ms on, 150 ms off), 518 is a launch
# loop (one block: one SM), 514 runs bf16 8192^3 products back to back, a fifth holds a context and launches nothing.
H200_10KHZ, H200_1KHZ = FIXTURES / "h200_ctxsw_10khz.sqlite", FIXTURES / "h200_ctxsw_1khz.sqlite"
FOOTPRINT = {516: 66 / 132, 515: 8 / 132, 518: 1 / 132}


@pytest.mark.parametrize("path", [H200_10KHZ, H200_1KHZ])
def test_h200_captures_give_each_job_the_sm_footprint_it_was_built_with(path):
    result = run(path)
    g0 = result["gpus"][0]
    jobs = procs(result)
    assert set(jobs) == {514, 515, 516, 518} and g0["unmatched_events"] == 0  # the idle holder had no slice
    assert sum(p["time_share"] for p in jobs.values()) + g0["switch_gap_share"] == approx(1.0, abs=1e-5)
    for pid, footprint in FOOTPRINT.items():  # while resident, within 1.5 points (the kernels' own gaps)
        assert jobs[pid]["while_resident"]["sm_active"] == approx(footprint, abs=0.015), pid
    assert jobs[514]["while_resident"]["sm_active"] > 0.9 and jobs[514]["while_resident"]["tensor_active"] > 0.85
    assert jobs[516]["while_resident"]["tensor_active"] < 0.01  # spin kernels do not touch the tensor cores


def test_h200_estimators_at_1khz_against_the_10khz_truth(tmp_path):
    done = subprocess.run([sys.executable, "bench/ctxsw_estimators.py", H200_10KHZ, tmp_path], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    worst = {name: found["max_abs_error"]["sm_active_of_gpu_error"]
             for name, found in json.loads((tmp_path / "ctxsw_estimators.json").read_text())["estimators"].items()}
    # the fit (the default) is within the 0.02 of the GPU for every job; splitting by overlap is not
    assert worst["fit"] < 0.01 and worst["overlap"] > 0.02 and worst["at"] > 0.02, worst


@pytest.mark.parametrize("edit, message", [
    ("alter table GPU_CONTEXT_SWITCH_EVENTS rename to E; create view GPU_CONTEXT_SWITCH_EVENTS as select * from E",
     "GPU_CONTEXT_SWITCH_EVENTS is a view"),
    ("alter table GPU_CONTEXT_SWITCH_EVENTS drop column seqNo", "GPU_CONTEXT_SWITCH_EVENTS has no column seqNo"),
    ("update GPU_CONTEXT_SWITCH_EVENTS set timestamp = 'soon' where rowid = 3",
     "GPU_CONTEXT_SWITCH_EVENTS.timestamp holds 'soon' where"),
    ("update GPU_CONTEXT_SWITCH_EVENTS set tag = x'00ff' where rowid = 2", "GPU_CONTEXT_SWITCH_EVENTS.tag holds"),
    ("update GPU_CONTEXT_SWITCH_EVENTS set gpuId = 'gpu0' where rowid = 1", "GPU_CONTEXT_SWITCH_EVENTS.gpuId holds"),
    ("update ENUM_GPU_CTX_SWITCH set name = 'RESTORE_START' || zeroblob(300) where id = 8", "ENUM_GPU_CTX_SWITCH.name"),
])
def test_hostile_switch_tables_get_one_line(tmp_path, edit, message):
    done = cli("workloads", edited(tmp_path, edit))
    assert done.returncode == 2 and done.stderr.startswith("error: ") and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_more_processes_than_the_cap_are_refused(tmp_path):
    from nsys_ingest.ctxsw import MAX_PROCESSES

    slices = [(0, i * 0.1, i * 0.1 + 0.05, 1000 + i, i) for i in range(MAX_PROCESSES + 1)]
    path = synth.ctxsw_export(tmp_path / "many.sqlite", slices=slices, samples=[(0, 0, {"sm_active": 0.5})])
    with pytest.raises(IngestError, match=f"more than {MAX_PROCESSES} processes"):
        run(path)
    assert len(procs(run(synth.ctxsw_export(tmp_path / "enough.sqlite", slices=slices[:-1])))) == MAX_PROCESSES


def test_text_inside_the_switch_table_is_named(tmp_path):
    done = cli("workloads", edited(tmp_path, "update GPU_CONTEXT_SWITCH_EVENTS set contextId = 'ctx' where rowid = 2"))
    assert done.returncode == 2 and "GPU_CONTEXT_SWITCH_EVENTS.contextId holds 'ctx' where a number belongs" in done.stderr


# -- hostile exports against the fit and the tallies (issue 39; figures: bench/ctxsw_attacks.py) -----------
def test_the_fits_sums_equal_x_transposed_x_whatever_the_blocks(monkeypatch):
    """X'X and X'y summed per (sample, code) and made in blocks equal the dense product: samples with many
    slices of one code, a sample larger than a block, a quantity not sampled everywhere."""
    import numpy as np

    import nsys_ingest.ctxsw as ctxsw

    rng = np.random.default_rng(5)
    n, size = 9, 4
    sample = np.concatenate([np.repeat(np.arange(n), 3), [4] * 20])  # sample 4: 23 entries, over a block of 5
    code = rng.integers(0, size, len(sample))
    fraction = rng.uniform(0.01, 0.2, len(sample))
    values = rng.uniform(0, 1, (n, 2))
    values[[2, 7], 1] = np.nan
    x = np.zeros((n, size))
    np.add.at(x, (sample, code), fraction)
    for block in (5, 1 << 18):
        monkeypatch.setattr(ctxsw, "PAIR_BLOCK", block)
        gpu = object.__new__(ctxsw._Gpu)
        gpu.quantities = ("sm_active", "gr_active")
        gpu.gram, gpu.moment = np.zeros((2, size, size)), np.zeros((2, size))
        gpu._fit(sample, code, fraction, values)
        for q in range(2):
            rows = ~np.isnan(values[:, q])
            assert gpu.gram[q] == pytest.approx(x[rows].T @ x[rows], abs=1e-12)
            assert gpu.moment[q] == pytest.approx(x[rows].T @ values[rows, q], abs=1e-12)


PEAK_RSS = """
import json, re, sys
from nsys_ingest.ctxsw import attribute
from nsys_ingest.reader import Export
with Export(sys.argv[1], require_metrics=False) as export:
    result = attribute(export).to_json()
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) / 1024
print(json.dumps({"result": result, "peak_rss_mb": peak}))
"""


def test_thousands_of_slices_in_one_sample_cost_no_more_than_a_few(tmp_path):
    """5,000 1-ns slices in one 1 ms sample: 1.8 GB when the fit joined the sample's pairs (bench/RESULTS.md);
    now what an export of three slices costs, with a generous margin."""
    path = synth.switches_in_one_sample(tmp_path / "one.sqlite", slices=5000, slice_ns=1, samples_ms=1)
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, path], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    g0 = answer["result"]["gpus"][0]
    assert g0["slices"] == 5001 and g0["fit_unconverged"] == []
    assert {p["pid"]: p["resident_s"] for p in g0["processes"]} == {100: 1e-4, 300: 2.5e-6, 301: 2.5e-6}
    assert answer["peak_rss_mb"] < 400, answer["peak_rss_mb"]


@pytest.mark.parametrize("kinds", [MAX_OTHER_TAGS, MAX_OTHER_TAGS + 1, 5000])
def test_other_tags_are_counted_by_name_up_to_the_cap_and_together_beyond(tmp_path, kinds):
    """Each event with its own unknown tag made the tally (and --json) grow with the events: 10 M rows, 2.2 GB."""
    path = synth.unknown_tags(tmp_path / "tags.sqlite", rows=kinds)
    other = run(path, chunk_rows=7)["gpus"][0]["other_events"]
    named = {f"unknown tag {1000 + k}": 1 for k in range(min(kinds, MAX_OTHER_TAGS))}  # the first kinds read
    assert other == (named if kinds <= MAX_OTHER_TAGS else {**named, OTHER_TAGS: kinds - MAX_OTHER_TAGS})


def test_tags_counted_by_name_keep_counting_after_the_cap_is_full(tmp_path):
    """20 kinds in turn, three rounds, 7 events a chunk: the first 16 kinds keep their own counts in every
    round, the 4 after them go together."""
    path = synth.unknown_tags(tmp_path / "tags.sqlite", rows=60, kinds=20)
    other = run(path, chunk_rows=7)["gpus"][0]["other_events"]
    assert other == {**{f"unknown tag {1000 + k}": 3 for k in range(MAX_OTHER_TAGS)}, OTHER_TAGS: 3 * 4}


def test_the_solver_stops_at_its_cap_of_updates_and_says_so(tmp_path, monkeypatch, capsys):
    import nsys_ingest.ctxsw as ctxsw

    assert [g["fit_unconverged"] for g in run(build(tmp_path))["gpus"]] == [[], []]  # converged
    ill = run(synth.ill_conditioned(tmp_path / "ill.sqlite", pairs=2, samples=16))  # 5 codes: 20,000 sweeps, unconverged
    assert ill["gpus"][0]["fit_unconverged"] == ill["quantities"]
    monkeypatch.setattr(ctxsw, "MAX_FIT_UPDATES", 3)  # one sweep: none converges in one
    result = run(build(tmp_path, name="again.sqlite"))
    # the quantities sampled (GPU 0: SM, tensor, GR; GPU 1: SM and GR)
    assert [g["fit_unconverged"] for g in result["gpus"]] == [["sm_active", "tensor_active", "gr_active"],
                                                              ["sm_active", "gr_active"]]
    ctxsw.print_workloads(ctxsw.Attribution.from_json(result))
    assert "the fit stopped at its cap of 3 updates before converging (sm_active, " in capsys.readouterr().out


def test_a_budget_spent_while_the_fit_solves_stops_it(tmp_path, monkeypatch):
    """Cancelled once the tables are read: only the solver's own check can stop it (attack 3: 138 s of CPU)."""
    import nsys_ingest.ctxsw as ctxsw

    solve = ctxsw._Gpu.densities

    def cancelled_first(gpu):
        gpu.stream.export.budget.cancel.set()
        return solve(gpu)

    solver, raised = ctxsw.bounded_least_squares, []

    def watched(*args, **kwargs):
        try:
            return solver(*args, **kwargs)
        except IngestError as exc:
            raised.append(str(exc))
            raise

    monkeypatch.setattr(ctxsw._Gpu, "densities", cancelled_first)
    monkeypatch.setattr(ctxsw, "bounded_least_squares", watched)
    with Export(synth.ill_conditioned(tmp_path / "ill.sqlite", pairs=2, samples=16), require_metrics=False) as export:
        with pytest.raises(IngestError, match="reading was cancelled"):
            attribute(export)
    assert raised and raised[0].startswith("reading was cancelled")  # the solver's own check fired


def test_the_solver_counts_sweeps_and_checks_the_budget_after_each():
    import numpy as np

    from nsys_ingest.ctxsw import bounded_least_squares

    gram = np.array([[1.0, 0.999999], [0.999999, 1.0]])  # nearly equal columns: it creeps
    moment = gram @ np.array([0.6, 0.4])  # inside the bounds: no bound stops the creep
    solved = bounded_least_squares(gram, moment, updates=200)
    assert (solved.sweeps, solved.converged) == (100, False)
    easy = bounded_least_squares(np.eye(2), np.array([0.25, 0.5]))
    assert (easy.sweeps, easy.converged, list(easy.densities)) == (2, True, [0.25, 0.5])
    with pytest.raises(IngestError, match="longer than its budget"):
        bounded_least_squares(gram, moment, budget=Budget(0))


P, Q = 100, 200  # two processes


# -- nsys_ingest/ctxsw.py ------------------------------------------------------------------------------
def test_at_gives_a_sample_stamped_at_a_slices_end_to_what_follows_and_one_at_its_start_to_the_slice(tmp_path):
    """Mutants: `ends[j] > lo` -> `>=` (the sample stamped 2 ms, P's end, goes to P: P 0.5667, no gap value);
    searchsorted side "right" -> "left" (the sample stamped 3 ms, Q's start, goes to the gap)."""
    path = synth.ctxsw_export(tmp_path / "at.sqlite", slices=[(0, 0.0, 2.0, P, 1), (0, 3.0, 5.0, Q, 2)],
                              samples=[(0, ms, {"sm_active": v}) for ms, v in enumerate((0.8, 0.8, 0.1, 0.4, 0.4))])
    result = run(path, estimator="at")
    p, q = procs(result)[P], procs(result)[Q]
    assert p["while_resident"]["sm_active"] == pytest.approx(0.8, abs=1e-6)
    assert q["while_resident"]["sm_active"] == pytest.approx(0.4, abs=1e-6)
    assert result["gpus"][0]["gap_means"]["sm_active"] == pytest.approx(0.1, abs=1e-6)


def test_a_restore_start_without_a_pid_takes_its_save_ends_pid(tmp_path):
    """Mutant: the slice's owner from its RESTORE_START only (the slice's time goes to pid None)."""
    path = synth.ctxsw_export(tmp_path / "nopid.sqlite", slices=[(0, 4.0, 5.0, Q, 2)],
                              events=[(0, 0.0, "RESTORE_START", 1, None), (0, 2.0, "SAVE_END", 1, P)], samples=[])
    processes = procs(run(path))
    assert set(processes) == {P, Q}
    assert (processes[P]["time_share"], processes[P]["slices"]) == (0.4, 1)  # 2 ms of the 0-5 ms window


def test_the_default_window_ends_one_sampling_period_after_the_last_sample(tmp_path):
    """Mutant: the window ends at the last sample's stamp (9 ms, not 10): P's share reads 4/9, not 0.4,
    and the last sample's interval is cut off."""
    path = synth.ctxsw_export(tmp_path / "window.sqlite", slices=[(0, 1.0, 5.0, P, 1)],
                              samples=[(0, ms, {"sm_active": 0.5}) for ms in range(1, 10)])
    result = run(path, estimator="overlap")
    assert result["window_s"] == [0.001, 0.01]  # from P's RESTORE_START to the last sample (9 ms) + 1 ms
    assert procs(result)[P]["time_share"] == pytest.approx(4 / 9, abs=1e-6)
    assert result["gpus"][0]["switch_gap_share"] == pytest.approx(5 / 9, abs=1e-6)
    assert result["gpus"][0]["samples"] == 9


def test_a_process_with_two_contexts_is_one_process_with_both_slices(tmp_path):
    """Mutant: _merge keeps the first part's time share (P reads 0.2, not 0.4). P's second context carries
    another globalPid of the same pid (nsys' upper bits differ), so the two are summed per pid."""
    import sqlite3

    path = synth.ctxsw_export(tmp_path / "contexts.sqlite",
                              slices=[(0, 0.0, 2.0, P, 1), (0, 3.0, 5.0, P, 2), (0, 6.0, 8.0, Q, 3)],
                              samples=[(0, ms, {"sm_active": v}) for ms, v in
                                       enumerate((0.8, 0.8, 0.0, 0.4, 0.4, 0.0, 0.2, 0.2, 0.0, 0.0))])
    con = sqlite3.connect(path)
    con.execute("update GPU_CONTEXT_SWITCH_EVENTS set globalPid = globalPid + ? where contextId = 2", (1 << 49,))
    con.commit()
    con.close()
    result = run(path, estimator="overlap")
    p, q = procs(result)[P], procs(result)[Q]
    assert (p["slices"], p["resident_s"], p["time_share"]) == (2, 0.004, 0.4)
    assert p["while_resident"]["sm_active"] == pytest.approx(0.6, abs=1e-6)  # 2 ms at 0.8, 2 ms at 0.4
    assert p["of_gpu"]["sm_active"] == pytest.approx(0.24, abs=1e-6)
    assert (q["slices"], q["time_share"], q["while_resident"]["sm_active"]) == (1, 0.2, pytest.approx(0.2, abs=1e-6))


# -- the attribution's cost (issue 47): the same answers without pandas, in bounded chunks ------------------
ATTRIBUTIONS = FIXTURES / "ctxsw_attributions.json"  # recorded with pandas' reader (main at 2796fc1), before issue 47


@pytest.mark.parametrize("key", sorted(json.loads(ATTRIBUTIONS.read_text())))
def test_the_recorded_captures_attribute_exactly_as_before(key):
    """Every figure of each recorded H200 capture, per estimator (and 2 samples combined), equal to the last digit
    to what the pandas reader gave: reading the samples grouped by SQLite changed no answer."""
    name, estimator, combine = key.split()
    result = run(FIXTURES / name, estimator=estimator, combine=int(combine))
    assert {**result, "file": name} == json.loads(ATTRIBUTIONS.read_text())[key]


def test_the_attribution_loads_no_pandas_nor_numpy_ma():
    """The child's start-up and peak (bench/attribution_memory.py): pandas alone cost ~0.25 s of CPU and ~42 MB,
    numpy.ma (which np.unique and np.isin load) 16-25 ms."""
    code = ("import sys; from exporter.samplers.ctxsw import attribute_export; "
            f"result = attribute_export({str(H200_1KHZ)!r}, 'fit'); "
            "print(len(result.gpus), 'pandas' in sys.modules, 'numpy.ma' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", "False", "False"], done.stderr


def test_samples_are_read_grouped_with_as_many_cells_in_flight_as_chunk_rows_of_rows(tmp_path):
    """Mutant: a fetch of chunk_rows samples (16 here: 8 per GPU), each 16 cells wide, instead of 4. Each sample is one
    row of sums and counts per quantity, its value the metric's percentage x 0.01."""
    from nsys_ingest.ctxsw import READ

    with Export(build(tmp_path), require_metrics=False) as export:
        chunks = list(export.sample_arrays(READ, None, None, chunk_rows=16))
    assert [(gpu, len(stamps)) for gpu, stamps, _, _ in chunks] == [(0, 2), (1, 2)] * 5  # 16 x 4 // (2 + 2 x 7)
    gpu, stamps, sums, counts = chunks[2]
    sm, dram = READ.index("sm_active"), READ.index("dram_read")
    assert (gpu, stamps.tolist(), sums[:, sm].tolist(), counts[:, sm].tolist()) == (0, [2_000_000, 3_000_000],
                                                                                   [44 * 0.01, 20 * 0.01], [1, 1])
    assert counts[:, dram].tolist() == [0, 0]  # not sampled: no dram_active for this export


def test_text_among_the_gpu_metrics_is_named(tmp_path):
    """Mutant: the grouped read sums it as 0 (SQLite's text to number) instead of refusing it."""
    path = edited(tmp_path, "update GPU_METRICS set value = 'lots' where rowid = 3")
    with pytest.raises(IngestError, match="GPU_METRICS.value holds 'lots' where a number belongs"):
        run(path)


def test_null_in_the_switch_table_is_named_and_a_pid_that_is_no_number_is_unknown(tmp_path):
    """Mutant: a NULL contextId named as None. A slice whose globalPid is text is kept, its process unknown."""
    untyped = ("alter table GPU_CONTEXT_SWITCH_EVENTS rename to E; create table GPU_CONTEXT_SWITCH_EVENTS (tag, vmId, "
               "seqNo, contextId, timestamp, globalPid, gpuId); insert into GPU_CONTEXT_SWITCH_EVENTS select * from E; "
               "drop table E;")
    with pytest.raises(IngestError, match="GPU_CONTEXT_SWITCH_EVENTS.contextId holds NULL where a number belongs"):
        run(edited(tmp_path, untyped + "update GPU_CONTEXT_SWITCH_EVENTS set contextId = NULL where rowid = 2"))
    result = run(edited(tmp_path, untyped + "update GPU_CONTEXT_SWITCH_EVENTS set globalPid = 'me' where contextId = 2"))
    assert procs(result)[None]["time_share"] == 0.42 and B not in procs(result)  # B's 4.2 ms of the 10 ms window


def test_dram_active_is_read_plus_write_at_most_1_and_either_alone(tmp_path):
    """Mutants: the sum not clipped (1.3), a GPU with only its read counted as not sampled."""
    samples = [(0, ms, {"dram_read": 0.7, "dram_write": 0.6}) for ms in range(10)]
    samples += [(1, ms, {"dram_read": 0.3}) for ms in range(10)]
    path = synth.ctxsw_export(tmp_path / "dram.sqlite", slices=[(0, 0.0, 10.0, A, 1), (1, 0.0, 10.0, B, 2)],
                              samples=samples,
                              metrics={**synth.CTXSW_METRICS, "dram_write": "DRAM Write Bandwidth [Throughput %]"})
    result = run(path, estimator="overlap")
    assert procs(result, 0)[A]["while_resident"]["dram_active"] == 1.0
    assert procs(result, 1)[B]["while_resident"]["dram_active"] == 0.3


def test_combined_samples_are_the_mean_of_what_was_sampled(tmp_path):
    """Mutant: a quantity sampled in one of the two combined samples halved (0.2), as if the other read 0."""
    samples = [(0, ms, {"sm_active": 0.5, **({"tensor_active": 0.4} if ms % 2 == 0 else {})}) for ms in range(10)]
    path = synth.ctxsw_export(tmp_path / "half.sqlite", slices=[(0, 0.0, 10.0, A, 1)], samples=samples)
    resident = procs(run(path, estimator="overlap", combine=2))[A]["while_resident"]
    assert (resident["sm_active"], resident["tensor_active"]) == (0.5, 0.4)


def test_a_catalogue_of_max_metrics_of_one_quantity_is_read_grouped(tmp_path):
    """Mutant: each (typeId, metricId) bound as its own SQL variable: SQLite refuses 3 x 4,091 x 2 of them (its limit
    here is 2 x MAX_METRICS + 16). The ids as large as make the statement longest (the chunks' reader overflowed)."""
    from nsys_ingest.reader import MAX_METRICS

    path = synth.ctxsw_export(tmp_path / "catalogue.sqlite", slices=[(0, 0.0, 5.0, A, 1), (0, 5.0, 10.0, B, 2)],
                              samples=[(0, ms, {"sm_active": 0.5}) for ms in range(10)])
    extra = MAX_METRICS - len(synth.CTXSW_METRICS)  # the catalogue full: every other metric an "SMs Active" of GPU 0
    type_ids = [2**62 + 256 * (i + 1) for i in range(extra)]  # low byte 0: GPU 0
    con = sqlite3.connect(path)
    con.executemany("insert into TARGET_INFO_GPU_METRICS values (?, ?, 'GPU metrics', ?, 'SMs Active [Throughput %]')",
                    [(t, t, 2**62 + i) for i, t in enumerate(type_ids)])
    con.executemany("insert into GPU_METRICS values (?, ?, ?, ?, ?)",
                    [(3_000_000, 3_000_000, t, 2**62 + i, 90) for i, t in enumerate(type_ids)])
    con.commit()
    con.close()
    at_3_ms = (0.5 + 0.9 * extra) / (extra + 1)  # the mean of the sample's rows of sm_active
    found = procs(run(path, estimator="overlap"))
    assert (found[A]["while_resident"]["sm_active"], found[B]["while_resident"]["sm_active"]) == \
        (round((4 * 0.5 + at_3_ms) / 5, 6), 0.5)
