"""Workloads: held shares, time shares, SM activity with its basis, held-idle and GPU-second counters,
per (holder, GPU). Exact figures on small synthetic cases; end to end with a real PodResources gRPC
server, the real exporter over HTTP replaying NVML answers recorded on the H100, and Debian's
Prometheus integrating the counters."""
import dataclasses
import json
import time
from collections import Counter

import pytest

from exporter.samplers.kubelet import DeviceMap, held_shares, offered_replicas, PodRef
from exporter.samplers.slurm import MAX_FILES, MAX_FILE_BYTES, cgroup_job, read_mapping
from exporter.snapshot import ComputeProcess, DeviceTelemetry, GpuIdentity, GpuView, MigDevice, ProcessUtilization, SpatialReading
from exporter.holders import EVEN_SPLIT, Held, Holdings, MIG, OTHER, REPLICAS, WHOLE
from exporter.samplers.cgroups import ProcFileOwners
from exporter.workloads import (EXACT, MIG_REASON, MPS_REASON, TIME_SHARE, Holder, HolderShare, WorkloadAccountant,
                               gpu_shares)
from exporter.workloads import IDLE_TIME_SHARE
from tests.helpers import FIXTURES, Exporter, Prometheus, http_get, parse_metrics, wait_for
from tests.kubelet_server import GPU, SLICED_UUID as UUID, kubernetes_node, pod
from tests.test_kubelet import node  # noqa: F401 - the fixture: a Kubernetes node with a real PodResources server

GPU0 = GpuIdentity(0, "GPU-aaaa", "H100")
TRAINER, NOTEBOOK, IDLE = Holder("team-a", "train-0", "trainer"), Holder("team-b", "notebook", "nb"), Holder("team-c", "idle", "c")


def view(processes, compute, time_utilization=0.99, sm_active=0.05, mode="time_sliced", mig=False):
    """A GPU view: processes {pid: sm ratio}, compute {pid: kind}."""
    tel = DeviceTelemetry(GPU0, 0.0, processes=tuple(ProcessUtilization(pid, "python3", sm, 0.0) for pid, sm in processes.items()),
                          compute_processes=tuple(ComputeProcess(pid, "python3", kind) for pid, kind in compute.items()),
                          mig_enabled=mig)
    spatial = None if sm_active is None else SpatialReading("gpm", 0.0, 1.0, sm_active=sm_active)
    return GpuView(GPU0, tel, time_utilization, None, None, spatial, None, (), mode)


TIME_SLICED = dict(processes={417: 0.30, 418: 0.10, 419: 0.40, 420: 0.20},
                   compute={417: "time_sliced", 418: "time_sliced", 419: "time_sliced", 420: "time_sliced"})
OWNERS = {417: TRAINER, 418: TRAINER, 419: NOTEBOOK}  # 420 runs on the host, in no holder


# -- shares of one GPU: exact figures -------------------------------------------------------------------
def test_time_sliced_holders_get_their_time_share_scaled_to_the_gpu_total_and_sm_by_time_share():
    shares = gpu_shares(view(**TIME_SLICED), {TRAINER: 0.5, NOTEBOOK: 0.25, IDLE: 0.25}, OWNERS)
    # raw 0.4 + 0.4 + 0.2 (host) = 1.0; the GPU read 0.99: every share x 0.99
    assert shares[TRAINER].time_share == pytest.approx(0.396, abs=1e-9)
    assert shares[NOTEBOOK].time_share == pytest.approx(0.396, abs=1e-9)
    assert shares[TRAINER].sm_active == pytest.approx(0.05 * 0.396 / 0.99, abs=1e-6)
    assert shares[TRAINER].sm_active_basis == shares[NOTEBOOK].sm_active_basis == TIME_SHARE
    assert shares[TRAINER].pids == (417, 418) and shares[TRAINER].processes == 2
    # a holder with no process on the GPU: known to run nothing
    assert dataclasses.replace(shares[IDLE], reason="") == HolderShare(
        pids=(), processes=0, time_share=0.0, time_share_basis="nvml", reason="", sm_active=0.0, sm_active_basis=EXACT)


def test_the_only_holder_running_gets_the_gpus_own_sm_activity_exactly():
    alone = dict(processes={417: 0.5, 418: 0.3}, compute={417: "time_sliced", 418: "time_sliced"})
    shares = gpu_shares(view(**alone, time_utilization=0.9), {TRAINER: 1.0}, OWNERS)
    assert shares[TRAINER].time_share == pytest.approx(0.9) and shares[TRAINER].sm_active == 0.05
    assert shares[TRAINER].sm_active_basis == EXACT
    # a process of nobody's beside it: the split is by time share, not exact
    alone["compute"][420] = "time_sliced"
    alone["processes"][420] = 0.2
    shares = gpu_shares(view(**alone, time_utilization=1.0), {TRAINER: 1.0}, OWNERS)
    assert shares[TRAINER].sm_active_basis == TIME_SHARE and shares[TRAINER].sm_active == pytest.approx(0.05 * 0.8)


def test_under_mps_no_time_share_exists_and_sm_only_for_a_holder_alone():
    mps = dict(processes={588: 1.0}, compute={417: "mps", 419: "mps", 588: "mps_server"}, mode="mps")
    shares = gpu_shares(view(**mps), {TRAINER: 0.5, NOTEBOOK: 0.5}, OWNERS)
    for holder in (TRAINER, NOTEBOOK):
        assert shares[holder].time_share is None and shares[holder].reason == MPS_REASON
        assert shares[holder].sm_active is None and shares[holder].processes == 1
    del mps["compute"][419]
    shares = gpu_shares(view(**mps), {TRAINER: 0.5, NOTEBOOK: 0.5}, OWNERS)
    assert (shares[TRAINER].sm_active, shares[TRAINER].sm_active_basis) == (0.05, EXACT)
    assert (shares[NOTEBOOK].sm_active, shares[NOTEBOOK].processes) == (0.0, 0)


def test_mig_holders_have_processes_no_time_share_and_their_instances_sm_activity():
    shares = gpu_shares(view(**TIME_SLICED, mig=True, mode="mig"), {TRAINER: 60 / 132}, OWNERS)
    assert shares[TRAINER].time_share is None and shares[TRAINER].sm_active is None  # instance not read
    assert shares[TRAINER].reason == MIG_REASON and shares[TRAINER].processes == 2
    shares = gpu_shares(view(**TIME_SLICED, mig=True, mode="mig"), {TRAINER: 60 / 132}, OWNERS, {TRAINER: 0.2})
    assert (shares[TRAINER].sm_active, shares[TRAINER].sm_active_basis) == (0.2, EXACT)


def mig_node(tmp_path):
    """The time-sliced H100 recording with MIG mode on: a 3g.40gb (60 SMs) and a 1g.10gb (16 SMs) device of
    132 SMs, the H100's MIG layout. MIG mode cannot be switched on the device we record on (its settings
    stay as they are), so the two instances' GPM answers are set here: 50 % and 25 % of their own SMs."""
    server, args = kubernetes_node(tmp_path)
    data = json.loads((tmp_path / "nvml.json").read_text())
    data["calls"]["mig_devices/0"] = [{"value": {"enabled": True, "sm_count": 132, "devices": [
        {"uuid": "MIG-big", "gpu_instance": 1, "compute_instance": 0, "sm_count": 60},
        {"uuid": "MIG-small", "gpu_instance": 2, "compute_instance": 0, "sm_count": 16}]}}]
    gpm = data["calls"]["gpm_metrics/0"][0]["value"]
    data["calls"]["gpm_mig_metrics/0/1"] = [{"value": {**gpm, "sm_active": 50.0}}]
    data["calls"]["gpm_mig_metrics/0/2"] = [{"value": {**gpm, "sm_active": 25.0}}]
    (tmp_path / "nvml.json").write_text(json.dumps(data))
    server.service.allocatable = [("nvidia.com/mig-3g.40gb", ["MIG-big"]), ("nvidia.com/mig-1g.10gb", ["MIG-small"])]
    server.service.pods = [pod("team-a", "train-0", {"trainer": [("nvidia.com/mig-3g.40gb", ["MIG-big"])]}),
                           pod("team-b", "notebook", {"nb": [("nvidia.com/mig-1g.10gb", ["MIG-small"])]})]
    return server, args


def test_mig_devices_of_different_sizes_over_http(tmp_path):
    server, args = mig_node(tmp_path)
    server.start()
    try:
        with Exporter(*args) as exporter:
            found = wait_for(lambda: len(workloads(exporter)) == 2 and all(
                w["sm_active"] is not None for w in workloads(exporter).values()) and workloads(exporter),
                20, 0.2, "MIG holders")
            big, small = found[("team-a", "train-0", "trainer", "")], found[("team-b", "notebook", "nb", "")]
            assert big["held_share"] == pytest.approx(60 / 132) and small["held_share"] == pytest.approx(16 / 132)
            assert big["sm_active"] == pytest.approx(0.5 * 60 / 132, abs=1e-6) and big["sm_active_basis"] == "exact"
            assert small["sm_active"] == pytest.approx(0.25 * 16 / 132, abs=1e-6)
            assert big["time_share"] is None and big["time_share_reason"] == MIG_REASON
            assert "Traceback" not in exporter.log()
    finally:
        server.stop()


def test_unknown_process_lists_say_nothing_about_holders():
    v = view(**TIME_SLICED)
    v = GpuView(GPU0, DeviceTelemetry(GPU0, 0.0, compute_processes=None), 0.99, None, None, v.spatial, None, ())
    entry = gpu_shares(v, {TRAINER: 1.0}, OWNERS)[TRAINER]
    assert entry.processes is None and entry.time_share is None and entry.sm_active is None


# -- held shares from device IDs ----------------------------------------------------------------------
def test_held_shares_of_replicas_whole_gpus_and_mig_devices():
    gpus = (GpuIdentity(0, "GPU-aaaa", "H100"), GpuIdentity(1, "GPU-bbbb", "H100"), GpuIdentity(2, "GPU-cccc", "H100"))
    # MIG layout of an H100 (NVML device attributes): 3g.40gb = 60 SMs, 1g.10gb = 16 SMs, of 132
    telemetry = {"GPU-cccc": DeviceTelemetry(gpus[2], 0.0, mig_enabled=True, mig_sm_count=132,
                                             mig_devices=(MigDevice("MIG-big", 1, 0, 60), MigDevice("MIG-small", 2, 0, 16)))}
    devices = DeviceMap(gpus, telemetry)
    ref = lambda ns, name: PodRef(ns, name, "c", GPU)
    claims = [("GPU-aaaa", "GPU-aaaa", ref("a", "whole")),
              ("GPU-bbbb::0", "GPU-bbbb", ref("b", "one")), ("GPU-bbbb::1", "GPU-bbbb", ref("b", "two")),
              ("GPU-bbbb::2", "GPU-bbbb", ref("b", "two")), ("GPU-bbbb::3", "GPU-bbbb", ref("b", "three")),
              ("MIG-big", "GPU-cccc", ref("c", "big")), ("MIG-small", "GPU-cccc", ref("c", "small"))]

    offered = offered_replicas(["GPU-aaaa", "GPU-bbbb::0", "GPU-bbbb::1", "GPU-bbbb::2", "GPU-bbbb::3", "MIG-big",
                                "MIG-small"])
    shares = held_shares(claims, devices, offered)
    assert shares["GPU-aaaa"] == {("a", "whole", "c"): 1.0}
    assert shares["GPU-bbbb"] == {("b", "one", "c"): 0.25, ("b", "two", "c"): 0.5, ("b", "three", "c"): 0.25}
    assert shares["GPU-cccc"] == {("c", "big", "c"): round(60 / 132, 9), ("c", "small", "c"): round(16 / 132, 9)}
    # a kubelet without GetAllocatableResources: whole GPUs stay exact, replica shares are unknown
    unknown = held_shares(claims, devices, None)
    assert unknown["GPU-aaaa"] == {("a", "whole", "c"): 1.0}
    assert set(unknown["GPU-bbbb"].values()) == {None}
    assert offered_replicas(None) is None and offered == Counter({"GPU-aaaa": 1, "GPU-bbbb": 4, "MIG-big": 1, "MIG-small": 1})


# -- the accountant: counters and idle time --------------------------------------------------------------
def test_counters_integrate_each_updates_rates_until_the_next_and_idle_is_timed():
    acc = WorkloadAccountant(held_idle_after=10.0)

    def kubelet(shares, owners):
        return [Holdings(gpus={"GPU-aaaa": {h: Held(share, REPLICAS) for h, share in shares.items()}}, owners=owners)]

    shares = {TRAINER: 0.5, IDLE: 0.25}
    owners = {417: TRAINER, 418: TRAINER}
    Kubelet = lambda: kubelet(shares, owners)

    busy = view(**TIME_SLICED)  # trainer: time 0.396, SM 0.02; idle holder: nothing
    first = {w.holder: w for w in acc.update(100.0, (busy,), Kubelet())}
    assert first[TRAINER].counters["held"] == 0.0 and first[TRAINER].created == 100.0
    acc.update(104.0, (busy,), Kubelet())
    last = {w.holder: w for w in acc.update(109.999, (busy,), Kubelet())}
    t, i = last[TRAINER], last[IDLE]
    assert t.counters["held"] == pytest.approx(0.5 * 9.999, abs=1e-6)
    assert t.counters["busy"] == pytest.approx(0.396 * 9.999, abs=1e-5)
    assert t.counters["sm_active"] == pytest.approx({TIME_SHARE: 0.05 * 0.396 / 0.99 * 9.999}, abs=1e-5)
    assert t.counters["hidden_idle"][TIME_SHARE] == pytest.approx((0.396 - 0.02) * 9.999, abs=1e-5)
    assert t.idle_seconds == 0.0 and not t.held_idle and t.counters["held_idle"] == 0.0
    assert i.idle_seconds == pytest.approx(9.999) and not i.held_idle  # just below --held-idle-after
    assert i.counters["held_idle"] == pytest.approx(0.25 * 9.999, abs=1e-6)
    at = {w.holder: w for w in acc.update(110.0, (busy,), Kubelet())}[IDLE]
    assert at.idle_seconds == pytest.approx(10.0) and at.held_idle  # at the threshold

    # The idle holder starts a process: its idle clock stops at once; a stalled gap is not integrated.
    owners[419] = IDLE
    woke = {w.holder: w for w in acc.update(111.0, (busy,), Kubelet())}[IDLE]
    assert woke.idle_seconds == 0.0 and not woke.held_idle
    stalled = {w.holder: w for w in acc.update(1111.0, (busy,), Kubelet())}[TRAINER]
    assert stalled.counters["held"] == pytest.approx(0.5 * (11.0 + 30.0), abs=1e-6)  # MAX_STEP_S, not 1000 s

    # The trainer leaves: its series go; back again, it starts from zero.
    shares = {IDLE: 0.25}
    assert [w.holder for w in acc.update(1112.0, (busy,), Kubelet())] == [IDLE]
    shares = {TRAINER: 0.5}
    again = acc.update(1113.0, (busy,), Kubelet())[0]
    assert again.holder == TRAINER and again.counters["held"] == 0.0 and again.created == 1113.0


# -- Slurm ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, job", [
    ("12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n11:cpu:/slurm/uid_1000/job_4242/step_0\n", "4242"),  # v1
    ("0::/system.slice/slurmstepd.scope/job_777/step_batch/user/task_0\n", "777"),  # v2
    ("0::/system.slice/slurmstepd.scope/job_777\n", "777"),
    ("0::/user.slice/session-1.scope\n", None),
    ("0::/kubepods.slice/job_12abc/x\n", None),
    ("", None),
])
def test_job_from_cgroup(text, job):
    assert cgroup_job(text) == job


def test_job_mapping_directory_good_and_bad_files(tmp_path):
    gpus = (GpuIdentity(0, "GPU-aaaa", "H100"), GpuIdentity(1, "GPU-bbbb", "H100"))
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "GPU-bbbb").write_text("100 1000\n101\n\n")  # "jobid uid" lines, as some prologs write
    (tmp_path / "7").write_text("1\n")  # no such GPU
    (tmp_path / "GPU-zzzz").write_text("1\n")
    (tmp_path / ".0.tmp").write_text("garbage")  # a prolog's temporary file
    problems = []
    assert read_mapping(tmp_path, DeviceMap(gpus, {}), problems) == {"GPU-aaaa": ("4242",), "GPU-bbbb": ("100", "101")}
    assert len(problems) == 2 and "no GPU '7'" in problems[0] and "GPU-zzzz" in problems[1]
    (tmp_path / "0").write_text("rm -rf /\n")
    (tmp_path / "1").write_bytes(b"1\n" * 5000)
    problems = []
    assert read_mapping(tmp_path, DeviceMap(gpus, {}), problems) == {"GPU-bbbb": ("100", "101")}
    assert any("'rm' is no Slurm job ID" in p for p in problems)
    assert any("larger than 4096 bytes" in p for p in problems)


# -- end to end over HTTP --------------------------------------------------------------------------
def workloads(exporter):
    status, body = http_get(exporter.url + "/api/v1/workloads")
    assert status == 200
    return {(w["namespace"], w["pod"], w["container"], w["hpc_job"]): w for w in json.loads(body)["workloads"]}


def test_replicas_across_pods_time_shares_bases_and_held_idle_over_http(node):
    """4 time-slicing replicas of one GPU across 3 pods (trainer 2, notebook 1, an idle pod 1): the
    recorded frame has pids 417+418 (trainer) at 30+10 %, 419 (notebook) at 40 %, 420 (host) at 20 %
    SM time, the GPU at 99 % and GPM SM active 5.66 %."""
    server, args = node
    server.service.allocatable = [(GPU, [f"{UUID}::{n}" for n in range(4)])]
    server.service.pods = [
        pod("team-a", "train-0", {"trainer": [(GPU, [f"{UUID}::0", f"{UUID}::1"])]}),
        pod("team-b", "notebook", {"nb": [(GPU, [f"{UUID}::2"])]}),
        pod("team-c", "idle", {"c": [(GPU, [f"{UUID}::3"])]}),
    ]
    server.start()
    with Exporter(*args, "--held-idle-after", "2s") as exporter:
        found = wait_for(lambda: len(workloads(exporter)) == 3 and workloads(exporter)[("team-c", "idle", "c", "")]["held_idle"]
                         and workloads(exporter), 20, 0.2, "three holders, one held idle")
        trainer, notebook, idle = (found[k] for k in (("team-a", "train-0", "trainer", ""),
                                                      ("team-b", "notebook", "nb", ""), ("team-c", "idle", "c", "")))
        assert (trainer["held_share"], notebook["held_share"], idle["held_share"]) == (0.5, 0.25, 0.25)
        assert trainer["time_share"] == pytest.approx(0.399622) and notebook["time_share"] == pytest.approx(0.399622)
        sm = 0.05656524648847919
        assert trainer["sm_active"] == pytest.approx(sm * 0.4, abs=1e-6) and trainer["sm_active_basis"] == "time_share"
        assert (idle["processes"], idle["time_share"], idle["sm_active"], idle["sm_active_basis"]) == (0, 0.0, 0.0, "exact")
        assert trainer["pids"] == [417, 418] and not trainer["held_idle"] and trainer["idle_seconds"] == 0.0

        samples = parse_metrics(exporter.metrics())
        by_pod = lambda name, **extra: {l["pod"]: v for l, v in samples[name] if all(l.get(k) == x for k, x in extra.items())}
        assert by_pod("gpu_workload_held_share_ratio") == {"train-0": 0.5, "notebook": 0.25, "idle": 0.25}
        assert by_pod("gpu_workload_held_idle") == {"train-0": 0.0, "notebook": 0.0, "idle": 1.0}
        assert by_pod("gpu_workload_processes") == {"train-0": 2.0, "notebook": 1.0, "idle": 0.0}
        assert set(by_pod("gpu_workload_sm_active_ratio", basis="time_share")) == {"train-0", "notebook"}
        # The ledger of the same frame by hand (docs/ledger.md): the GPU's busy time T (the raw shares 0.4, 0.4
        # and 0.2 scaled to it) is the pods' 0.4 T each (work = SM x 0.4, the rest hidden idle) and the host
        # process's 0.2 T (nobody's: unattributed, SM active beyond the pods' in work); the 1 - T no kernel ran
        # by held share. Both views side by side in the API.
        busy = trainer["time_share"] / 0.4
        ledger = {cell: round(v, 6) for cell, v in trainer["ledger"].items() if v}
        assert ledger == pytest.approx({"sm_active_work": sm * 0.4, "hidden_idle": 0.4 * busy - sm * 0.4,
                                        "time_idle": (1 - busy) * 0.5}, abs=2e-6)
        assert {c: v for c, v in idle["ledger"].items() if v} == pytest.approx({"time_idle": (1 - busy) * 0.25}, abs=2e-6)
        status, body = http_get(exporter.url + "/api/v1/workloads")
        (gpu_ledger,) = json.loads(body)["ledgers"]
        assert {c: v for c, v in gpu_ledger["cells"].items() if v} == pytest.approx({
            "sm_active_work": sm * 0.8, "hidden_idle": 0.8 * busy - sm * 0.8, "unattributed_sm_active_work": sm * 0.2,
            "unattributed_hidden_idle": 0.2 * busy - sm * 0.2, "time_idle": 1 - busy}, abs=2e-6)
        labels = next(l for l, _ in samples["gpu_workload_held_share_ratio"] if l["pod"] == "idle")
        assert labels == {"gpu": "0", "uuid": UUID, "model": "NVIDIA H100 80GB HBM3", "namespace": "team-c",
                          "pod": "idle", "container": "c", "hpc_job": "", "claim": "", "user": ""}  # empty: never stored

        # Pods come and go: the idle pod leaves and takes its series along; no holder, no series.
        server.service.pods = server.service.pods[:2]
        wait_for(lambda: set(workloads(exporter)) == {("team-a", "train-0", "trainer", ""), ("team-b", "notebook", "nb", "")},
                 15, 0.2, "idle pod gone")
        samples = parse_metrics(exporter.metrics())
        assert {l["pod"] for l, _ in samples["gpu_workload_held_share_ratio"]} == {"train-0", "notebook"}

        # The kubelet stops answering GetAllocatableResources: replica shares are unknown, not guessed.
        server.service.allocatable = None
        wait_for(lambda: all(w["held_share"] is None for w in workloads(exporter).values()), 15, 0.2, "shares unknown")
        assert "gpu_workload_held_share_ratio" not in parse_metrics(exporter.metrics())
        assert exporter.log().count("GetAllocatableResources failed (UNIMPLEMENTED)") == 1
        assert "Traceback" not in exporter.log()


def test_mps_holders_have_no_time_share_and_say_why(tmp_path):
    server, args = kubernetes_node(tmp_path)
    # the MPS recording: clients 518-521 and the server 588; 518 and 519 run in the trainer's container
    from exporter.nvml_replay import cut

    cut(FIXTURES / "nvml_h100_mps.json", tmp_path / "nvml.json", frame=0)
    proc = tmp_path / "proc"
    for pid, cid in ((518, "a" * 64), (519, "a" * 64), (520, "b" * 64)):
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/kubepods.slice/cri-containerd-{cid}.scope\n")
    server.service.allocatable = [(GPU, [f"{UUID}::{n}" for n in range(10)])]
    server.service.pods = [pod("team-a", "train-0", {"trainer": [(GPU, [f"{UUID}::0"])]}),
                           pod("team-b", "notebook", {"nb": [(GPU, [f"{UUID}::1"])]})]
    server.start()
    try:
        with Exporter(*args) as exporter:
            found = wait_for(lambda: len(workloads(exporter)) == 2 and all(w["processes"] for w in workloads(exporter).values())
                             and workloads(exporter), 20, 0.2, "MPS holders")
            trainer = found[("team-a", "train-0", "trainer", "")]
            assert trainer["held_share"] == 0.1 and trainer["processes"] == 2 and trainer["pids"] == [518, 519]
            assert trainer["time_share"] is None and trainer["time_share_reason"] == MPS_REASON
            assert trainer["sm_active"] is None  # two holders run under one server: no split exists
            samples = parse_metrics(exporter.metrics())
            assert "gpu_workload_time_share_ratio" not in samples and "gpu_workload_sm_active_ratio" not in samples
            assert {l["pod"]: v for l, v in samples["gpu_workload_processes"]} == {"train-0": 2.0, "notebook": 1.0}
    finally:
        server.stop()


def test_slurm_jobs_from_the_mapping_directory_and_cgroups_over_http(tmp_path):
    from exporter.nvml_replay import cut

    cut(FIXTURES / "nvml_h100_time_sliced.json", tmp_path / "nvml.json", frame=0)
    proc = tmp_path / "proc"
    layouts = {417: "12:memory:/slurm/uid_1000/job_4242/step_0/task_0",  # cgroup v1
               418: "0::/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0",  # v2
               419: "0::/system.slice/slurmstepd.scope/job_5151/step_0/user/task_0",
               420: "0::/user.slice/session-1.scope"}
    for pid, text in layouts.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text + "\n")
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "0").write_text("4242\n5151\n")
    with Exporter("--nvml-replay", str(tmp_path / "nvml.json"), "--no-mps", "--interval", "0.2", "--kubelet-socket", "none",
                  "--proc-root", str(proc), "--hpc-job-mapping-dir", str(mapping)) as exporter:
        # GPM's first window needs two of its samples: until then the GPU's time utilization is NVML's (0.99,
        # whole percent, against GPM's 0.999), so a snapshot taken first under load reads 0.396, not 0.399622
        found = wait_for(lambda: len(workloads(exporter)) == 2 and workloads(exporter)[("", "", "", "4242")]["processes"] == 2
                         and workloads(exporter)[("", "", "", "4242")]["time_share"] > 0.3990 and workloads(exporter),
                         15, 0.2, "two jobs over GPM's window")
        job, other = found[("", "", "", "4242")], found[("", "", "", "5151")]
        assert (job["held_share"], job["pids"], job["time_share"]) == (0.5, [417, 418], pytest.approx(0.399622))
        assert (other["held_share"], other["pids"], other["time_share"]) == (0.5, [419], pytest.approx(0.399622))
        samples = parse_metrics(exporter.metrics())
        assert {l["hpc_job"] for l, _ in samples["gpu_workload_held_share_ratio"]} == {"4242", "5151"}
        assert samples["gpu_workload_held_share_ratio"][0][0]["namespace"] == ""

        (mapping / "0").write_text("not-a-job\n")  # a broken prolog: one log line, no holders
        wait_for(lambda: not workloads(exporter), 15, 0.2, "bad file ignored")
        (mapping / "0").unlink()  # the epilog ran
        time.sleep(0.5)
        assert not workloads(exporter)
        assert exporter.log().count("'not-a-job' is no Slurm job ID") == 1 and "Traceback" not in exporter.log()


def test_counters_in_prometheus_equal_the_hand_computed_gpu_seconds(node, tmp_path):
    """Constant rates from one recorded frame: increase() over a window is rate x window. Every counter of
    an update integrates the same interval of the exporter's clock, so through Prometheus their ratios
    are exact whatever the machine's pace; the held rate itself is checked against the exporter's own
    clock (the snapshot time of two answers), not against the wall time between scrapes (a busy
    machine's late update moved it 1.4 %)."""
    server, args = node
    server.service.allocatable = [(GPU, [f"{UUID}::{n}" for n in range(4)])]
    server.service.pods = [pod("team-a", "train-0", {"trainer": [(GPU, [f"{UUID}::0", f"{UUID}::1"])]}),
                           pod("team-c", "idle", {"c": [(GPU, [f"{UUID}::3"])]})]
    server.start()
    with Exporter(*args) as exporter:
        wait_for(lambda: len(workloads(exporter)) == 2, 15, 0.2, "holders")
        prom = Prometheus(tmp_path, {"gpu": [exporter.url.removeprefix("http://")]})
        try:
            window = 4  # every counter of an update integrates the same interval: its length changes no ratio
            busy = 0.9990552358092995 * 0.4  # GPM's GRAPHICS_UTIL of the frame x the trainer's NVML time share
            expected = {("train-0", "held"): 0.5, ("train-0", "busy"): busy, ("train-0", "sm_active"): 0.05656524648847919 * 0.4,
                        ("train-0", "hidden_idle"): busy - 0.05656524648847919 * 0.4,
                        ("idle", "held"): 0.25, ("idle", "held_idle"): 0.25, ("train-0", "held_idle"): 0.0}

            def increases():
                out = {}
                for q in ("held", "busy", "sm_active", "hidden_idle", "held_idle"):
                    for r in prom.query(f"sum by (pod) (increase(gpu_workload_{q}_gpu_seconds_total[{window}s]))"):
                        out[(r["metric"]["pod"], q)] = float(r["value"][1]) / window
                return out
            def covered():  # scraped over the whole window, so increase() needs no extrapolation from a start
                counts = prom.query(f"min(count_over_time(gpu_workload_held_gpu_seconds_total[{window + 2}s]))")
                return counts and float(counts[0]["value"][1]) >= window + 1
            wait_for(covered, 60, 1.0, "a window of scrapes")
            found = wait_for(lambda: set(expected) <= set(increases()) and increases(), 60, 1.0, "counters scraped")
            held = found[("train-0", "held")]
            for key, rate in expected.items():
                assert found[key] / held == pytest.approx(rate / 0.5, rel=1e-3, abs=1e-4), key

            def answer():
                status, body = http_get(exporter.url + "/api/v1/workloads")
                data = json.loads(body)
                trainer = next(w for w in data["workloads"] if w["pod"] == "train-0")
                return data["snapshot_time"], trainer["gpu_seconds"]["held"]
            first = answer()
            last = wait_for(lambda: (a := answer())[0] >= first[0] + 2 and a, 60, 0.2, "two seconds of updates")
            assert (last[1] - first[1]) / (last[0] - first[0]) == pytest.approx(0.5, rel=1e-4)
            # the GPU's ledger: its cells add up to the wall clock it was observed (1 GPU-second per second of it)
            cells = prom.query(f"sum(increase(gpu_ledger_gpu_seconds_total[{window}s]))")
            observed = prom.query(f"sum(increase(gpu_ledger_observed_seconds_total[{window}s]))")
            assert float(cells[0]["value"][1]) == pytest.approx(float(observed[0]["value"][1]), rel=1e-3)
        finally:
            prom.stop()


# -- bounded holders per GPU ---------------------------------------------------------------------------
def test_holders_beyond_the_limit_fold_into_other_and_every_second_counts_once():
    """Limit 2, four holders of 0.25: trainer and notebook run (time 0.396 each), two hold idle. Held
    GPU-seconds over all published series always add up to 1 GPU x elapsed time, through a holder
    moving out of and into the fold."""
    acc = WorkloadAccountant(series_limit=2)
    spare = Holder("team-d", "spare", "c")
    shares = {TRAINER: 0.25, NOTEBOOK: 0.25, IDLE: 0.25, spare: 0.25}
    owners = dict(OWNERS)
    holdings = lambda: [Holdings(gpus={"GPU-aaaa": {h: Held(v, REPLICAS) for h, v in shares.items()}},
                                 owners=owners)]
    busy = view(**TIME_SLICED)

    def held_total(views):
        return {w.holder: w.counters["held"] for w in views}

    acc.update(100.0, (busy,), holdings())
    views = acc.update(110.0, (busy,), holdings())
    assert [w.holder for w in views] == [OTHER, TRAINER, NOTEBOOK]  # sorted by labels; idle and spare folded
    other = next(w for w in views if w.holder == OTHER)
    assert (other.folded, other.held_share, other.processes, other.time_share) == (2, 0.5, 0, 0.0)
    assert other.held_share_basis == REPLICAS and other.idle_seconds is None
    assert held_total(views) == pytest.approx({OTHER: 5.0, NOTEBOOK: 2.5, TRAINER: 2.5})

    owners[419] = spare  # the notebook's process now runs in spare's container: spare is busier
    views = acc.update(120.0, (busy,), holdings())
    got = held_total(views)
    assert set(got) == {OTHER, spare, TRAINER}
    assert got[spare] == 0.0 and next(w for w in views if w.holder == spare).created == 120.0  # starts again
    # other: 5 + idle and spare's 110-120 (5) + the notebook's 110-120, published no more in its own series (2.5)
    assert got[OTHER] == pytest.approx(12.5) and got[TRAINER] == pytest.approx(5.0)
    # the published increases add up: trainer 5, notebook 2.5 (last seen), spare 0, other 12.5 = 1 GPU x 20 s
    assert got[OTHER] + got[TRAINER] + got[spare] + 2.5 == pytest.approx(20.0)

    views = acc.update(130.0, (busy,), holdings())
    got = held_total(views)
    assert got[spare] == pytest.approx(2.5) and got[OTHER] == pytest.approx(17.5)
    shares.pop(IDLE), shares.pop(NOTEBOOK)  # back under the limit: no other
    assert OTHER not in {w.holder for w in acc.update(131.0, (busy,), holdings())}


def test_a_thousand_pods_on_one_gpu_publish_a_bounded_body_and_say_what_was_folded(node):
    """As many pods as the kubelet sampler reads (MAX_CONTAINERS; beyond it they are counted, not held:
    tests/test_kubelet.py) on one GPU: 21 holders published, the rest summed, the accounts adding up."""
    server, args = node
    count = 1000
    server.service.allocatable = [(GPU, [f"{UUID}::{n}" for n in range(count)])]
    server.service.pods = [pod("team-a", "train-0", {"trainer": [(GPU, [f"{UUID}::0"])]})] + [
        pod(f"ns-{n % 50}", f"replica-{n}", {"c": [(GPU, [f"{UUID}::{n}"])]}) for n in range(1, count)]
    server.start()
    with Exporter(*args, "--kubelet-interval", "2", "--holder-series-limit", "20") as exporter:
        def folded():
            samples = parse_metrics(exporter.metrics())
            return samples.get("gpu_workload_folded_holders") and samples
        samples = wait_for(folded, 60, 0.5, "holders folded")
        assert samples["gpu_workload_folded_holders"][0][1] == count - 20
        assert len(samples["gpu_workload_held_share_ratio"]) == 21
        other = next(v for l, v in samples["gpu_workload_held_share_ratio"] if l["pod"] == "other")
        assert sum(v for _, v in samples["gpu_workload_held_share_ratio"]) == pytest.approx(1.0, abs=1e-6)
        assert other == pytest.approx((count - 20) / count, abs=1e-6)
        assert any(l["pod"] == "train-0" for l, _ in samples["gpu_workload_held_share_ratio"])  # the busy one stays
        pod_info = samples["gpu_pod_info"]
        assert len(pod_info) == 21 and {l["pod"]: v for l, v in pod_info}["other"] == count - 20
        assert samples["gpu_pods"][0][1] == count
        body = exporter.metrics()
        assert len(body) < 256 * 1024, len(body)  # 32 MB before the bound with 10,000; ~96 KB with 21 holders
        started = time.monotonic()
        for _ in range(20):
            exporter.metrics()
        print(f"{count} pods: /metrics body {len(body)} bytes, {1000 * (time.monotonic() - started) / 20:.1f} ms a scrape")
        assert exporter.log().count("more than --holder-series-limit 20") == 1
        assert "Traceback" not in exporter.log()
        # the JSON API lists 256 holders per GPU and says how many it left out, instead of all of them
        answer = exporter.gpus()
        gpu, kubelet = answer["gpus"][0], answer["kubelet"]
        assert len(gpu["pods"]) == 256 and gpu["pods_omitted"] == count - 256
        assert len(kubelet["pods"][UUID]) == 256 and kubelet["pods_omitted"] == {UUID: count - 256}


JOB = Holder(hpc_job="4242")


def sliced_view(processes: dict[int, float], time_utilization):
    """One GPU, every process time-sliced, SM active 0.05."""
    tel = DeviceTelemetry(GPU0, 0.0, processes=tuple(ProcessUtilization(pid, "python3", sm, 0.0)
                                                     for pid, sm in processes.items()),
                          compute_processes=tuple(ComputeProcess(pid, "python3", "time_sliced") for pid in processes))
    return GpuView(GPU0, tel, time_utilization, None, None, SpatialReading("gpm", 0.0, 1.0, sm_active=0.05), None, (),
                   "time_sliced")


# -- exporter/workloads.py ---------------------------------------------------------------------------------
@pytest.mark.parametrize("time_share, idle", [(0.0099, True), (IDLE_TIME_SHARE, False), (0.05, False)])
def test_idle_below_one_percent_of_the_time_not_at_it(time_share, idle):
    """Mutations: IDLE_TIME_SHARE 0.01 -> 0.1 (0.05 reads idle), `<` -> `<=` (0.01 reads idle)."""
    assert IDLE_TIME_SHARE == 0.01
    accountant = WorkloadAccountant(held_idle_after=1.0)
    job = [Holdings(gpus={GPU0.uuid: {JOB: Held(1.0, EVEN_SPLIT)}}, owners={417: JOB})]
    gpu = sliced_view({417: time_share}, time_utilization=time_share)  # alone: its time share is the GPU's
    for now in (100.0, 102.0):
        (work,) = accountant.update(now, (gpu,), job)
    assert work.time_share == time_share
    assert (work.idle_seconds, work.held_idle) == ((2.0, True) if idle else (0.0, False))


def test_a_holders_time_share_never_exceeds_the_whole_gpu():
    """Without a GPU total to scale to, two processes of one job reading 0.7 each are one GPU, not 1.4.
    Mutation: the clamp of a time share to 1.0 dropped."""
    shares = gpu_shares(sliced_view({417: 0.7, 418: 0.7}, time_utilization=None), {JOB: 1.0}, {417: JOB, 418: JOB})
    assert shares[JOB].time_share == 1.0


# -- exporter/samplers/slurm.py --------------------------------------------------------------------------
def test_a_mapping_file_of_exactly_the_cap_is_read_one_byte_more_is_not(tmp_path):
    """Mutation: `len(data) > MAX_FILE_BYTES` -> `>=`."""
    assert MAX_FILE_BYTES == 4096
    gpus = (GpuIdentity(0, "GPU-aaaa", "H100"), GpuIdentity(1, "GPU-bbbb", "H100"))
    (tmp_path / "0").write_bytes(b"42\n" + b"\n" * (MAX_FILE_BYTES - 3))  # 4096 bytes: a job and blank lines
    (tmp_path / "1").write_bytes(b"43\n" + b"\n" * (MAX_FILE_BYTES - 2))  # 4097 bytes
    problems = []
    assert read_mapping(tmp_path, DeviceMap(gpus, {}), problems) == {"GPU-aaaa": ("42",)}
    assert problems == [f"{tmp_path / '1'}: larger than 4096 bytes, not a job mapping: ignored"]


@pytest.mark.parametrize("files, too_many", [(MAX_FILES, False), (MAX_FILES + 1, True)])
def test_more_than_1024_files_is_said_exactly_then(tmp_path, files, too_many):
    """Mutations: the count of listed names off by one (`MAX_FILES + 1` -> `MAX_FILES` in the listing, or
    `len(names) > MAX_FILES` -> `>=`)."""
    assert MAX_FILES == 1024
    (tmp_path / "0").write_text("42\n")  # sorts first: read in both cases
    for n in range(files - 1):
        (tmp_path / f"x{n:05d}").write_text("1\n")  # names no GPU: one problem each
    problems = []
    assert read_mapping(tmp_path, DeviceMap((GPU0,), {}), problems) == {"GPU-aaaa": ("42",)}
    counted = [p for p in problems if "more than" in p]
    assert counted == ([f"{tmp_path} holds more than 1024 files: only the first 1024 are read"] if too_many else [])
    assert len(problems) == 1024 if too_many else len(problems) == files - 1


# -- exporter/samplers/cgroups.py ------------------------------------------------------------------------
def test_a_pid_that_left_the_gpu_is_forgotten_so_a_reused_pid_gets_its_new_owner(tmp_path):
    """Mutation: the cache keeps every pid it ever read (a reused pid keeps the old job)."""
    cgroup = tmp_path / "4000" / "cgroup"
    cgroup.parent.mkdir()
    cgroup.write_text("0::/system.slice/slurmstepd.scope/job_100/step_0\n")
    owners = ProcFileOwners(tmp_path, cgroup_job)
    assert owners.lookup({4000}) == {4000: "100"}
    cgroup.write_text("0::/system.slice/slurmstepd.scope/job_200/step_0\n")  # read once in its life:
    assert owners.lookup({4000}) == {4000: "100"}  # still the process read before
    assert owners.lookup(set()) == {}  # it left the GPU
    assert owners.lookup({4000}) == {4000: "200"}  # the pid again: another process, read anew


def test_a_holders_hidden_idle_is_never_negative():
    """SM active above the time share (windows of different sources): hidden idle 0, not negative, in
    the counter too. Mutation: `max(0.0, time_share - sm)` -> `time_share - sm`."""
    accountant = WorkloadAccountant()
    job = [Holdings(gpus={GPU0.uuid: {JOB: Held(1.0, EVEN_SPLIT)}}, owners={417: JOB})]
    tel = DeviceTelemetry(GPU0, 0.0, processes=(ProcessUtilization(417, "python3", 0.5, 0.0),),
                          compute_processes=(ComputeProcess(417, "python3", "time_sliced"),))
    gpu = GpuView(GPU0, tel, 0.5, None, None, SpatialReading("gpm", 0.0, 1.0, sm_active=0.6), None, (), "exclusive")
    for now in (100.0, 110.0):
        (work,) = accountant.update(now, (gpu,), job)
    assert (work.time_share, work.sm_active) == (0.5, 0.6)
    assert work.counters["hidden_idle"] == {"exact": 0.0}


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
