"""The native record path (gpu_trace/native/gputrace.c), built here with the system C compiler and fed
synthetic CUPTI activity buffers laid out as cupti_activity.h lays them out: every figure below is
computed by hand. The CUPTI and driver calls themselves are exercised on the device
(bench/native_layout.sh checks the offsets against the toolkit's headers, bench/RESULTS.md the accuracy)."""
from __future__ import annotations

import ctypes
import json
import os
import random
import socket
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

from gpu_trace import native

KERNEL_SIZE = 200  # a CUpti_ActivityKernel9-sized record: the fields read are its leading ones
COPY_SIZE = 80
LO = 1_000_000_000
MS = 1_000_000
GPU_SMS = 132


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    # bench/native_mutations.py points the tests at a mutant of gputrace.c
    source = os.environ.get("GPU_TRACE_NATIVE_SOURCE", native.SOURCE)
    return native.load(native.build(tmp_path_factory.mktemp("native"), source=source))


def kernel(start, end, grid=(1, 1, 1), block=(1, 1, 1), registers=0, shared=0, device=0, stream=7, queued=None):
    """A CONCURRENT_KERNEL record (kind 10) at CUPTI's offsets; queued defaults to its start (no wait)."""
    r = bytearray(KERNEL_SIZE)
    struct.pack_into("<I", r, 0, 10)
    struct.pack_into("<H", r, 6, registers)
    struct.pack_into("<QQ", r, 16, start, end)
    struct.pack_into("<III", r, 40, device, 1, stream)
    struct.pack_into("<iii", r, 52, *grid)
    struct.pack_into("<iii", r, 64, *block)
    struct.pack_into("<ii", r, 76, shared, 0)
    struct.pack_into("<QQ", r, 120, start if queued is None else queued, start)
    return bytes(r)


def copy(start, end, copy_kind, device=0, kind=1, stream=0):
    """A MEMCPY (kind 1, copyKind at byte 4: 1 HtoD, 8 DtoD) or MEMSET (kind 2) record."""
    r = bytearray(COPY_SIZE)
    struct.pack_into("<IB", r, 0, kind, copy_kind)
    struct.pack_into("<QQ", r, 16, start, end)
    struct.pack_into("<III", r, 32, device, 1, stream)
    return bytes(r)


def window(lib, kernels=(), copies=(), hi=LO + 1000 * MS, devices=((GPU_SMS, GPU_SMS),), max_records=0,
           cut=0):
    """Feeds the records (kernels and copies in two buffers, as CUPTI keeps kinds apart) and returns the
    per-GPU summary, with (kept, refused, incomplete)."""
    sms = (ctypes.c_int * len(devices))(*[d[0] for d in devices])
    whole = (ctypes.c_int * len(devices))(*[d[1] for d in devices])
    assert lib.gt_test_devices(len(devices), sms, whole) == 0
    lib.gt_test_open(LO, max_records)
    for records, size in ((kernels, KERNEL_SIZE), (copies, COPY_SIZE)):
        buffer = b"".join(records)
        lib.gt_test_feed(buffer, len(buffer) - cut if records else 0, size)
    out = ctypes.create_string_buffer(16384)
    assert lib.gt_test_summary(LO, hi, out, len(out)) == 0
    refused, incomplete = ctypes.c_size_t(), ctypes.c_uint64()
    kept = lib.gt_test_counts(ctypes.byref(refused), ctypes.byref(incomplete))
    lib.gt_test_close()
    return json.loads(out.value), (kept, refused.value, incomplete.value)


def test_overlapping_kernels_are_a_union_and_their_sms_capped_at_the_gpu(lib):
    # 66 blocks of 1,024 threads: 2 fit an SM, one wave on 66 SMs (0.5); 132 blocks: every SM (1.0)
    [gpu], _ = window(lib, [kernel(LO, LO + 400 * MS, (66, 1, 1), (1024, 1, 1)),
                            kernel(LO + 200 * MS, LO + 600 * MS, (132, 1, 1), (32, 32, 1), stream=8)])
    assert gpu["kernels"] == 2
    assert gpu["kernel_busy_s"] == pytest.approx(0.6, abs=1e-9)
    assert gpu["busy_s"] == pytest.approx(0.6, abs=1e-9)
    # 0.2 s alone at 0.5, 0.2 s together (1.5, capped at 1), 0.2 s alone at 1.0
    assert gpu["sm_seconds"] == pytest.approx(0.1 + 0.2 + 0.2, abs=1e-6)
    assert (gpu["sms"], gpu["gpu_sms"]) == (132, 132)


def test_records_out_of_order_give_the_same_summary(lib):
    records = [kernel(LO + i * 10 * MS, LO + i * 10 * MS + 7 * MS, (33, 1, 1), (256, 1, 1), stream=i % 3)
               for i in range(50)]
    in_order, _ = window(lib, records)
    random.Random(4).shuffle(records)
    shuffled, _ = window(lib, records)
    assert shuffled == in_order
    assert in_order[0]["kernel_busy_s"] == pytest.approx(0.35, abs=1e-9)  # 50 x 7 ms, no overlap
    assert in_order[0]["sm_seconds"] == pytest.approx(0.35 * 33 / 132, abs=1e-6)


def test_a_kernel_across_an_edge_counts_its_part_inside_and_one_outside_is_not_counted(lib):
    [gpu], _ = window(lib, [kernel(LO - 100 * MS, LO + 100 * MS, (132, 1, 1), (1024, 1, 1), queued=LO - 200 * MS),
                            kernel(LO + 1001 * MS, LO + 1100 * MS, (132, 1, 1), (1024, 1, 1))])
    assert gpu["kernel_busy_s"] == pytest.approx(0.1, abs=1e-9)
    assert gpu["kernels"] == 1  # the one after the window's end is not the window's


def test_work_queued_before_the_window_counts_from_the_window_start(lib):
    # stream 7's first launch inside the window waited 290 ms behind work queued before it: that stream was
    # busy from the window's start; 33 blocks of one warp hold 33 SMs (0.25)
    first = kernel(LO + 300 * MS, LO + 350 * MS, (33, 1, 1), (32, 1, 1), queued=LO + 10 * MS)
    [gpu], _ = window(lib, [first])
    assert gpu["kernel_busy_s"] == pytest.approx(0.05, abs=1e-9)
    assert gpu["backlog_busy_s"] == pytest.approx(0.3, abs=1e-9)
    assert gpu["busy_s"] == pytest.approx(0.35, abs=1e-9)
    assert gpu["sm_seconds"] == pytest.approx(0.35 * 0.25, abs=1e-6)


def test_the_backlog_rule_holds_past_the_launch_wait_and_not_at_it(lib):
    wait = 20_000  # ns: an idle stream's launch latency
    at_bound = kernel(LO + 10 * MS + wait, LO + 20 * MS, (33, 1, 1), (32, 1, 1), queued=LO + 10 * MS)
    [gpu], _ = window(lib, [at_bound])
    assert gpu["backlog_busy_s"] == 0.0
    past = kernel(LO + 10 * MS + wait + 1, LO + 20 * MS, (33, 1, 1), (32, 1, 1), queued=LO + 10 * MS)
    [gpu], _ = window(lib, [past])
    assert gpu["backlog_busy_s"] == pytest.approx((10 * MS + wait + 1) / 1e9, abs=1e-9)


def test_only_the_first_launch_of_a_stream_tells_its_backlog(lib):
    # the second kernel waits behind the first (launched in the window): no backlog from it
    records = [kernel(LO + 5 * MS, LO + 50 * MS, (33, 1, 1), (32, 1, 1), queued=LO + 5 * MS),
               kernel(LO + 50 * MS, LO + 90 * MS, (33, 1, 1), (32, 1, 1), queued=LO + 6 * MS)]
    [gpu], _ = window(lib, records)
    assert gpu["backlog_busy_s"] == 0.0
    assert gpu["busy_s"] == pytest.approx(0.085, abs=1e-9)


def test_a_kernel_not_started_by_the_flush_means_a_backlog_all_window(lib):
    waiting = kernel(0, 0, (66, 1, 1), (32, 1, 1), queued=LO + 1 * MS)  # incomplete: no start, no end
    [gpu], (kept, _refused, incomplete) = window(lib, [waiting])
    assert (kept, incomplete) == (1, 1)  # the backlog interval itself is the one kept
    assert gpu["busy_s"] == pytest.approx(1.0, abs=1e-9)
    assert gpu["kernel_busy_s"] == 0.0


def test_a_thread_limited_client_holds_only_its_sms(lib):
    # MPS gives it 8 of 132 SMs: 132 blocks of 1,024 threads run 2 per SM in 9 waves of 16, the last of 4
    [limited, whole], _ = window(lib, [kernel(LO, LO + 1000 * MS, (132, 1, 1), (1024, 1, 1), device=0),
                                       kernel(LO, LO + 1000 * MS, (132, 1, 1), (1024, 1, 1), device=1)],
                                 devices=((8, GPU_SMS), (GPU_SMS, GPU_SMS)))
    assert limited["sm_seconds"] == pytest.approx((8 * 8 + 4) / 9 / 132, abs=1e-6)
    assert (limited["sms"], limited["gpu_sms"]) == (8, 132)
    assert whole["sm_seconds"] == pytest.approx(1.0, abs=1e-6)


def test_device_to_device_copies_and_memsets_are_sm_work_host_copies_are_not(lib):
    [gpu], _ = window(lib, [kernel(LO + 800 * MS, LO + 1000 * MS, (33, 1, 1), (32, 1, 1))],
                      [copy(LO + 700 * MS, LO + 900 * MS, 8),  # DtoD: every SM the process may use
                       copy(LO, LO + 500 * MS, 1),  # HtoD: a copy engine
                       copy(LO + 950 * MS, LO + 960 * MS, 0, kind=2)])  # memset
    assert gpu["sm_copy_busy_s"] == pytest.approx(0.21, abs=1e-9)
    assert gpu["copy_busy_s"] == pytest.approx(0.5, abs=1e-9)
    assert gpu["busy_s"] == pytest.approx(0.3, abs=1e-9)
    # 0.1 s copy alone (1.0), 0.1 s copy + kernel (capped 1.0), 0.1 s kernel alone (0.25) with a memset
    # of 10 ms on top (1.0)
    assert gpu["sm_seconds"] == pytest.approx(0.1 + 0.1 + 0.09 * 0.25 + 0.01, abs=1e-6)


def test_a_limited_client_copy_holds_its_share_of_the_sms(lib):
    [gpu], _ = window(lib, [], [copy(LO, LO + 500 * MS, 8)], devices=((33, GPU_SMS),))
    assert gpu["sm_seconds"] == pytest.approx(0.5 * 33 / 132, abs=1e-6)


def test_a_record_whose_end_precedes_its_start_is_not_kept(lib):
    [gpu], (kept, _r, incomplete) = window(lib, [kernel(LO + 500 * MS, LO + 400 * MS, (132, 1, 1), (32, 1, 1))],
                                            [copy(LO + 500 * MS, LO + 499 * MS, 8)])
    assert (kept, incomplete) == (0, 2)
    assert gpu["busy_s"] == 0.0


def test_a_buffer_cut_mid_record_reads_the_whole_records_only(lib):
    records = [kernel(LO + i * 100 * MS, LO + i * 100 * MS + 50 * MS, (132, 1, 1), (32, 1, 1)) for i in range(3)]
    [gpu], (kept, _r, _i) = window(lib, records, cut=1)
    assert kept == 2
    assert gpu["kernel_busy_s"] == pytest.approx(0.1, abs=1e-9)


def test_a_full_store_refuses_the_rest_and_counts_them(lib):
    records = [kernel(LO + i * MS, LO + i * MS + MS // 2, (1, 1, 1), (32, 1, 1)) for i in range(5)]
    _, (kept, refused, _i) = window(lib, records, max_records=3)
    assert (kept, refused) == (3, 2)


def test_a_record_of_an_unknown_device_is_not_counted(lib):
    [gpu], (kept, _r, _i) = window(lib, [kernel(LO, LO + 100 * MS, (132, 1, 1), (32, 1, 1), device=1)])
    assert kept == 0 and gpu["kernels"] == 0


@pytest.mark.parametrize("threads, registers, shared, fit", [
    (528, 0, 0, 3),  # 17 warps (a partial warp is a whole one): 64 // 17
    (512, 0, 0, 4),
    (1024, 0, 0, 2),
    (32, 0, 0, 32),  # the per-SM block limit
    (256, 128, 0, 2),  # 128 registers x 256 threads: 65,536 / 32,768
    (256, 0, 100 * 1024, 2),  # 100 KiB + 1 KiB reserved per block in 228 KiB
    (256, 0, 114 * 1024, 1),
    (256, 33, 0, 6),  # 33 registers: 1,056 a warp, allocated as 1,280 (units of 256)
])
def test_blocks_per_sm_follows_cudas_occupancy_rules(lib, threads, registers, shared, fit):
    assert lib.gt_blocks_per_sm(64, 32, 65536, 233472, threads, registers, shared) == fit


def test_the_c_occupancy_matches_the_python_one(lib):
    from gpu_trace.occupancy import DeviceLimits, blocks_per_sm, sms_occupied

    limits = DeviceLimits(sm_count=132)
    for threads, registers, shared in [(528, 40, 0), (96, 255, 48 * 1024), (1024, 64, 0), (64, 0, 0)]:
        assert lib.gt_blocks_per_sm(64, 32, 65536, 233472, threads, registers, shared) == \
            blocks_per_sm(limits, threads, registers, shared)
    for sms, blocks, fit in [(132, 1, 1), (132, 265, 2), (8, 132, 2), (132, 10_000, 4)]:
        assert lib.gt_sms_occupied(sms, blocks, fit) == pytest.approx(sms_occupied(sms, blocks, fit))


def test_without_libcupti_the_tracer_says_why_in_one_line(lib, monkeypatch):
    # a fresh copy of the library (the module's has test devices set), in a child without CUDA's folders
    code = textwrap.dedent(f"""
        import ctypes
        lib = ctypes.CDLL({str(lib._name)!r})
        lib.gt_last_error.restype = ctypes.c_char_p
        print(lib.gt_load(None), lib.gt_last_error().decode())
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GPU_SPATIAL_CUPTI_LIBRARY": "/nonexistent"}).stdout
    rc, why = out.split(" ", 1)
    assert rc == "-1"
    assert "libcupti" in why or "libcuda" in why  # CI has neither; a machine with the toolkit lacks the driver


def hung_up(conn) -> bool:
    try:
        return conn.recv(10) == b""
    except ConnectionResetError:  # it closed with our bytes unread
        return True


def test_the_injected_client_answers_the_exporter_on_its_socket(lib, tmp_path):
    """What the CUDA driver does with CUDA_INJECTION64_PATH (InitializeInjection at cuInit), done by a
    child process; here, without CUPTI, its answer is the protocol's error line for its own pid."""
    path = str(tmp_path / "cupti.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(60)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import ctypes, time
        lib = ctypes.CDLL({str(lib._name)!r})
        lib.InitializeInjection()
        time.sleep(60)
        """)], env={**os.environ, "GPU_SPATIAL_TRACE_SOCKET": path, "GPU_SPATIAL_CUPTI_LIBRARY": "/nonexistent"})
    try:
        conn, _ = listener.accept()
        conn.settimeout(60)
        conn.sendall(b'{"trace": 1.0, "window": 7}\n')
        answer = conn.makefile("rb").readline()
        report = json.loads(answer)
        assert report["window"] == 7 and report["pid"] == child.pid
        assert "libcupti" in report["error"] or "libcuda" in report["error"]
        conn.sendall(b'{"trace": "x"}\n')  # not our exporter: the client hangs up
        assert hung_up(conn)
    finally:
        child.kill()
        child.wait()
        listener.close()


def test_the_injected_client_hangs_up_on_a_command_longer_than_the_cap(lib, tmp_path):
    path = str(tmp_path / "cupti.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(60)
    child = subprocess.Popen([sys.executable, "-c", f"import ctypes, time; ctypes.CDLL({str(lib._name)!r})"
                              ".InitializeInjection(); time.sleep(60)"],
                             env={**os.environ, "GPU_SPATIAL_TRACE_SOCKET": path})
    try:
        conn, _ = listener.accept()
        conn.settimeout(60)
        # 256 bytes are a command's most (gpu_trace.protocol.MAX_COMMAND_BYTES); this line is 257 + newline
        conn.sendall(b'{"trace": 1, "window": 1' + b" " * (257 - 25) + b"}\n")
        assert hung_up(conn)
    finally:
        child.kill()
        child.wait()
        listener.close()


def test_one_client_per_process_whoever_claims_first(lib):
    assert lib.gt_claim() == 1
    assert lib.gt_claim() == 0
    assert lib.InitializeInjection() == 1  # the injection defers to the claim already made


US = 1_000


@pytest.mark.parametrize("gap_ns, queued_at, stream, counted", [
    (5 * US, LO + 5 * MS, 7, True),  # queued long before the first ended: the GPU turned to it
    (100 * US, LO + 5 * MS, 7, True),  # the longest turn counted
    (100 * US + 1, LO + 5 * MS, 7, False),  # longer: a wait on something else
    (5 * US, LO + 10 * MS + 1, 7, False),  # queued after the first ended: the stream was idle
    (5 * US, LO + 5 * MS, 8, False),  # another stream: no order between them
])
def test_a_gap_between_queued_kernels_of_one_stream_is_busy_time(lib, gap_ns, queued_at, stream, counted):
    first = kernel(LO + 2 * MS, LO + 10 * MS, (33, 1, 1), (32, 1, 1), queued=LO + 2 * MS - US)
    second = kernel(LO + 10 * MS + gap_ns, LO + 20 * MS, (33, 1, 1), (32, 1, 1), queued=queued_at, stream=stream)
    [gpu], _ = window(lib, [second, first])
    kernels = 8 * MS + 10 * MS - gap_ns
    assert gpu["queue_gap_s"] == pytest.approx(gap_ns / 1e9 if counted else 0.0, abs=1e-12)
    if stream == 7:  # (on stream 8 the second kernel is that stream's first, and it waited: a backlog)
        assert gpu["sm_seconds"] == pytest.approx(kernels / 1e9 * 0.25, abs=1e-9)  # a gap holds no SMs
        assert gpu["busy_s"] == pytest.approx((kernels + (gap_ns if counted else 0)) / 1e9, abs=1e-12)


TURN_NS = 3 * US


@pytest.mark.parametrize("gap_ns, stream, second_is_copy, counted", [
    (TURN_NS, 7, False, True),  # no queued timestamps: a turn this short was work queued behind the first
    (TURN_NS + 1, 7, False, False),  # longer: it may have been launched into an idle stream
    (1, 8, False, False),  # another stream: no order between them
    (TURN_NS, 7, True, True),  # a device copy queued behind a kernel turns the same way
])
def test_without_queued_timestamps_a_short_turn_of_one_stream_is_busy_time(lib, gap_ns, stream, second_is_copy,
                                                                            counted):
    first = kernel(LO + 2 * MS, LO + 10 * MS, (33, 1, 1), (32, 1, 1), queued=0)
    if second_is_copy:
        [gpu], _ = window(lib, [first], [copy(LO + 10 * MS + gap_ns, LO + 20 * MS, 8, stream=stream)])
        assert gpu["sm_copy_busy_s"] == pytest.approx((10 * MS - gap_ns) / 1e9, abs=1e-12)
    else:
        [gpu], _ = window(lib, [kernel(LO + 10 * MS + gap_ns, LO + 20 * MS, (33, 1, 1), (32, 1, 1), queued=0,
                                       stream=stream), first])
    assert gpu["queue_gap_s"] == pytest.approx(gap_ns / 1e9 if counted else 0.0, abs=1e-12)
    assert gpu["busy_s"] == pytest.approx((18 * MS - gap_ns + (gap_ns if counted else 0)) / 1e9, abs=1e-12)
    assert gpu["backlog_busy_s"] == 0.0  # without queued timestamps no stream is known to have waited


def test_queued_timestamps_decide_over_the_turn_rule(lib):
    """A gap shorter than a turn, but the second kernel was launched after the first ended: the stream was
    idle (the rule without timestamps would have counted it)."""
    first = kernel(LO + 2 * MS, LO + 10 * MS, (33, 1, 1), (32, 1, 1), queued=LO + 2 * MS)
    second = kernel(LO + 10 * MS + US, LO + 20 * MS, (33, 1, 1), (32, 1, 1), queued=LO + 10 * MS + 1)
    [gpu], _ = window(lib, [first, second])
    assert gpu["queue_gap_s"] == 0.0


def test_a_kernel_still_running_at_the_flush_is_not_counted_but_its_stream_is_followed(lib):
    running = bytearray(kernel(LO + 900 * MS, LO + 950 * MS, (132, 1, 1), (32, 1, 1)))
    struct.pack_into("<Q", running, 24, 0)  # a forced flush: no end yet
    [gpu], (kept, _r, incomplete) = window(lib, [bytes(running)])
    assert (kept, incomplete) == (0, 1)
    assert gpu["busy_s"] == 0.0 and gpu["kernels"] == 0


def test_a_record_queued_before_the_window_tells_no_backlog(lib):
    # CUPTI records only what was launched while it was on: a record queued before the window is
    # inconsistent, not evidence that its stream was busy
    [gpu], _ = window(lib, [kernel(LO + 30 * MS, LO + 40 * MS, (33, 1, 1), (32, 1, 1), queued=LO - 50 * MS)])
    assert gpu["backlog_busy_s"] == 0.0
    assert gpu["busy_s"] == pytest.approx(0.01, abs=1e-9)


def test_the_package_build_compiles_the_library_without_cuda(tmp_path):
    """What `pip install .` runs (setup.py's extension): the system C compiler alone, no CUDA headers."""
    root = native.HERE.parent.parent
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path),
                            "--build-temp", str(tmp_path / "tmp")], cwd=root, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    [built] = (tmp_path / "gpu_trace" / "native").glob("_gputrace*.so")
    lib = native.load(built)
    assert lib.gt_blocks_per_sm(64, 32, 65536, 233472, 528, 0, 0) == 3


class FakeLibrary:
    """gt_load and gt_trace as gputrace.c defines them (0 or -1, the body written into `out`), standing in
    for CUPTI, which CI does not have: the window returns what `body` says, or waits on `release`."""

    def __init__(self, body=b'{"start": 1.0, "end": 2.0, "devices": [], "native": true}', rc=0):
        self.body, self.rc = body, rc
        self.release = threading.Event()
        self.block = False
        self.saw_stop = False

    def gt_load(self, path):
        return 0

    def gt_last_error(self):
        return b"cuptiActivityFlushAll failed"

    def gt_trace(self, seconds, stop, out, cap):
        if self.block:
            while not self.release.wait(0.01):
                if stop._obj.value:
                    self.saw_stop = True
                    break
        out.value = self.body
        return self.rc


def test_the_native_window_answers_the_librarys_body():
    assert native.NativeTracer(FakeLibrary()).trace(0.01) == {"start": 1.0, "end": 2.0, "devices": [], "native": True}


def test_a_failed_native_window_says_what_failed():
    with pytest.raises(RuntimeError, match="cuptiActivityFlushAll failed"):
        native.NativeTracer(FakeLibrary(rc=-1)).trace(0.01)


def test_a_native_window_that_does_not_return_is_late_and_the_next_is_refused_until_it_does():
    from gpu_trace.tracer import WindowLate

    lib = FakeLibrary()
    lib.block = True
    tracer = native.NativeTracer(lib, close_wait_s=0.05)
    with pytest.raises(WindowLate, match="had not returned"):
        tracer.trace(0.01)
    with pytest.raises(WindowLate, match="have not returned yet"):
        tracer.trace(0.01)
    lib.release.set()
    tracer._worker.join(30)
    lib.block = False
    assert tracer.trace(0.01)["native"] is True


def test_a_stopped_client_ends_its_native_window():
    lib = FakeLibrary()
    lib.block = True
    stop = threading.Event()
    stop.set()
    assert native.NativeTracer(lib, close_wait_s=30).trace(0.01, stop)["native"] is True
    assert lib.saw_stop


def test_libcupti_is_found_in_pytorchs_wheel_unless_named(tmp_path, monkeypatch):
    wheel = tmp_path / "nvidia" / "cu13" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcupti.so.13").write_bytes(b"")
    monkeypatch.delenv("GPU_SPATIAL_CUPTI_LIBRARY", raising=False)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path / "elsewhere"), str(tmp_path)])
    assert native.cupti_library() == str(wheel / "libcupti.so.13")
    monkeypatch.chdir(tmp_path)  # "" on sys.path is the working folder
    monkeypatch.setattr(sys, "path", [""])
    assert native.cupti_library() == "nvidia/cu13/lib/libcupti.so.13"
    monkeypatch.setenv("GPU_SPATIAL_CUPTI_LIBRARY", "/opt/cupti/libcupti.so")
    assert native.cupti_library() is None  # the library opens the one named itself


def test_the_hook_claims_the_process_once(tmp_path, monkeypatch):
    """The Python hook and the injection share one claim: a second start in the process makes no client."""
    from gpu_trace import hook

    library = native.build(tmp_path)  # a copy of its own: a fresh claim
    monkeypatch.setenv("GPU_SPATIAL_TRACE_LIBRARY", str(library))
    monkeypatch.setattr(hook, "_client", None)
    first = hook.start(str(tmp_path / "none.sock"))
    try:
        assert first is not None and first.is_alive()
        monkeypatch.setattr(hook, "_client", None)
        assert hook.start(str(tmp_path / "none.sock")) is None
    finally:
        first.stop.set()
