"""Fault injection: every source broken while the exporter runs as a real process on 127.0.0.1.

For each fault: every scrape answers within its usual latency, /healthz and the collector success
series tell the truth, the problem is logged once, no traceback, and no value of the broken source
stays published as if fresh."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import socketserver
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, Exporter, http_get, parse_metrics, sample_value, wait_for

SLICED = FIXTURES / "nvml_h100_time_sliced.json"
H100 = json.loads(SLICED.read_text())["calls"]["identity/0"][0]["value"]["uuid"]
SECOND = "GPU-00000000-1111-2222-3333-444444444444"
RECORDED_H100 = "GPU-b2071921-9a0c-9128-f80c-5300b638b846"  # GPU 0 of the dcgm-exporter fixture
SCRAPE_BUDGET_S = 0.5  # a scrape serves a rendered snapshot: milliseconds; this is far above that
PER_TICK = ("utilization_samples", "memory", "power_watts", "sm_clock_hz", "temperature_celsius")


class Scraper:
    """Scrapes /metrics and /healthz in a thread for the whole test; keeps the slowest and failures."""

    def __init__(self, exporter: Exporter, every: float = 0.05):
        self.exporter, self.every = exporter, every
        self.slowest, self.failures, self.count = 0.0, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                status, _ = http_get(self.exporter.url + "/metrics", timeout=5)
                if status != 200:
                    self.failures.append(f"/metrics {status}")
            except OSError as exc:
                self.failures.append(repr(exc))
            self.slowest = max(self.slowest, time.perf_counter() - started)
            self.count += 1
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        assert not self.failures, self.failures[:5]
        assert self.count > 10 and self.slowest < SCRAPE_BUDGET_S, (self.count, self.slowest)


def samples(exporter):
    return parse_metrics(exporter.metrics())


def healthz(exporter) -> int:
    return http_get(exporter.url + "/healthz")[0]


def no_traceback(exporter):
    assert "Traceback" not in exporter.log(), exporter.log()


def log_lines(exporter, *needles) -> int:
    return sum(all(n in line for n in needles) for line in exporter.log().splitlines())


# -- NVML: errors on one GPU of two, a GPU lost and back (recorded-replay boundary) --------------
def two_gpu_recording(tmp_path, second_gpu_streams) -> Path:
    """The H100 recording as GPU 0, and a copy of it as GPU 1 whose streams `second_gpu_streams` edits."""
    data = json.loads(SLICED.read_text())
    calls = data["calls"]
    calls["device_count"] = [{"value": 2}]
    for key in [k for k in calls if k.endswith("/0")]:
        calls[key.replace("/0", "/1")] = json.loads(json.dumps(calls[key]))
    calls["identity/1"][0]["value"]["uuid"] = SECOND
    second_gpu_streams(calls)
    path = tmp_path / "two_gpus.json"
    path.write_text(json.dumps(data))
    return path


def failing_stream(good: list, good_ticks: int, failing_ticks: int, answer: dict) -> list:
    """A stream of `good_ticks` good answers, `failing_ticks` times `answer`, then good ones for the rest of a test."""
    return [good[i % len(good)] for i in range(good_ticks)] + [answer] * failing_ticks + good * 400


def error(call, reason, lost=False):
    return {"error": reason, "call": call, "gpu_lost": lost, "unsupported": False}


def gpu_series(m, name, uuid):
    return sample_value(m, name, uuid=uuid)


def test_nvml_errors_on_one_gpu_of_two_drop_only_its_values(tmp_path):
    def edit(calls):  # GPU 1: 15 good ticks, 25 failing ones, then good for the rest of the test
        for method in PER_TICK:
            calls[f"{method}/1"] = failing_stream(calls[f"{method}/1"], 15, 25, error(method, "Unknown Error"))
        # Where GPM serves a GPU its time utilization is GPM's (the next test), and NVML's samples are read only
        # now and then: without GPM, GPU 1's time utilization is NVML's samples, read every tick
        calls["gpm_support/1"] = [{"value": {"reason": "GPM not supported (declared)", "supported": False}}]

    with Exporter("--nvml-replay", str(two_gpu_recording(tmp_path, edit)), "--no-mps", "--interval", "0.2") as e, \
            Scraper(e):
        def failing():
            m = samples(e)
            return m if gpu_series(m, "gpu_power_watts", SECOND) is None else None

        m = wait_for(failing, 15, 0.05, "GPU 1's values gone")
        assert gpu_series(m, "gpu_power_watts", H100) is not None  # GPU 0 untouched
        assert gpu_series(m, "gpu_time_utilization_ratio", SECOND) is None  # no repeated old sample
        assert sample_value(m, "gpu_exporter_collector_success", collector="nvml") == 0
        assert healthz(e) == 200  # the exporter is healthy; one GPU's readings are not
        wait_for(lambda: gpu_series(samples(e), "gpu_power_watts", SECOND) is not None, 15, 0.1, "GPU 1 back")
        wait_for(lambda: sample_value(samples(e), "gpu_exporter_collector_success", collector="nvml") == 1, 5)
        # the failure went into what GPU 1's time utilization is read from
        assert sample_value(samples(e), "gpu_time_utilization_source_info", uuid=SECOND, source="nvml") == 1
        assert log_lines(e, "nvml GPU 1", "Unknown Error") == 1
        # GPU 0 untouched: no problem logged (INFO lines name, once each, the calls this recording predates)
        assert log_lines(e, "nvml GPU 0", "WARNING") == 0 and log_lines(e, "nvml GPU 0", "ERROR") == 0
        no_traceback(e)


def test_gpm_errors_on_one_gpu_of_two_drop_only_its_busy_time_and_sm_activity(tmp_path):
    """Where GPM serves the GPU its time utilization is GPM's GRAPHICS_UTIL (0.999 in this recording) and
    NVML's samples are not read; where GPM fails, NVML's samples are read again. GPU 1's NVML answers hold no
    GPU utilization samples (declared), so while GPM fails nothing can read its busy time: its time
    utilization, SM activity and hidden idle disappear, never GPM's last answer repeated."""
    def edit(calls):  # GPU 1: 15 good GPM ticks, 25 failing ones, then good for the rest of the test
        calls["gpm_metrics/1"] = failing_stream(calls["gpm_metrics/1"], 15, 25, error("nvmlGpmSampleGet", "Unknown Error"))
        for answer in calls["utilization_samples/1"]:
            answer["value"]["gpu"] = []

    with Exporter("--nvml-replay", str(two_gpu_recording(tmp_path, edit)), "--no-mps", "--interval", "0.2") as e, \
            Scraper(e):
        def source(m, uuid):
            return {labels["source"] for labels, _ in m.get("gpu_time_utilization_source_info", ()) if labels["uuid"] == uuid}

        wait_for(lambda: source(samples(e), SECOND) == {"gpm"}, 15, 0.05, "GPU 1's time utilization from GPM")
        def gpm_failing():
            m = samples(e)
            return m if sample_value(m, "gpu_spatial_source_state", uuid=SECOND, source="gpm", state="error") == 1 else None

        m = wait_for(gpm_failing, 15, 0.05, "GPM failing on GPU 1")
        assert source(m, SECOND) == set() and gpu_series(m, "gpu_time_utilization_ratio", SECOND) is None
        assert gpu_series(m, "gpu_sm_active_ratio", SECOND) is None and gpu_series(m, "gpu_hidden_idle_sm_ratio", SECOND) is None
        assert source(m, H100) == {"gpm"} and gpu_series(m, "gpu_sm_active_ratio", H100) is not None  # GPU 0 untouched
        wait_for(lambda: source(samples(e), SECOND) == {"gpm"}, 15, 0.1, "GPU 1's GPM back")
        assert log_lines(e, "gpm GPU 1", "Unknown Error") == 1
        no_traceback(e)


def test_a_lost_gpu_disappears_and_comes_back_when_it_answers_again(tmp_path):
    def edit(calls):
        good = calls["memory/1"]
        calls["memory/1"] = good * 5 + [error("nvmlDeviceGetMemoryInfo", "GPU is lost", lost=True)] + good * 400
        calls["xid_open"] = [{"value": {"0": None, "1": None}}]  # both GPUs registered for XID events

    with Exporter("--nvml-replay", str(two_gpu_recording(tmp_path, edit)), "--no-mps", "--interval", "0.2") as e, \
            Scraper(e):
        lost_at = wait_for(lambda: gpu_series(samples(e), "gpu_memory_used_bytes", SECOND) is None and time.monotonic(),
                           15, 0.05, "GPU 1 lost")
        m = samples(e)
        assert all(labels.get("uuid") != SECOND for name, rows in m.items() if name.startswith("gpu_")
                   and name not in ("gpu_spatial_source_state", "gpu_lost") for labels, _ in rows)
        assert gpu_series(m, "gpu_lost", SECOND) == 1 and gpu_series(m, "gpu_lost", H100) == 0
        assert gpu_series(m, "gpu_memory_used_bytes", H100) is not None
        wait_for(lambda: gpu_series(samples(e), "gpu_memory_used_bytes", SECOND) is not None, 20, 0.2, "GPU 1 back")
        assert gpu_series(samples(e), "gpu_lost", SECOND) == 0
        assert time.monotonic() - lost_at >= 9  # asked again after LOST_RETRY_S, not every tick
        assert log_lines(e, "nvml GPU 1", "GPU lost") == 1
        assert log_lines(e, "nvml GPU 1", "answers again") == 1
        # the XID event set held the lost GPU's old handle: the GPU is registered again, once
        wait_for(lambda: log_lines(e, "xid GPU 1", "registered for XID events again") == 1, 10, 0.1, "XID again")
        no_traceback(e)


# -- dcgm-exporter: hangs, 100 MB, unknown UUIDs, refused --------------------------------------
class DcgmExporterDouble:
    """An HTTP server on 127.0.0.1 with dcgm-exporter's /metrics text (the recorded fixture, GPU 0 as
    the replayed H100), whose behaviour the test switches: ok, hang, huge, strangers."""

    def __init__(self):
        self.mode = "ok"
        self.release = threading.Event()
        text = (FIXTURES / "dcgm_exporter_metrics.txt").read_text().replace(RECORDED_H100, H100)
        # live counters move: two answers that differ in the last digit of one field, taken in turn
        variants = [text, text.replace("0.997904", "0.997905")]
        self.served = 0
        double = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if double.mode == "hang":
                    double.release.wait(30)
                    return
                double.served += 1
                body = (text if double.mode == "frozen" else variants[double.served % 2]).encode()
                if double.mode == "strangers":
                    body = text.replace("GPU-", "GPU-0ther-").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                try:
                    if double.mode == "huge":  # 100 MB of valid-looking exposition
                        line = b"# HELP filler padding\n" * 4096
                        for _ in range(100 * 2**20 // len(line)):
                            self.wfile.write(line)
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def dcgm_state(m, state):
    return sample_value(m, "gpu_spatial_source_state", uuid=H100, source="dcgm", state=state) == 1


def test_dcgm_exporter_that_hangs_floods_serves_strangers_or_refuses(tmp_path):
    double = DcgmExporterDouble()
    try:
        with Exporter("--nvml-replay", str(SLICED), "--no-mps", "--interval", "0.2", "--dcgm-exporter-url",
                      double.url, "--dcgm-timeout", "1", "--dcgm-frozen-after", "2") as e, Scraper(e):
            wait_for(lambda: dcgm_state(samples(e), "active"), 15, 0.1, "dcgm active")

            for mode, state, success, logged in (("hang", "error", 0, "did not answer within 1.0 s"),
                                                 ("huge", "error", 0, "more than 8 MB"),
                                                 ("strangers", "unsupported", 1, "NVML does not see here"),
                                                 ("frozen", "error", 1, "frozen")):
                double.mode = mode
                m = wait_for(lambda: (lambda m: m if dcgm_state(m, state) else None)(samples(e)), 20, 0.1,
                             f"dcgm {state} while it {mode}s")
                # no DCGM value stays published; GPM, next in the chain, serves the GPU meanwhile
                assert sample_value(m, "gpu_sm_active_ratio", uuid=H100, source="dcgm") is None
                assert sample_value(m, "gpu_sm_active_ratio", uuid=H100, source="gpm") is not None
                assert sample_value(m, "gpu_exporter_collector_success", collector="dcgm") == success
                assert healthz(e) == 200
                time.sleep(1.5)  # several ticks in the same fault
                assert log_lines(e, logged) == 1, (mode, e.log())
                double.mode = "ok"
                wait_for(lambda: dcgm_state(samples(e), "active"), 15, 0.1, f"dcgm active after {mode}")

            double.close()  # refused connections
            m = wait_for(lambda: (lambda m: m if dcgm_state(m, "error") else None)(samples(e)), 15, 0.1, "refused")
            assert sample_value(m, "gpu_exporter_collector_success", collector="dcgm") == 0
            assert sample_value(m, "gpu_sm_active_ratio", uuid=H100, source="dcgm") is None
            time.sleep(1)
            assert log_lines(e, "unreachable") == 1
            no_traceback(e)
    finally:
        double.close()


# -- nsys watch directory: half-written, garbage, deleted mid-read ------------------------------
def aged(path: Path, seconds: float = 10):
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp))
    return path


def test_watched_exports_that_are_half_written_garbage_or_deleted(tmp_path):
    watch = tmp_path / "watch"
    watch.mkdir()
    good = FIXTURES / "h100_quarter_sms_50hz.sqlite"
    aged(Path(shutil.copy(good, watch / "good.sqlite")), 60)
    with Exporter("--no-nvml", "--no-mps", "--interval", "0.2", "--nsys-watch-dir", str(watch)) as e, Scraper(e):
        stamp = lambda m: sample_value(m, "gpu_spatial_sample_timestamp_seconds", source="nsys")
        published = wait_for(lambda: stamp(samples(e)), 15, 0.1, "good export published")

        half = watch / "half.sqlite"
        half.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
        aged(half, 30)
        m = wait_for(lambda: (lambda m: m if sample_value(m, "gpu_exporter_collector_success", collector="nsys") == 0
                              else None)(samples(e)), 15, 0.1, "half-written export refused")
        # the last good window stays, with its capture time: visibly old, never restamped as fresh
        assert stamp(m) == published
        assert healthz(e) == 200
        half.unlink()

        garbage = watch / "garbage.sqlite"
        garbage.write_bytes(os.urandom(64 * 1024))
        aged(garbage, 20)
        wait_for(lambda: "not a SQLite file" in e.log(), 15, 0.1, "garbage refused")
        garbage.unlink()

        # files that vanish between listing and reading, over and over
        stop = threading.Event()

        def churn():
            n = 0
            while not stop.is_set():
                path = watch / f"churn-{n}.sqlite"
                shutil.copy(good, path)
                aged(path, 5)
                time.sleep(0.03)
                path.unlink()
                n += 1

        worker = threading.Thread(target=churn, daemon=True)
        worker.start()
        time.sleep(4)
        stop.set()
        worker.join(5)
        wait_for(lambda: sample_value(samples(e), "gpu_exporter_collector_success", collector="nsys") == 1, 15, 0.1,
                 "nsys healthy again")
        assert log_lines(e, "half.sqlite") == 1
        assert log_lines(e, "garbage.sqlite") == 1
        assert log_lines(e, "WARNING", "churn-") == 0, e.log()  # vanished files are no problem
        no_traceback(e)


# -- /proc entries vanishing mid-scan, the MPS control pipe hanging -----------------------------
def test_proc_entries_vanishing_mid_scan(tmp_path):
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", proc)
    stop = threading.Event()

    def churn():  # daemons and other processes come and go, some half-way (stat without status)
        spare = tmp_path / "spare"
        shutil.copytree(FIXTURES / "proc" / "202", spare)
        while not stop.is_set():
            for pid in range(9000, 9040):
                shutil.copytree(spare, proc / str(pid), dirs_exist_ok=True)
                if pid % 3 == 0:
                    (proc / str(pid) / "status").unlink()
            time.sleep(0.01)
            for pid in range(9000, 9040):
                shutil.rmtree(proc / str(pid), ignore_errors=True)

    worker = threading.Thread(target=churn, daemon=True)
    try:
        with Exporter("--no-nvml", "--interval", "0.2", "--proc-root", str(proc), "--mps-control-binary",
                      str(FIXTURES / "fake-mps-control")) as e, Scraper(e):
            wait_for(lambda: sample_value(samples(e), "mps_daemon_up", role="server") == 1, 15, 0.1, "MPS seen")
            worker.start()
            time.sleep(5)
            m = samples(e)
            assert sample_value(m, "mps_daemon_up", role="control") == 1
            assert healthz(e) == 200
            stop.set()
            worker.join(10)
            for pid in ("202", "303"):  # both servers exit
                shutil.rmtree(proc / pid)
            m = wait_for(lambda: (lambda m: m if sample_value(m, "mps_daemon_up", role="server") == 0 else None)(
                samples(e)), 15, 0.1, "servers gone")
            assert sample_value(m, "mps_daemon_major_page_faults_total", role="server") is None  # not frozen
            no_traceback(e)
    finally:
        stop.set()


def test_a_hanging_mps_control_pipe(tmp_path):
    with Exporter("--no-nvml", "--interval", "0.2", "--proc-root", str(FIXTURES / "proc"), "--mps-timeout", "0.5",
                  "--mps-control-binary", str(FIXTURES / "hung-mps-control")) as e, Scraper(e):
        m = wait_for(lambda: (lambda m: m if "mps_control_reachable" in m else None)(samples(e)), 15, 0.1)
        wait_for(lambda: sample_value(samples(e), "mps_control_reachable") == 0, 10, 0.1, "control unreachable")
        time.sleep(3)  # several queries time out
        m = samples(e)
        assert sample_value(m, "mps_server_clients") is None  # clients unknown: gone, not the last count
        assert sample_value(m, "mps_daemon_up", role="server") == 1  # /proc still read
        assert healthz(e) == 200
        assert log_lines(e, "did not answer within 0.5 s") == 1
        no_traceback(e)


@pytest.fixture(autouse=True)
def _bounded():
    started = time.monotonic()
    yield
    assert time.monotonic() - started < 90, "a fault test must stay bounded in time"
