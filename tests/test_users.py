"""Unix users as holders on a host without Kubernetes or Slurm: uid from /proc/PID/status under
--proc-root, name from the host's user database, held share 1/number of users with a context on the
GPU. The real exporter over HTTP replaying the H100 recorded with 4 time-sliced processes."""
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from exporter.holders import EVEN_SPLIT, Held, Holder
from hostio.files import read_capped
from exporter.samplers.users import MAX_STATUS_BYTES, parse_passwd, status_uid
from exporter.snapshot import ComputeProcess, DeviceTelemetry, GpuIdentity
from tests.helpers import FIXTURES, ROOT, Exporter, http_get, parse_metrics, wait_for
from tests.test_dra import Clock

PROC = FIXTURES / "proc_users"
FLAGS = ("--no-mps", "--interval", "0.2", "--kubelet-socket", "none")


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    """One frame of the recording (pids 417-420 at 30/10/40/20 % SM time, the GPU at 99 %)."""
    from exporter.nvml_replay import cut

    path = tmp_path_factory.mktemp("nvml") / "nvml.json"
    cut(FIXTURES / "nvml_h100_time_sliced.json", path, frame=0)
    return ("--nvml-replay", str(path), *FLAGS)


def test_uid_and_names():
    assert status_uid((PROC / "417" / "status").read_text()) == 1001
    assert status_uid("Name:\tx\nUid:\tabc\t1\n") is None and status_uid("") is None
    assert status_uid("Uid:\n") is None and status_uid("Uid:\t1001\n") == 1001  # no uid; the real one alone
    assert parse_passwd("root:x:0:0::/:/bin/sh\n# c\n+nis::::\nbad\nalice:x:1001:1001::/:/bin/sh\n"
                        "alice2:x:1001:1::/:/bin/sh\n") == {0: "root", 1001: "alice"}
    # three fields name a user; an empty name does not; a name is kept to 64 characters
    assert parse_passwd("carol:x:1002\n:x:1003:0::/:\n" + "d" * 65 + ":x:1004:0::/:\n") == {1002: "carol", 1004: "d" * 64}


def users_on_the_replayed_h100(proc):
    """A users sampler of one replayed frame (pids 417-420 with contexts) reading the proc tree `proc`."""
    from exporter.nvml_replay import ReplayNvml, cut
    from exporter.samplers.nvml import NvmlSampler
    from exporter.samplers.users import UsersSampler

    cut(FIXTURES / "nvml_h100_time_sliced.json", proc.parent / "nvml.json", frame=0)
    nvml = NvmlSampler(ReplayNvml(proc.parent / "nvml.json"))
    nvml.tick()
    return UsersSampler(nvml, proc_root=proc, passwd=str(proc / "1" / "root" / "etc" / "passwd"))


@pytest.mark.parametrize("uid, holds", [
    pytest.param("9" * 5000, False, id="5000-digits"),  # int() refuses 4,300 digits and more: it stopped the users source for every user
    ("4294967295", False), ("4294967294", True),  # (uid_t)-1 is no uid, the one below it is
    ("99999999999", False), ("²", False), ("٣", False),  # 11 digits; digits, but not ASCII ones
])
def test_a_uid_no_process_can_have_is_that_process_problem_alone(tmp_path, uid, holds):
    """Pid 420's /proc/PID/status names `uid`: the others still hold their GPU, 420 holds as that uid or
    not at all; a passwd line with such a uid is skipped, not the file."""
    from exporter.holders import Holder

    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    (proc / "420" / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    passwd = proc / "1" / "root" / "etc" / "passwd"
    passwd.write_text(f"huge:x:{uid}:0::/:/bin/sh\n" + passwd.read_text())
    sampler = users_on_the_replayed_h100(proc)
    sampler.tick()
    held = set(next(iter(sampler.holdings.gpus.values())))
    assert sampler.health.success and {Holder(user="alice"), Holder(user="bob")} <= held
    assert held - {Holder(user="alice"), Holder(user="bob")} == ({Holder(user="huge")} if holds else set())


def test_reads_are_capped_and_never_block_on_a_fifo(tmp_path):
    fifo = tmp_path / "status"
    os.mkfifo(fifo)
    done = []
    reader = threading.Thread(target=lambda: done.append(pytest.raises(OSError, read_capped, fifo, 100)), daemon=True)
    reader.start()
    reader.join(10)
    assert done, "read_capped blocked on a FIFO"
    big = tmp_path / "big"
    big.write_bytes(b"x" * (MAX_STATUS_BYTES * 4))
    assert len(read_capped(big, MAX_STATUS_BYTES, truncate=True)) == MAX_STATUS_BYTES


def workloads(exporter):
    status, body = http_get(exporter.url + "/api/v1/workloads")
    assert status == 200
    return {w["user"]: w for w in json.loads(body)["workloads"]}


def test_users_hold_the_gpu_they_have_contexts_on_over_http(tmp_path, frame):
    REPLAY = frame
    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    with Exporter(*REPLAY, "--proc-root", str(proc), "--held-idle-after", "1s") as exporter:
        # the SM basis needs the GPU's first spatial reading too: wait for it, never assume it came with the holders
        found = wait_for(lambda: (lambda w: len(w) == 3 and all(x["sm_active_basis"] for x in w.values()) and w)(
            workloads(exporter)), 15, 0.2, "three users with their SM basis")
        alice, bob, nameless = found["alice"], found["bob"], found["1003"]
        third = round(1 / 3, 9)
        assert (alice["held_share"], alice["held_share_basis"], alice["pids"]) == (third, "even_split", [417, 418])
        # GPM serves the GPU, so its busy time is GPM's GRAPHICS_UTIL (99.90552358 %), not NVML's samples (99 %):
        # alice 0.999055 x (30 + 10) / 100 = 0.399622, bob 0.999055 x 40 / 100, pid 420 0.999055 x 20 / 100
        assert alice["time_share"] == pytest.approx(0.399622) and bob["time_share"] == pytest.approx(0.399622)
        assert nameless["time_share"] == pytest.approx(0.199811) and nameless["pids"] == [420]
        assert alice["sm_active_basis"] == "time_share" and alice["namespace"] == alice["pod"] == ""
        samples = parse_metrics(exporter.metrics())
        assert {l["user"]: v for l, v in samples["gpu_workload_held_share_ratio"]} == {
            "alice": third, "bob": third, "1003": third}
        assert {l["collector"]: v for l, v in samples["gpu_exporter_collector_success"]}["users"] == 1.0

        # A process's status turns into a FIFO (a hostile /proc): the tick goes on, that pid holds nothing.
        (proc / "420" / "status").unlink()
        os.mkfifo(proc / "420" / "status")
        exporter_restart = Exporter(*REPLAY, "--proc-root", str(proc))
        with exporter_restart as again:
            found = wait_for(lambda: len(workloads(again)) == 2 and workloads(again), 15, 0.2, "two users")
            assert set(found) == {"alice", "bob"} and found["alice"]["held_share"] == 0.5
            wait_for(lambda: "1 GPU process(es) not found under" in again.log(), 10, 0.2, "one line")
            assert "Traceback" not in again.log()


def test_without_a_user_database_users_are_their_uid_and_holders_can_be_chosen(tmp_path, frame):
    REPLAY = frame
    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    shutil.rmtree(proc / "1")
    with Exporter(*REPLAY, "--proc-root", str(proc)) as exporter:
        found = wait_for(lambda: len(workloads(exporter)) == 3 and workloads(exporter), 15, 0.2, "uids")
        assert set(found) == {"1001", "1002", "1003"}
        assert exporter.log().count("users are labelled by uid") == 1
    passwd = tmp_path / "passwd"
    passwd.write_text("carol:x:1001:1001::/:/bin/sh\n")
    with Exporter(*REPLAY, "--proc-root", str(proc), "--passwd", str(passwd)) as exporter:
        assert set(wait_for(lambda: len(workloads(exporter)) == 3 and workloads(exporter), 15, 0.2, "names")) == \
            {"carol", "1002", "1003"}
    with Exporter(*REPLAY, "--proc-root", str(proc), "--holders", "none") as exporter:
        wait_for(lambda: exporter.gpus()["gpus"], 15, 0.2, "a snapshot")
        samples = parse_metrics(exporter.metrics())
        assert "gpu_workload_held_share_ratio" not in exporter.metrics() and "users" not in {
            l["collector"] for l, _ in samples["gpu_exporter_collector_success"]}
    # On a replay read against this host's /proc, the recording's pids are nobody's here: no users.
    with Exporter(*REPLAY) as exporter:
        wait_for(lambda: exporter.gpus()["gpus"], 15, 0.2, "a snapshot")
        assert "users as holders: off for an NVML replay" in exporter.log()


@pytest.mark.parametrize("flag, message", [
    ("slurm", "--holders slurm needs --hpc-job-mapping-dir"),
    ("users,pods", "want auto, none or a list of distinct kinds"),
])
def test_bad_holder_choices_are_one_line(flag, message):
    replay = ("--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), *FLAGS)
    done = subprocess.run([sys.executable, "-m", "exporter", "--holders", flag, "--port", "0", *replay],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_the_readmes_users_replay_reports_no_row_above_what_existed(tmp_path, capsys, monkeypatch):
    """The README's tour, rerun (issue 35): the whole H100 recording, users alice, bob and uid 1003, a real
    Prometheus scraping every second, `gpu-spatial report --by user`. The old account printed alice busy at
    168% and waste above the GPU-hours; now the GPU ledger's cells add up to the GPU-hours that existed
    (0.1%), no user's physical row exceeds them, and total waste stays within them. Used of held (the
    allocation view) may exceed 100%: it is labelled as such, never added to the ledger."""
    from tests.helpers import Prometheus
    from tests.test_report import run_report

    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    with Exporter("--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), *FLAGS, "--proc-root", str(proc),
                  "--held-idle-after", "1m") as exporter:
        wait_for(lambda: len(workloads(exporter)) == 3, 15, 0.2, "three users")
        prom = Prometheus(tmp_path, {"gpu": [exporter.url.removeprefix("http://")]})
        try:
            def scraped(count):
                found = prom.query("count_over_time(gpu_ledger_observed_seconds_total[1h])")
                return found and float(found[0]["value"][1]) >= count
            wait_for(lambda: scraped(10), 40, 0.5, "ten scrapes of the ledger")
            code, out, err = run_report(capsys, "--prometheus", prom.url, "--last", "1h", "--by", "user",
                                        "--source", "counters", "--format", "json")
            assert code == 0, err
            document = json.loads(out)
            monkeypatch.setenv("COLUMNS", "200")  # every column of the text table
            code, text, err = run_report(capsys, "--prometheus", prom.url, "--last", "1h", "--by", "user",
                                         "--source", "counters")
            assert code == 0, err
        finally:
            prom.stop()
    ledger = document["gpu_ledger"]
    existed = ledger["existed_gpu_hours"]
    assert ledger["gpus"] == 1 and existed > 0
    assert ledger["unobserved_gpu_hours"] <= 2 / 3600  # its exporter ran all along (to a scrape at each edge)
    assert ledger["cells_sum_gpu_hours"] == pytest.approx(existed, rel=1e-3)
    assert ledger["waste_gpu_hours"] <= existed
    users = {g["name"]: g for g in document["groups"]}
    assert set(users) == {"alice", "bob", "1003"}
    for row in [*users.values(), document["total"]]:
        assert row["ledger"]["gpu_hours"] <= existed * (1 + 1e-3), row
        assert row["waste_gpu_hours"] <= row["ledger"]["gpu_hours"] + 1e-9
    assert document["total"]["ledger"]["gpu_hours"] <= existed * (1 + 1e-3)
    # the text shows both views under their own names, and no row's "of what existed" above 100%
    header = next(line for line in text.splitlines() if line.lstrip().startswith("user"))
    assert header.split()[-1] == "existed" and "used/held" in header.split()
    assert "used/held: share of its held time in which its kernels ran (above 100%" in " ".join(text.split())
    shares = [float(line.split()[-1].rstrip("%")) for line in text.splitlines()
              if line.split() and line.split()[0] in {"alice", "bob", "1003", "(all)"}]
    assert len(shares) == 4 and max(shares) <= 100.0, text


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
