"""The live context-switch source (--workload-ctxsw): per-holder time share and SM activity with basis
ctxsw, end to end with a fake `nsys` that follows nsys' command-line contract and replays an export
(tests/fixtures/fake-nsys), the NVML answers recorded on the H100 (time-sliced, pids 417-420) and a
Slurm mapping directory with cgroup files; the join's rules on small exact cases."""
import json
import os
import time
from pathlib import Path

import pytest

from exporter.samplers.ctxsw import (ACTIVE, ALONE, DCGM, ERROR, MIG, MPS, NOT_ROOT, STANDBY, UNSUPPORTED,
                                     CtxswSampler)
from exporter.sampler import ProcessShare, ProcessWindow, SourceState
from exporter.snapshot import OK, ComputeProcess, DeviceTelemetry, GpuIdentity, SourceResult
from exporter.workloads import CTXSW, EXACT, NVML, TIME_SHARE, WorkloadAccountant, gpu_shares
from tests import synthetic_exports as synth
from tests.helpers import FIXTURES, Exporter, http_get, parse_metrics, wait_for
from tests.test_metric_contract import CONTRACT, undocumented
from tests.test_workloads import IDLE, NOTEBOOK, OWNERS, TIME_SLICED, TRAINER, view

FAKE_NSYS = FIXTURES / "fake-nsys"
NVML_UUID = "GPU-0cc7d789-89a7-98d7-87e6-31b003867920"  # nvml_h100_time_sliced.json
# 20 ms at 1 kHz on GPU 0: 417 [0,4] [10,14] at SM 0.5; 418 [4.5,6.5] at 1.0; 419 [7,10] [14,20] at 0.2;
# 420 never resident; gaps 4-4.5 and 6.5-7 at 0. Samples (4,5] and (6,7] straddle 418 and a gap: 0.5.
LIVE_SLICES = [(0, 0.0, 4.0, 417, 1), (0, 4.5, 6.5, 418, 2), (0, 7.0, 10.0, 419, 3), (0, 10.0, 14.0, 417, 1),
               (0, 14.0, 20.0, 419, 3)]
LIVE_SM = {**{ms: 0.5 for ms in (1, 2, 3, 4, 5, 7, 11, 12, 13, 14)}, 6: 1.0,
           **{ms: 0.2 for ms in (8, 9, 10, 15, 16, 17, 18, 19, 20)}}
LIVE_SM[7] = 0.5  # (6,7]: 0.5 ms of 418 at 1.0, 0.5 ms of gap
# by hand (the fit, exact here since every sample is its slices' densities mixed by time): 417 share 0.4, SM
# while resident 0.5; 418 share 0.1 at 1.0; 419 share 0.45 at 0.2. Job 4242 (417, 418): 0.5 of the time, SM
# 0.4*0.5 + 0.1*1.0 = 0.3 of the GPU; job 5151: 0.45, 0.09. (The overlap split would give 418 0.75.)


def live_export(path: Path) -> Path:
    synth.ctxsw_export(path, slices=LIVE_SLICES, samples=[(0, ms - 1, {"sm_active": v, "gr_active": 1.0})
                                                          for ms, v in sorted(LIVE_SM.items())],
                       processes={417: "python3", 418: "python3", 419: "python3", 420: "python3"})
    import sqlite3

    con = sqlite3.connect(path)  # the GPU as NVML knows it on the host that "recorded" it
    con.execute("update TARGET_INFO_GPU set uuid = ? where id = 0", (NVML_UUID.removeprefix("GPU-"),))
    con.commit()
    con.close()
    return path


def reading(shares, listed=(), end=1000.0):
    """A ctxsw window from pid -> (time share, SM active)."""
    return ProcessWindow(basis=CTXSW, window_start=end - 10.0, window_end=end, listed=frozenset(listed),
                         shares={pid: ProcessShare(time=t, sm=sm) for pid, (t, sm) in shares.items()})


# -- the join: exact figures ------------------------------------------------------------------------
def test_ctxsw_time_shares_and_sm_of_own_slices_replace_nvml_for_covered_holders():
    ctx = reading({417: (0.3, 0.15), 418: (0.1, 0.02), 419: (0.45, 0.09)}, listed=(417, 418, 419, 420))
    shares = gpu_shares(view(**TIME_SLICED), {TRAINER: 0.5, NOTEBOOK: 0.25, IDLE: 0.25}, OWNERS, None, ctx)
    trainer, notebook, idle = shares[TRAINER], shares[NOTEBOOK], shares[IDLE]
    assert (trainer.time_share, trainer.time_share_basis, trainer.window) == (0.4, CTXSW, (990.0, 1000.0))
    assert (trainer.sm_active, trainer.sm_active_basis) == (pytest.approx(0.17), CTXSW)
    assert (notebook.time_share, notebook.sm_active, notebook.sm_active_basis) == (0.45, 0.09, CTXSW)
    assert (idle.time_share, idle.sm_active, idle.sm_active_basis) == (0.0, 0.0, EXACT)  # runs nothing


def test_a_process_the_window_did_not_see_keeps_the_holder_on_nvml():
    # 418 started after the window: the trainer's ctxsw sum would miss it, so its NVML share stays
    ctx = reading({417: (0.3, 0.15), 419: (0.45, 0.09)}, listed=(417, 419, 420))
    shares = gpu_shares(view(**TIME_SLICED), {TRAINER: 0.5, NOTEBOOK: 0.25}, OWNERS, None, ctx)
    assert (shares[TRAINER].time_share, shares[TRAINER].time_share_basis) == (pytest.approx(0.396), NVML)
    assert shares[TRAINER].sm_active_basis == TIME_SHARE
    assert shares[NOTEBOOK].time_share_basis == CTXSW
    # listed by NVML during the window but never resident: it held a context and got no slice
    ctx = reading({417: (0.3, 0.15), 419: (0.45, 0.09)}, listed=(417, 418, 419, 420))
    assert gpu_shares(view(**TIME_SLICED), {TRAINER: 0.5}, OWNERS, None, ctx)[TRAINER].time_share == 0.3
    # a pid that left (418 is no longer on the GPU): its slices are no longer the trainer's
    gone = dict(processes={417: 0.3, 419: 0.4}, compute={417: "time_sliced", 419: "time_sliced"})
    ctx = reading({417: (0.3, 0.15), 418: (0.1, 0.02), 419: (0.45, 0.09)}, listed=(417, 418, 419))
    entry = gpu_shares(view(**gone), {TRAINER: 0.5, NOTEBOOK: 0.25}, OWNERS, None, ctx)[TRAINER]
    assert (entry.time_share, entry.sm_active, entry.pids) == (0.3, 0.15, (417,))


def test_the_holder_alone_on_the_gpu_keeps_the_exact_sm():
    alone = dict(processes={417: 0.5, 418: 0.3}, compute={417: "time_sliced", 418: "time_sliced"})
    ctx = reading({417: (0.6, 0.2), 418: (0.3, 0.1)}, listed=(417, 418))
    entry = gpu_shares(view(**alone), {TRAINER: 1.0}, OWNERS, None, ctx)[TRAINER]
    assert (entry.time_share, entry.time_share_basis, entry.sm_active, entry.sm_active_basis) == (0.9, CTXSW, 0.05, EXACT)


class Sampler:
    """What the accountant reads of the ctxsw sampler."""
    name, interval, health, basis = "ctxsw", 60.0, None, CTXSW

    def __init__(self, readings, max_age=130.0):
        self.readings, self.max_age = readings, max_age

    fresh = CtxswSampler.fresh
    state = CtxswSampler.state
    not_yet, stalled = CtxswSampler.not_yet, CtxswSampler.stalled
    states = {}


def test_busy_counters_integrate_the_best_basis_and_keep_it_and_old_windows_disappear():
    from exporter.holders import REPLICAS, Held, Holder, Holdings

    trainer = Holder("team-a", "train-0", "trainer")
    holdings = [Holdings(gpus={"GPU-aaaa": {trainer: Held(0.5, REPLICAS)}}, owners={417: trainer, 418: trainer})]
    sampler = Sampler({})
    acc = WorkloadAccountant(sources=[sampler])
    busy = view(**TIME_SLICED)
    acc.update(100.0, (busy,), holdings)  # no window yet: nvml, 0.396
    acc.update(110.0, (busy,), holdings)
    sampler.readings["GPU-aaaa"] = reading({417: (0.3, 0.15), 418: (0.1, 0.02)}, listed=(417, 418, 419, 420), end=109.0)
    first = acc.update(120.0, (busy,), holdings)[0]  # from here on ctxsw, 0.4
    assert (first.time_share, first.time_share_basis, first.ctxsw_window) == (0.4, CTXSW, (99.0, 109.0))
    last = acc.update(125.0, (busy,), holdings)[0]
    assert last.counters["busy_basis"] == {NVML: pytest.approx(0.396 * 20), CTXSW: pytest.approx(0.4 * 5)}
    assert last.counters["busy"] == pytest.approx(0.396 * 20 + 0.4 * 5)
    assert last.counters["sm_active"][CTXSW] == pytest.approx(0.17 * 5)
    # the window is older than max_age: back to NVML, the ctxsw value is gone
    gone = acc.update(109.0 + 130.5, (busy,), holdings)[0]
    assert (gone.time_share, gone.time_share_basis, gone.ctxsw_window) == (pytest.approx(0.396), NVML, None)
    assert acc.ctxsw_states[0][1].state == STANDBY


# -- the sampler: where it cannot run, it says why ------------------------------------------------------
class Nvml:
    def __init__(self, kinds=("time_sliced", "time_sliced"), mig=False):
        self.gpus = [GpuIdentity(0, NVML_UUID, "NVIDIA H100 80GB HBM3")]
        processes = tuple(ComputeProcess(417 + i, "python3", kind) for i, kind in enumerate(kinds))
        self.telemetry = {NVML_UUID: DeviceTelemetry(self.gpus[0], 0.0, compute_processes=processes, mig_enabled=mig)}


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NSYS_EXPORT", str(live_export(tmp_path / "recorded.sqlite")))
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    return tmp_path


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="nsys traces context switches only as root")


@root_only
def test_one_window_from_the_fake_nsys_and_nothing_left_behind(fake_nsys, monkeypatch):
    import nsys_ingest.ctxsw

    # the attribution runs in a child process, whose memory goes back when it ends: not in this one
    monkeypatch.setattr(nsys_ingest.ctxsw, "attribute", lambda *a, **k: pytest.fail("attributed in the exporter"))
    sampler = CtxswSampler(Nvml(), str(FAKE_NSYS), window_s=0.2, period_s=5.0)
    sampler.tick()
    assert sampler.attribution["cpu_s"] > 0 and sampler.attribution["peak_rss_bytes"] > 0
    assert 0 < sampler.attribution["startup_cpu_s"] <= sampler.attribution["cpu_s"]  # its start-up, apart
    assert "attributed in a child process" in sampler.states[NVML_UUID].reason
    state = sampler.states[NVML_UUID]
    assert state.state == ACTIVE and sampler.health.success, (state, sampler.health)
    got = sampler.readings[NVML_UUID]
    assert got.shares == {417: ProcessShare(time=0.4, sm=0.2), 418: ProcessShare(time=0.1, sm=0.1),
                          419: ProcessShare(time=0.45, sm=0.09)}
    assert (got.basis, got.switch_overhead) == (CTXSW, pytest.approx(0.05))  # gaps 4-4.5 and 6.5-7 ms of 20
    assert got.listed == {417, 418} and got.window_end - got.window_start == pytest.approx(0.02)
    calls = (fake_nsys / "calls.log").read_text().splitlines()
    assert calls[0].startswith("profile --gpuctxsw=true --trace=none --gpu-metrics-devices=0 --gpu-metrics-frequency=500")
    assert calls[0].endswith("sleep 0.2") and calls[1].startswith("export --type sqlite -o ")
    assert not list(fake_nsys.glob("gpu-exporter-ctxsw-*"))  # the report and the export are removed


def ill_conditioned_capture(path: Path) -> Path:
    """tests/synthetic_exports.ill_conditioned (4 processes whose fit creeps) on the recorded NVML's GPU."""
    import sqlite3

    synth.ill_conditioned(path, pairs=2, samples=16)
    con = sqlite3.connect(path)
    con.execute("update TARGET_INFO_GPU set uuid = ? where id = 0", (NVML_UUID.removeprefix("GPU-"),))
    con.commit()
    con.close()
    return path


@root_only
def test_a_fit_stopped_at_its_cap_says_so_and_a_spent_budget_withdraws_the_window(fake_nsys, monkeypatch):
    """Issue 39, attack 3: the solver stops at its cap and the state says which quantities; a read past its
    budget is the source's error (success 0) and the GPU's last window is withdrawn, not kept."""
    import exporter.samplers.ctxsw as ctxsw

    monkeypatch.setenv("FAKE_NSYS_EXPORT", str(ill_conditioned_capture(fake_nsys / "ill.sqlite")))
    sampler = CtxswSampler(Nvml(), str(FAKE_NSYS), window_s=0.1, period_s=5.0)
    sampler.tick()
    state = sampler.states[NVML_UUID]
    assert state.state == ACTIVE and (
        "estimator fit (stopped at its cap before converging: sm_active, sm_occupancy, tensor_active, dram_active, "
        "gr_active, dram_read); attributed in a child process:") in state.reason, state.reason
    assert set(sampler.readings[NVML_UUID].shares) == {1000, 1001, 1002, 1003}
    monkeypatch.setattr(ctxsw, "READ_BUDGET_S", 0.0)
    sampler.tick()
    state = sampler.states[NVML_UUID]
    assert (state.state, sampler.health.success) == (ERROR, False)
    assert "took longer than its budget of 0 s" in state.reason and NVML_UUID not in sampler.readings


@root_only
def test_any_exception_from_reading_the_capture_is_the_sources_error(fake_nsys, monkeypatch, caplog):
    """Issue 39: not only IngestError: whatever reading a hostile export raises is one line, success 0, and
    the GPU's last window withdrawn at once (exporter/nsys_exports.read_export turns it into the export's error)."""
    sampler = CtxswSampler(Nvml(), str(FAKE_NSYS), window_s=0.1, period_s=5.0)
    sampler.tick()
    assert NVML_UUID in sampler.readings
    # the attribution runs in its child process: the child's own code, with attribute() raising there
    sampler.child = ("-c", "import sys, nsys_ingest.ctxsw as c; from exporter.samplers.ctxsw import main\n"
                           "def broken(*a, **k): raise ValueError('a hostile value')\n"
                           "c.attribute = broken; sys.exit(main(sys.argv[1:]))")
    sampler.tick()
    sampler.tick()
    state = sampler.states[NVML_UUID]
    assert (state.state, sampler.health.success) == (ERROR, False) and NVML_UUID not in sampler.readings
    assert state.reason == "the capture's export is unreadable: unreadable export (ValueError: a hostile value)"
    assert sum("a hostile value" in r.getMessage() for r in caplog.records) == 1  # once, not per tick


@pytest.mark.parametrize("nvml, others, state, reason", [
    (Nvml(kinds=("mps", "mps")), {}, UNSUPPORTED, MPS),
    (Nvml(mig=True), {}, UNSUPPORTED, MIG),
    (Nvml(), {"dcgm": type("Dcgm", (), {"results": {NVML_UUID: SourceResult(OK, "")}})()}, UNSUPPORTED, DCGM),
])
@root_only
def test_gpus_it_must_not_capture(fake_nsys, nvml, others, state, reason):
    sampler = CtxswSampler(nvml, str(FAKE_NSYS), window_s=0.1, other_sources=others)
    sampler.tick()
    assert (sampler.states[NVML_UUID].state, sampler.states[NVML_UUID].reason) == (state, reason)
    assert not (fake_nsys / "calls.log").exists()  # nothing ran


class TwoGpus:
    """NVML on a node of two GPUs whose indices run the other way round from the export's device ids."""

    def __init__(self):
        self.gpus = [GpuIdentity(0, "GPU-00000001-0000-4000-8000-000000000000", "NVIDIA H200"),
                     GpuIdentity(1, "GPU-00000000-0000-4000-8000-000000000000", "NVIDIA H200")]
        listed = {0: (419, 420), 1: (417, 418)}
        self.telemetry = {g.uuid: DeviceTelemetry(g, 0.0, compute_processes=tuple(
            ComputeProcess(pid, "python3", "time_sliced") for pid in listed[g.index])) for g in self.gpus}


@root_only
def test_one_capture_covers_every_gpu_and_each_gpu_keeps_its_own_processes(fake_nsys, monkeypatch):
    """Two GPUs in one 20 ms export at 1 kHz. Export device 0 (NVML index 1): 417 [0,10) at SM 0.5, 418
    [10,20) at 1.0. Export device 1 (NVML index 0): 419 [0,5) at 0.2, 420 [5,20) at 0.8. By hand: 417
    0.5 of the time and 0.25 of the GPU's SMs, 418 0.5 and 0.5; 419 0.25 and 0.05, 420 0.75 and 0.6."""
    slices = [(0, 0.0, 10.0, 417, 1), (0, 10.0, 20.0, 418, 2), (1, 0.0, 5.0, 419, 3), (1, 5.0, 20.0, 420, 4)]
    density = {0: lambda ms: 0.5 if ms < 10 else 1.0, 1: lambda ms: 0.2 if ms < 5 else 0.8}
    samples = [(gpu, ms, {"sm_active": density[gpu](ms), "gr_active": 1.0}) for gpu in (0, 1) for ms in range(20)]
    export = synth.ctxsw_export(fake_nsys / "two.sqlite", slices=slices, samples=samples,
                                processes={pid: "python3" for pid in (417, 418, 419, 420)})
    monkeypatch.setenv("FAKE_NSYS_EXPORT", str(export))
    sampler = CtxswSampler(TwoGpus(), str(FAKE_NSYS), window_s=0.1)
    sampler.tick()
    calls = (fake_nsys / "calls.log").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["profile", "export"]  # one capture, one export for both GPUs
    assert "--gpu-metrics-devices=0,1" in calls[0].split()
    first, second = (sampler.readings[g.uuid] for g in TwoGpus().gpus)
    assert {pid: (t, pytest.approx(sm, abs=1e-6)) for pid, (t, sm) in ((p, (s.time, s.sm)) for p, s in first.shares.items())} == \
        {419: (0.25, 0.05), 420: (0.75, 0.6)}
    assert {pid: (t, pytest.approx(sm, abs=1e-6)) for pid, (t, sm) in ((p, (s.time, s.sm)) for p, s in second.shares.items())} == \
        {417: (0.5, 0.25), 418: (0.5, 0.5)}
    assert (first.listed, second.listed) == ({419, 420}, {417, 418})
    assert all(sampler.states[g.uuid].state == ACTIVE for g in TwoGpus().gpus)


def test_no_nsys_or_no_root_is_unsupported_with_one_line(tmp_path, caplog, monkeypatch):
    sampler = CtxswSampler(Nvml(), str(tmp_path / "no-such-nsys"), window_s=0.1)
    for _ in range(3):
        sampler.tick()
    state = sampler.states[NVML_UUID]
    assert state.state == UNSUPPORTED and "nsys not found" in state.reason and not sampler.health.success
    assert sum("nsys not found" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # a user: nsys would trace nothing system-wide
    sampler = CtxswSampler(Nvml(), str(FAKE_NSYS), window_s=0.1)
    for _ in range(3):
        sampler.tick()
    assert (sampler.states[NVML_UUID].state, sampler.states[NVML_UUID].reason) == (UNSUPPORTED, NOT_ROOT)
    assert sampler.readings == {} and [r.getMessage() for r in caplog.records] == [f"ctxsw: {NOT_ROOT}"]


@root_only
def test_a_failing_capture_is_an_error_and_drops_the_last_window(fake_nsys, monkeypatch):
    """Every step printing 1 MiB of progress first (more than the 64 KiB read back), and the heap given back
    after each window, good or failed (bench/RESULTS.md, "The exporter's memory after a context-switch window")."""
    import exporter.heap

    given_back = []
    monkeypatch.setattr(exporter.heap, "give_back", lambda: given_back.append(1))
    monkeypatch.setenv("FAKE_NSYS_OUTPUT_BYTES", str(1 << 20))
    sampler = CtxswSampler(Nvml(), str(FAKE_NSYS), window_s=0.1)
    sampler.tick()
    assert NVML_UUID in sampler.readings and len(given_back) == 1
    monkeypatch.setenv("FAKE_NSYS_FAIL", "export")
    sampler.tick()
    state = sampler.states[NVML_UUID]
    assert state.state == ERROR and state.reason == "nsys export failed (exit 1): Error: export failed (FAKE_NSYS_FAIL)"
    assert NVML_UUID not in sampler.readings and not list(fake_nsys.glob("gpu-exporter-ctxsw-*"))
    assert len(given_back) == 2


@root_only
def test_the_childs_answer_is_read_whole_beyond_what_an_nsys_step_keeps(fake_nsys):
    """An answer line longer than the 64 KiB kept of an nsys step (a window of many processes) is read whole."""
    sampler = CtxswSampler(Nvml(), str(FAKE_NSYS), window_s=0.1)
    sampler.child = ("-c", "import sys, dataclasses, exporter.samplers.ctxsw as c\nreal = c.attribute_export\n"
                           "c.attribute_export = lambda *a, **k: dataclasses.replace(real(*a, **k), file='x' * 100_000)\n"
                           "sys.exit(c.main(sys.argv[1:]))")
    sampler.tick()
    assert sampler.states[NVML_UUID].state == ACTIVE and NVML_UUID in sampler.readings, sampler.states[NVML_UUID]


def test_a_step_is_read_up_to_its_last_bytes_and_its_last_line_says_why_it_failed():
    """What a step prints (nsys' progress bars, a child's warnings) costs the exporter its last `keep` bytes:
    20 MB printed, 1,000 bytes kept, under 1 MiB allocated while reading (tracemalloc's peak)."""
    import sys
    import threading
    import tracemalloc

    from exporter.nsys_exports import CaptureError, NsysRunner

    runner = NsysRunner(threading.Event())
    chatty = "import sys; sys.stdout.write('progress 50%\\n' * 1_600_000); print('the last line'); sys.exit({})"
    tracemalloc.start()
    try:
        out = runner.run([sys.executable, "-c", chatty.format(0)], 120, "a step", keep=1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(out) == 1000 and out.endswith("progress 50%\nthe last line\n") and peak < 1 << 20, peak
    with pytest.raises(CaptureError, match=r"^a step failed \(exit 3\): the last line$"):
        runner.run([sys.executable, "-c", chatty.format(3)], 120, "a step", keep=1000)
    exactly = "import sys; sys.stdout.write('x' * {})"
    assert runner.run([sys.executable, "-c", exactly.format(1000)], 60, "a step", keep=1000) == "x" * 1000
    assert runner.run([sys.executable, "-c", exactly.format(1001)], 60, "a step", keep=1000) == "x" * 1000
    with pytest.raises(CaptureError, match=r"^a step failed \(exit 1\): no output$"):
        runner.run([sys.executable, "-c", "raise SystemExit(1)"], 60, "a step")


@root_only
def test_no_switches_is_standby_for_one_process_and_unsupported_for_several(fake_nsys, monkeypatch):
    empty = synth.ctxsw_export(fake_nsys / "none.sqlite", samples=[(0, 1, {"sm_active": 0.5})])
    monkeypatch.setenv("FAKE_NSYS_EXPORT", str(empty))
    sampler = CtxswSampler(Nvml(kinds=("time_sliced",)), str(FAKE_NSYS), window_s=0.1)
    sampler.tick()
    assert (sampler.states[NVML_UUID].state, sampler.states[NVML_UUID].reason) == (STANDBY, ALONE)
    sampler = CtxswSampler(Nvml(), str(FAKE_NSYS), window_s=0.1)
    sampler.tick()
    assert sampler.states[NVML_UUID].state == UNSUPPORTED and "no context switches recorded while 2" in \
        sampler.states[NVML_UUID].reason


# -- end to end: the exporter over HTTP -----------------------------------------------------------------
def slurm_node(tmp_path, recorded: Path, jobs: dict[int, str], renamed: dict[int, int] | None = None,
               uuid: str | None = None):
    """The exporter's flags and environment for a Slurm node: the time-sliced H100 NVML recording (frame 0,
    pids 417-420, renamed by `renamed`, the GPU's UUID set to `uuid`), cgroups under --proc-root putting
    each pid in its job of `jobs` (the others in a login session), a mapping file listing the jobs on
    GPU 0, and the fake nsys replaying `recorded`."""
    from exporter.nvml_replay import cut

    cut(FIXTURES / "nvml_h100_time_sliced.json", tmp_path / "nvml.json", frame=0)
    if renamed or uuid:
        data = json.loads((tmp_path / "nvml.json").read_text())
        for call in ("compute_processes/0", "process_utilization/0"):
            for frame in data["calls"][call]:
                listed = frame["value"]["compute"] if call.startswith("compute") else frame["value"]
                for process in listed:
                    process["pid"] = (renamed or {}).get(process["pid"], process["pid"])
        if uuid:
            data["calls"]["identity/0"][0]["value"]["uuid"] = uuid
        (tmp_path / "nvml.json").write_text(json.dumps(data))
    proc = tmp_path / "proc"
    for pid in [(renamed or {}).get(p, p) for p in (417, 418, 419, 420)]:
        (proc / str(pid)).mkdir(parents=True)
        job = jobs.get(pid)
        (proc / str(pid) / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"
                                                if job else "0::/user.slice/session-1.scope\n")
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "0").write_text("".join(f"{job}\n" for job in sorted(set(jobs.values()))))
    work = tmp_path / "tmp"
    work.mkdir()
    args = ["--nvml-replay", str(tmp_path / "nvml.json"), "--no-mps", "--interval", "0.2", "--kubelet-socket", "none",
            "--proc-root", str(proc), "--hpc-job-mapping-dir", str(mapping), "--workload-ctxsw", "--ctxsw-window", "1s",
            "--ctxsw-period", "2s", "--nsys-binary", str(FAKE_NSYS)]
    return args, {"FAKE_NSYS_EXPORT": str(recorded), "TMPDIR": str(work)}, work


def workloads_answer(exporter):
    status, body = http_get(exporter.url + "/api/v1/workloads")
    return json.loads(body) if status == 200 else None


def ctxsw_everywhere(exporter, seconds=60):
    """/api/v1/workloads once every holder's time share comes from a context-switch window."""
    return wait_for(lambda: (a := workloads_answer(exporter)) and a["ctxsw"] and a["ctxsw"][0]["state"] == "active"
                    and all(w["time_share_basis"] == "ctxsw" for w in a["workloads"]) and a, seconds, 0.2, "ctxsw windows")


def test_slurm_jobs_get_ctxsw_time_shares_and_sm_from_the_replayed_capture(tmp_path):
    args, env, work = slurm_node(tmp_path, live_export(tmp_path / "recorded.sqlite"), {417: "4242", 418: "4242", 419: "5151"})
    with Exporter(*args, env=env) as exporter:
        if os.geteuid() != 0:  # not root: it says so, and the NVML basis stays
            found = wait_for(lambda: (a := workloads_answer(exporter)) and a["ctxsw"] and a["ctxsw"][0]["state"] == "unsupported" and a,
                             30, 0.2, "ctxsw unsupported")
            assert found["ctxsw"][0]["reason"] == NOT_ROOT
            assert {w["time_share_basis"] for w in found["workloads"]} == {"nvml"}
            return
        found = ctxsw_everywhere(exporter)
        jobs = {w["hpc_job"]: w for w in found["workloads"]}
        assert (jobs["4242"]["time_share"], jobs["4242"]["sm_active"], jobs["4242"]["sm_active_basis"]) == (0.5, 0.3, "ctxsw")
        assert (jobs["5151"]["time_share"], jobs["5151"]["sm_active"], jobs["5151"]["sm_active_basis"]) == (0.45, 0.09, "ctxsw")
        window = jobs["4242"]["ctxsw_window"]
        assert window[1] - window[0] == pytest.approx(0.02) and abs(window[1] - time.time()) < 60
        state = found["ctxsw"][0]
        assert (state["gpu"], state["uuid"]) == (0, NVML_UUID) and "5 slices of 3 processes" in state["reason"]

        samples = parse_metrics(exporter.metrics())
        share = {(l["hpc_job"], l["basis"]): v for l, v in samples["gpu_workload_time_share_ratio"]}
        assert share == {("4242", "ctxsw"): 0.5, ("5151", "ctxsw"): 0.45}
        assert {(l["hpc_job"], l["basis"]): v for l, v in samples["gpu_workload_sm_active_ratio"]} == \
            {("4242", "ctxsw"): 0.3, ("5151", "ctxsw"): 0.09}
        assert {l["basis"] for l, _ in samples["gpu_workload_busy_gpu_seconds_total"]} <= {"ctxsw", "nvml"}
        states = {l["state"]: v for l, v in samples["gpu_workload_ctxsw_state"]}
        assert states == {"active": 1.0, "standby": 0.0, "unsupported": 0.0, "error": 0.0, "disabled": 0.0}
        assert samples["gpu_workload_ctxsw_sample_timestamp_seconds"][0][1] == pytest.approx(window[1], abs=1e-3)
        assert {l["collector"]: v for l, v in samples["gpu_exporter_collector_success"]}["ctxsw"] == 1.0
        assert not undocumented(exporter.metrics(), CONTRACT.read_text())  # every family in docs/metrics.md
        assert "Traceback" not in exporter.log()
    assert not list(work.glob("gpu-exporter-ctxsw-*"))  # stopped mid-capture: its files go too


def test_flags_offer_every_estimator_and_refuse_a_window_longer_than_the_period(capsys):
    from exporter.config import parse_args
    from nsys_ingest.ctxsw import ESTIMATORS

    for estimator in ESTIMATORS:
        assert parse_args(["--ctxsw-estimator", estimator]).ctxsw_estimator == estimator
    args = parse_args(["--workload-ctxsw"])
    assert (args.ctxsw_window, args.ctxsw_period, args.ctxsw_frequency, args.ctxsw_estimator) == (10.0, 180.0, 500, "fit")
    with pytest.raises(SystemExit):
        parse_args(["--workload-ctxsw", "--ctxsw-window", "1m", "--ctxsw-period", "1m"])
    assert "--ctxsw-window 60s must be at least 1 s and shorter than --ctxsw-period 60s" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--workload-ctxsw", "--nsys-live"])
    assert "choose one" in capsys.readouterr().err


@root_only
def test_the_h200_capture_replayed_gives_each_job_its_processes_shares(tmp_path):
    """The real capture (five jobs time-sliced on an H200): pids 514 (matmul) and 518 (launch loop) in job
    201, 516 (66-SM spin) in 202, 515 (8-SM spin) in 203; NVML's recording renamed to those pids."""
    from nsys_ingest.ctxsw import attribute
    from nsys_ingest.reader import Export

    recorded = FIXTURES / "h200_ctxsw_1khz.sqlite"
    with Export(recorded) as export:
        truth = {p["pid"]: p for p in attribute(export).to_json()["gpus"][0]["processes"]}
    renamed = {417: 514, 418: 518, 419: 516, 420: 515}
    args, env, _ = slurm_node(tmp_path, recorded, {514: "201", 518: "201", 516: "202", 515: "203"}, renamed,
                              uuid="GPU-915c814a-f1dc-3deb-0741-1665ee6a8727")
    with Exporter(*args, env=env) as exporter:
        jobs = {w["hpc_job"]: w for w in ctxsw_everywhere(exporter)["workloads"]}
    expected = {"201": (514, 518), "202": (516,), "203": (515,)}
    for job, pids in expected.items():
        assert jobs[job]["time_share"] == approx(sum(truth[p]["time_share"] for p in pids)), job
        assert jobs[job]["sm_active"] == approx(sum(truth[p]["of_gpu"]["sm_active"] for p in pids)), job
        assert jobs[job]["sm_active_basis"] == "ctxsw"
    # what the jobs were built to do, read back through the exporter: a full-GPU matmul, 66 and 8 of 132 SMs
    assert jobs["202"]["sm_active"] / jobs["202"]["time_share"] == approx(66 / 132, abs=0.015)
    assert jobs["203"]["sm_active"] / jobs["203"]["time_share"] == approx(8 / 132, abs=0.015)
    assert jobs["201"]["time_share"] == approx(0.46, abs=0.01) and jobs["201"]["sm_active"] > 0.35


def approx(value, abs=1e-6):  # the API rounds to 6 digits
    return pytest.approx(value, abs=abs)


@root_only
def test_the_first_capture_waits_for_nvmls_first_look_at_the_gpus(fake_nsys):
    """Every sampler ticks at once when the exporter starts: the first window is not a period late."""
    import threading

    nvml, ready = Nvml(), Nvml()
    nvml.gpus, nvml.telemetry = [], {}
    threading.Timer(0.5, lambda: (setattr(nvml, "telemetry", ready.telemetry), setattr(nvml, "gpus", ready.gpus))).start()
    sampler = CtxswSampler(nvml, str(FAKE_NSYS), window_s=0.1)
    sampler.tick()
    assert sampler.states[NVML_UUID].state == ACTIVE


def test_the_exporter_with_the_source_on_never_loads_the_attributions_libraries(tmp_path):
    """numpy and pandas (~50 MB resident) and the export's rows belong to the attribution's child: the exporter
    builds the source and its accountant without them."""
    import subprocess
    import sys

    code = ("import sys; from exporter.__main__ import build_engine; from exporter.config import parse_args; "
            "engine, _ = build_engine(parse_args(['--nvml-replay', sys.argv[1], '--no-mps', '--kubelet-socket', 'none', "
            "'--hpc-job-mapping-dir', sys.argv[2], '--workload-ctxsw'])); "
            "print([s.name for s in engine.workloads.sources.values()], sorted(m for m in ('numpy', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "nvml_h100_time_sliced.json"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert done.stdout.strip() == "['ctxsw'] []", done.stderr[-500:]


def test_the_attribution_child_answers_one_json_line_and_its_failures_are_one_line(tmp_path):
    from exporter.samplers.ctxsw import CaptureError, child_answer, main

    assert child_answer('a warning\n{"result": {"gpus": []}, "cpu_s": 0.4}\n') == {"result": {"gpus": []}, "cpu_s": 0.4}
    for garbage in ("", "Traceback (most recent call last):\n  boom", '{"neither": 1}', "[1, 2]", "{" * 10):
        with pytest.raises(CaptureError, match="the attribution answered no result"):
            child_answer(garbage)
    (tmp_path / "bad.sqlite").write_bytes(b"not a database")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([str(tmp_path / "bad.sqlite"), "--window", "0.2"]) == 0
    answer = child_answer(out.getvalue())
    assert "error" in answer and "\n" not in answer["error"] and answer["peak_rss_bytes"] > 0


def test_the_attribution_child_runs_numpy_with_one_blas_thread():
    """Mutant: the child's numpy with OpenBLAS' thread per core (one more thread here: 0.04 s of every start-up)."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    code = ("import os, runpy, sys\n"
            f"sys.argv = ['ctxsw', {str(FIXTURES / 'h200_ctxsw_1khz.sqlite')!r}]\n"
            "try:\n    runpy.run_module('exporter.samplers.ctxsw', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")})
    answer, threads = done.stdout.strip().splitlines()[-2:]
    assert '"result"' in answer and threads == "1 1", done.stdout[-300:] + done.stderr[-300:]


# -- exporter/samplers/ctxsw.py ------------------------------------------------------------------------
def test_the_live_sources_windows_last_two_periods_and_a_window_then_the_state_says_stalled():
    """Mutants: `max_age = 2 * period + window` -> `period + window` (a window 370 s old is dropped);
    `<=` -> `<` in fresh() (exactly 370 s is dropped); the staleness check in state() removed (a stalled
    source keeps saying "active")."""
    sampler = CtxswSampler(nvml=None, window_s=10.0, period_s=180.0)
    assert sampler.max_age == 370.0
    sampler.readings["GPU-aaaa"] = reading({417: (0.5, 0.2)}, listed=(417,))
    sampler.states["GPU-aaaa"] = SourceState(ACTIVE, "captured", 990.0, 1000.0)
    assert sampler.fresh("GPU-aaaa", 1370.0) is sampler.readings["GPU-aaaa"]
    assert sampler.state("GPU-aaaa", 1370.0).state == ACTIVE
    assert sampler.fresh("GPU-aaaa", 1370.001) is None
    stalled = sampler.state("GPU-aaaa", 1370.001)
    assert (stalled.state, stalled.window_end) == (STANDBY, 1000.0)
    assert "older than 370 s" in stalled.reason
    assert sampler.state("GPU-bbbb", 1000.0).state == STANDBY  # never captured


class ChangingNvml:
    """NVML listing 417 and 418 on the GPU until `nsys profile` ran (its call is logged), 417 and 419 after."""

    def __init__(self, calls):
        self.calls, self.gpus = calls, Nvml().gpus
        self.gpu = self.gpus[0]

    @property
    def telemetry(self):
        pids = (417, 419) if self.calls.exists() else (417, 418)
        processes = tuple(ComputeProcess(pid, "python3", "time_sliced") for pid in pids)
        return {NVML_UUID: DeviceTelemetry(self.gpu, 0.0, compute_processes=processes),
                OTHER_GPU.uuid: DeviceTelemetry(OTHER_GPU, 0.0, mig_enabled=True)}


OTHER_GPU = GpuIdentity(1, "GPU-other", "NVIDIA H100 80GB HBM3")


@root_only
def test_a_window_lists_the_pids_nvml_saw_at_its_start_or_its_end_and_a_gpu_that_left_is_forgotten(fake_nsys):
    """Mutants: the pids listed at the window's end only (418, there at its start, is missing); the states
    and windows of a GPU that left kept."""
    nvml = ChangingNvml(fake_nsys / "calls.log")
    sampler = CtxswSampler(nvml, str(FAKE_NSYS), window_s=0.1, period_s=5.0)
    sampler.tick()
    assert sampler.states[NVML_UUID].state == ACTIVE
    assert sampler.readings[NVML_UUID].listed == {417, 418, 419}
    nvml.gpus = [OTHER_GPU]  # the GPU left (unbound, fell off the bus); another one (MIG: not captured) is there
    sampler.tick()
    assert set(sampler.states) == {OTHER_GPU.uuid} and sampler.readings == {}


# -- exporter/workloads.py -----------------------------------------------------------------------------
def test_a_holder_with_a_resident_process_whose_sm_was_not_sampled_gets_no_ctxsw_sm():
    """Mutant: all() -> any() in the ctxsw SM basis: 418 was resident (0.1 of the time) without an SM
    value, so the trainer's SM of its own slices is unknown, not 417's 0.15 alone."""
    ctx = reading({417: (0.3, 0.15), 418: (0.1, None), 419: (0.45, 0.09)}, listed=(417, 418, 419, 420))
    trainer = gpu_shares(view(**TIME_SLICED), {TRAINER: 0.5, NOTEBOOK: 0.25}, OWNERS, None, ctx)[TRAINER]
    assert (trainer.time_share, trainer.time_share_basis) == (0.4, CTXSW)
    assert (trainer.sm_active, trainer.sm_active_basis) == (round(0.05 * 0.4 / 0.99, 6), TIME_SHARE)
    # without a spatial source for the GPU: no SM at all, not a partial one
    shares = gpu_shares(view(**TIME_SLICED, sm_active=None), {TRAINER: 0.5, NOTEBOOK: 0.25}, OWNERS, None, ctx)
    assert (shares[TRAINER].sm_active, shares[TRAINER].sm_active_basis) == (None, None)
    assert (shares[NOTEBOOK].sm_active, shares[NOTEBOOK].sm_active_basis) == (0.09, CTXSW)
    # a process that was never resident (time 0) needs no SM value
    ctx = reading({417: (0.3, 0.15), 418: (0.0, None)}, listed=(417, 418))
    trainer = gpu_shares(view(**TIME_SLICED, sm_active=None), {TRAINER: 0.5}, OWNERS, None, ctx)[TRAINER]
    assert (trainer.sm_active, trainer.sm_active_basis) == (0.15, CTXSW)


def test_a_holders_ctxsw_time_share_is_at_most_the_whole_gpu():
    """Mutant: the clamp of the summed ctxsw time shares dropped (417 and 418 said to be resident 0.7 and
    0.6 of one window: 1.3 of the GPU)."""
    ctx = reading({417: (0.7, 0.5), 418: (0.6, 0.6)}, listed=(417, 418))
    trainer = gpu_shares(view(**TIME_SLICED, sm_active=None), {TRAINER: 0.5}, OWNERS, None, ctx)[TRAINER]
    assert (trainer.time_share, trainer.time_share_basis) == (1.0, CTXSW)
    assert (trainer.sm_active, trainer.sm_active_basis) == (1.0, CTXSW)
