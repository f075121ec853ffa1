"""Rules no other test held (issue 27, "Tests that guard"): each test here fails when its rule is
broken. The mutation each one catches is named in its docstring; bench/mutations.py applies them and
runs these tests (bench/RESULTS.md, "Mutation review").

Workload idle threshold and time-share clamp, the Slurm mapping directory's caps at their boundaries,
the cgroup cache forgetting a pid that left the GPU, MIG devices offered as replicas, the HiddenIdleSMs
thresholds at exactly 0.8 and 0.5 (promtool), and the HTTP idle and keep-alive deadlines (real exporter,
real sockets)."""
from __future__ import annotations

import http.client
import socket
import subprocess
import time
from collections import Counter

import pytest

import tests.synthetic_exports as synth
from exporter.samplers.cgroups import ProcFileOwners
from exporter.samplers.dcgm import DcgmExporterSource
from exporter.samplers.kubelet import DeviceMap, PodRef, held_shares, mig_holdings
from exporter.holders import EVEN_SPLIT, Held, Holdings
from exporter.samplers.slurm import MAX_FILE_BYTES, MAX_FILES, cgroup_job, read_mapping
from exporter.snapshot import ComputeProcess, DeviceTelemetry, GpuIdentity, GpuView, MigDevice, ProcessUtilization, \
    SpatialReading
from exporter.workloads import IDLE_TIME_SHARE, Holder, WorkloadAccountant, gpu_shares
from nsys_ingest.analysis import summarise
from nsys_ingest.reader import Export
from tests.helpers import FIXTURES, ROOT, Exporter, needs

GPU0 = GpuIdentity(0, "GPU-aaaa", "H100")
JOB = Holder(hpc_job="4242")


def view(processes: dict[int, float], time_utilization):
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
    gpu = view({417: time_share}, time_utilization=time_share)  # alone: its time share is the GPU's
    for now in (100.0, 102.0):
        (work,) = accountant.update(now, (gpu,), job)
    assert work.time_share == time_share
    assert (work.idle_seconds, work.held_idle) == ((2.0, True) if idle else (0.0, False))


def test_a_holders_time_share_never_exceeds_the_whole_gpu():
    """Without a GPU total to scale to, two processes of one job reading 0.7 each are one GPU, not 1.4.
    Mutation: the clamp of a time share to 1.0 dropped."""
    shares = gpu_shares(view({417: 0.7, 418: 0.7}, time_utilization=None), {JOB: 1.0}, {417: JOB, 418: JOB})
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


# -- exporter/samplers/kubelet.py ------------------------------------------------------------------------
def test_a_mig_device_offered_as_replicas_is_not_held_whole():
    """A 3g MIG device (60 of 132 SMs) that the device plugin offers twice (`MIG-big::0`, `::1`): a pod holding
    one replica holds half of its share, and its instance's SM activity is not the pod's alone.
    Mutations: replicas ignored for MIG devices (held whole), mig_holdings without the one-replica test."""
    gpu = GpuIdentity(0, "GPU-aaaa", "H100")
    tel = DeviceTelemetry(gpu, 0.0, mig_enabled=True, mig_devices=(MigDevice("MIG-big", 1, 0, 60),), mig_sm_count=132)
    devices = DeviceMap((gpu,), {gpu.uuid: tel})
    ref = PodRef("team-a", "train-0", "trainer")
    claims = [("MIG-big::0", gpu.uuid, ref)]
    offered = Counter({"MIG-big": 2})
    assert held_shares(claims, devices, offered) == {gpu.uuid: {("team-a", "train-0", "trainer"): round(60 / 132 / 2, 9)}}
    assert mig_holdings(claims, devices, offered) == {}
    whole = [("MIG-big", gpu.uuid, ref)]  # offered once: held whole, its instance's SMs are the pod's
    assert held_shares(whole, devices, Counter({"MIG-big": 1})) == {
        gpu.uuid: {("team-a", "train-0", "trainer"): round(60 / 132, 9)}}
    assert mig_holdings(whole, devices, Counter({"MIG-big": 1})) == {gpu.uuid: {("team-a", "train-0", "trainer"): ("MIG-big",)}}


# -- rules ---------------------------------------------------------------------------------------------
@needs("promtool")
def test_alert_thresholds_hold_at_their_boundaries():
    """tests/rules/thresholds.test.yaml. Mutations: HiddenIdleSMs `>= 0.8` -> `> 0.8`, `<= 0.5` -> `< 0.5`."""
    done = subprocess.run(["promtool", "test", "rules", "tests/rules/thresholds.test.yaml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# -- exporter/server.py --------------------------------------------------------------------------------
def test_a_silent_connection_closes_at_the_idle_timeout_not_the_header_timeout():
    """--http-idle-timeout 1s with --http-header-timeout 120s: a connection that never sends a byte is
    closed well before 60 s. Mutation: the idle deadline computed from the header timeout."""
    with Exporter("--no-nvml", "--no-mps", "--http-idle-timeout", "1", "--http-header-timeout", "120") as exporter:
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=60) as conn:
            assert conn.recv(1) == b""  # closed by the server (a timeout here raises)


def test_a_kept_alive_connection_lives_for_the_idle_timeout_not_uvicorns_default():
    """--http-idle-timeout 120s: a kept-alive connection still answers a second request 8 s after the
    first (uvicorn's own keep-alive timer defaults to 5 s). Mutation: uvicorn's timeout_keep_alive not
    set from --http-idle-timeout."""
    with Exporter("--no-nvml", "--no-mps", "--http-idle-timeout", "120") as exporter:
        conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)
        try:
            conn.request("GET", "/healthz")
            first = conn.getresponse()
            first.read()
            local = conn.sock.getsockname()
            time.sleep(8)  # longer than uvicorn's default, far shorter than the idle timeout asked for
            conn.request("GET", "/healthz")
            second = conn.getresponse()
            second.read()
            assert second.status == first.status == 200 and conn.sock.getsockname() == local  # the same connection
        finally:
            conn.close()


# -- survivors of this round's own mutation review (bench/mutations.py) ----------------------------------
def test_busy_but_idle_counts_gr_active_of_exactly_80_percent(tmp_path):
    """`summary`'s busy-but-idle share: GR active >= 0.8 and SM active <= 0.5, both at the boundary.
    Mutation: `gr >= BUSY_GR` -> `>`."""

    def share(gr, sm):
        path = synth.metric_phases(FIXTURES / "h100_diag_matmul.sqlite", tmp_path / f"{gr}_{sm}.sqlite",
                                   [(0, 2, {"GR Active": gr, "SMs Active": sm})])
        with Export(path) as export:
            (gpu,) = summarise(export)["gpus"]
        return gpu["busy_but_idle_share"]

    assert (share(80, 50), share(79, 50), share(80, 51)) == (1.0, 0.0, 0.0)


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


def test_dcgm_values_are_frozen_after_exactly_the_frozen_time():
    """Mutation: `now - first seen >= frozen_after_s` -> `>`."""
    source = DcgmExporterSource("http://127.0.0.1:9/metrics", frozen_after_s=30.0)
    values = {"sm_active": 0.25, "sm_occupancy": 0.1}
    assert not source._frozen("GPU-aaaa", values, 1000.0)  # first seen
    assert not source._frozen("GPU-aaaa", values, 1029.5)
    assert source._frozen("GPU-aaaa", values, 1030.0)  # exactly 30 s unchanged
    assert not source._frozen("GPU-aaaa", {**values, "sm_active": 0.26}, 1031.0)  # moved: the clock restarts
