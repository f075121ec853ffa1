"""Files on the host that anyone may have put there (issue 25, items 8-11, and the tick deadline):
FIFOs, devices, huge files and link loops where regular files belong, and log lines that quote
them. Each attack runs against real files, the real exporter over HTTP or the real engine threads."""
from __future__ import annotations

import logging
import os
import time

import pytest

from hostio.files import FileTooLarge, NotRegularFile, read_capped
from tests.helpers import FIXTURES, Exporter, sample_value, wait_for
from tests.test_faults import Scraper, log_lines, samples
from tests.test_workloads import workloads

SLICED = FIXTURES / "nvml_h100_time_sliced.json"
JOB = ("", "", "", "4242")


# -- the one helper every sampler reads host files with ------------------------------------------------
def test_read_capped_refuses_what_is_not_a_regular_file_and_stops_at_its_cap(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_bytes(b"x" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for path, kind in ((tmp_path / "fifo", "a FIFO"), ("/dev/zero", "a character device"), (tmp_path, "a directory"),
                       (tmp_path / "link", "a symbolic link"), (tmp_path / "loop", "a symbolic link")):
        with pytest.raises(NotRegularFile, match=kind):
            read_capped(path, 10)
    assert read_capped(tmp_path / "file", 100) == b"x" * 100  # the boundary: exactly the cap is fine
    with pytest.raises(FileTooLarge, match="larger than 99 bytes"):
        read_capped(tmp_path / "file", 99)
    assert read_capped(tmp_path / "file", 99, truncate=True) == b"x" * 99
    assert read_capped(tmp_path / "link", 100, follow=True) == b"x" * 100
    assert read_capped("/proc/self/stat", 4096).startswith(str(os.getpid()).encode())  # procfs files are regular


# -- item 8: a FIFO in the Slurm mapping directory ------------------------------------------------------
def slurm_node(tmp_path):
    from exporter.nvml_replay import cut

    cut(SLICED, tmp_path / "nvml.json", frame=0)
    proc = tmp_path / "proc"
    (proc / "417").mkdir(parents=True)
    (proc / "417" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    mapping = tmp_path / "map"
    mapping.mkdir()
    (mapping / "0").write_text("4242\n")
    return proc, mapping, ("--nvml-replay", str(tmp_path / "nvml.json"), "--no-mps", "--interval", "0.2",
                           "--kubelet-socket", "none", "--proc-root", str(proc), "--hpc-job-mapping-dir", str(mapping))


def slurm_success(exporter):
    return sample_value(samples(exporter), "gpu_exporter_collector_success", collector="slurm")


def test_a_fifo_in_the_slurm_mapping_directory_never_blocks_and_its_job_goes(tmp_path):
    _, mapping, args = slurm_node(tmp_path)
    with Exporter(*args) as exporter, Scraper(exporter):
        wait_for(lambda: JOB in workloads(exporter) and slurm_success(exporter) == 1, 15, 0.2, "job 4242 held")
        (mapping / "0").unlink()
        os.mkfifo(mapping / "0")  # nobody ever writes: open() without O_NONBLOCK would wait forever
        wait_for(lambda: not workloads(exporter) and slurm_success(exporter) == 0, 15, 0.2, "job gone, success 0")
        assert 'hpc_job="4242"' not in exporter.metrics()  # held_gpu_seconds_total too: nothing frozen
        time.sleep(1.0)  # five more ticks: still one line
        assert log_lines(exporter, "map/0: a FIFO, not a regular file: ignored") == 1
        (mapping / "0").unlink()
        (mapping / "0").write_text("4242\n")
        wait_for(lambda: JOB in workloads(exporter) and slurm_success(exporter) == 1, 15, 0.2, "job 4242 back")
    assert "Traceback" not in exporter.log()


# -- items 8 and 9: /proc/PID/{cgroup,stat} as a FIFO, a device or 300 MB, with MPS on ------------------
def test_fifos_devices_and_huge_files_under_proc_root_cost_nothing(tmp_path):
    proc, mapping, args = slurm_node(tmp_path)
    for pid in (418, 419, 420):  # processes NVML names: their cgroup is a FIFO, /dev/zero, 300 MB
        (proc / str(pid)).mkdir()
    os.mkfifo(proc / "418" / "cgroup")
    (proc / "419" / "cgroup").symlink_to("/dev/zero")
    with open(proc / "420" / "cgroup", "wb") as f:
        f.truncate(300 << 20)  # sparse: 300 MB to read, nothing on disk
    (proc / "stat").write_text("cpu 1 2 3 4\nbtime 1763794570\n")
    for pid, attack in ((500, "fifo"), (501, "zero"), (502, "huge")):  # their stat: a FIFO, /dev/zero, 300 MB
        (proc / str(pid)).mkdir()
        stat = proc / str(pid) / "stat"
        if attack == "fifo":
            os.mkfifo(stat)
        elif attack == "zero":
            stat.symlink_to("/dev/zero")
        else:
            with open(stat, "wb") as f:
                f.truncate(300 << 20)
    args = tuple(a for a in args if a != "--no-mps")
    with Exporter(*args, "--mps-control-binary", str(FIXTURES / "fake-mps-control")) as exporter, Scraper(exporter):
        found = wait_for(lambda: JOB in workloads(exporter) and workloads(exporter), 15, 0.2, "job 4242 from pid 417")
        assert found[JOB]["pids"] == [417]  # the others are unattributed, not hanging the first tick
        wait_for(lambda: sample_value(samples(exporter), "gpu_exporter_collector_success", collector="mps") is not None,
                 15, 0.2, "MPS sampled (not stuck at 'not sampled yet')")
        time.sleep(2.0)  # ten ticks of 300 MB files
        assert peak_rss_mb(exporter.proc.pid) < 150
        assert log_lines(exporter, "pid 500: a FIFO, not a regular file") == 1
    assert "Traceback" not in exporter.log()


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


# -- the tick deadline: a sampler stuck in the kernel (a FIFO, a hung NFS mount) ---------------------------
@pytest.mark.parametrize("failure", ["stuck", "raising"])
def test_a_stuck_or_raising_sampler_has_its_values_withdrawn_and_comes_back(tmp_path, caplog, failure):
    """The Slurm sampler on a mapping directory whose mount hangs (a FIFO opened blocking stands in for
    it), or whose tick raises (a RecursionError once escaped the kubelet's claim view): its jobs are
    gone from the published snapshot (past the deadline, or at once), never left standing for holders
    that may have left; its success is 0 and one line says so; when the tick returns or stops raising,
    a fresh tick publishes them again."""
    from exporter.engine import Engine
    from exporter.nvml_replay import ReplayNvml
    from exporter.samplers.gpm import GpmSource
    from exporter.samplers.nvml import NvmlSampler
    from exporter.samplers.slurm import SlurmSampler
    from exporter.workloads import WorkloadAccountant

    proc, mapping, _ = slurm_node(tmp_path)
    hang = tmp_path / "hang"
    os.mkfifo(hang)

    class FailingMount(SlurmSampler):
        failing = False

        def tick(self):
            if self.failing and failure == "raising":
                raise RecursionError("maximum recursion depth exceeded")
            if self.failing:
                with open(hang, "rb") as f:  # blocks until a writer opens the FIFO
                    f.read()
                self.failing = False
            super().tick()

    nvml = NvmlSampler(ReplayNvml(tmp_path / "nvml.json"), interval=0.1)
    slurm = FailingMount(str(mapping), nvml, proc_root=str(proc), interval=0.1)
    engine = Engine(nvml, [GpmSource(nvml), slurm], interval=0.1, workloads=WorkloadAccountant())
    engine.tick_deadline = 1.0
    jobs = lambda: {w.holder.hpc_job for w in engine.snapshot.workloads}
    caplog.set_level(logging.INFO, logger="exporter.engine")
    engine.start()
    try:
        wait_for(lambda: jobs() == {"4242"} and engine.snapshot.health["slurm"].success, 15, 0.05, "job held")
        slurm.failing = True
        wait_for(lambda: "slurm" not in engine.snapshot.published, 15, 0.05, "values withdrawn")
        assert jobs() == set() and not engine.snapshot.health["slurm"].success
        why = {"stuck": "tick stuck for more than 1 s", "raising": "tick failed: RecursionError"}[failure]
        assert why in engine.snapshot.health["slurm"].error
        assert engine.snapshot.health["nvml"].success  # the other loops go on
        version = engine.snapshot.version
        wait_for(lambda: engine.snapshot.version > version + 10, 15, 0.05, "snapshots still published")
        assert jobs() == set() and "slurm" not in engine.snapshot.published
        assert len([r for r in caplog.records if f"sampler slurm: {why}" in r.getMessage()]) == 1
        if failure == "stuck":
            with open(hang, "wb"):  # the mount answers again
                pass
        slurm.failing = False
        wait_for(lambda: jobs() == {"4242"} and engine.snapshot.health["slurm"].success, 15, 0.05, "job back")
        assert [r.getMessage() for r in caplog.records if r.getMessage() == "sampler slurm: recovered"]
    finally:
        engine.stop()


# -- item 10: a symbolic link loop named x.sqlite in the watch directory --------------------------------
def test_a_link_loop_in_the_watch_directory_is_skipped_and_the_export_beside_it_published(tmp_path):
    watch = tmp_path / "watch"
    watch.mkdir()
    (watch / "x.sqlite").symlink_to(watch / "x.sqlite")
    os.mkfifo(watch / "y.sqlite")
    good = watch / "good.sqlite"
    good.write_bytes((FIXTURES / "hostile" / "wal_mode.sqlite").read_bytes())
    os.utime(good, (time.time() - 100, time.time() - 100))
    with Exporter("--no-nvml", "--no-mps", "--nsys-watch-dir", str(watch), "--interval", "0.2") as exporter, \
            Scraper(exporter):
        wait_for(lambda: "published the last 5.0 s of good.sqlite" in exporter.log(), 15, 0.2, "the good export")
        time.sleep(1.0)
        assert log_lines(exporter, "skipped in", "x.sqlite (Too many levels of symbolic links)",
                         "y.sqlite (not a regular file)") == 1
        assert exporter.gpus()["collectors"]["nsys"]["success"]
    assert "Traceback" not in exporter.log()


# -- item 11: what a log line quotes is escaped and capped -----------------------------------------------
def test_a_path_with_a_newline_cannot_forge_a_log_line(tmp_path):
    _, mapping, args = slurm_node(tmp_path)
    (mapping / "0\nERROR forged: the exporter is down").write_text("4242\n")
    (mapping / ("9" * 1_000_000)[:200]).write_text("1\n")  # a long name: NAME_MAX is 255, paths are capped too
    with Exporter(*args) as exporter:
        wait_for(lambda: "no GPU" in exporter.log(), 15, 0.2, "the bad names logged")
        time.sleep(0.5)
        log = exporter.log()
    assert "\nERROR forged" not in log and "0\\nERROR forged: the exporter is down" in log
    assert "Traceback" not in log


def test_log_once_escapes_caps_and_treats_alike_past_the_cap_as_one_problem(caplog):
    from exporter.snapshot import MAX_LOGGED_CHARS, LogOnce

    logger = logging.getLogger("test.logonce")
    caplog.set_level(logging.INFO, logger="test.logonce")
    once = LogOnce(logger)
    once.problem("kubelet\nattribution", "IDs " + "a" * 1_000_000 + "\x1b[2J")
    once.problem("kubelet\nattribution", "IDs " + "a" * 500_000 + "b" + "a" * 500_000 + "\x1b[2J")  # differs in the cut
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, [len(line) for line in lines]
    assert "\n" not in lines[0] and "\x1b" not in lines[0] and len(lines[0]) < MAX_LOGGED_CHARS + 300
    assert f"aaa [... cut to {MAX_LOGGED_CHARS} characters ...] aaa" in lines[0] and lines[0].endswith("a\\x1b[2J")
    assert lines[0].startswith("kubelet\\nattribution: IDs aaa")
    once.problem("x", "a" * MAX_LOGGED_CHARS)  # at the cap: whole, no note
    assert caplog.records[-1].getMessage() == "x: " + "a" * MAX_LOGGED_CHARS


def test_a_kubelet_answering_1_mb_device_ids_writes_short_log_lines(tmp_path):
    """Each List answers a new 1 MB device ID (before: one 15 MB line per change): every line stays under
    the cap, and the exporter keeps serving."""
    from tests.kubelet_server import GPU, kubernetes_node, pod

    server, args = kubernetes_node(tmp_path)
    calls = []

    def huge_ids(request, context):
        calls.append(1)
        return pb.ListPodResourcesResponse(pod_resources=[
            # just under the answer's 1 MiB cap (--kubelet-max-answer-bytes): an answer the source reads
            pod("team-a", "p", {"c": [(GPU, [f"{len(calls):08d}" + "x" * ((1 << 20) - 4096)])]})])

    from exporter.kubelet import podresources_pb2 as pb

    server.service.List = huge_ids
    server.start()
    try:
        with Exporter(*args, "--no-mps") as exporter, Scraper(exporter) as scraper:
            wait_for(lambda: len(calls) >= 4 and exporter.log().count("kubelet attribution") >= 2, 30, 0.2,
                     "answers with new IDs logged")
            wait_for(lambda: scraper.count > 20, 30, 0.1, "scrapes meanwhile")
            log = exporter.log()
    finally:
        server.stop()
    lines = [line for line in log.splitlines() if "kubelet attribution" in line]
    assert all(line.endswith("is no GPU on this node") for line in lines)  # the end of the message is kept
    assert lines and max(map(len, lines)) < 2500, (log[:3000], [len(line) for line in lines])
    assert len(log) < 100_000 and "Traceback" not in log
