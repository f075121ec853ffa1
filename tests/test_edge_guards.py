"""Edge rules no other test held (issue 39, "Rules no test guards"): each test here fails when its rule
is broken, with exact figures at the boundary. The mutant each one catches is named in its docstring;
bench/mutations.py applies them and runs these tests (bench/RESULTS.md, "Mutation review").

The context-switch attribution's "at" boundary, a RESTORE_START without a pid, the default window; the
live source's default max age and its staleness; the ctxsw SM basis; which holder kind keeps a pid; DRA
consumed capacity (clamp, order, both parts kept); the API reader forgetting devices; the cooling advice."""
from __future__ import annotations

import types

import pytest

from exporter import kubernetes_api
from exporter.holders import CAPACITY, EVEN_SPLIT, MIG, REPLICAS, WHOLE, Held, Holder, Holdings, join_gpu, \
    join_owners
from exporter.kubernetes_api import FORGET_AFTER_S, SLICES_EVERY_S, Endpoint, KubernetesApi
from exporter.sampler import SourceState
from exporter.samplers.ctxsw import ACTIVE, STANDBY, CtxswSampler
from exporter.snapshot import ComputeProcess, DeviceTelemetry, GpuIdentity
from exporter.samplers.dra import ApiView, attribute_claims, capacity_ratio, merge
from exporter.workloads import CTXSW, TIME_SHARE, gpu_shares
from nsys_ingest.verdicts import Evidence, judge
from tests import synthetic_exports as synth
from tests.kubelet_server import SLICED_UUID as UUID, claim_pod
from tests.kubernetes_api_server import FakeApiServer, device, resource_slice
from tests.test_ctxsw_live import FAKE_NSYS, NVML_UUID, Nvml, fake_nsys, reading, root_only  # noqa: F401 - fake_nsys: a fixture
from tests.test_ctxsw import procs, run
from tests.test_dra import A, B, node_gpus
from tests.test_workloads import NOTEBOOK, OWNERS, TIME_SLICED, TRAINER, view

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
    """Mutant: _merge keeps the first context's time share (P reads 0.2, not 0.4)."""
    path = synth.ctxsw_export(tmp_path / "contexts.sqlite",
                              slices=[(0, 0.0, 2.0, P, 1), (0, 3.0, 5.0, P, 2), (0, 6.0, 8.0, Q, 3)],
                              samples=[(0, ms, {"sm_active": v}) for ms, v in
                                       enumerate((0.8, 0.8, 0.0, 0.4, 0.4, 0.0, 0.2, 0.2, 0.0, 0.0))])
    result = run(path, estimator="overlap")
    p, q = procs(result)[P], procs(result)[Q]
    assert (p["slices"], p["resident_s"], p["time_share"]) == (2, 0.004, 0.4)
    assert p["while_resident"]["sm_active"] == pytest.approx(0.6, abs=1e-6)  # 2 ms at 0.8, 2 ms at 0.4
    assert p["of_gpu"]["sm_active"] == pytest.approx(0.24, abs=1e-6)
    assert (q["slices"], q["time_share"], q["while_resident"]["sm_active"]) == (1, 0.2, pytest.approx(0.2, abs=1e-6))


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


# -- exporter/holders.py -------------------------------------------------------------------------------
def test_where_two_kinds_claim_one_pid_the_first_kind_keeps_it_and_a_failed_kind_says_nothing():
    """Mutants: join_owners lets the later kind win (417 becomes a Unix user's, not the Slurm job's); the
    `not h.error` checks dropped (a failed sampler's holders and owners still count)."""
    job, user, ghost = Holder(hpc_job="4242"), Holder(user="alice"), Holder(user="ghost")
    slurm = Holdings(gpus={"GPU-aaaa": {job: Held(1.0)}}, owners={417: job})
    users = Holdings(gpus={"GPU-aaaa": {user: Held(1.0)}}, owners={417: user, 418: user})
    failed = Holdings(gpus={"GPU-aaaa": {ghost: Held(1.0)}}, owners={419: ghost}, error="stale")
    assert join_owners([slurm, users, failed]) == {417: job, 418: user}
    assert join_owners([users, slurm]) == {417: user, 418: user}
    assert join_gpu("GPU-aaaa", [slurm, users, failed]) == {job: Held(1.0), user: Held(1.0)}


# -- exporter/samplers/dra.py --------------------------------------------------------------------------
def test_consumed_capacity_over_the_devices_capacity_is_at_most_the_whole_device():
    """Mutant: the clamp in capacity_ratio dropped: an allocation said to consume twice the MIG device's
    capacity holds 2 x 16/132 of the GPU, more than the device."""
    answer = [claim_pod("nb", n, {"c": [(f"{n}-gpu", [("gpu-1-mig-19-6-1", s)])]}) for n, s in (("x", "s1"), ("y", "s2"))]
    pool_device = ("node-a", "gpu-1-mig-19-6-1")
    api = ApiView(capacity={pool_device: {"shares": 2.0}},
                  consumed={("nb", "x-gpu", *pool_device, "s1"): {"shares": 4.0},
                            ("nb", "y-gpu", *pool_device, "s2"): {"shares": 1.0}})
    held = attribute_claims(answer, node_gpus(api)).held[B]
    assert held[("nb", "x", "c")][:2] == (round(16 / 132, 9), CAPACITY)
    assert held[("nb", "y", "c")][:2] == (round(16 / 132 / 2, 9), CAPACITY)
    assert capacity_ratio({"shares": 2.0}, {"shares": 2.0}) == 1.0


def test_shares_decide_before_memory_where_a_device_offers_both():
    """Mutant: memory tried before shares (1 of 4 shares reads as 60 of 80 GiB)."""
    assert capacity_ratio({"shares": 4.0, "memory": 80.0}, {"shares": 1.0, "memory": 60.0}) == 0.25
    assert capacity_ratio({"shares": 4.0, "memory": 80.0}, {"memory": 60.0}) == 0.75  # no shares consumed
    assert capacity_ratio({"memory": 80.0}, {"shares": 1.0}) is None
    assert capacity_ratio({}, {"shares": 1.0}) is None and capacity_ratio({"shares": 4.0}, {}) is None


def test_a_container_holding_one_gpu_both_ways_holds_the_sum_of_both_parts():
    """Mutant: merge keeps the claim's share only (the device-plugin quarter is lost: 0.5, not 0.75), or
    the device plugin's basis and MIG devices only."""
    answer = [claim_pod("ml", "q", {"c": [("q-gpu", [("gpu-0", "s1")])]}),
              claim_pod("ml", "r", {"c": [("r-gpu", [("gpu-0", "s2")])]})]
    device_plugin = {A: {Holder("ml", "q", "c"): Held(0.25, REPLICAS)}}
    merged = merge(device_plugin, attribute_claims(answer, node_gpus()))
    assert merged[A] == {Holder("ml", "q", "c", claim="q-gpu"): Held(0.75, EVEN_SPLIT),
                         Holder("ml", "r", "c", claim="r-gpu"): Held(0.5, EVEN_SPLIT)}
    # the MIG devices held whole of both parts are kept, and the weaker basis is said
    answer = [claim_pod("ml", "p", {"c": [("big", [("gpu-1-mig-9-0-4", None)])]})]
    device_plugin = {B: {Holder("ml", "p", "c"): Held(16 / 132, MIG, ("MIG-small",))}}
    merged = merge(device_plugin, attribute_claims(answer, node_gpus()))
    assert merged[B] == {Holder("ml", "p", "c", claim="big"): Held(round(76 / 132, 9), MIG, ("MIG-big", "MIG-small"))}
    # an unknown part makes the whole unknown
    whole = [claim_pod("ml", "q", {"c": [("q-gpu", [("gpu-0", None)])]})]
    merged = merge({A: {Holder("ml", "q", "c"): Held(None, WHOLE)}}, attribute_claims(whole, node_gpus()))
    assert merged[A] == {Holder("ml", "q", "c", claim="q-gpu"): Held(None, WHOLE)}


# -- exporter/kubernetes_api.py ------------------------------------------------------------------------
class Clock:
    """The reader's monotonic clock, moved by the test (its module's `time`); sleep is real."""

    def __init__(self, now: float):
        import time

        self.now, self.sleep, self.time = now, time.sleep, time.time

    def monotonic(self) -> float:
        return self.now


def test_device_uuids_and_capacities_are_forgotten_after_the_api_server_stopped_answering(monkeypatch):
    """Mutants: the FORGET_AFTER_S drop removed (a device the API server no longer confirms keeps its
    uuid and capacity forever); `>` -> `>=` (forgotten at exactly FORGET_AFTER_S)."""
    server = FakeApiServer().start()
    try:
        server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4")])]
        clock = Clock(10_000.0)
        monkeypatch.setattr(kubernetes_api, "time", clock)
        reader = KubernetesApi(Endpoint(server.url, None, None), node_name="node-a")
        devices = {("node-a", "gpu-0")}
        known = reader.view(devices, set())
        assert known.uuids == {("node-a", "gpu-0"): UUID} and known.capacity == {("node-a", "gpu-0"): {"shares": 4.0}}
        server.status = 500  # the API server stops answering
        for at in (SLICES_EVERY_S, FORGET_AFTER_S):
            clock.now = 10_000.0 + at
            assert reader.view(devices, set()) == known, at
        assert not reader.health.success
        clock.now = 10_000.0 + FORGET_AFTER_S + 0.001
        assert reader.view(devices, set()) == ApiView()
    finally:
        server.stop()


# -- nsys_ingest/verdicts.py ---------------------------------------------------------------------------
def test_a_hardware_slowdown_asks_for_both_cooling_and_power():
    """Mutants: hw_slowdown dropped from the cooling advice, or from the power advice."""
    found = judge(Evidence(0.99, 0.95, sm_clock_hertz=1000e6, sm_clock_max_hertz=1980e6,
                           clock_event_reasons=("hw_slowdown",)))
    assert found.verdict == "throttled"
    assert found.advice.startswith("cooling: ") and "; power: " in found.advice
