"""The MPS client's tracer (gpu_trace) on CPU: the occupancy rule, the union and SM sweep on hand-built
traces, the tracer's own code path on records recorded with CUPTI on an H200 under MPS
(tests/fixtures/cupti_h200_mps.json: bench/cupti_record.py), and a missing CUPTI."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpu_trace import hook
from gpu_trace.client import Client
from gpu_trace.occupancy import DeviceLimits, blocks_per_sm, sm_fraction, sms_occupied
from gpu_trace.summary import COPY, KERNEL, Records, summarise, sweep
from gpu_trace.tracer import Tracer, uuid_text

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "cupti_h200_mps.json").read_text())
H200 = DeviceLimits(**FIXTURE["devices"]["0"][1])
UUID = FIXTURE["devices"]["0"][0]


# -- how many SMs a grid holds ------------------------------------------------------------------------
def test_the_h200_limits_recorded_are_hoppers():
    assert H200 == DeviceLimits(sm_count=132, max_warps_per_sm=64, max_blocks_per_sm=32, registers_per_sm=65536,
                                shared_per_sm=233472)


def test_a_grid_smaller_than_the_sm_count_holds_one_sm_per_block():
    assert sm_fraction(H200, 1, 128, 16, 0) == 1 / 132
    assert sm_fraction(H200, 131, 128, 16, 0) == 131 / 132
    assert sm_fraction(H200, 132, 128, 16, 0) == 1.0


def test_the_spin_kernels_shared_memory_allows_one_block_per_sm():
    # 227 KiB + the 1 KiB reserved fill the SM's 228 KiB exactly: one block; 1 byte more than half: still one
    assert blocks_per_sm(H200, 256, 16, 232448) == 1
    assert blocks_per_sm(H200, 256, 16, 233472 // 2 - 1024) == 2
    assert blocks_per_sm(H200, 256, 16, 233472 // 2 - 1024 + 1) == 1
    assert sm_fraction(H200, 66, 256, 16, 232448) == 0.5


def test_registers_threads_and_the_block_limit_each_bound_the_blocks_per_sm():
    assert blocks_per_sm(H200, 1024, 32, 0) == 2  # 64 warps per SM / 32 warps
    assert blocks_per_sm(H200, 1024, 64, 0) == 1  # 64 registers x 1024 threads = the SM's 65536
    assert blocks_per_sm(H200, 1024, 33, 0) == 1  # 33 registers round up to 40 per thread per warp unit
    assert blocks_per_sm(H200, 256, 36, 0) == 6  # 36 x 32 = 1152 registers a warp, allocated as 1280: 6, not 7
    assert blocks_per_sm(H200, 32, 8, 0) == 32  # the per-SM block limit, not the 64 warps
    assert blocks_per_sm(H200, 2048, 255, 233472) == 1  # never below one: the kernel did launch


def test_a_partial_last_wave_counts_the_sms_it_holds():
    assert sms_occupied(132, 200, 1) == (132 + 68) / 2  # two waves, the second on 68 SMs
    assert sms_occupied(132, 264, 1) == 132
    assert sms_occupied(132, 265, 2) == (132 + 1) / 2  # 264 per wave at two per SM, one block left over
    assert sms_occupied(132, 464, 2) == 132  # a last wave of 200 blocks at two per SM still holds every SM once
    assert sms_occupied(132, 0, 1) == 0.0


# -- the union and the SM sweep on hand-built traces ------------------------------------------------------
def test_overlapping_kernels_of_one_client_count_their_union_not_their_sum():
    busy, sm = sweep([0, 5], [10, 20], [0.5, 0.75], 0, 100)
    assert busy == 20  # not 25
    assert sm == 0.5 * 5 + 1.0 * 5 + 0.75 * 10  # at most the whole GPU while both run (1.25 -> 1)


def test_kernels_straddling_the_windows_edges_count_their_part_inside():
    busy, sm = sweep([-5, 95, 200], [5, 120, 300], [1.0, 0.5, 1.0], 0, 100)
    assert (busy, sm) == (10, 5 + 2.5)


def test_a_client_that_stops_mid_window_counts_only_what_ran():
    busy, sm = sweep([0, 10, 20], [10, 20, 30], [0.25] * 3, 0, 100)
    assert (busy, sm) == (30, 7.5)


def test_copies_are_busy_apart_from_kernels_and_hold_no_sms():
    records = Records(10)
    records.add(KERNEL, 0, 0, 10_000_000, 0.5)
    records.add(COPY, 0, 5_000_000, 25_000_000, 0.0)
    records.add(KERNEL, 1, 0, 1_000_000, 1.0)  # another GPU
    [first, second] = summarise(records, 0, 100_000_000, {0: "GPU-a", 1: "GPU-b"})
    assert first == {"uuid": "GPU-a", "kernels": 1, "kernel_busy_s": 0.01, "sm_seconds": 0.005, "copy_busy_s": 0.02}
    assert second["kernel_busy_s"] == 0.001 and second["sm_seconds"] == 0.001


def test_a_gpu_the_process_ran_nothing_on_is_listed_with_zeros():
    [entry] = summarise(Records(4), 0, 10, {0: UUID})
    assert entry == {"uuid": UUID, "kernels": 0, "kernel_busy_s": 0.0, "sm_seconds": 0.0, "copy_busy_s": 0.0}


def test_the_store_is_bounded():
    records = Records(2)
    assert records.add(KERNEL, 0, 0, 1, 1.0) and records.add(KERNEL, 0, 1, 2, 1.0)
    assert not records.add(KERNEL, 0, 2, 3, 1.0)
    assert (len(records), records.refused, records.nbytes) == (2, 1, 2 * (1 + 2 + 8 + 8 + 4))


# -- the tracer's code path on recorded CUPTI records --------------------------------------------------
class ReplayCupti:
    """CUPTI's boundary as the tracer uses it, replaying one recorded window: the records come in
    one buffer at the flush, the two timestamps are the window's recorded ones."""

    kernel_kind, copy_kinds = 10, (1, 2)  # cupti.ActivityKind CONCURRENT_KERNEL, MEMCPY, MEMSET

    def __init__(self, window: dict, devices: dict = FIXTURE["devices"]):
        self.window, self.calls = window, []
        self._devices = {int(o): (u, DeviceLimits(**limits)) for o, (u, limits) in devices.items()}
        self._stamps = list(window["stamps"])

    def register(self, requested, completed):
        self.requested, self.completed = requested, completed

    def enable(self):
        self.calls.append("enable")

    def disable(self):
        self.calls.append("disable")

    def flush(self):
        self.calls.append("flush")
        self.completed([SimpleNamespace(**r) for r in self.window["records"]])

    def timestamp(self):
        return self._stamps.pop(0)

    def devices(self):
        return self._devices


def window(name: str) -> dict:
    return next(w for w in FIXTURE["windows"] if w["name"] == name)


def in_window(w: dict, kind: int):
    lo, hi = w["stamps"]
    return [r for r in w["records"] if r["kind"] == kind and r["end"] > lo and r["start"] < hi]


def test_the_recorded_spin_kernels_give_half_the_gpu_while_they_run():
    w = window("spin66")
    api = ReplayCupti(w)
    body = Tracer(api, settle_s=0).trace(0)
    lo, hi = w["stamps"]
    kernels = in_window(w, 10)
    assert kernels and all(r["grid_x"] == 66 and r["dynamic_shared_memory"] == 232448 for r in kernels)
    ran = sum(min(r["end"], hi) - max(r["start"], lo) for r in kernels) / 1e9  # one stream: no overlap
    [gpu] = body["devices"]
    assert gpu["uuid"] == UUID and gpu["kernels"] == len(kernels)
    assert gpu["kernel_busy_s"] == pytest.approx(ran, abs=1e-9)
    assert gpu["sm_seconds"] == pytest.approx(ran * 66 / 132, abs=1e-9)
    assert api.calls == ["enable", "disable", "flush"]
    assert body["records"] == len(w["records"]) and body["refused"] == 0


def test_the_recorded_matmul_holds_every_sm_and_its_memsets_are_copies():
    w = window("matmul")
    body = Tracer(ReplayCupti(w), settle_s=0).trace(0)
    [gpu] = body["devices"]
    kernels, memsets = in_window(w, 10), in_window(w, 2)
    assert kernels and memsets
    assert gpu["sm_seconds"] == pytest.approx(gpu["kernel_busy_s"], abs=1e-9)  # 132 blocks, one per SM
    assert gpu["copy_busy_s"] > 0 and gpu["kernels"] == len(kernels)


def test_a_kernel_still_running_at_the_flush_is_not_counted():
    w = dict(window("spin66"))
    lo, hi = w["stamps"]
    w["records"] = [{**w["records"][0], "start": lo + 1000, "end": 0}, {**w["records"][1], "start": lo + 10,
                                                                         "end": lo + 4_000_010}]
    body = Tracer(ReplayCupti(w), max_records=1, settle_s=0).trace(0)  # it takes no place in the store either
    [gpu] = body["devices"]
    assert (gpu["kernels"], gpu["kernel_busy_s"], body["records"], body["refused"]) == (1, 0.004, 1, 0)


def test_a_full_store_ends_the_window_where_its_records_end():
    w = window("spin66")
    tracer = Tracer(ReplayCupti(w), max_records=10, settle_s=0)
    body = tracer.trace(0)
    first = sorted(r["end"] for r in w["records"][:10])
    assert body["records"] == 10 and body["refused"] == 1  # the buffer's rest is dropped at once
    assert body["end"] == pytest.approx(body["start"] + (first[-1] - w["stamps"][0]) / 1e9, abs=1e-6)


def test_records_outside_a_window_are_not_kept_and_cupti_is_detached_after_each():
    api = ReplayCupti(window("spin66"))
    api.detach = lambda: api.calls.append("detach")
    tracer = Tracer(api, settle_s=0)
    tracer.trace(0)
    assert tracer.idle(60)  # the worker detaches after the answer
    api.completed([SimpleNamespace(**r) for r in window("spin66")["records"][:3]])  # a buffer after the window
    assert tracer.late == 3 and api.calls == ["enable", "disable", "flush", "detach"]


class BacklogCupti(ReplayCupti):
    """A busy trainer's window (bench/RESULTS.md, issue 34): CUPTI delivered the first `delivered` records
    during the window (a full buffer), then its flush drains the backlog for as long as `drained` is unset."""

    def __init__(self, w: dict, delivered: int):
        super().__init__(w)
        self._stamps *= 3
        self.delivered, self.drained = delivered, threading.Event()

    def disable(self):
        super().disable()
        if self.delivered:
            self.completed([SimpleNamespace(**r) for r in self.window["records"][:self.delivered]])

    def flush(self):
        self.calls.append("flush")
        self.drained.wait(60)
        self.completed([SimpleNamespace(**r) for r in self.window["records"][self.delivered:]])


def backlog_client(api: BacklogCupti, close_wait_s: float) -> tuple[Tracer, Client]:
    """A client (pid 7) whose tracer over `api` waits 0.01 s for a flush and `close_wait_s` for the rest."""
    tracer = Tracer(api, settle_s=0, close_wait_s=close_wait_s, flush_wait_s=0.01)
    return tracer, Client("/nonexistent", tracer_factory=lambda: tracer, pid=7, cuda_check=lambda: True)


def answer_of(client: Client, number: int) -> dict:
    """The client's answer, on a thread of its own: a tracer that waits for CUPTI would hang the test."""
    answers = []
    asking = threading.Thread(target=lambda: answers.append(client.window(number, 0.0)), daemon=True)
    asking.start()
    asking.join(60)
    assert answers, "the client did not answer while CUPTI's flush was still draining"
    return answers[0]


def test_the_answer_never_waits_for_a_flush_that_has_not_returned(capfd):
    w = window("spin66")
    api = BacklogCupti(w, delivered=40)
    tracer, client = backlog_client(api, close_wait_s=60)
    try:
        first = answer_of(client, 1)
        ends = [r["end"] for r in w["records"][:40]]
        lo = w["stamps"][0]
        # the part whose records arrived: up to the last delivered kernel's end, not the window's end
        assert (first["complete"], first["records"], tracer.cut) == (False, 40, 1)
        assert first["end"] == pytest.approx(first["start"] + (max(ends) - lo) / 1e9, abs=1e-6)
        assert first["devices"][0]["kernels"] == len([r for r in w["records"][:40] if r["kind"] == 10 and r["end"] > lo])
        second = answer_of(client, 2)  # asked again while the flush still drains: on time, with the reason
        assert second == {"window": 2, "pid": 7, "error": "the last window's CUPTI flush has not returned yet"}
    finally:
        api.drained.set()
    assert tracer.idle(60) and tracer.late == len(w["records"]) - 40  # the backlog arrived after the answer
    third = answer_of(client, 3)  # the backlog drained: the next window is whole again
    assert (third["complete"], third["records"]) == (True, len(w["records"]))
    err = capfd.readouterr().err
    assert err.count("gpu_trace: window 1: CUPTI's flush had not returned in time") == 1
    assert err.count("gpu_trace: window 2 not reported") == 1


@pytest.mark.parametrize("delivered", ["nothing", "only records ending before the window"])
def test_a_flush_that_delivers_nothing_in_time_is_answered_as_an_error(delivered):
    w = window("spin66")
    if delivered != "nothing":  # an empty window would be refused by the exporter, and the client disconnected
        lo = w["stamps"][0]
        w = {**w, "records": [{**r, "start": lo - 2_000_000, "end": lo} for r in w["records"][:3]] + w["records"]}
    api = BacklogCupti(w, delivered=0 if delivered == "nothing" else 3)
    _, client = backlog_client(api, close_wait_s=60)
    try:
        answer = answer_of(client, 1)
    finally:
        api.drained.set()
    assert answer == {"window": 1, "pid": 7, "error": "CUPTI's flush had not returned 0.01 s after the window "
                      "closed: nothing complete to report"}


@pytest.mark.parametrize("step", ["register", "enable", "disable"])
def test_a_cupti_call_that_does_not_return_is_answered_on_time(step):
    api = BacklogCupti(window("spin66"), delivered=0)
    held = getattr(api, step)

    def stuck(*args):
        api.drained.wait(60)
        return held(*args)
    setattr(api, step, stuck)
    phase = {"register": "registration"}.get(step, step)
    _, client = backlog_client(api, close_wait_s=0.01)
    try:
        answer = answer_of(client, 1)
    finally:
        api.drained.set()
    # the step it names is the stuck one, or one before it when the worker had not reached it yet (a busy CPU)
    steps = ["start", "device query", "registration", "enable", "window", "disable"]
    assert set(answer) == {"window", "pid", "error"}
    assert re.fullmatch(r"CUPTI's (.+) had not returned 0.01 s after the window's end: nothing complete to report",
                        answer["error"])[1] in steps[:steps.index(phase) + 1]


def test_the_uuid_is_spelled_as_nvml_spells_it():
    assert uuid_text(bytes.fromhex("29e0f399fd5a65ec478fe3260f46e199")) == "GPU-29e0f399-fd5a-65ec-478f-e3260f46e199"


# -- without CUPTI -------------------------------------------------------------------------------------
def test_without_cupti_the_client_says_so_once_and_answers_with_the_reason(capfd):
    from gpu_trace.tracer import CuptiUnavailable

    def no_cupti():
        raise CuptiUnavailable("cupti-python is not importable (ModuleNotFoundError: No module named 'cupti')")

    client = Client("/nonexistent", tracer_factory=no_cupti, pid=4242, cuda_check=lambda: True)
    first, second = client.window(1, 1.0), client.window(2, 1.0)
    assert first == {"window": 1, "pid": 4242, "error": "cupti-python is not importable (ModuleNotFoundError: "
                     "No module named 'cupti')"}
    assert second["window"] == 2 and second["error"] == first["error"]
    assert capfd.readouterr().err.count("gpu_trace: CUPTI is not available") == 1


def test_a_process_without_cuda_starts_no_cupti():
    started = []
    client = Client("/nonexistent", tracer_factory=lambda: started.append(1), pid=1, cuda_check=lambda: False)
    assert client.window(1, 1.0) == {"window": 1, "pid": 1, "error": "no CUDA in this process yet"} and not started


def test_the_hook_without_the_native_library_nor_cupti_python_says_so_and_the_program_runs(tmp_path):
    """No native library and no cupti-python (CI has none): the command says it once, the traced Python
    program once, and it runs to its end."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_SPATIAL_TRACE_SOCKET": str(tmp_path / "none.sock"),
           "GPU_SPATIAL_TRACE_LIBRARY": str(tmp_path / "absent.so")}
    out = subprocess.run([sys.executable, "-m", "gpu_trace", "--", sys.executable, "-c", "print(6 * 7)"],
                         env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "42\n"
    assert out.stderr.splitlines() == [
        "gpu-spatial trace: the native tracer is not built here (pip install . with a C compiler builds it): only "
        "Python processes are traced, through cupti-python, which slows them inside each window",
        "gpu_trace: the native tracer is not built here (pip install . builds it with a C compiler), and "
        "cupti-python is not installed: this process is not traced"]


def test_the_hook_with_the_native_library_is_silent_and_injects_it(tmp_path):
    """With the library built, nothing is said before a window is asked for, and any CUDA program the
    command starts gets it through CUDA_INJECTION64_PATH."""
    from gpu_trace import native

    library = native.build(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_SPATIAL_TRACE_SOCKET": str(tmp_path / "none.sock"),
           "GPU_SPATIAL_TRACE_LIBRARY": str(library)}
    code = "import os; print(os.environ['CUDA_INJECTION64_PATH'])"
    out = subprocess.run([sys.executable, "-m", "gpu_trace", "--", sys.executable, "-c", code],
                         env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == f"{library}\n"
    assert out.stderr == ""


def test_an_existing_sitecustomize_still_runs_after_the_hook(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.SITE_RAN = True\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "GPU_SPATIAL_TRACE": "0"}
    out = subprocess.run([sys.executable, "-m", "gpu_trace", "--", sys.executable, "-c",
                          "import builtins; print(builtins.SITE_RAN)"], env=env, capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.stdout == "True\n", out.stderr


def test_trace_without_a_command_exits_2(capsys):
    from gpu_trace.__main__ import main

    assert main([]) == 2 and "give the command" in capsys.readouterr().err


def test_start_without_cupti_python_starts_no_thread(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(hook.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(hook, "_client", None)
    monkeypatch.setenv("GPU_SPATIAL_TRACE_LIBRARY", str(tmp_path / "absent.so"))  # no native library either
    assert hook.start("/nonexistent") is None
    assert "cupti-python is not installed" in capsys.readouterr().err


def test_a_process_connects_only_once_it_has_loaded_cuda(tmp_path):
    """A Python process that never loads CUDA (a data loader's worker) takes no slot at the exporter."""
    path = str(tmp_path / "cupti.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    loaded, asked = threading.Event(), threading.Semaphore(0)

    def cuda_check():
        asked.release()
        return loaded.is_set()

    client = Client(path, pid=5, cuda_check=cuda_check, cuda_poll_s=0.01)
    client.start()
    try:
        for _ in range(3):  # it looked three times and found no CUDA: nothing connected
            assert asked.acquire(timeout=30)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
        loaded.set()
        listener.settimeout(30)
        conn, _ = listener.accept()
        conn.close()
    finally:
        client.stop.set()
        listener.close()


class CountedStop(threading.Event):
    """A stop event that records every back-off the client waits and stops it after `waits` of them."""

    def __init__(self, waits: int, before_first=lambda: None):
        super().__init__()
        self.waited: list[float] = []
        self.waits = waits
        self.before_first = before_first

    def wait(self, timeout=None):
        if not self.waited:
            self.before_first()
        self.waited.append(timeout)
        if len(self.waited) >= self.waits:
            self.set()
        return self.is_set()


def test_the_client_backs_off_while_the_exporter_is_absent_and_starts_over_after_a_connection(tmp_path):
    client = Client(str(tmp_path / "absent.sock"), pid=5, cuda_check=lambda: True)
    client.stop = CountedStop(4)
    client.run()
    assert client.stop.waited == [1.0, 5.0, 30.0, 30.0]
    path = str(tmp_path / "cupti.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    accepted = threading.Thread(target=lambda: (listener.accept()[0].close(), listener.close()))
    accepted.start()  # one connection, closed by the exporter at once; then no exporter
    client = Client(path, pid=5, cuda_check=lambda: True)
    client.stop = CountedStop(3, before_first=lambda: accepted.join(30))
    client.run()
    assert client.stop.waited == [1.0, 5.0, 30.0]  # the connection started the back-off over
