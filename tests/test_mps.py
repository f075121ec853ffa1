"""MPS collector against a fake proc tree (tests/fixtures/proc), node_exporter style."""
import shutil
import time

import pytest

from exporter.samplers.mps import MpsSampler, StatError, parse_stat
from tests.helpers import FIXTURES

PROC = FIXTURES / "proc"
FAKE_CONTROL = str(FIXTURES / "fake-mps-control")


def sampler(root=PROC, **kw) -> MpsSampler:
    kw.setdefault("control_binary", FAKE_CONTROL)
    return MpsSampler(root, **kw)


def by_pid(snapshot):
    return {d.pid: d for d in snapshot.daemons}


def test_finds_control_and_servers_by_argv0_since_comm_is_cut_at_15_characters():
    s = sampler()
    s.tick()
    daemons = by_pid(s.snapshot)
    assert {pid: d.role for pid, d in daemons.items()} == {101: "control", 202: "server", 303: "server"}
    server = daemons[202]
    assert (server.major_faults, server.minor_faults) == (250, 48000)
    assert server.resident_bytes == 81920 * 1024 and server.swap_bytes == 2048 * 1024
    assert server.cpu_seconds == pytest.approx((900 + 300) / 100)
    assert server.start_time == pytest.approx(1795320000 + 1500 / 100)
    assert server.user == "54321" and daemons[101].user == "root"


def test_zombies_garbage_and_vanished_daemons_are_skipped():
    s = sampler()
    s.tick()
    pids = set(by_pid(s.snapshot))
    assert 505 not in pids  # zombie
    assert 606 not in pids  # garbage stat
    assert 707 not in pids  # gone before its status was read
    assert "pid 606" in s.health.error and not s.health.success


def test_clients_and_thread_percentage_from_the_control_pipe():
    s = sampler()
    s.tick()
    assert s.snapshot.clients == {"54321": 3, "54322": 1}
    assert s.snapshot.default_active_thread_percentage == 100.0
    assert s.snapshot.control_reachable


def test_a_hung_control_daemon_times_out_without_blocking():
    s = sampler(control_binary=str(FIXTURES / "hung-mps-control"), timeout=0.5)
    started = time.monotonic()
    s.tick()
    assert time.monotonic() - started < 15  # the 0.5 s timeout, not the daemon's 30 s silence (generous: CI is busy)
    assert "did not answer" in s.snapshot.control_error
    assert s.snapshot.clients == {} and not s.snapshot.control_reachable
    assert s.snapshot.up("server")  # the /proc side still works


def test_a_control_daemon_that_stops_answering_leaves_no_earlier_answer_behind():
    s = sampler(timeout=0.5)
    s.tick()
    assert s.snapshot.default_active_thread_percentage == 100.0
    s.control_binary, s._last_query = str(FIXTURES / "hung-mps-control"), float("-inf")
    s.tick()
    assert s.snapshot.clients == {} and s.snapshot.default_active_thread_percentage is None
    assert not s.snapshot.control_reachable


def test_missing_control_program_is_reported_not_raised():
    s = sampler(control_binary="/nonexistent/nvidia-cuda-mps-control")
    s.tick()
    assert "not found" in s.snapshot.control_error


def test_no_mps_is_a_normal_state(tmp_path):
    (tmp_path / "stat").write_text("btime 1795320000\n")
    s = sampler(tmp_path)
    s.tick()
    assert not s.snapshot.up("control") and not s.snapshot.up("server")
    assert s.health.success


def test_counters_never_go_back_within_one_daemons_life(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root)
    s = sampler(root)
    s.tick()
    stat = root / "202" / "stat"
    stat.write_text(stat.read_text().replace(" 48000 0 250 0 ", " 47000 0 240 0 "))  # a garbled lower read
    s.tick()
    assert by_pid(s.snapshot)[202].major_faults == 250
    assert by_pid(s.snapshot)[202].minor_faults == 48000


def test_major_fault_rate_over_ten_seconds_for_the_live_diagnosis(tmp_path, monkeypatch):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root)
    clock = [1000.0]
    monkeypatch.setattr("exporter.samplers.mps.time.monotonic", lambda: clock[0])
    s = sampler(root)
    s.tick()
    assert by_pid(s.snapshot)[202].major_faults_per_s is None  # no window yet
    stat = root / "202" / "stat"
    stat.write_text(stat.read_text().replace(" 48000 0 250 0 ", " 48000 0 300 0 "))
    clock[0] += 10
    s.tick()
    assert by_pid(s.snapshot)[202].major_faults_per_s == pytest.approx(5.0)  # 50 faults in 10 s
    clock[0] += 5
    s.tick()
    assert by_pid(s.snapshot)[202].major_faults_per_s == pytest.approx(5.0)  # kept until the next window ends
    clock[0] += 5
    s.tick()
    assert by_pid(s.snapshot)[202].major_faults_per_s == 0.0


def test_a_restarted_daemon_is_a_new_series_start(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root)
    s = sampler(root)
    s.tick()
    shutil.rmtree(root / "202")
    shutil.copytree(PROC / "202", root / "208")
    stat = (root / "208" / "stat").read_text().replace("202 (", "208 (").replace(" 48000 0 250 0 ", " 10 0 1 0 ")
    (root / "208" / "stat").write_text(stat.replace(" 0 1500 ", " 0 9000 "))
    s.tick()
    server = by_pid(s.snapshot)[208]
    assert server.major_faults == 1  # not held at the old daemon's 250
    assert server.start_time == pytest.approx(1795320000 + 90)


@pytest.mark.parametrize("comm", ["a b", "x) S 1 2 (", "))", "nvidia-cuda-mps", "", "🙂 emoji"])
def test_stat_parses_any_command_name(comm):
    fields = "S 1 2 2 0 -1 0 11 0 22 0 33 44 0 0 20 0 1 0 55 1 1"
    parsed = parse_stat(f"7 ({comm}) {fields}")
    assert parsed["comm"] == comm
    assert (parsed["minflt"], parsed["majflt"], parsed["utime"], parsed["stime"], parsed["starttime"]) == (11, 22, 33, 44, 55)


@pytest.mark.parametrize("text", ["", "7 nvidia", "7 (x) S 1 2", "7 (x) S 1 2 2 0 -1 0 a b c d e f g h i j k l m"])
def test_garbage_stat_raises_stat_error(text):
    with pytest.raises(StatError):
        parse_stat(text)


def test_unreadable_proc_root_is_a_failed_collector_not_a_crash(tmp_path):
    s = sampler(tmp_path / "missing")
    s.tick()
    assert not s.health.success and s.snapshot.daemons == ()
