"""The exporter's cupti source (exporter/samplers/cupti.py): what it accepts from a traced MPS client, the
channel over a real Unix socket with the real client (gpu_trace.client) replaying recorded CUPTI records,
and attacks from other processes (another pid, oversized, garbage, dripping, numbers too large for a float,
1,000 connections from one process, a user's many processes, a socket kept after its process exited)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporter import vocabulary as V
from exporter.samplers import cupti as source_module
from exporter.samplers.cupti import BadReport, ClientReport, CuptiSource, DeviceReport, gpu_windows, parse_report
from gpu_trace.client import Client
from gpu_trace.tracer import Tracer
from tests.test_gpu_trace import UUID, ReplayCupti, window

ROOT = Path(__file__).resolve().parent.parent
OTHER_GPU = "GPU-00000000-0000-0000-0000-000000000001"
GPUS = frozenset({UUID, OTHER_GPU})
NVML = SimpleNamespace(gpus=[SimpleNamespace(uuid=UUID, index=0), SimpleNamespace(uuid=OTHER_GPU, index=1)])


def report(**overrides) -> bytes:
    body = {"window": 3, "pid": 100, "start": 1000.5, "end": 1010.5,
            "devices": [{"uuid": UUID, "kernels": 5, "kernel_busy_s": 4.0, "sm_seconds": 2.0, "copy_busy_s": 0.5}]}
    body.update(overrides)
    return json.dumps(body).encode()


def parse(line: bytes, pid: int = 100) -> ClientReport:
    return parse_report(line, pid, 3, asked_at=1000.0, asked_s=10.0, now=1011.0, gpus=GPUS)


# -- what is accepted ----------------------------------------------------------------------------------
def test_a_good_report_becomes_the_clients_unscaled_shares_of_its_window():
    got = parse(report())
    assert got == ClientReport(100, 1000.5, 1010.5, {UUID: DeviceReport(4.0, 2.0, 0.5, 5)})
    [(uuid, win)] = gpu_windows([got]).items()
    assert uuid == UUID and win.basis == V.CUPTI and (win.window_start, win.window_end) == (1000.5, 1010.5)
    assert win.listed == frozenset({100}) and win.shares[100].time == 0.4 and win.shares[100].sm == 0.2


def test_a_report_claiming_someone_elses_pid_is_refused():
    with pytest.raises(BadReport, match="speaks for pid 1, but the socket's peer is pid 100"):
        parse(report(pid=1))


@pytest.mark.parametrize("overrides, why", [
    ({"window": 2}, "not the window asked"),
    ({"start": 997.9}, "start 997.9 outside"),  # more than START_SLACK_S before it was asked
    ({"end": 1012.1}, "end 1012.1 outside"),  # after now + 1 s
    ({"end": 1000.5}, "an empty window"),
    ({"devices": [{"uuid": UUID, "kernels": 1, "kernel_busy_s": 10.02, "sm_seconds": 0, "copy_busy_s": 0}]},
     "kernel_busy_s 10.02 outside"),  # busier than the window is long
    ({"devices": [{"uuid": UUID, "kernels": 1, "kernel_busy_s": 1.0, "sm_seconds": 1.01, "copy_busy_s": 0}]},
     "sm_seconds 1.01 outside"),  # more SM-seconds than busy seconds: more than the whole GPU
    ({"devices": [{"uuid": UUID, "kernels": True, "kernel_busy_s": 1.0, "sm_seconds": 1, "copy_busy_s": 0}]},
     "kernels is not a number"),
    ({"devices": [{"uuid": UUID, "kernels": 1, "kernel_busy_s": float("nan"), "sm_seconds": 0, "copy_busy_s": 0}]},
     "kernel_busy_s is not a number"),
    ({"devices": [{"uuid": "GPU-ffffffff-0000-0000-0000-000000000000", "kernels": 0, "kernel_busy_s": 0,
                   "sm_seconds": 0, "copy_busy_s": 0}]}, "not a GPU of this host"),
    ({"devices": [{"uuid": "../../etc", "kernels": 0}]}, "without a GPU UUID"),
    ({"devices": [{}] * 17}, "at most 16"),
    ({"end": 1000.4}, "end 1000.4 outside"),  # before its start
    ({"start": 998.0, "end": 1010.1}, "end 1010.1 outside"),  # past start + the window + 2 s (now + 1 s is later)
    ({"devices": [{"uuid": UUID, "kernels": 1, "kernel_busy_s": -1e-9, "sm_seconds": 0, "copy_busy_s": 0}]},
     "kernel_busy_s -1e-09 outside"),
    ({"devices": [{"uuid": UUID, "kernels": 1, "kernel_busy_s": 1, "sm_seconds": 0, "copy_busy_s": 10.011}]},
     "copy_busy_s 10.011 outside"),  # the window is 10 s: 10.01 with the float slack
    ({"devices": [{"uuid": UUID, "kernels": 10**12 + 1, "kernel_busy_s": 1, "sm_seconds": 0, "copy_busy_s": 0}]},
     "kernels 1e+12 outside"),
    ({"devices": [{"uuid": UUID, "kernels": 1.5, "kernel_busy_s": 1, "sm_seconds": 0, "copy_busy_s": 0}]},
     "kernels 1.5 is not a whole number"),
    ({"devices": [{"uuid": UUID, "kernels": 1, "kernel_busy_s": 1, "sm_seconds": 0, "copy_busy_s": 0}] * 2},
     f"{UUID} reported twice"),
    # JSON's integers have no bound and 1e400 reads as infinity: neither may reach the arithmetic
    ({"start": 10**400}, "start is too large for a number"),
    ({"devices": [{"uuid": UUID, "kernels": 10**400, "kernel_busy_s": 1, "sm_seconds": 0, "copy_busy_s": 0}]},
     "kernels is too large for a number"),
    ({"devices": [{"uuid": UUID, "kernels": 1, "kernel_busy_s": 1, "sm_seconds": -10**400, "copy_busy_s": 0}]},
     "sm_seconds is too large for a number"),
])
def test_a_report_out_of_bounds_is_refused(overrides, why):
    with pytest.raises(BadReport, match=re.escape(why)):
        parse(report(**overrides))


def test_the_bounds_themselves_are_accepted():
    # start 2 s before the ask; end at start + the window + 2 s; busy, SM and copies the whole window
    edge = report(start=998.0, end=1010.0, devices=[{"uuid": UUID, "kernels": 0, "kernel_busy_s": 12.0,
                                                      "sm_seconds": 12.0, "copy_busy_s": 12.0}])
    assert parse(edge).devices[UUID].sm_seconds == 12.0
    late = report(start=1002.0, end=1011.0)  # the end bound is now + 1 s here, not start + 12 s
    assert parse(late).end == 1011.0


def test_sixteen_gpus_are_read():
    gpus = [f"GPU-00000000-0000-0000-0000-{n:012x}" for n in range(16)]
    line = report(devices=[{"uuid": uuid, "kernels": 1, "kernel_busy_s": 1, "sm_seconds": 0, "copy_busy_s": 0}
                           for uuid in gpus])
    assert len(parse_report(line, 100, 3, 1000.0, 10.0, 1011.0, frozenset(gpus)).devices) == 16


def test_a_float_literal_past_the_range_is_refused_not_inf():
    with pytest.raises(BadReport, match="end is not a number"):
        parse(report().replace(b'"end": 1010.5', b'"end": 1e400'))


def test_a_whole_count_given_as_a_float_is_kept_as_its_integer():
    got = parse(report(devices=[{"uuid": UUID, "kernels": 1e12, "kernel_busy_s": 1, "sm_seconds": 0,
                                 "copy_busy_s": 0}]))
    assert got.devices[UUID].kernels == 10**12 and isinstance(got.devices[UUID].kernels, int)


def test_an_sm_share_past_one_by_the_float_slack_is_clamped_to_one():
    # busy 10.009 s and SM-seconds 10.019 in a 10 s window pass the slack of the bounds: 1.0019 of the GPU
    got = parse(report(start=1000.0, end=1010.0, devices=[{"uuid": UUID, "kernels": 1, "kernel_busy_s": 10.009,
                                                            "sm_seconds": 10.019, "copy_busy_s": 0}]))
    share = gpu_windows([got])[UUID].shares[100]
    assert (share.time, share.sm) == (1.0, 1.0)


def test_garbage_and_deep_nesting_are_refused_not_raised():
    for line in (b"\xff\xfe", b"[" * 20000, b"42", b'{"pid": 100, "window": 3, "devices": "x", "start": 1000.5, '
                 b'"end": 1001}'):
        with pytest.raises(BadReport):
            parse(line)


def test_a_client_that_cannot_trace_says_why_and_shares_nothing():
    got = parse(json.dumps({"window": 3, "pid": 100, "error": "no CUDA in this process yet"}).encode())
    assert got.error == "no CUDA in this process yet" and gpu_windows([got]) == {}


def test_two_clients_on_one_gpu_and_one_on_two():
    a = ClientReport(1, 0.0, 10.0, {UUID: DeviceReport(10.0, 5.0, 0, 9)})
    b = ClientReport(2, 0.1, 10.1, {UUID: DeviceReport(5.0, 4.0, 0, 9), OTHER_GPU: DeviceReport(0, 0, 0, 0)})
    windows = gpu_windows([a, b])
    assert windows[UUID].shares[1].time == 1.0 and windows[UUID].shares[1].sm == 0.5
    assert windows[UUID].shares[2].time == 0.5 and windows[UUID].shares[2].sm == 0.4
    assert (windows[UUID].window_start, windows[UUID].window_end) == (0.0, 10.1)
    assert windows[OTHER_GPU].listed == frozenset({2}) and windows[OTHER_GPU].shares[2].time == 0.0


# -- the channel, over a real socket --------------------------------------------------------------------
@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setattr(source_module, "REPLY_GRACE_S", 3.0)
    path = str(tmp_path / "run" / "cupti.sock")
    s = CuptiSource(NVML, path, window_s=0.0, period_s=60.0, max_clients=8)
    s.open()
    yield s
    s.close()


def connected(source, n: int = 1, timeout: float = 10.0):
    """Waits (by polling the listener, not by the clock of the code under test) for n connections."""
    import time

    deadline = time.monotonic() + timeout
    while len(source._clients) < n and time.monotonic() < deadline:
        source._accept()
        time.sleep(0.01)
    assert len(source._clients) >= n


def test_no_client_is_standby_and_the_socket_is_open_to_every_local_user(source):
    source.tick()
    assert source.health.success and source.state(UUID, 0).state == V.STANDBY
    assert "no tracing client" in source.state(UUID, 0).reason and source.fresh(UUID, 0) is None
    assert os.stat(source.path).st_mode & 0o777 == 0o666


def test_the_real_client_replaying_recorded_cupti_records_gives_its_window(source, caplog):
    """gpu_trace's client thread with the tracer on recorded H200 records, against the source: the pid
    the source keeps is the socket peer's (this process), the shares are the recorded window's; the debug
    log names the client's own window (bench/cupti_accuracy.py counts each client's truth over it)."""
    caplog.set_level(logging.DEBUG, logger=source_module.__name__)
    w = window("spin66")
    source.window_s = 2.0  # the recorded window's length: the client waits it out, as a real one does
    tracer = Tracer(ReplayCupti(w), settle_s=0)
    client = Client(source.path, tracer_factory=lambda: tracer, cuda_check=lambda: True)
    client.start()
    try:
        connected(source)
        source.tick()
    finally:
        client.stop.set()
    win = source.fresh(UUID, now=win_end(source))
    assert win is not None and set(win.shares) == {os.getpid()}
    share = win.shares[os.getpid()]
    lo, hi = w["stamps"]
    expected = Tracer(ReplayCupti(w), settle_s=0).trace(0)["devices"][0]
    length = client_window_length(source)
    assert share.time == round(expected["kernel_busy_s"] / length, 6)
    assert share.sm == round(expected["sm_seconds"] / length, 6) and share.sm == pytest.approx(share.time / 2, abs=2e-6)
    state = source.state(UUID, win.window_end)
    assert state.state == V.ACTIVE and state.reason.startswith("1 client(s) traced")
    assert source.state(OTHER_GPU, win.window_end).state == V.STANDBY
    assert f"cupti window 1: pid {os.getpid()} traced {win.window_start:.6f} to {win.window_end:.6f}" in caplog.messages


def win_end(source):
    return source.readings[UUID].window_end


def client_window_length(source):
    win = source.readings[UUID]
    return win.window_end - win.window_start


def attacker(path: str, script: str, *args) -> subprocess.Popen:
    """Another process on the host talking to the socket (its pid is not ours)."""
    return subprocess.Popen([sys.executable, "-c", script, path, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


ANSWER_AS = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("connected", flush=True)
command = json.loads(s.makefile().readline())
body = sys.argv[2].replace("WINDOW", str(command["window"]))
s.sendall(body.encode()); s.recv(1)
"""


def logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == source_module.__name__]


def run_attack(source, script_body: str, caplog) -> list[str]:
    return run_attacker(source, caplog, ANSWER_AS, script_body)


def run_attacker(source, caplog, script: str, *args) -> list[str]:
    """One tick of `source` while another process runs `script` against its socket: what the source logged."""
    proc = attacker(source.path, script, *args)
    try:
        assert proc.stdout.readline() == "connected\n"
        connected(source)
        with caplog.at_level(logging.WARNING, logger=source_module.__name__):
            source.tick()
    finally:
        proc.kill()
        proc.wait()
    return logged(caplog)


def test_another_process_claiming_our_pid_is_refused_with_one_line(source, caplog):
    body = json.dumps({"window": 0, "pid": os.getpid(), "start": 0, "end": 1, "devices": []})
    lines = run_attack(source, body.replace('"window": 0', '"window": WINDOW') + "\n", caplog)
    assert len(lines) == 1 and f"speaks for pid {os.getpid()}, but the socket's peer is pid" in lines[0]
    assert source.readings == {} and source._clients == {} and source.refused == {"bad report": 1}


def test_an_oversized_report_is_cut_off_at_the_cap(source, caplog):
    lines = run_attack(source, "x" * 20000, caplog)
    assert lines == [f"cupti refused (oversized): pid {lines[0].split('pid ')[1].split(' ')[0]} (uid {os.getuid()}): "
                     "a report over 16384 bytes: report refused, disconnected"]
    assert source._clients == {}


def test_garbage_is_one_line_and_the_connection_goes(source, caplog):
    lines = run_attack(source, "\x7f\x01 not json\n", caplog)
    assert len(lines) == 1 and "not JSON" in lines[0] and source._clients == {}


def test_a_silent_or_dripping_client_is_disconnected_at_the_windows_deadline(source, caplog):
    drip = r"""
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("connected", flush=True)
s.makefile().readline()
for _ in range(1000):
    s.send(b"{"); time.sleep(0.05)
"""
    proc = attacker(source.path, drip)
    try:
        assert proc.stdout.readline() == "connected\n"
        connected(source)
        with caplog.at_level(logging.WARNING, logger=source_module.__name__):
            source.tick()  # returns at the window's deadline (0 s + the grace), not when the drip ends
    finally:
        proc.kill()
        proc.wait()
    lines = logged(caplog)
    assert len(lines) == 1 and "did not answer within the window" in lines[0] and source._clients == {}


REPORTER = r"""
import json, os, socket, sys, time
while True:  # as gpu_trace's client: connected again whenever the exporter hangs up
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError:
        time.sleep(0.05)
        continue
    print("connected", flush=True)
    for line in s.makefile("rb"):
        window, now = json.loads(line)["window"], time.time()
        body = sys.argv[2].replace("WINDOW", str(window)).replace("PID", str(os.getpid()))
        s.sendall(body.replace("START", repr(now)).replace("END", repr(now + 0.01)).encode() + b"\n")
    s.close()
"""
HALF_BUSY = [{"uuid": UUID, "kernels": 1, "kernel_busy_s": 0.005, "sm_seconds": 0.002, "copy_busy_s": 0}]


def reply(**fields) -> str:
    """REPORTER's answer: its window, its pid and a 10 ms window of now unless `fields` say otherwise."""
    body = {"window": "WINDOW", "pid": "PID", "start": "START", "end": "END", "devices": HALF_BUSY, **fields}
    text = json.dumps(body)
    for token in ("WINDOW", "PID", "START", "END"):
        text = text.replace(f'"{token}"', token)
    return text


@contextlib.contextmanager
def processes(path: str, script: str, *args, count: int = 1, **popen):
    """`count` processes running `script` against the socket at `path`, each past its first connect."""
    procs = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", script, path, *map(str, args)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, **popen))
            procs[-1].said = procs[-1].stdout.readline()
            assert procs[-1].said.startswith("connected")
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_number_too_large_for_a_float_is_that_clients_refusal_once_and_the_others_keep_theirs(source, caplog):
    """Issue 42: a 400-digit start made the whole tick raise OverflowError: every client's shares gone. Two
    windows; two clients send it (one line each, not one per window), one answers well."""
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    with processes(source.path, REPORTER, reply(start=10**400), count=2) as bad, \
            processes(source.path, REPORTER, reply()) as [good]:
        for _ in range(2):
            connected(source, 3)
            source.tick()
            assert source.health.success and set(source.fresh(UUID, source.clock()).shares) == {good.pid}
            assert source.fresh(UUID, source.clock()).shares[good.pid].time == pytest.approx(0.5, abs=1e-3)
    assert sorted(logged(caplog)) == sorted(f"cupti refused (bad report): pid {p.pid} (uid {os.getuid()}): start is too "
                                            "large for a number: report refused, disconnected" for p in bad)
    assert source.refused == {"bad report": 4}


def test_whatever_a_report_makes_of_the_parser_is_that_clients_refusal(source, caplog, monkeypatch):
    def broken(*args):
        raise ZeroDivisionError("a case no check foresaw")
    monkeypatch.setattr(source_module, "parse_report", broken)
    lines = run_attacker(source, caplog, REPORTER, reply())
    assert source.health.success and len(lines) == 1 and "bad report" in lines[0]
    assert lines[0].endswith("unreadable (ZeroDivisionError): report refused, disconnected")


FLOOD = r"""
import json, os, selectors, socket, sys
held, selector = [], selectors.DefaultSelector()
for _ in range(1000):
    s = socket.socket(socket.AF_UNIX); s.setblocking(False)
    try:
        s.connect(sys.argv[1]); held.append(s); selector.register(s, selectors.EVENT_READ)
    except OSError:
        s.close()  # the listener's backlog is full: the kernel refuses
print("connected", len(held), flush=True)
while True:  # every connection still open answers, with a valid error line (issue 42's attack)
    for key, _ in selector.select():
        try:
            line = key.fileobj.recv(4096)
        except OSError:
            line = b""
        if not line:
            selector.unregister(key.fileobj)
            continue
        window = json.loads(line)["window"]
        key.fileobj.sendall(json.dumps({"window": window, "pid": os.getpid(), "error": "no CUDA"}).encode() + b"\n")
"""


def test_one_process_holding_a_thousand_connections_keeps_one_and_the_next_client_is_traced(source, caplog):
    """Issue 42: 128 connections from one process, each answering an error line, locked every later client
    out. One connection per process (its newest): the flood holds one slot, said once, naming the pid."""
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    with processes(source.path, FLOOD) as [flood]:
        held = int(flood.said.split()[1])  # what the listener's backlog took, 129 here
        source._accept()
        assert held > 8 and [c.pid for c in source._clients.values()] == [flood.pid]
        assert source.refused == {"per process": held - 1}
        with processes(source.path, REPORTER, reply()) as [client]:
            connected(source, 2)
            source.tick()
    assert source.health.success and set(source.fresh(UUID, source.clock()).shares) == {client.pid}
    assert "1 client(s) cannot trace" in source.state(OTHER_GPU, source.clock()).reason
    assert logged(caplog) == [f"cupti refused (per process): pid {flood.pid} (uid {os.getuid()}): connected again: "
                              "its older connection is closed (one per process)"]


CONNECT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print("connected", flush=True); sys.stdin.read()
"""


@contextlib.contextmanager
def connection_of_user(path: str, uid: int):
    """A forked process of user `uid` (this one is root) holding a connection to `path` (no exec: the
    interpreter's folder need not be open to that user)."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(done_w)
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(path)
            os.write(ready_w, b"c")
            os.read(done_r, 1)  # until the parent closes its end
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        assert os.read(ready_r, 1) == b"c"
        yield pid
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def test_a_user_holds_at_most_its_share_of_the_connections(caplog):
    where = Path(tempfile.mkdtemp(prefix="cupti-"))  # under /tmp, open to every user as the real socket's folder
    os.chmod(where, 0o755)
    s = CuptiSource(NVML, str(where / "cupti.sock"), window_s=0.0, max_clients=3, max_per_user=2)
    s.open()
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    try:
        with processes(s.path, CONNECT, count=3) as procs:
            s._accept()  # each has connected (it said so): the third is refused
            assert sorted(c.pid for c in s._clients.values()) == sorted(p.pid for p in procs[:2])
            assert s.refused == {"per user": 1} and logged(caplog) == [
                f"cupti refused (per user): pid {procs[2].pid} (uid {os.getuid()}): uid {os.getuid()} already holds "
                "--cupti-max-clients-per-user 2 connections: closed"]
            s._drop(next(iter(s._clients.values())))  # one of the user's connections goes: room for one more
            with processes(s.path, CONNECT):
                s._accept()
            assert len(s._clients) == 2 and dict(s._per_user) == {os.getuid(): 2} and s.refused == {"per user": 1}
            if os.geteuid() == 0:  # another user still gets in
                with connection_of_user(s.path, 65534):
                    s._accept()
                    assert sorted(c.uid for c in s._clients.values()) == [os.getuid()] * 2 + [65534]
            for client in list(s._clients.values()):
                s._drop(client)
            assert s._per_user == {} and s._by_process == {}  # nothing kept of who has gone
    finally:
        s.close()
        shutil.rmtree(where)


def test_at_most_the_cap_of_connections_in_all(tmp_path, caplog):
    s = CuptiSource(NVML, str(tmp_path / "cupti.sock"), window_s=0.0, max_clients=2, max_per_user=3)
    s.open()
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    try:
        with processes(s.path, CONNECT, count=3) as procs:
            s._accept()
            assert len(s._clients) == 2 and s.refused == {"connections": 1}
            assert logged(caplog) == [f"cupti refused (connections): pid {procs[2].pid} (uid {os.getuid()}): "
                                      "--cupti-max-clients 2 connections are held: closed"]
    finally:
        s.close()


def test_refusals_already_said_are_remembered_up_to_a_bound(monkeypatch, caplog):
    monkeypatch.setattr(source_module, "MAX_REMEMBERED_REFUSALS", 2)
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    s = CuptiSource(NVML, "/nonexistent/cupti.sock")
    for pid in (1, 2, 1, 3, 2):  # 1 and 2 said; 1 again: known, now the newest; 3 said, 2 forgotten; 2 said again
        s._refuse("late", "silent", SimpleNamespace(who=f"pid {pid}"))
    assert [line.split(": ")[1] for line in logged(caplog)] == ["pid 1", "pid 2", "pid 3", "pid 2"]
    assert list(s._said) == [("late", "pid 3"), ("late", "pid 2")] and s.refused == {"late": 5}


FORKED = r"""
import json, os, socket, sys, time
held = {}
for _ in range(int(sys.argv[3])):
    s = socket.socket(socket.AF_UNIX)
    child = os.fork()
    if child == 0:  # each child connects (the socket's peer is its pid), then exits at a byte on stdin
        s.connect(sys.argv[1]); os.write(1, b"connected\n"); os.read(0, 1); os._exit(0)  # one write: no interleaving
    held[child] = s
for child in held:
    if sys.argv[2] == "reaped":
        os.waitpid(child, 0)
    else:  # left a zombie: its /proc/PID/stat stays, with state Z
        while open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
print("exited", flush=True)
child, s = next(iter(held.items()))
for line in s.makefile("rb"):  # the parent answers for its first child's pid, which SO_PEERCRED gave the socket
    now = time.time()
    s.sendall(json.dumps({"window": json.loads(line)["window"], "pid": child, "start": now, "end": now + 0.01,
                          "devices": []}).encode() + b"\n")
"""


@pytest.mark.parametrize("child", ["reaped", "zombie"])
def test_a_socket_kept_after_its_process_exited_speaks_for_no_one(source, caplog, child):
    """Issue 42: a child connects and exits, its parent keeps the socket and answers for the child's pid."""
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    with processes(source.path, FORKED, child, 1) as [parent]:
        connected(source)
        [peer] = [c.pid for c in source._clients.values()]
        os.write(parent.stdin.fileno(), b"g")
        assert parent.stdout.readline() == "exited\n"
        source.tick()
    assert peer != parent.pid and source._clients == {} and source.readings == {}
    assert logged(caplog) == [f"cupti refused (not its process): pid {peer} (uid {os.getuid()}): the process that "
                              "connected has exited (its pid may name another process now): report refused, disconnected"]


def test_the_slots_of_processes_that_exited_are_freed_before_anyone_is_refused(tmp_path, caplog):
    """One process fills its user's slots through children that connect and exit, keeping their sockets: a
    new process of that user is still let in, the exited children's connections closed, a live one kept."""
    s = CuptiSource(NVML, str(tmp_path / "cupti.sock"), window_s=0.0, max_clients=8, max_per_user=3)
    s.open()
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    try:
        with processes(s.path, CONNECT) as [live], processes(s.path, FORKED, "reaped", 2) as [parent]:
            assert parent.stdout.readline() == "connected\n"
            s._accept()
            children = sorted(c.pid for c in s._clients.values() if c.pid != live.pid)
            assert len(children) == 2 and parent.pid not in children
            os.write(parent.stdin.fileno(), b"gg")
            assert parent.stdout.readline() == "exited\n"
            with processes(s.path, CONNECT) as [newcomer]:
                s._accept()
                assert [c.pid for c in s._clients.values()] == [live.pid, newcomer.pid]
    finally:
        s.close()
    assert sorted(logged(caplog)) == [f"cupti refused (not its process): pid {pid} (uid {os.getuid()}): the process "
                                      "that connected has exited: its slot freed, disconnected" for pid in children]


def fake_proc(root: Path, pid: int, start_shift: int = 0) -> None:
    """`root`/PID/stat: the real process's stat, its start time (field 22) moved by `start_shift` ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
    rest = fields[1].split()
    rest[19] = str(int(rest[19]) + start_shift)
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{fields[0]}) {' '.join(rest)}\n")


def test_a_report_after_the_pid_names_another_process_is_refused(source, caplog, tmp_path):
    """The pid's reuse by another process, through a proc root this test controls: the same pid with a new
    start time. The connection's first window is the client's; its next, after the reuse, is refused."""
    source.proc_root = tmp_path / "proc"
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    with processes(source.path, REPORTER, reply()) as [client]:
        fake_proc(source.proc_root, client.pid)
        connected(source)
        source.tick()
        assert set(source.fresh(UUID, source.clock()).shares) == {client.pid} and logged(caplog) == []
        fake_proc(source.proc_root, client.pid, start_shift=1)
        source.tick()
    assert source.fresh(UUID, source.clock()) is None
    assert logged(caplog) == [f"cupti refused (not its process): pid {client.pid} (uid {os.getuid()}): the process "
                              "that connected has exited (its pid may name another process now): report refused, "
                              "disconnected"]


def test_a_connection_whose_process_cannot_be_read_is_closed(source, caplog, tmp_path):
    source.proc_root = tmp_path / "proc"  # empty: no process to bind the connection to
    caplog.set_level(logging.WARNING, logger=source_module.__name__)
    with processes(source.path, CONNECT) as [proc]:
        source._accept()
        assert source._clients == {} and source.refused == {"no process": 1}
    assert logged(caplog) == [f"cupti refused (no process): pid {proc.pid} (uid {os.getuid()}): no live process "
                              f"{proc.pid} under {source.proc_root} to bind the connection to: closed"]


def test_something_else_at_the_socket_path_is_an_error_not_removed(tmp_path):
    path = tmp_path / "cupti.sock"
    path.write_text("keep me")
    s = CuptiSource(NVML, str(path), window_s=0.0)
    good = gpu_windows([ClientReport(1, 0.0, 10.0, {UUID: DeviceReport(1.0, 1.0, 0.0, 1)})])
    s.readings, s.states = good, {UUID: None}  # the last good window, then the socket fails
    s.tick()
    assert not s.health.success and "exists and is not a socket" in s.health.error and path.read_text() == "keep me"
    assert s.state(UUID, 10.0).state == V.ERROR and s.fresh(UUID, 10.0) is None  # not served beside the error
    s.close()


def test_flags_refuse_a_window_over_half_the_period(capsys):
    from argparse import ArgumentParser

    parser = ArgumentParser()
    source_module.add_arguments(parser)
    args = parser.parse_args(["--workload-cupti", "--cupti-window", "31", "--cupti-period", "60"])
    assert "at most half of --cupti-period" in source_module.check_arguments(args)
    args = parser.parse_args(["--workload-cupti", "--cupti-window", "30", "--cupti-period", "60"])
    assert source_module.check_arguments(args) is None
    built = source_module.build(args, NVML)
    assert isinstance(built, CuptiSource) and (built.max_clients, built.max_per_user) == (128, 64)
    built = source_module.build(parser.parse_args(["--workload-cupti", "--cupti-max-clients", "9"]), NVML)
    assert (built.max_clients, built.max_per_user) == (9, 5)  # half, rounded up
    def per_user(value: str):
        return source_module.check_arguments(parser.parse_args(["--workload-cupti", "--cupti-max-clients-per-user", value]))
    assert "give 1 to --cupti-max-clients" in per_user("0") and "give 1 to --cupti-max-clients" in per_user("129")
    assert per_user("1") is None and per_user("128") is None
    assert source_module.build(parser.parse_args([]), NVML) is None


# -- the join: per-client shares of an MPS GPU, exact figures ---------------------------------------------
# (its imports stay with it, as the section it came from had them)
from exporter.holders import Held, Holdings  # noqa: E402 - the section's own imports
from exporter.sampler import ProcessShare, ProcessWindow  # noqa: E402 - the section's own imports
from exporter.snapshot import SpatialReading  # noqa: E402 - the section's own imports
from exporter.workloads import (CUPTI, EXACT, MPS_REASON, SmHistory, WorkloadAccountant, cupti_gpu,  # noqa: E402 - the section's own
                                gpu_shares)
from tests.test_workloads import GPU0, IDLE, NOTEBOOK, TRAINER, view  # noqa: E402 - the section's own imports

MPS = dict(processes={99: 1.0}, compute={99: "mps_server", 501: "mps", 502: "mps", 503: "mps"}, mode="mps")
MPS_OWNERS = {501: TRAINER, 502: TRAINER, 503: NOTEBOOK}
HOLDERS = {TRAINER: 0.5, NOTEBOOK: 0.25, IDLE: 0.25}


def clients(shares: dict, start=990.0, end=1000.0) -> ProcessWindow:
    return ProcessWindow(V.CUPTI, start, end, frozenset(shares),
                         {pid: ProcessShare(time=t, sm=sm) for pid, (t, sm) in shares.items()})


def test_clients_whose_estimates_exceed_the_gpus_sm_active_are_scaled_to_it():
    # estimates 0.5 + 0.3 + 0.4 = 1.2 against a measured 0.6 over the same window: each halved
    win = clients({501: (1.0, 0.5), 502: (0.4, 0.3), 503: (0.8, 0.4)})
    scaling = cupti_gpu(win, {501, 502, 503}, 0.6)
    assert (scaling.estimated, scaling.scale, scaling.unattributed, scaling.traced, scaling.untraced) == \
        (1.2, 0.5, 0.0, 3, 0)
    shares = gpu_shares(view(**MPS, sm_active=0.6), HOLDERS, MPS_OWNERS, None, None, win, scaling)
    trainer, notebook = shares[TRAINER], shares[NOTEBOOK]
    assert (trainer.time_share, trainer.time_share_basis, trainer.window) == (1.0, CUPTI, (990.0, 1000.0))
    assert (trainer.sm_estimate, trainer.sm_active, trainer.sm_active_basis) == (0.8, 0.4, CUPTI)
    assert (notebook.time_share, notebook.sm_estimate, notebook.sm_active) == (0.8, 0.4, 0.2)
    assert trainer.sm_active + notebook.sm_active == pytest.approx(0.6)  # never past the GPU's
    assert (shares[IDLE].sm_active, shares[IDLE].sm_active_basis) == (0.0, EXACT)


def test_estimates_under_the_gpus_sm_active_are_not_scaled_up():
    win = clients({501: (0.5, 0.2), 502: (0.5, 0.1), 503: (0.5, 0.1)})
    scaling = cupti_gpu(win, {501, 502, 503}, 0.5)
    assert (scaling.scale, scaling.unattributed) == (1.0, 0.1)
    shares = gpu_shares(view(**MPS, sm_active=0.5), HOLDERS, MPS_OWNERS, None, None, win, scaling)
    assert (shares[TRAINER].sm_active, shares[NOTEBOOK].sm_active) == (0.3, 0.1)


def test_a_holder_with_an_untraced_client_keeps_the_mps_reason_and_the_gpu_says_what_is_unattributed():
    win = clients({501: (0.6, 0.3), 503: (0.5, 0.25)})  # 502 (the trainer's second client) does not trace
    scaling = cupti_gpu(win, {501, 502, 503}, 0.75)
    assert (scaling.traced, scaling.untraced, scaling.estimated, scaling.unattributed) == (2, 1, 0.55, 0.2)
    shares = gpu_shares(view(**MPS, sm_active=0.75), HOLDERS, MPS_OWNERS, None, None, win, scaling)
    trainer, notebook = shares[TRAINER], shares[NOTEBOOK]
    assert trainer.time_share is None and trainer.sm_active is None and trainer.sm_estimate is None
    assert trainer.reason == (f"{MPS_REASON}; 1 of its clients do not trace their kernels (gpu-spatial trace: "
                                 "docs/mps-clients.md)")
    assert (notebook.time_share, notebook.sm_active, notebook.sm_active_basis) == (0.5, 0.25, CUPTI)


def test_a_report_for_a_gpu_the_process_is_not_on_changes_nothing():
    win = clients({501: (1.0, 0.5), 777: (1.0, 1.0)})  # 777: not an MPS client NVML lists on the GPU
    assert cupti_gpu(win, {501}, 0.5) == cupti_gpu(clients({501: (1.0, 0.5)}), {501}, 0.5)


def test_without_the_gpus_sm_active_over_the_window_no_scaled_value_is_published():
    win = clients({501: (1.0, 0.5), 503: (0.8, 0.4)})
    scaling = cupti_gpu(win, {501, 503}, None)
    shares = gpu_shares(view(**MPS, sm_active=0.6), HOLDERS, MPS_OWNERS, None, None, win, scaling)
    assert shares[NOTEBOOK].time_share == 0.8 and shares[NOTEBOOK].sm_estimate == 0.4
    assert shares[NOTEBOOK].sm_active is None and scaling.unattributed is None


def test_the_gpus_sm_active_is_averaged_over_the_clients_window_not_read_now():
    history = SmHistory(keep=3)
    for start, value in ((980, 0.9), (990, 0.2), (995, 0.6), (1000, 0.1)):  # 5 s readings; keep=3 drops 980
        history.add("GPU-a", SpatialReading("gpm", start, start + 5, sm_active=value))
    assert history.mean("GPU-a", 990, 1000) == pytest.approx(0.4)  # (0.2 + 0.6) / 2, not the latest 0.1
    assert history.mean("GPU-a", 992, 1002) == pytest.approx((3 * 0.2 + 5 * 0.6 + 2 * 0.1) / 10)
    assert history.mean("GPU-a", 970, 990) is None  # the kept readings cover none of it
    assert history.mean("GPU-a", 985, 995) == pytest.approx(0.2)  # exactly half covered: enough
    assert history.mean("GPU-a", 984, 995) is None  # under half
    history.add("GPU-a", SpatialReading("gpm", 1000, 1005, sm_active=0.7))  # the same window again: kept once
    assert history.mean("GPU-a", 1000, 1005) == pytest.approx(0.1)


class StubSource:
    """The cupti source as the accountant reads it (fresh windows), without a socket."""

    name, basis = "cupti", V.CUPTI

    def __init__(self, window):
        self.window = window

    def fresh(self, uuid, now):
        return self.window

    def state(self, uuid, now):
        from exporter.sampler import SourceState

        return SourceState(V.ACTIVE, "3 client(s) traced", self.window.window_start, self.window.window_end)


def test_the_accountant_counts_cupti_busy_and_sm_seconds_and_reports_the_gpu():
    win = clients({501: (1.0, 0.5), 502: (0.4, 0.3), 503: (0.8, 0.4)}, start=0.0, end=1.0)
    accountant = WorkloadAccountant(sources=[StubSource(win)])
    holdings = [Holdings({GPU0.uuid: {TRAINER: Held(0.5), NOTEBOOK: Held(0.5)}}, MPS_OWNERS)]
    accountant.update(1.0, [view(**MPS, sm_active=0.6)], holdings)  # GPM's [0, 1] reading: 0.6
    views = {w.holder: w for w in accountant.update(11.0, [view(**MPS, sm_active=0.6)], holdings)}
    trainer = views[TRAINER]
    assert (trainer.time_share, trainer.time_share_basis, trainer.sm_active, trainer.sm_active_basis,
            trainer.sm_estimate) == (1.0, CUPTI, 0.4, CUPTI, 0.8)
    assert trainer.counters["busy_basis"] == {CUPTI: 10.0} and trainer.counters["sm_active"] == {CUPTI: 4.0}
    [(gpu, scaling)] = accountant.cupti_gpus
    assert gpu == GPU0 and (scaling.gpu_sm_active, scaling.scale, scaling.window) == (0.6, 0.5, (0.0, 1.0))


def test_holders_folded_beyond_the_series_limit_keep_the_cupti_basis():
    win = clients({501: (1.0, 0.5), 502: (0.4, 0.3), 503: (0.8, 0.4)}, start=0.0, end=1.0)
    accountant = WorkloadAccountant(series_limit=1, sources=[StubSource(win)])
    holdings = [Holdings({GPU0.uuid: {TRAINER: Held(0.5), NOTEBOOK: Held(0.5)}}, MPS_OWNERS)]
    views = {w.holder.pod: w for w in accountant.update(1.0, [view(**MPS, sm_active=0.6)], holdings)}
    assert views["other"].time_share == 0.8 and views["other"].time_share_basis == CUPTI


# -- end to end: the real exporter and a client process ------------------------------------------------
H100_MPS = "GPU-0cc7d789-89a7-98d7-87e6-31b003867920"  # the GPU of tests/fixtures/nvml_h100_mps.json
CLIENT = r"""
import sys
from gpu_trace.client import Client
from gpu_trace.tracer import Tracer
from tests.test_gpu_trace import FIXTURE, ReplayCupti, window

def tracer():  # a fresh replay of the recorded spin window for every window asked, on the replayed GPU
    devices = {"0": [sys.argv[2], FIXTURE["devices"]["0"][1]]}
    return Tracer(ReplayCupti(window("spin66"), devices), settle_s=0, detach=False)

class Replaying(Client):
    def window(self, number, seconds):
        self._tracer = tracer()
        return super().window(number, seconds)

print("started", flush=True)
Replaying(sys.argv[1], tracer_factory=tracer, cuda_check=lambda: True).run()
"""


@contextlib.contextmanager
def traced_mps_client(tmp_path: Path):
    """A client process (gpu_trace's client, CUPTI replayed from the H200 recording) whose pid is one of the
    four MPS clients' in NVML's answers recorded under MPS on the H100 (the three others: pids of no process
    here, which do not trace). Yields the client's pid and the exporter's arguments that replay that recording
    and ask the client over its socket."""
    sock = tmp_path / "cupti.sock"
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(sock), H100_MPS], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert client.stdout.readline() == "started\n"
        recording = (ROOT / "tests" / "fixtures" / "nvml_h100_mps.json").read_text()
        (tmp_path / "nvml.json").write_text(recording.replace('"pid": 518', f'"pid": {client.pid}'))
        yield client.pid, ("--nvml-replay", str(tmp_path / "nvml.json"), "--no-mps", "--kubelet-socket", "none",
                           "--holders", "users", "--workload-cupti", "--cupti-socket", str(sock),
                           "--cupti-window", "2", "--cupti-period", "4")
    finally:
        client.kill()
        client.wait()


def test_the_exporter_gives_a_traced_mps_client_its_own_shares_end_to_end(tmp_path):
    """The traced MPS client and the real exporter: the exporter asks over its socket, takes the pid from
    the peer, joins it to its Unix user and publishes basis cupti in /api/v1/workloads and /metrics; the
    three other clients do not trace."""
    from tests.helpers import Exporter, http_get, parse_metrics, sample_value, wait_for
    from tests.test_metric_contract import CONTRACT, undocumented

    with traced_mps_client(tmp_path) as (pid, args), Exporter("--interval", "0.5", *args) as exporter:
        def traced():
            status, body = http_get(exporter.url + "/api/v1/workloads")
            answer = json.loads(body) if status == 200 else {}
            mine = [w for w in answer.get("workloads", ()) if pid in w["pids"]]
            return (mine[0], answer["cupti"][0]) if mine and mine[0]["time_share_basis"] == "cupti" else None
        workload, gpu = wait_for(traced, 60, what="a cupti window")  # the client connects within 6 s
        text = http_get(exporter.url + "/metrics")[1].decode()
        metrics = parse_metrics(text)
        assert not undocumented(text, CONTRACT.read_text())  # every family in docs/metrics.md
    expected = Tracer(ReplayCupti(window("spin66")), settle_s=0).trace(0)
    length = expected["end"] - expected["start"]
    assert workload["time_share"] == pytest.approx(expected["devices"][0]["kernel_busy_s"] / length, abs=2e-6)
    assert workload["sm_estimate"] == pytest.approx(expected["devices"][0]["sm_seconds"] / length, abs=2e-6)
    assert workload["pids"] == [pid] and workload["user"]
    assert (gpu["state"], gpu["traced"], gpu["untraced"]) == ("active", 1, 3)
    # the client's own window, apart from the others, as the API serves it (a model field FastAPI keeps)
    kernels = workload["time_share"]  # the Python path reads kernels alone
    assert gpu["clients"] == {str(pid): {
        "time": kernels, "sm": workload["sm_estimate"], "record_path": "cupti-python (slows the job inside its windows)",
        "parts": {"kernel_busy": kernels, "sm_copy_busy": 0.0, "backlog_busy": 0.0, "queue_gap": 0.0, "copy_busy": 0.0}}}
    # the fixture's 160 spin records (0.64 s of 4 ms kernels on 66 SMs) in a 2 s window: 0.16 of the GPU, under
    # the recorded GPU's SM active (0.24): not scaled, the rest unattributed (the three clients that do not trace)
    assert (gpu["estimated"], gpu["scale"], workload["sm_active"], workload["sm_active_basis"]) == \
        (workload["sm_estimate"], 1.0, workload["sm_estimate"], "cupti")
    assert 0.2 < gpu["gpu_sm_active"] < 0.3 and gpu["unattributed"] == round(gpu["gpu_sm_active"] - gpu["estimated"], 6)
    assert sample_value(metrics, "gpu_workload_time_share_ratio", basis="cupti", user=workload["user"]) == \
        workload["time_share"]
    assert sample_value(metrics, "gpu_workload_cupti_sm_estimate_ratio", user=workload["user"]) == workload["sm_estimate"]
    assert sample_value(metrics, "gpu_workload_cupti_untraced_clients") == 3
    assert sample_value(metrics, "gpu_workload_cupti_state", state="active") == 1


# -- the native tracer's fields (gpu_trace/native): SM work apart from kernels, the SMs a client may use --
NATIVE_DEVICE = {"uuid": UUID, "kernels": 5, "kernel_busy_s": 4.0, "busy_s": 6.0, "sm_seconds": 2.0,
                 "copy_busy_s": 0.5, "sm_copy_busy_s": 1.5, "backlog_busy_s": 0.25, "queue_gap_s": 0.25,
                 "sms": 32, "gpu_sms": 132}


def native_report(**device) -> bytes:
    return report(devices=[{**NATIVE_DEVICE, **device}], native=True)


def test_a_native_report_counts_all_its_sm_work_and_shows_its_parts():
    got = parse(native_report())
    device = got.devices[UUID]
    assert (device.busy_s, device.sms, device.gpu_sms, device.native) == (6.0, 32, 132, True)
    [(_, win)] = gpu_windows([got]).items()
    share = win.shares[100]
    assert share.time == 0.6 and share.sm == 0.2  # busy: kernels, device copies and queued work
    assert share.to_json() == {"time": 0.6, "sm": 0.2, "record_path": "native", "parts": {
        "kernel_busy": 0.4, "sm_copy_busy": 0.15, "backlog_busy": 0.025, "queue_gap": 0.025, "copy_busy": 0.05}}


def test_an_older_clients_report_means_what_it_meant():
    device = parse(report()).devices[UUID]
    assert (device.busy_s, device.sm_copy_busy_s, device.backlog_busy_s, device.queue_gap_s) == (4.0, 0.0, 0.0, 0.0)
    assert (device.sms, device.gpu_sms, device.native) == (None, None, False)
    [(_, win)] = gpu_windows([parse(report())]).items()
    assert win.shares[100].record_path == source_module.PERTURBING


@pytest.mark.parametrize("field, value, accepted", [
    ("busy_s", 4.0 / 1.001, True),  # as busy as its kernels, float rounding allowed
    ("busy_s", 4.0 / 1.001 - 1e-6, False),  # less busy than its own kernels
    ("busy_s", 10.0 * 1.001, True),
    ("busy_s", 10.0 * 1.001 + 1e-6, False),  # busier than the window is long
    ("sm_seconds", 6.0 * 1.001 + 1e-9, True),  # the whole GPU while busy
    ("sm_seconds", 6.0 * 1.001 + 2e-9, False),
    ("sm_copy_busy_s", 6.0 * 1.001 + 2e-9, False),  # a part of the busy time is no longer than it
    ("backlog_busy_s", 6.0 * 1.001 + 2e-9, False),
    ("queue_gap_s", 6.0 * 1.001 + 2e-9, False),
    ("queue_gap_s", -1e-9, False),
    ("sms", 1, True),
    ("sms", 0, False),
    ("sms", 4097, False),
    ("sms", 32.5, False),  # a count
    ("gpu_sms", 32, True),  # a client that may use the whole GPU
    ("gpu_sms", 31, False),  # a GPU smaller than what the client may use
    ("gpu_sms", 4097, False),
])
def test_the_native_fields_are_refused_just_past_their_bounds(field, value, accepted):
    line = native_report(**{field: value})
    if accepted:
        assert getattr(parse(line).devices[UUID], field) == value
    else:
        with pytest.raises(BadReport, match=field):
            parse(line)


def test_a_report_that_says_native_only_as_true_is_native():
    assert parse(report(native="yes")).devices[UUID].native is False


def test_a_part_of_the_busy_time_is_at_most_the_window():
    # float rounding lets a client's busy time pass the window's length by 0.1 %: its share stays within 1
    got = parse(native_report(kernel_busy_s=10.005, busy_s=10.0 * 1.001, sm_seconds=1.0, sm_copy_busy_s=0.0))
    parts = dict(got.devices[UUID].parts(got.end - got.start))
    assert parts["kernel_busy"] == 1.0 and parts["copy_busy"] == 0.05


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
