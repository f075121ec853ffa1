"""Edge rules no other test held (issue 39, "Rules no test guards"): each test here fails when its rule
is broken, with exact figures at the boundary. The mutant each one catches is named in its docstring;
bench/mutations.py applies them and runs these tests (bench/RESULTS.md, "Mutation review").

The context-switch attribution's "at" boundary, a RESTORE_START without a pid, the default window; the
live source's default max age and its staleness; the ctxsw SM basis; which holder kind keeps a pid; DRA
consumed capacity (clamp, order, both parts kept); the API reader forgetting devices; the cooling advice."""
from __future__ import annotations

import json

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
from tests.kubernetes_api_server import FakeApiServer, claim, device, resource_slice
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


def test_holder_kinds_are_built_in_their_order_users_only_without_a_scheduler_or_when_named(tmp_path):
    """Mutants: KINDS reordered (Slurm's owners would win over the kubelet's); users beside a scheduler under
    --holders auto; --holders none building some; `explicit` inverted (users of this host's /proc for a
    replay under auto, none when named)."""
    from exporter.config import parse_args
    from exporter.holders import build_holders
    from tests.helpers import FIXTURES

    (tmp_path / "map").mkdir()
    replay = ["--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), "--kubernetes-api", "off"]
    schedulers = ["--kubelet-socket", str(tmp_path / "kubelet.sock"), "--hpc-job-mapping-dir", str(tmp_path / "map")]

    def kinds(*flags):
        return [s.name for s in build_holders(parse_args([*replay, *flags]), Nvml())]

    assert kinds(*schedulers, "--proc-root", str(tmp_path), "--holders", "auto") == ["kubelet", "slurm"]
    assert kinds(*schedulers, "--proc-root", str(tmp_path), "--holders", "users,slurm") == ["slurm", "users"]
    assert kinds(*schedulers, "--holders", "none") == []
    assert kinds("--kubelet-socket", "none", "--holders", "auto") == []  # a replay against this host's /proc
    assert kinds("--kubelet-socket", "none", "--proc-root", str(tmp_path), "--holders", "auto") == ["users"]
    assert kinds("--kubelet-socket", "none", "--holders", "users") == ["users"]  # named: the user's call


def test_the_weakest_basis_of_several_is_said_from_whole_to_even_split():
    """Mutants: the bases' order (capacity after even split); the strongest said instead of the weakest."""
    from exporter.holders import weakest_basis

    assert weakest_basis([CAPACITY, EVEN_SPLIT]) == EVEN_SPLIT
    assert weakest_basis([WHOLE, MIG]) == MIG and weakest_basis([MIG, REPLICAS]) == REPLICAS
    assert weakest_basis([REPLICAS, CAPACITY]) == CAPACITY and weakest_basis([]) == WHOLE


# -- exporter/samplers/users.py ------------------------------------------------------------------------
def test_users_hold_by_their_real_uid_with_contexts_on_a_gpu_nvml_still_reads(tmp_path, monkeypatch):
    """Mutants: the effective uid instead of the real one; passwd comments and NIS lines read; the MPS server holding its GPU; a lost GPU
    keeping holders; a process without a uid holding as user "None"; no even split; names kept after the
    user database became unreadable; the interval floor of 1 s."""
    import exporter.samplers.users as users
    from exporter.config import parse_args
    from exporter.samplers.users import UsersSampler, context_pids, status_uid

    assert status_uid("Name:\tx\nUid:\t1000\t0\t0\t0\n") == 1000  # real 1000, effective root (setuid)
    # commented-out and NIS (+/-) entries with a uid of their own are no users
    assert users.parse_passwd("#old:x:7:7::/:/bin/sh\n+nis:x:8:8::/:\n-ex:x:9:9::/:\nroot:x:0:0::/:/bin/sh\n") == {0: "root"}
    gpu, lost = GpuIdentity(0, "GPU-aaaa", "H100"), GpuIdentity(1, "GPU-lost", "H100")
    kinds = {417: "time_sliced", 418: "mps", 419: "time_sliced", 420: "mps_server"}
    telemetry = {gpu.uuid: DeviceTelemetry(gpu, 0.0, compute_processes=tuple(ComputeProcess(p, "x", k) for p, k in kinds.items())),
                 lost.uuid: DeviceTelemetry(lost, 0.0, compute_processes=(ComputeProcess(417, "x", "time_sliced"),), lost=True)}
    assert context_pids(telemetry) == {gpu.uuid: {417, 418, 419}}
    for pid, uid in ((417, "1000"), (418, "1001"), (419, None), (420, "0")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n" if uid else "Name:\tx\n")
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0::/:/bin/sh\nalice:x:1000:1000::/:/bin/sh\nbob:x:1001:1001::/:/bin/sh\n")
    clock = Clock(10_000.0)
    monkeypatch.setattr(users, "time", clock)
    sampler = UsersSampler(type("Nvml", (), {"telemetry": telemetry})(), proc_root=tmp_path, passwd=str(passwd))
    sampler.tick()
    alice, bob = Holder(user="alice"), Holder(user="bob")
    assert sampler.holdings.gpus == {gpu.uuid: {alice: Held(0.5, EVEN_SPLIT), bob: Held(0.5, EVEN_SPLIT)}}
    assert sampler.holdings.owners == {417: alice, 418: bob}
    passwd.unlink()
    clock.now += users.PASSWD_EVERY_S
    sampler.tick()
    assert set(sampler.holdings.gpus[gpu.uuid]) == {Holder(user="1000"), Holder(user="1001")}
    args = parse_args(["--nvml-replay", "x.json", "--proc-root", str(tmp_path), "--interval", "0.2"])
    assert users.build(args, None).interval == 1.0


# -- exporter/samplers/kubelet.py ----------------------------------------------------------------------
def test_device_plugin_shares_at_their_edges():
    """Mutants: a container's IDs of one GPU not clamped to the GPU ("0" and "GPU-aaaa" are one GPU twice);
    index:mig IDs held whole; a replica whose N the kubelet does not say held whole; an ID offered twice
    counted as two replicas; the outermost container ID of a cgroup path taken; a replica's basis said whole."""
    from collections import Counter

    from exporter.samplers.kubelet import PodRef, cgroup_container_id, held_shares, offered_replicas, replicas_of
    from tests.test_kubelet import two_gpus_one_mig

    devices = two_gpus_one_mig()
    ref = PodRef("ml", "train", "main")
    assert held_shares([("0", "GPU-aaaa", ref), ("GPU-aaaa", "GPU-aaaa", ref)], devices, None) == \
        {"GPU-aaaa": {("ml", "train", "main"): 1.0}}
    assert devices.base_share("1:0") is None and devices.base_share("1") == 1.0
    assert replicas_of("GPU-aaaa::2", None) is None and replicas_of("GPU-aaaa", None) == 1
    assert held_shares([("GPU-aaaa::2", "GPU-aaaa", ref)], devices, None) == {"GPU-aaaa": {("ml", "train", "main"): None}}
    assert offered_replicas(["GPU-aaaa::0", "GPU-aaaa::1", "GPU-aaaa::1"]) == Counter({"GPU-aaaa": 2})
    from exporter.samplers.kubelet import id_basis

    two = Counter({"GPU-aaaa": 2, "MIG-1111": 1})
    assert (id_basis("GPU-aaaa::0", devices, two), id_basis("GPU-aaaa", devices, Counter({"GPU-aaaa": 1})),
            id_basis("MIG-1111", devices, two)) == (REPLICAS, WHOLE, MIG)
    outer, inner = "a" * 64, "b" * 64
    assert cgroup_container_id(f"0::/kubepods/pod1/{outer}/nested/{inner}\n") == inner


def test_a_process_belongs_only_to_a_container_listed_as_holding_a_gpu(tmp_path):
    """Mutants: the listed check dropped (the notebook's pid 419 would be owned by a container that holds no
    GPU now: its pod left the List answer, its log link is still there); a failed List keeping the holders."""
    from exporter.samplers.kubelet import KubeletSampler, PodRef
    from tests.kubelet_server import kubernetes_node

    kubernetes_node(tmp_path)  # /proc of pids 417-420 and the kubelet's log links, under tmp_path
    gpu = GpuIdentity(0, "GPU-aaaa", "H100")
    compute = tuple(ComputeProcess(pid, "python3", "time_sliced") for pid in (417, 418, 419, 420))
    nvml = type("Nvml", (), {"telemetry": {gpu.uuid: DeviceTelemetry(gpu, 0.0, compute_processes=compute)}})()
    sampler = KubeletSampler(str(tmp_path / "kubelet.sock"), nvml, proc_root=str(tmp_path / "proc"),
                             container_logs=str(tmp_path / "containers"))
    trainer = PodRef("team-a", "train-0", "trainer")
    assert sampler._owners({("team-a", "train-0", "trainer")}, []) == {417: trainer, 418: trainer}
    # the kubelet gone: what it listed goes too (mutant: the holdings of the last good List kept)
    sampler.holdings = Holdings(gpus={gpu.uuid: {Holder("team-a", "train-0", "trainer"): Held(1.0)}}, owners={417: TRAINER})
    sampler.tick()
    assert sampler.holdings.gpus == {} and sampler.holdings.owners == {} and "no kubelet" in sampler.holdings.error
    assert not sampler.health.success


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


def test_a_container_holding_two_allocations_of_one_gpu_holds_at_most_the_gpu():
    """Mutant: the clamp of a container's summed allocations dropped (3 + 3 of 4 shares: 1.5 GPUs)."""
    answer = [claim_pod("nb", "x", {"c": [("a-gpu", [("gpu-0", "s1")]), ("b-gpu", [("gpu-0", "s2")])]})]
    api = ApiView(capacity={("node-a", "gpu-0"): {"shares": 4.0}},
                  consumed={("nb", "a-gpu", "node-a", "gpu-0", "s1"): {"shares": 3.0},
                            ("nb", "b-gpu", "node-a", "gpu-0", "s2"): {"shares": 3.0}})
    assert attribute_claims(answer, node_gpus(api)).held[A][("nb", "x", "c")] == (1.0, CAPACITY, (), "a-gpu,b-gpu")


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
    """A module's `time`, whose monotonic clock the test moves (everything else is the real module's)."""

    def __init__(self, now: float):
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name):
        import time

        return getattr(time, name)


def frozen_api_clock(monkeypatch) -> Clock:
    """One clock at 10,000 s for the reader and for hostio.answers, which measures each request's deadline
    on it: with the real clock there, a machine up longer than 10,000 s found every deadline spent."""
    from hostio import answers

    clock = Clock(10_000.0)
    monkeypatch.setattr(kubernetes_api, "time", clock)
    monkeypatch.setattr(answers, "time", clock)
    return clock


def test_device_uuids_and_capacities_are_forgotten_after_the_api_server_stopped_answering(monkeypatch):
    """Mutants: the FORGET_AFTER_S drop removed (a device the API server no longer confirms keeps its
    uuid and capacity forever); `>` -> `>=` (forgotten at exactly FORGET_AFTER_S)."""
    server = FakeApiServer().start()
    try:
        server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4")])]
        clock = frozen_api_clock(monkeypatch)
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


@pytest.fixture()
def api_at(monkeypatch):
    """A FakeApiServer on 127.0.0.1 with this node's GPU 0 (4 shares) and a reader of it whose clock the
    test moves."""
    server = FakeApiServer().start()
    server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4")])]
    clock = frozen_api_clock(monkeypatch)
    yield server, KubernetesApi(Endpoint(server.url, None, None), node_name="node-a"), clock
    server.stop()


def test_a_claim_deleted_meanwhile_is_no_failure_and_is_asked_again_after_the_back_off(api_at):
    """Mutants: a 404 for a claim is a failure (the reader backs off, health 0); a claim lacking an
    allocation listed now read again at once, not after BACKOFF_S."""
    from exporter.kubernetes_api import BACKOFF_S

    server, reader, clock = api_at
    gone = {("nb", "x-gpu", "node-a", "gpu-0", "s1")}
    assert reader.view({("node-a", "gpu-0")}, gone).consumed == {} and reader.health.success
    asked = len(server.requests)
    server.claims = {("nb", "x-gpu"): claim("nb", "x-gpu", [("node-a", "gpu-0", "s1", {"shares": "1"})])}
    clock.now += BACKOFF_S - 0.001
    assert reader.view({("node-a", "gpu-0")}, gone).consumed == {} and len(server.requests) == asked
    clock.now += 0.001
    assert reader.view({("node-a", "gpu-0")}, gone).consumed == {("nb", "x-gpu", "node-a", "gpu-0", "s1"): {"shares": 1.0}}


def test_a_device_the_slices_did_not_name_lists_them_again_after_a_sixth_of_the_period(api_at):
    """Mutant: an unknown device waits for the next full SLICES_EVERY_S."""
    server, reader, clock = api_at
    assert reader.view({("node-a", "gpu-0")}, set()).uuids == {("node-a", "gpu-0"): UUID}
    server.slices[0]["spec"]["devices"].append(device("gpu-1", "GPU-one"))
    clock.now += SLICES_EVERY_S / 6 - 0.001
    assert ("node-a", "gpu-1") not in reader.view({("node-a", "gpu-0"), ("node-a", "gpu-1")}, set()).uuids
    clock.now += 0.001
    assert reader.view({("node-a", "gpu-0"), ("node-a", "gpu-1")}, set()).uuids[("node-a", "gpu-1")] == "GPU-one"


def test_other_drivers_answers_and_capacities_that_are_no_number_are_left_out(api_at):
    """Mutants: the driver checks on slices and on claim results dropped (an API server or proxy that
    ignores the field selector); capacities of 0 or that are no quantity kept."""
    server, reader, _ = api_at
    server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="0", memory="lots")])]
    other = resource_slice("node-a", "node-a", [device("gpu-0", "GPU-not-nvidia", shares="2"),
                                                device("gpu-9", "GPU-not-nvidia-either")], driver="x.example.com")
    server.body = json.dumps({"kind": "ResourceSliceList", "metadata": {}, "items": [*server.slices, other]}).encode()
    view = reader.view({("node-a", "gpu-0")}, set())
    assert view.uuids == {("node-a", "gpu-0"): UUID} and view.capacity == {("node-a", "gpu-0"): {}}
    server.body = None
    theirs = claim("nb", "x-gpu", [("node-a", "gpu-0", "s1", {"shares": "1"}), ("node-a", "gpu-0", "s2", {"shares": "3"})])
    theirs["status"]["allocation"]["devices"]["results"][1]["driver"] = "x.example.com"
    server.claims = {("nb", "x-gpu"): theirs}
    wanted = {("nb", "x-gpu", "node-a", "gpu-0", "s1"), ("nb", "x-gpu", "node-a", "gpu-0", "s2")}
    assert reader.view({("node-a", "gpu-0")}, wanted).consumed == {("nb", "x-gpu", "node-a", "gpu-0", "s1"): {"shares": 1.0}}


def test_slices_keep_at_most_max_slice_devices_and_say_so_once(api_at, caplog):
    """Attack 6's tally: ten pages of `{"name":...}` devices were some 600,000 uuids and capacities kept.
    MAX_SLICE_DEVICES are kept (exactly that many: no line), one more is left out and said once, not
    on each list; a device named twice is one. Mutants: the cap dropped, `==` -> `>`, a device named twice
    counted twice, the line never said."""
    import logging

    from exporter.kubernetes_api import MAX_SLICE_DEVICES

    server, reader, clock = api_at
    per_slice = 1024
    server.slices = [resource_slice("node-a", "node-a", [device(f"gpu-{i}", f"GPU-{i}", shares="2")
                                                         for i in range(at, min(at + per_slice, MAX_SLICE_DEVICES))])
                     for at in range(0, MAX_SLICE_DEVICES, per_slice)]
    server.slices.append(resource_slice("node-a", "node-a", [device("gpu-0", "GPU-0")]))  # named twice: one device
    line = f"list more than {MAX_SLICE_DEVICES} devices: only the first {MAX_SLICE_DEVICES} are read"
    with caplog.at_level(logging.INFO, "exporter.kubernetes_api"):
        view = reader.view({("node-a", "gpu-0")}, set())
        assert len(view.uuids) == len(view.capacity) == MAX_SLICE_DEVICES and reader.health.success
        assert not any(line in r.getMessage() for r in caplog.records)
        server.slices.append(resource_slice("node-a", "node-a", [device("gpu-last", "GPU-last", shares="2")]))
        for _ in range(2):  # two lists of the slices, one line
            clock.now += SLICES_EVERY_S
            view = reader.view({("node-a", "gpu-0")}, set())
    assert len(view.uuids) == len(view.capacity) == MAX_SLICE_DEVICES and ("node-a", "gpu-last") not in view.uuids
    assert view.capacity[("node-a", f"gpu-{MAX_SLICE_DEVICES - 1}")] == {"shares": 2.0}
    assert sum(line in r.getMessage() for r in caplog.records) == 1, [r.getMessage() for r in caplog.records]


def test_only_the_capacities_a_share_is_split_by_and_the_allocations_listed_are_kept(api_at):
    """A device's 64 capacities and a claim's 256 results were all kept, for every claim listed: only
    CAPACITY_NAMES and the allocations the kubelet lists are. Mutants: the name filter or the
    allocation filter dropped."""
    server, reader, _ = api_at
    many = {f"c{i}": str(i + 1) for i in range(62)}
    server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4", memory="80Gi", **many)])]
    server.claims = {("nb", "x-gpu"): claim("nb", "x-gpu", [("node-a", "gpu-0", f"s{i}", {"shares": "1", **many})
                                                            for i in range(256)])}
    view = reader.view({("node-a", "gpu-0")}, {("nb", "x-gpu", "node-a", "gpu-0", "s7")})
    assert view.capacity == {("node-a", "gpu-0"): {"shares": 4.0, "memory": 80 * 2**30}}
    assert view.consumed == {("nb", "x-gpu", "node-a", "gpu-0", "s7"): {"shares": 1.0}}


# -- gpu_spatial/report/account.py ---------------------------------------------------------------------
def test_rule_runs_and_spans_at_their_edges():
    """Mutants: a spacing exactly 25 % off breaks a run; a spacing of exactly W breaks it; a run of two
    evaluations used; the rollups' lag (W - D) / 2 dropped (the samples used shift by 2 minutes)."""
    from gpu_spatial.report.account import plan_spans, runs

    assert len(runs([(0.0, 300.0), (60.0, 300.0), (135.0, 300.0)])) == 1  # 75 s after 60 s: 25 % off
    assert len(runs([(0.0, 300.0), (60.0, 300.0), (135.1, 300.0)])) == 2
    assert len(runs([(0.0, 60.0), (60.0, 60.0), (120.0, 60.0)])) == 1  # every W: still covered
    # two evaluations spanning the whole range are no run; three are
    assert [s.source for s in plan_spans([(1000.0, 300.0), (1060.0, 300.0)], 830.0, 930.0)] == ["counters"]
    assert "rules" in [s.source for s in plan_spans([(940.0, 300.0), (1000.0, 300.0), (1060.0, 300.0)], 830.0, 930.0)]
    # every 60 s with W = 300 over 0..3600: a sample at t sums the increase over (t - 180, t - 120]
    (span,) = plan_spans([(float(t), 300.0) for t in range(0, 3601, 60)], 600.0, 3000.0)
    assert (span.source, span.start, span.end, span.first, span.last, span.step) == ("rules", 600.0, 3000.0, 750.0,
                                                                                      3120.0, 60.0)


def test_an_evaluation_on_the_edge_of_two_days_is_read_once():
    """Mutant: `chunk_start < t` -> `<=` (a store answering a range's both ends, as a range selector may,
    makes the evaluation at midnight count in both days: "stored more than once")."""
    from gpu_spatial.report.account import DAY, Plan, heartbeat

    class Store:  # the heartbeat every 60 s; a range [at - d, at] answered with both ends
        def query_matrix(self, expr, at):
            d = float(expr.rsplit("[", 1)[1].rstrip("ms]")) / 1000
            return [{"metric": {}, "values": [[t, "300"] for t in range(0, int(2 * DAY) + 1, 60) if at - d <= t <= at]}]

    notes = []
    evaluations, twice = heartbeat(Store(), Plan("namespace"), 0.0, 2 * DAY, notes)
    assert twice == set() and notes == [] and len(evaluations) == 2 * DAY / 60  # (0, 2 days]: once each


def test_report_pieces_that_keep_unknown_and_odd_values_apart():
    """Mutants: a matcher on a label the rollups drop still reads the rollups; the last day runs past the
    range; NaN and Inf kept; busy without a basis label not "nvml"; the unknown held counted in a span's
    held total."""
    from gpu_spatial.report.account import Plan, Totals, _value, chunks

    assert Plan("namespace", [("pod", "=", '"x"')]).rules_unusable() == \
        "--match on pod, which the namespace rollups do not keep"
    assert Plan("namespace", [("namespace", "=~", '"team-.*"')]).rules_unusable() is None
    assert chunks(0.0, 100.0, 60.0) == [(0.0, 60.0), (60.0, 100.0)]
    assert _value({"value": [0, "NaN"]}) == 0.0 and _value({"value": [0, "+Inf"]}) == 0.0
    totals = Totals(("namespace",))
    assert totals.add("busy", False, [{"metric": {"namespace": "a"}, "value": [0, "5"]}]) == 0.0
    assert totals.add("held", True, [{"metric": {"namespace": "a"}, "value": [0, "2"]}]) == 0.0
    assert totals.add("held", False, [{"metric": {"namespace": "a"}, "value": [0, "7"]}]) == 7.0
    assert totals.groups == {("a",): {("busy", "nvml"): 5.0, ("held", "unknown"): 2.0, ("held", "exact"): 7.0}}


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



# -- exporter/engine.py and exporter/sampler.py (the sampler contract) ----------------------------------
def test_a_samplers_own_max_tick_seconds_keeps_a_long_tick_published_and_a_failure_clears_when_it_ticks_again():
    """Mutants: the deadline ignores the sampler's max_tick_seconds (a 3 s tick of a sampler allowed 600 s
    is withdrawn after the engine's 0.3 s); a crashed tick's failure never cleared by a good one."""
    import threading
    import time

    from exporter.engine import Engine
    from tests.helpers import wait_for
    from tests.test_sampler_contract import FanSampler, nvml

    class LongTicks(FanSampler):
        max_tick_seconds = 600.0

        def __init__(self, device):
            super().__init__(device, "long")
            self.go, self.waiting = threading.Event(), threading.Event()
            self.go.set()

        def tick(self):
            if not self.go.is_set():
                self.waiting.set()
                self.go.wait(60)
            super().tick()

    device = nvml()
    long = LongTicks(device)
    engine = Engine(device, [long], interval=0.05)
    engine.tick_deadline = 0.3
    engine.start()
    try:
        wait_for(lambda: "long" in engine.snapshot.published, 30, 0.05, "published")
        long.go.clear()
        assert long.waiting.wait(30)
        blocked = time.monotonic()
        # ten times the engine's deadline (the mutant withdraws after it), a fiftieth of the sampler's own
        wait_for(lambda: time.monotonic() - blocked > 3.0 and engine.publish(), 30, 0.1, "3 s into the long tick")
        assert "long" in engine.snapshot.published and engine.snapshot.health["long"].success
        long.go.set()
        long.fail = True
        wait_for(lambda: engine.snapshot.health["long"].error.startswith("tick failed"), 30, 0.05, "the failure")
        long.fail = False
        wait_for(lambda: engine.snapshot.health["long"].success, 30, 0.05, "a good tick clears it")
    finally:
        long.go.set()
        engine.stop()


def test_a_source_serves_a_gpu_only_while_ok_and_a_state_without_a_window_says_none():
    """Mutants: serves() true for any state (a DCGM in error would keep the live captures off the GPU); the
    contract's defaults (start at once, in a loop of its own); a state's JSON inventing a window."""
    from exporter.sampler import SamplerDefaults, serves
    from exporter.snapshot import SourceResult
    from exporter.vocabulary import ERROR, OK

    dcgm = type("Dcgm", (), {"results": {"GPU-aaaa": SourceResult(OK, ""), "GPU-bbbb": SourceResult(ERROR, "down")}})()
    assert serves({"dcgm": dcgm}, "dcgm", "GPU-aaaa") is True
    assert serves({"dcgm": dcgm}, "dcgm", "GPU-bbbb") is False and serves({"dcgm": dcgm}, "dcgm", "GPU-cccc") is False
    assert serves({}, "dcgm", "GPU-aaaa") is False
    assert (SamplerDefaults.after_nvml, SamplerDefaults.in_nvml_loop, SamplerDefaults.max_tick_seconds) == (False, False, 0.0)
    assert SourceState(STANDBY, "not yet").to_json() == {"state": STANDBY, "reason": "not yet", "window": None}
    assert SourceState(ACTIVE, "ok", 990.0, 1000.0).to_json()["window"] == [990.0, 1000.0]


def test_a_stuck_nvml_loop_publishes_no_telemetry():
    """Mutant: the views keep NVML's last telemetry while its loop is stuck (frozen values)."""
    import threading

    from exporter.engine import Engine
    from exporter.nvml_replay import ReplayNvml
    from exporter.samplers.nvml import NvmlSampler
    from tests.helpers import wait_for
    from tests.test_sampler_contract import RECORDING

    class Stalling(ReplayNvml):
        def __init__(self, path):
            super().__init__(path)
            self.go, self.stalled = threading.Event(), threading.Event()
            self.go.set()

        def __getattr__(self, method):
            call = super().__getattr__(method)
            if method != "memory":
                return call

            def stalling(*args):
                if not self.go.is_set():
                    self.stalled.set()
                    self.go.wait(60)
                return call(*args)
            return stalling

    backend = Stalling(RECORDING)
    engine = Engine(NvmlSampler(backend, interval=0.05), [], interval=0.05)
    engine.tick_deadline = 0.3
    engine.start()
    try:
        wait_for(lambda: engine.snapshot.gpus and engine.snapshot.gpus[0].telemetry is not None, 30, 0.05, "telemetry")
        backend.go.clear()
        assert backend.stalled.wait(30)
        wait_for(lambda: "tick stuck" in engine.snapshot.health["nvml"].error, 30, 0.05, "NVML's loop stuck")
        assert engine.publish().gpus[0].telemetry is None
    finally:
        backend.go.set()
        engine.stop()


# -- exporter/samplers/cupti.py ------------------------------------------------------------------------
def test_cupti_windows_at_their_edges():
    """Mutants: a window may start 20 s after it was asked (not 2); a client's time share above 1 kept (busy
    may exceed the window by float rounding); a window lasting one period and a window, not two; the last
    windows kept when no client is connected any more."""
    from exporter.samplers.cupti import CuptiSource
    from tests.test_cupti import NVML, UUID, parse, report

    with pytest.raises(Exception, match="start 1002.1 outside"):
        parse(report(start=1002.1, end=1011.0))
    assert parse(report(start=1002.0, end=1011.0)).start == 1002.0
    from exporter.samplers.cupti import ClientReport, DeviceReport, gpu_windows

    over = gpu_windows([ClientReport(1, 0.0, 10.0, {UUID: DeviceReport(10.009, 10.0, 0.0, 3)})])
    assert (over[UUID].shares[1].time, over[UUID].shares[1].sm) == (1.0, 1.0)
    source = CuptiSource(NVML, "/nonexistent/cupti.sock", window_s=5.0, period_s=600.0)
    assert source.max_age == 1205.0
    source.readings[UUID] = over[UUID]
    assert source.fresh(UUID, 10.0 + 1205.0) is over[UUID] and source.fresh(UUID, 10.0 + 1205.001) is None


def test_no_client_left_means_no_window_and_a_line_past_the_cap_is_refused_even_when_it_ends(tmp_path, monkeypatch,
                                                                                             caplog):
    """Mutants: tick() with no client keeps the last windows; a report whose newline comes after 16 KiB
    (in the read that crosses the cap) parsed instead of refused."""
    from exporter.samplers import cupti
    from tests.test_cupti import NVML, UUID, run_attacker

    monkeypatch.setattr(cupti, "REPLY_GRACE_S", 3.0)
    source = cupti.CuptiSource(NVML, str(tmp_path / "cupti.sock"), window_s=0.0, period_s=60.0, max_clients=8)
    source.open()
    try:
        source.readings[UUID] = cupti.gpu_windows([cupti.ClientReport(1, 0.0, 10.0, {UUID: cupti.DeviceReport(
            1.0, 1.0, 0.0, 1)})])[UUID]
        source.tick()  # nobody connected
        assert source.readings == {} and source.fresh(UUID, 10.0) is None
        padded = r"""
import json, os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("connected", flush=True)
command = json.loads(s.makefile().readline())
now = time.time()
body = json.dumps({"window": command["window"], "pid": os.getpid(), "start": now, "end": now + 0.001, "devices": []})
s.sendall((body + " " * (16500 - len(body)) + "\n").encode()); s.recv(1)
"""
        run_attacker(source, caplog, padded)
        assert source.refused == {"oversized": 1} and source._clients == {}
    finally:
        source.close()


# -- exporter/ledger.py --------------------------------------------------------------------------------
def test_ledger_cells_at_their_edges():
    """Mutants: the holders' own busy time ignored where the GPU's reads lower (a's 0.8 squeezed into 0.5);
    MPS hidden idle taken from the GPU's SM active where the clients' work is larger (cells past 1); switch
    overhead not clipped to the whole GPU."""
    from exporter.ledger import GpuUse, HolderUse, cells
    from exporter.vocabulary import BUSY_UNSPLIT, HIDDEN_IDLE, SM_ACTIVE_WORK, SWITCH_OVERHEAD, TIME_IDLE

    a, b = Holder("t", "a", "c"), Holder("t", "b", "c")
    mine, gpu = cells(GpuUse(busy=0.5), {a: HolderUse(held=1.0, time=0.8)})
    assert mine[a] == {BUSY_UNSPLIT: 0.8, TIME_IDLE: pytest.approx(0.2)}
    assert sum(gpu.values()) == pytest.approx(1.0)
    clients = {a: HolderUse(held=0.5, time=0.6, sm=0.5, concurrent=True), b: HolderUse(held=0.5, time=0.2, sm=0.3,
                                                                                          concurrent=True)}
    mine, gpu = cells(GpuUse(busy=1.0, sm=0.6, complete=True), clients)
    assert mine[a][HIDDEN_IDLE] == pytest.approx(0.15) and mine[b][HIDDEN_IDLE] == pytest.approx(0.05)
    assert (mine[a][SM_ACTIVE_WORK], mine[b][SM_ACTIVE_WORK]) == (0.5, 0.3) and sum(gpu.values()) == pytest.approx(1.0)
    mine, gpu = cells(GpuUse(busy=0.5, switch_overhead=1.2), {a: HolderUse(held=1.0, time=0.5)})
    assert gpu[SWITCH_OVERHEAD] == 1.0 and sum(gpu.values()) == pytest.approx(1.0)
