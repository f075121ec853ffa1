"""`gpu-spatial top`: the screen model on small synthetic snapshots (exact figures, hostile JSON), and the
real program under Debian's tmux at 80x24 and 160x48, in-process on replays and against a real
exporter over HTTP: the pane must show what /api/v1/gpus says for the snapshot it names, keys must
work, and an exporter that dies must be reported and then picked up again."""
from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from gpu_spatial.top.feeds import HttpFeed
from gpu_spatial.top.render import View, pct, plain, render
from gpu_spatial.top.state import screen_state
from gpu_spatial.top.tui import handle_key
from tests.helpers import FIXTURES, ROOT, Exporter, wait_for

FROZEN = ("--no-mps", "--nvml-replay", str(FIXTURES / "nvml_h100_quarter_sms_frame.json"))  # one frame forever
PHASES = ("--no-mps", "--nvml-replay", str(FIXTURES / "nvml_h100_phases.json"),
          "--replay", str(FIXTURES / "h100_quarter_sms_50hz.sqlite"))
MPS = ("--nvml-replay", str(FIXTURES / "nvml_h100_mps.json"), "--proc-root", str(FIXTURES / "proc"),
       "--mps-control-binary", str(FIXTURES / "fake-mps-control"))
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install tmux)")


# -- the screen model -----------------------------------------------------------------------------
def snapshot(**gpu) -> dict:
    base = {
        "index": 3, "uuid": "GPU-1234", "model": "NVIDIA H100 80GB HBM3", "time_utilization": 0.9,
        "spatial": {"source": "gpm", "sm_active": 0.3, "sm_occupancy": 0.12, "tensor_active": 0.05,
                    "dram_active": 0.4},
        "hidden_idle_sm_ratio": 0.6, "sharing_mode": "time_sliced",
        "diagnosis": {"verdict": "time_sliced_small_kernels", "reason": "r", "advice": "use MPS",
                      "evidence": {"mps_server_faults_per_s": 0.0}},
        "sources": [{"source": "dcgm", "state": "unsupported", "reason": "not configured"},
                    {"source": "gpm", "state": "active", "reason": "GPM sample"}],
        "telemetry": {"lost": False, "memory_used_bytes": 2**31, "memory_total_bytes": 80 * 2**30,
                      "processes": [{"pid": 11, "command": "a", "sm": 0.2, "memory": 0.0},
                                    {"pid": 12, "command": "b", "sm": 0.7, "memory": 0.0}],
                      "compute_processes": [{"pid": 11, "command": "a", "kind": "time_sliced"},
                                            {"pid": 12, "command": "b", "kind": "time_sliced"},
                                            {"pid": 13, "command": "c", "kind": "mps"}],
                      "errors": []},
    }
    base.update(gpu)
    return {"snapshot_version": 42, "snapshot_time": 1e9, "gpus": [base]}


def screen(data: dict, width=80, height=24, view=None) -> str:
    return plain(render(screen_state(data, "test"), view or View(), width, height))


def test_exact_figures_at_80x24():
    text = screen(snapshot())
    assert "snapshot 42" in text.splitlines()[0]
    gpu = next(line for line in text.splitlines() if line.startswith(">"))
    assert re.search(r"time\[#+ *\] 90% SM\[#+~+ *\] 30% hid 60%", gpu), gpu
    assert "time  90%  SM  30%  occ  12%  tensor   5%  DRAM  40%  hidden idle  60%" in text
    assert "mode time_sliced  spatial gpm" in text
    assert "verdict time_sliced_small_kernels: use MPS" in text
    assert "mem 2.0G/80.0G" in text
    assert all(len(line) <= 80 for line in text.splitlines()) and len(text.splitlines()) <= 24


def test_why_page_gives_the_reason_behind_each_na():
    text = screen(snapshot(spatial=None, time_utilization=None), width=160, view=View(page="why"))
    assert "SM active: n/a: no spatial source: dcgm unsupported (not configured); gpm active (GPM sample)" in text
    assert "time utilization: n/a: NVML has no samples of this GPU" in text
    assert "TIME% n/a for MPS clients (M)" in text
    main = screen(snapshot(spatial=None), width=160)
    assert "spatial n/a (w: why)" in main and "SM n/a" in main.replace("SM  n/a", "SM n/a")


def test_tiny_terminals_clip_instead_of_failing():
    for width, height in ((20, 5), (10, 2), (80, 1)):
        lines = render(screen_state(snapshot(), "t"), View(), width, height)
        assert len(lines) <= height and all(sum(len(t) for t, _ in line) <= width for line in lines)


def test_bar_cells_and_hidden_idle():
    from gpu_spatial.top.render import bar

    cells = "".join(t for t, _ in bar(10, 0.3, 0.9))
    assert cells == "[###~~~~~~ ]"
    assert "".join(t for t, _ in bar(10, 0.9, 0.3)) == "[######### ]"  # SM above time: no hidden idle
    assert "n/a" in "".join(t for t, _ in bar(10, None))


def test_processes_sorted_marked_and_mps_client_without_time_share():
    rows = lambda text: [line.split()[0] if line[0] == " " else line.split()[1]
                         for line in text.splitlines() if re.match(r"^[ MS]\s*\d+ ", line)]
    assert rows(screen(snapshot())) == ["12", "11", "13"]  # time share, biggest first; n/a last
    view = View()
    handle_key(ord(">"), view, 1)
    handle_key(ord(">"), view, 1)
    assert view.sort == "pid" and rows(screen(snapshot(), view=view)) == ["11", "12", "13"]
    handle_key(ord("i"), view, 1)
    assert rows(screen(snapshot(), view=view)) == ["13", "12", "11"]
    view = View()
    handle_key(ord("<"), view, 1)  # time -> command (wraps round), a..c
    assert view.sort == "command" and rows(screen(snapshot(), view=view)) == ["11", "12", "13"]
    handle_key(ord("s"), view, 1)
    assert view.sort == "time"
    assert re.search(r"^M\s+13 n/a\s+n/a\s+n/a\s+c$", screen(snapshot()), re.M)


def test_lost_gpu_shows_no_stale_values():
    data = snapshot()
    data["gpus"][0]["telemetry"]["lost"] = True
    text = screen(data)
    assert "GPU lost" in text and " 90%" not in text and "30%" not in text


def test_hostile_json_reads_na_without_exception():
    for garbage in ({"gpus": "x"}, {"gpus": [None, 3, {"index": "a", "spatial": [], "telemetry": 7}]},
                    {"gpus": [{"time_utilization": float("nan"), "sources": [1], "diagnosis": "x",
                               "telemetry": {"processes": [{"pid": "1"}], "compute_processes": 5}}]}, [], None):
        text = screen(garbage)
        assert "gpu-spatial top" in text


def test_workloads_shown_when_present_never_required():
    data = snapshot()
    assert "workload" not in screen(data)
    data["workloads"] = [{"uuid": "GPU-1234", "namespace": "ml", "pod": "trainer-0", "time_share": 0.45},
                         {"uuid": "GPU-other", "namespace": "ml", "pod": "elsewhere", "time_share": 0.1}]
    assert "workload trainer-0  time_share 0.45" in screen(data) and "elsewhere" not in screen(data)
    # each figure with its basis where the exporter names it (issue 26: measured from context switches or not)
    data["workloads"][0].update(time_share_basis="ctxsw", sm_active=0.2, sm_active_basis="time_share")
    assert "workload trainer-0  time_share 0.45 (ctxsw)  sm_active 0.20 (time_share)" in screen(data)


def test_both_views_of_a_holder_and_the_gpus_ledger_are_shown_apart():
    """Issue 35: a holder's allocation (held, used) and its ledger cells on one line, labelled apart; the
    GPU's ledger on its own line, unattributed parts named, summing to 100% of the GPU."""
    data = snapshot()
    data["workloads"] = [{"uuid": "GPU-1234", "pod": "trainer-0", "held_share": 0.25, "time_share": 0.4,
                          "ledger": {"sm_active_work": 0.02, "hidden_idle": 0.38, "time_idle": 0.0}}]
    data["ledgers"] = [{"uuid": "GPU-1234", "cells": {"sm_active_work": 0.04, "hidden_idle": 0.76,
                                                      "unattributed_hidden_idle": 0.19, "time_idle": 0.01}},
                       {"uuid": "GPU-other", "cells": {"unheld": 1.0}}]
    text = screen(data, width=200, height=40)
    assert "workload trainer-0  alloc: held_share 0.25  time_share 0.40  | ledger: work 0.02  hidden idle 0.38  " \
           "time idle 0.00" in text
    assert "ledger work   4%  hidden idle  95% ( 19% nobody's)  time idle   1%  (physical: sums to 100%)" in text
    assert "unheld" not in text  # another GPU's ledger


def test_mps_server_paging_shown_only_when_it_pages():
    quiet, paging = snapshot(), snapshot()
    paging["gpus"][0]["diagnosis"]["evidence"]["mps_server_faults_per_s"] = 0.1
    assert "paging" not in screen(quiet)
    assert "MPS server paging: 0.1 major faults/s" in screen(paging)


def test_user_and_slurm_job_only_for_the_process_nvml_named(tmp_path):
    from gpu_spatial.top.state import LocalProcesses

    pid = tmp_path / "4321"
    pid.mkdir()
    (pid / "comm").write_text("python3\n")
    (pid / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    (pid / "cgroup").write_text("0::/slurm/uid_0/job_4242/step_0\n")
    local = LocalProcesses(str(tmp_path))
    assert local.user(4321, "/usr/bin/python3") == "root"
    assert local.slurm_job(4321, "python3") == "slurm job 4242"
    assert local.user(4321, "trainer") is None and local.slurm_job(4321, "trainer") == ""  # pid reused
    assert local.user(9999, "python3") is None
    state = screen_state(snapshot(), "t", local)
    assert all(p.user is None for p in state.gpus[0].processes)  # commands a, b, c are not pid 4321's


class _Garbage(http.server.BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


class _DrippingHeaders(_Garbage):
    """Headers one byte every 0.05 s: each read returns, only a deadline over the whole request stops it."""

    def do_GET(self):
        with contextlib.suppress(OSError):
            for byte in b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 400 + b"\r\n\r\n{}":
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.05)


# (issue 39) nested JSON: RecursionError escaped and killed the poll thread with a traceback; 1.2 M values in
# 2.4 MB: over one value per 16 bytes of the 16 MiB cap
@pytest.mark.parametrize("body,reason", [(b"<html>", "not JSON"), (b'{"x": 1}', "not a gpu-spatial exporter"),
                                         (b"[" * (17 * 2**20), "answer over 16777216 bytes"),
                                         (b"[" * 200_000 + b"]" * 200_000, "JSON nested too deeply"),
                                         (b"[" + b"0," * 1_200_000 + b"0]", "JSON of more than 1048576 values")])
def test_http_feed_refuses_what_is_not_an_exporter(body, reason):
    handler = type("H", (_Garbage,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        feed = HttpFeed(f"http://127.0.0.1:{server.server_port}", 1.0)
        feed.poll_once()
        assert "not answering since" in feed.state().problem and reason in feed.state().problem
        assert feed.state().gpus == []
    finally:
        server.shutdown()


def test_http_feed_refuses_an_error_status_whatever_its_body():
    class Failing(_Garbage):
        def do_GET(self):
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"gpus": []}')

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        feed = HttpFeed(f"http://127.0.0.1:{server.server_port}", 1.0)
        feed.poll_once()
        assert feed.state().problem.endswith("retrying (HTTP 503)"), feed.state().problem
    finally:
        server.shutdown()


def test_http_feed_gives_up_on_dripping_headers_at_its_deadline():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DrippingHeaders)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        feed = HttpFeed(f"http://127.0.0.1:{server.server_port}", 1.0, timeout=0.5)
        feed.poll_once()  # the headers alone take 20 s at this pace
        assert feed.state().problem.endswith("retrying (slower than its deadline)"), feed.state().problem
    finally:
        server.shutdown()


def test_bad_flags_exit_2_with_one_line():
    for argv, expect in ((["--url", "ftp://x"], "want http://host:port"), (["--interval", "0"], "interval"),
                         (["--url", "http://x", "--replay", "f"], "not with --url"),
                         (["--nvml-replay", "/nonexistent.json"], "error"),
                         (["--once", "--size", "10x2", "--no-nvml"], "COLSxROWS")):
        run = subprocess.run([sys.executable, "-m", "gpu_spatial", "top", *argv], cwd=ROOT, capture_output=True,
                             text=True, timeout=30)
        assert run.returncode == 2, (argv, run.stderr)
        assert expect in run.stderr and "Traceback" not in run.stderr, (argv, run.stderr)


def test_the_interval_takes_the_exporters_suffixes_and_bounds():
    from gpu_spatial.top import build_parser

    assert [build_parser().parse_args(["--interval", text]).interval for text in ("2s", "1m", "0.1", "60")] == \
        [2.0, 60.0, 0.1, 60.0]
    for text in ("0.09", "61", "1m1"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--interval", text])


# -- the real program under tmux ------------------------------------------------------------------
class Tmux:
    """A private tmux server (own socket) running `gpu-spatial top ...` in a window of a given size."""

    def __init__(self, args, width: int, height: int, env: dict | None = None):
        self.directory = tempfile.mkdtemp(prefix="top-test-")
        self.socket = os.path.join(self.directory, "tmux")  # its own server, its socket gone afterwards
        command = " ".join(f"'{a}'" for a in [sys.executable, "-m", "gpu_spatial", "top", *args])
        environment = " ".join(f"{k}='{v}'" for k, v in {"PYTHONPATH": str(ROOT), **(env or {})}.items())
        # The shell stays after top exits, so the test reads its exit status on the pane.
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
                   f"cd '{ROOT}'; env {environment} {command}; echo TOP-EXITED=$?; sleep 60")

    def _tmux(self, *args) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout

    def capture(self, *flags: str) -> str:
        return self._tmux("capture-pane", "-p", *flags, "-t", "t")

    def keys(self, *keys) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def wait(self, predicate, timeout=20.0, what="screen"):
        """Waits until predicate(pane text) holds; the pane text, or a TimeoutError showing it."""
        try:
            return wait_for(lambda: predicate(text := self.capture()) and text, timeout, 0.2, what)
        except TimeoutError:
            raise AssertionError(f"{what} not on screen within {timeout} s:\n{self.capture()}") from None

    def close(self):
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._tmux("kill-server")
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def tmux(args, width, height, env=None):
    session = Tmux(args, width, height, env)
    try:
        yield session
    finally:
        session.close()


def gpu_rows(text: str) -> list[tuple[str, str]]:
    """(time, SM) as printed on each GPU line."""
    return re.findall(r"^[> ]\s*\S+ .*?time\[[^\]]*\]\s*(n/a|\d+%) SM\[[^\]]*\]\s*(n/a|\d+%)", text, re.M)


def detail(text: str) -> tuple[str, str]:
    mode = re.search(r"mode (\S+)", text).group(1)
    verdict = re.search(r"^verdict (\S+):", text, re.M).group(1)
    return mode, verdict


def expected(api: dict, selected: int = 0):
    rows = [(pct(g["time_utilization"]).strip(), pct((g["spatial"] or {}).get("sm_active")).strip())
            for g in api["gpus"]]
    gpu = api["gpus"][selected]
    return rows, (gpu["sharing_mode"] or "n/a", (gpu["diagnosis"] or {}).get("verdict") or "n/a")


COLOUR = re.compile(r"\x1b\[[0-9;]*3[1-6]m")  # red..cyan in capture-pane -e output (37 is the default)


@needs_tmux
@pytest.mark.parametrize("width,height,env", [(80, 24, {"NO_COLOR": "1"}), (160, 48, {})])
def test_in_process_replay_matches_the_exporter(width, height, env):
    """A frozen replay (one recorded frame forever): top in-process shows what the exporter serves."""
    with Exporter(*FROZEN) as exporter:
        api = wait_for(lambda: (a := exporter.gpus())["gpus"][0]["spatial"] and a, 15, what="GPM reading")
        with tmux([*FROZEN], width, height, env) as pane:
            text = pane.wait(lambda t: re.search(r"SM\[[^\]]*\]\s*\d+%", t), what="an SM active figure")
            assert bool(COLOUR.search(pane.capture("-e"))) == (not env)  # NO_COLOR: plain
            rows, (mode, verdict) = expected(api)
            # time: GPM's GRAPHICS_UTIL 99.79 % (GPM serves the GPU; NVML's samples say 99 %), SM active 24.95 %
            assert gpu_rows(text) == rows and rows[0] == ("100%", "25%")
            assert detail(text) == (mode, verdict) == ("n/a", "small_kernels")
            assert "in-process (replay)" in text and "Traceback" not in text
            assert all(len(line) <= width for line in text.splitlines())
            pane.keys("?")
            pane.wait(lambda t: "select a GPU" in t and "hidden idle (time - SM)" in t, what="help")
            pane.keys("x")
            pane.wait(lambda t: "verdict small_kernels" in t, what="the main page again")
            pane.keys("w")
            pane.wait(lambda t: "spatial sources, in order of preference" in t and "dcgm" in t, what="why page")
            pane.keys("Escape")
            pane.wait(lambda t: "verdict" in t, what="main page")
            pane.keys("q")
            pane.wait(lambda t: "TOP-EXITED=0" in t, timeout=15, what="top exiting on q")


class Recorder:
    """Polls /api/v1/gpus in a thread and keeps every snapshot by version, to look up the one on screen."""

    def __init__(self, url: str):
        self.url = url
        self.seen: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        import urllib.request

        while not self._stop.wait(0.03):
            with contextlib.suppress(OSError, ValueError, http.client.HTTPException):  # the exporter killed
                with urllib.request.urlopen(self.url + "/api/v1/gpus", timeout=2) as r:
                    data = json.loads(r.read())
                self.seen[data["snapshot_version"]] = data

    def stop(self):
        self._stop.set()
        self._thread.join(5)


def shown_version(text: str) -> int | None:
    match = re.search(r"snapshot (\d+)", text)
    return int(match.group(1)) if match else None


def match_api(pane, recorder, selected: int, tries: int = 40):
    """Captures until the version on screen is one the recorder saw (it polls, so it may miss one),
    then compares the figures; returns the pane text."""
    for _ in range(tries):
        text = pane.wait(lambda t: shown_version(t) is not None and "not answering" not in t, what="a snapshot")
        version = shown_version(text)
        time.sleep(0.15)  # the recorder's next poll
        if version in recorder.seen:
            rows, (mode, verdict) = expected(recorder.seen[version], selected)
            assert gpu_rows(text) == rows, (version, text)
            assert detail(text) == (mode, verdict), (version, text)
            return text
        time.sleep(0.7)
    raise AssertionError(f"no snapshot on screen was among those recorded ({sorted(recorder.seen)[-5:]})")


class Restartable(Exporter):
    """The exporter again on the port of the one that died."""

    def __init__(self, *args, port: int):
        super().__init__(*args)
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.args[self.args.index("--port") + 1] = str(port)


@needs_tmux
@pytest.mark.parametrize("width,height", [(80, 24), (160, 48)])
def test_over_http_matches_the_api_keys_and_recovery(width, height):
    with contextlib.ExitStack() as stack:
        exporter = stack.enter_context(Exporter(*PHASES))
        recorder = Recorder(exporter.url)
        stack.callback(recorder.stop)
        pane = stack.enter_context(tmux(["--url", exporter.url], width, height))
        text = match_api(pane, recorder, 0)
        assert len(gpu_rows(text)) == 2 and exporter.url in text
        pane.keys("1")  # the second GPU (the one only the nsys replay knows)
        pane.wait(lambda t: "GPU 1 GPU-d0231d62" in t, what="second GPU selected")
        text = match_api(pane, recorder, 1)
        pane.keys("Up")
        pane.wait(lambda t: "GPU 0 GPU-b2071921" in t, what="first GPU selected again")

        exporter.proc.kill()
        exporter.proc.wait(10)
        text = pane.wait(lambda t: "not answering since" in t, what="the lost exporter")
        assert re.search(rf"exporter at {re.escape(exporter.url)} not answering since \d\d:\d\d:\d\d: retrying", text)
        assert not gpu_rows(text) and "Traceback" not in text  # no stale figures
        again = stack.enter_context(Restartable(*PHASES, port=exporter.port))
        recorder.seen.clear()
        text = match_api(pane, recorder, 0)
        assert "not answering" not in text and again.url == exporter.url
        pane.keys("q")
        pane.wait(lambda t: "TOP-EXITED=0" in t, timeout=15, what="top exiting on q")


@needs_tmux
def test_mps_clients_marked_and_sort_keys_over_http():
    with Exporter(*MPS) as exporter, tmux(["--url", exporter.url], 80, 24) as pane:
        first = lambda t: re.search(r"^([MS ])\s*(\d+) ", t.split("PID", 1)[-1].split("\n", 1)[-1], re.M)
        text = pane.wait(lambda t: first(t), what="the process table")
        assert first(text).groups() == ("S", "588")  # time share: the MPS server (NVML charges it)
        assert re.search(r"^M\s+518 ", text, re.M) and "mode mps" in text
        pane.keys(">", ">")  # time -> memory -> pid
        text = pane.wait(lambda t: "sort pid" in t, what="sort by pid")
        assert first(text).groups() == ("M", "518")
        pane.keys("i")
        text = pane.wait(lambda t: first(t) and first(t).group(2) != "518", what="reversed")
        assert first(text).group(2) == "588"
        pane.keys("s")  # pid -> user
        pane.wait(lambda t: "sort user" in t, what="sort by user")
        pane.keys("q")
        pane.wait(lambda t: "TOP-EXITED=0" in t, timeout=15, what="top exiting on q")


@needs_tmux
def test_a_lost_gpu_reads_lost_without_figures_then_comes_back(tmp_path):
    from tests.test_faults import SECOND, error, two_gpu_recording

    def edit(calls):
        good = calls["memory/1"]
        calls["memory/1"] = good * 5 + [error("nvmlDeviceGetMemoryInfo", "GPU is lost", lost=True)] + good * 400

    recording = two_gpu_recording(tmp_path, edit)
    with tmux(["--nvml-replay", str(recording), "--no-mps", "--interval", "0.2"], 80, 24) as pane:
        pane.keys("1")
        text = pane.wait(lambda t: "GPU lost" in t, what="GPU 1 lost")
        lost_line = next(line for line in text.splitlines() if "GPU lost" in line)
        assert "%" not in lost_line and len(gpu_rows(text)) == 1  # GPU 0 still has its figures
        assert SECOND[:20] in text and "Traceback" not in text
        pane.wait(lambda t: len(gpu_rows(t)) == 2, timeout=30, what="GPU 1 answering again")
        pane.keys("q")
        pane.wait(lambda t: "TOP-EXITED=0" in t, timeout=15, what="top exiting on q")
