"""What a tick costs in NVML calls per GPU (issue 37), counted on the stand-in NVML library (tests/nvml_library.py)
under the live wrapper, with a clock that moves only when told: the counts are exact.

Rules guarded:
- a GPU that lists no compute process gets no per-process utilization call, one that lists some gets one a tick;
- where GPM measured the tick's busy time, NVML's GPU utilization samples are not read (only the memory
  samples, every 2 s); without GPM, or where another spatial source (DCGM) publishes the GPU, they are read
  every tick;
- process names come from the process lists (every 2 s), not from a call per process and tick;
- every slower read keeps its cadence (2 s, 30 s, 60 s) through the one schedule; the health reads every 30 s;
- the exact calls per tick and GPU, idle and with 6 time-sliced processes (bench/RESULTS.md, "Cost per GPU");
- an exporter with the default flags never loads what only a flag it was not given uses (resident memory).
"""
from __future__ import annotations

import pytest

from exporter.snapshot import OK, SourceResult
from tests.nvml_library import calls_per_tick

IDLE = {"nvmlDeviceGetClockInfo": 2.0, "nvmlDeviceGetComputeRunningProcesses": 0.5,
        "nvmlDeviceGetCurrentClocksEventReasons": 1.0, "nvmlDeviceGetDecoderUtilization": 0.033,
        "nvmlDeviceGetEncoderUtilization": 0.033, "nvmlDeviceGetFieldValues": 0.05,
        "nvmlDeviceGetMPSComputeRunningProcesses": 0.5, "nvmlDeviceGetMemoryInfo": 1.0, "nvmlDeviceGetMigMode": 0.033,
        "nvmlDeviceGetPowerUsage": 1.0, "nvmlDeviceGetSamples": 0.5, "nvmlDeviceGetTemperature": 1.0,
        "nvmlGpmMetricsGet": 1.0, "nvmlGpmSampleGet": 1.0}


def test_an_idle_gpu_costs_its_telemetry_gpm_and_the_memory_samples_every_2_s():
    found = calls_per_tick(gpus=2, processes={}, ticks=60)
    assert found["by_function_per_tick"] == IDLE
    assert found["per_tick"] == {0: 9.65, 1: 9.65}
    assert found["most_in_one_tick"] == {0: 16, 1: 16}  # a tick with the 2 s and the 30 s reads together


def test_six_time_sliced_processes_add_one_utilization_call_a_tick_and_their_names_every_2_s():
    found = calls_per_tick(gpus=2, processes={0: 6, 1: 6}, ticks=60, busy=99.0)
    calls = found["by_function_per_tick"]
    assert calls["nvmlDeviceGetProcessUtilization"] == 1.0
    assert calls["nvmlSystemGetProcessName"] == 3.0  # 6 names with each list, every 2 s: none per tick
    assert calls["nvmlDeviceGetComputeRunningProcesses"] == 1.0  # pynvml: the count, then the list
    assert calls["nvmlDeviceGetSamples"] == 0.5
    assert found["per_tick"] == {0: 14.15, 1: 14.15}


def test_a_gpu_without_processes_on_one_side_pays_nothing_for_the_other_sides_processes():
    found = calls_per_tick(gpus=2, processes={1: 6}, ticks=60, busy=99.0)
    assert found["per_tick"] == {0: 9.65, 1: 14.15}


def test_without_gpm_the_gpu_utilization_samples_are_read_every_tick():
    found = calls_per_tick(gpus=1, processes={}, ticks=60, gpm=False)
    assert found["by_function_per_tick"]["nvmlDeviceGetSamples"] == 1.5  # GPU each tick, memory every 2 s
    assert "nvmlGpmSampleGet" not in found["by_function_per_tick"]


class Serving:
    """A spatial source that publishes every GPU (DCGM as the chain sees it)."""

    def __init__(self):
        self.results = {f"GPU-00000000-0000-0000-0000-{i:012d}": SourceResult(OK, "serving") for i in range(4)}


def test_where_dcgm_publishes_the_gpu_its_hidden_idle_keeps_nvmls_samples():
    found = calls_per_tick(gpus=1, processes={}, ticks=20, others={"dcgm": Serving()})
    assert found["by_function_per_tick"]["nvmlDeviceGetSamples"] == 1.5


@pytest.mark.parametrize("interval, memory_samples", [(1.0, 0.5), (0.5, 0.25), (2.0, 1.0), (0.25, 0.125)])
def test_the_memory_samples_and_process_lists_keep_their_2_s_cadence_at_any_interval(interval, memory_samples):
    found = calls_per_tick(gpus=1, processes={}, ticks=80, interval=interval)
    assert found["by_function_per_tick"]["nvmlDeviceGetSamples"] == memory_samples
    assert found["by_function_per_tick"]["nvmlDeviceGetComputeRunningProcesses"] == memory_samples


def test_the_slow_reads_keep_30_and_60_s():
    """The health reads every 30 s: dcgm-exporter's default collection interval for the same fields."""
    found = calls_per_tick(gpus=1, processes={}, ticks=120)
    calls = found["by_function_per_tick"]
    assert calls["nvmlDeviceGetEncoderUtilization"] == round(4 / 120, 3)  # every 30 s
    assert calls["nvmlDeviceGetMigMode"] == round(4 / 120, 3)  # every 30 s
    assert calls["nvmlDeviceGetFieldValues"] == round((4 + 2) / 120, 3)  # health every 30 s, errors every 60 s


# -- bench/cost_per_gpu.py: what the device run reports (tests/cost_summary.py) ---------------------------------
def device_report(**phases):
    return {"gpus": 2, "ctxsw_period_s": 180.0, "phases": phases}


def side(one_gpu, ours, nvitop, rss=(60.0, 56.0)):
    return {"one_gpu": one_gpu, "exporters": {"ours": {"cpu_percent_of_core": ours, "vmrss_mib": rss[0]},
                                               "nvitop": {"cpu_percent_of_core": nvitop, "vmrss_mib": rss[1]}}}


def test_the_device_summary_gives_the_slope_per_gpu_the_8_gpu_projection_and_the_rss_margin():
    from tests.cost_summary import summary

    found = summary(device_report(all_idle=side(False, 1.0, 6.9), one_idle=side(True, 0.6, 0.5),
                                  all_loaded=side(False, 1.3, 5.9, rss=(67.0, 56.0)),
                                  one_loaded=side(True, 0.8, 0.9, rss=(66.3, 56.0))))
    assert found["slope_percent_per_gpu"] == {"ours_idle": 0.4, "nvitop_idle": 6.4, "ours_loaded": 0.5, "nvitop_loaded": 5.0}
    assert found["projection_8_gpus_percent"] == {"ours_idle": 3.4, "nvitop_idle": 45.3, "ours_loaded": 4.3,
                                                  "nvitop_loaded": 35.9}
    # nvitop-exporter's + 10 MB (10.49 MiB over 56 MiB: 66.49): 66.3 MiB passes, 67 does not
    assert {k: v["met"] for k, v in found["rss_within_nvitop_plus_10mb"].items()} == \
        {"all_idle": True, "one_idle": True, "all_loaded": False, "one_loaded": True}
    assert [(r["phase"], r["gpus"], r["exporter"]) for r in found["rows"]][:2] == [("all_idle", 2, "ours"),
                                                                                   ("all_idle", 2, "nvitop")]


def test_the_device_summary_gives_a_windows_cost_less_the_exporters_own_rate():
    from tests.cost_summary import summary, table

    window = {"seconds": 20.0, "exporter_tree_cpu_s": 1.5, "nsys_outside_cpu_s": 2.0, "baseline_percent_of_core": 1.0,
              "exporter": {"vmrss_mib": 62.0, "vmhwm_mib": 63.0}, "attribution_child": {"cpu_s": 0.4, "peak_mib": 150}}
    found = summary(device_report(all_ctxsw={**window, "gpus": 2}, one_ctxsw={**window, "gpus": 1,
                                                                                "exporter_tree_cpu_s": 1.0}))
    both, one = found["ctxsw"]["all_ctxsw"], found["ctxsw"]["one_ctxsw"]
    assert both["window_cpu_s"] == 3.3  # 1.5 + 2.0 - 1 % of 20 s
    assert (both["percent_of_core_at_default_duty"], both["per_gpu_percent_at_default_duty"]) == (1.833, 0.917)
    assert (one["window_cpu_s"], found["ctxsw"]["window_cpu_s_per_added_gpu"]) == (2.8, 0.5)
    assert both["attribution_child"] == {"cpu_s": 0.4, "peak_mib": 150}
    # the source's cost is a phase of its own in the printed table, per GPU at the default duty
    assert table(found).splitlines()[-2:] == ["| all_ctxsw | 2 | 3.3 | 2.0 | 0.4 | 150 | None | 1.833 | 0.917 |",
                                              "| one_ctxsw | 1 | 2.8 | 2.0 | 0.4 | 150 | None | 1.556 | 1.556 |"]
    # a window that ended in an error (the device run of 2026-11-28: Nsight Compute's nsys) is said to be no measure
    states = [{"state": "active", "reason": "12 slices"}, {"state": "error", "reason": "nsys profile wrote no report"}]
    failed = summary(device_report(one_ctxsw={**window, "gpus": 1, "states": states}))
    assert failed["ctxsw"]["one_ctxsw"]["not_attributed"] == "error: nsys profile wrote no report"
    assert table(failed).splitlines()[-1].endswith("| not the source's cost: error: nsys profile wrote no report")
    assert found["ctxsw"]["one_ctxsw"]["not_attributed"] is None


def test_the_device_run_reads_the_sources_state_and_the_childs_cost_as_the_exporter_writes_them():
    from tests.cost_summary import child_cost, settled
    from exporter.samplers.ctxsw import CtxswSampler

    sampler = CtxswSampler(None)
    sampler.attribution = {"cpu_s": 0.4567, "peak_rss_bytes": 150 * 2**20 + 1}
    assert child_cost(f"12 slices of 2 processes in 10.0 s{sampler._attribution_cost()}") == \
        {"cpu_s": 0.46, "startup_cpu_s": None, "peak_mib": 150}
    sampler.attribution["startup_cpu_s"] = 0.2049  # a child that says how much of it was its start-up
    assert child_cost(f"12 slices of 2 processes in 10.0 s{sampler._attribution_cost()}") == \
        {"cpu_s": 0.46, "startup_cpu_s": 0.2, "peak_mib": 150}
    assert child_cost("12 slices of 2 processes in 10.0 s") is None
    line = 'gpu_workload_ctxsw_state{gpu="%d",uuid="GPU-%d",model="H200",state="%s"} %s'
    metrics = "\n".join([line % (0, 0, "active", "1.0"), line % (0, 0, "standby", "0.0"), line % (1, 1, "standby", "1.0")])
    assert not settled(metrics)  # GPU 1 still waits for its first window
    assert settled(metrics.replace('state="standby"} 1.0', 'state="error"} 1.0'))
    assert not settled("")


def test_the_device_run_on_the_replay_reports_every_phase(tmp_path):
    """bench/cost_per_gpu.py end to end without a GPU: our exporter on the NVML replay, no nvitop-exporter,
    no loops, no capture; every side-by-side phase measured and summarised (the figures are this machine's)."""
    import json
    import subprocess
    import sys

    from tests.helpers import FIXTURES, ROOT

    done = subprocess.run([sys.executable, str(ROOT / "bench" / "cost_per_gpu.py"), "--out", str(tmp_path),
                           "--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), "--no-nvitop", "--no-workers",
                           "--no-ctxsw", "--measure", "1", "--warmup", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "cost_per_gpu.json").read_text())
    assert list(report["phases"]) == ["all_idle", "all_loaded", "one_loaded", "one_idle"]
    for name, phase in report["phases"].items():
        ours = phase["exporters"]["ours"]
        assert ours["alive"] and ours["cpu_percent_of_core"] is not None and ours["vmrss_mib"] > 0, name
        assert ours["scrapes"] and all(s["ok"] and s["gpu_series"] > 0 for s in ours["scrapes"]), name
    assert [r["phase"] for r in report["summary"]["rows"]] == ["all_idle", "all_loaded", "one_loaded", "one_idle"]
    assert "| one_idle | 1 | ours |" in done.stdout


# -- resident memory: what a default exporter imports -------------------------------------------------------
# Each is loaded where the flag that needs it is given (bench/RESULTS.md, "Resident memory at steady state"):
# the package metadata (--version), SQLite and the export reader (an nsys export read), the upload spool and its
# HMAC (--nsys-upload-token-file), the nsys source's reading of exports (--replay, --nsys-watch-dir, --nsys-live;
# its module declares the flags, exporter/sources.py, so it is loaded: 0.25 MB, bench/RESULTS.md), the attribution
# (--workload-ctxsw: its child), the IDNA codec (a host name that is not ASCII). What uvicorn, click, argparse and
# prometheus_client import themselves (ssl, pickle, configparser, uuid, tempfile, timeit, mimetypes, shutil) is
# theirs; gpu_trace.protocol holds the cupti flags' defaults.
NOT_AT_DEFAULTS = ("importlib.metadata", "csv", "zipfile", "sqlite3", "nsys_ingest.reader",
                   "nsys_ingest.attribution", "exporter.uploads", "exporter.spool", "hmac",
                   "encodings.idna", "numpy", "pandas")


def test_an_exporter_with_the_default_flags_loads_nothing_only_other_flags_use():
    """A real exporter on the replay, with what `python -S` loads (no .pth file: this machine's import some of
    these), after its first ticks and a scrape, and after its stop."""
    import os
    import signal
    import site
    import subprocess
    import sys

    from tests.helpers import FIXTURES, ROOT, free_port, http_get, wait_for

    port = free_port()
    launcher = ("import atexit, sys; names = sys.argv.pop(1).split(','); "
                "atexit.register(lambda: print(sorted(m for m in names if m in sys.modules))); "
                "from exporter.__main__ import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": ":".join([str(ROOT), *site.getsitepackages()])}
    proc = subprocess.Popen([sys.executable, "-S", "-c", launcher, ",".join(NOT_AT_DEFAULTS), "--nvml-replay",
                             str(FIXTURES / "nvml_h100_time_sliced.json"), "--no-mps", "--listen-address", "127.0.0.1",
                             "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: proc.poll() is not None or b"gpu_time_utilization_ratio{" in
                 http_get(f"http://127.0.0.1:{port}/metrics", 5)[1], 60, 0.2, "a scrape with the GPU's values")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and out.strip() == "[]", (out, err[-1500:])


def test_the_heap_gives_its_free_pages_back():
    """exporter.heap.give_back (after each context-switch window): 40 MB freed under a chunk still in use at
    the heap's top, which free() alone cannot hand back, leave the process's RSS (glibc; elsewhere a no-op)."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    code = ("from exporter import heap\n"
            "rss = lambda: int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) // 1024\n"
            "held = [bytearray(2000) for _ in range(20000)]  # malloc's chunks, above pymalloc's 512 bytes\n"
            "pin = bytearray(2000)\n"
            "del held\n"
            "before = rss()\n"
            "print(heap.give_back(), before - rss())")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    trimmed, freed_mib = done.stdout.split()
    if trimmed == "False":
        pytest.skip("not glibc: no malloc_trim")
    assert int(freed_mib) >= 30, done.stdout


def test_the_engine_gives_the_heap_back_after_nvmls_first_tick_and_then_every_minute(monkeypatch):
    """NVML's loop, not another sampler's, gives the heap back at its first tick; after that no sooner than
    60 s later (a clock that moves only when told)."""
    import exporter.engine as engine_module
    import exporter.heap
    from exporter.engine import HEAP_GIVE_BACK_S, Engine
    from exporter.nvml_replay import ReplayNvml
    from exporter.samplers.nvml import NvmlSampler
    from tests.helpers import FIXTURES, wait_for

    assert HEAP_GIVE_BACK_S == 60.0
    given_back = []
    monkeypatch.setattr(exporter.heap, "give_back", lambda: given_back.append(1))
    nvml = NvmlSampler(ReplayNvml(str(FIXTURES / "nvml_h100_time_sliced.json")), interval=0.1)
    engine = Engine(nvml, [], interval=0.1)
    engine.start()
    try:
        wait_for(lambda: given_back, 30, 0.05, "the heap given back after NVML's first tick")
    finally:
        engine.stop()
    now = [1000.0]
    monkeypatch.setattr(engine_module.time, "monotonic", lambda: now[0])
    engine._heap_given_back = now[0]
    given_back.clear()
    for at, expected in ((59.999, 0), (60.0, 1), (119.0, 1), (120.0, 2)):
        now[0] = 1000.0 + at
        engine._give_back_heap()
        assert len(given_back) == expected, at


def test_the_8x64_bench_writes_why_it_failed_into_its_result(tmp_path):
    """On the device it exited 1 and its log did not come back: the cause (here the stubs' protobuf refusing
    an older runtime, as it does at import) and the versions it ran with come back in its --out."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    grpc = tmp_path / "stubs" / "grpc"  # a grpc that refuses at import: the bench is run, never imported
    grpc.mkdir(parents=True)
    (grpc / "__init__.py").write_text('def refused():\n    raise ImportError("Detected mismatched Protobuf Gencode/Runtime '
                                      'major versions: gencode 7.35.1 runtime 5.29.5")\n\n\nrefused()\n')
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "scrape_8x64.py"), "--out", str(tmp_path / "s.json")],
                          env={**os.environ, "PYTHONPATH": str(grpc.parent)}, capture_output=True, timeout=60)
    assert done.returncode == 1
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["error"] == ("ImportError: Detected mismatched Protobuf Gencode/Runtime major versions: "
                               "gencode 7.35.1 runtime 5.29.5")
    assert result["stage"] == "start" and "refused" in result["traceback_tail"]
    assert set(result["versions"]) == {"python", "grpcio", "protobuf"}


# -- /metrics under steady scraping: the render leaves the event loop ----------------------------------------
def test_scrapes_during_a_render_get_the_previous_body_and_the_one_that_asked_gets_the_current():
    import asyncio
    import threading

    from exporter.app import build_registry
    from exporter.engine import Engine
    from exporter.fastpath import FRESH_S, MetricsCache
    from exporter.nvml_replay import ReplayNvml
    from exporter.samplers.nvml import NvmlSampler
    from tests.helpers import FIXTURES

    engine = Engine(NvmlSampler(ReplayNvml(FIXTURES / "nvml_h100_quarter_sms_frame.json"), interval=0.5), interval=0.5)
    engine.tick_devices()
    engine.publish()
    now = [0.0]
    cache = MetricsCache(engine, build_registry(engine), clock=lambda: now[0])
    release, rendering = threading.Event(), threading.Event()
    slow_render = cache.render

    def held_render(*args):  # a render that takes as long as the test says
        rendering.set()
        release.wait(10)
        return slow_render(*args)

    async def scrapes():
        first = await cache.body()
        assert await cache.body() is first  # same snapshot: the same bytes
        engine.publish()
        cache.render = held_render
        asker = asyncio.ensure_future(cache.body())  # starts the new snapshot's render in a thread, waits for it
        while not rendering.is_set():
            await asyncio.sleep(0.01)
        now[0] += FRESH_S - 0.01
        meanwhile = await cache.body()  # another scraper, during the render: the previous body, at once
        now[0] += 0.02
        waiting = asyncio.ensure_future(cache.body())  # the previous body is FRESH_S old: it waits too
        await asyncio.sleep(0.05)
        assert not waiting.done()
        release.set()
        current, later = await asyncio.wait_for(asker, 10), await asyncio.wait_for(waiting, 10)
        return first, meanwhile, current, later

    first, meanwhile, current, later = asyncio.run(scrapes())
    assert meanwhile is first and current is not first and later is current


# -- the server between scrapes -------------------------------------------------------------------------------
def test_the_server_wakes_once_a_second_when_idle_and_at_once_for_a_stop(monkeypatch):
    """uvicorn polls for a stop ten times a second; idle, that was most of the exporter's own CPU. The loop
    waits IDLE_TICK_S (refreshing the Date header each time, as uvicorn does every tenth poll) and a stop
    ends the wait at once."""
    import asyncio
    import signal

    import uvicorn

    from exporter import server

    srv = server._Server(uvicorn.Config(app=None))
    srv.config.encoded_headers = []
    waits, real_wait_for = [], asyncio.wait_for

    async def recorded(awaitable, timeout):
        waits.append(timeout)
        if len(waits) == 3:  # a SIGTERM during the third wait: it ends without waiting out its second
            asyncio.get_running_loop().call_soon(srv.handle_exit, signal.SIGTERM, None)
            return await awaitable  # no timeout: only the stop can end this wait
        return await real_wait_for(awaitable, 0.001)

    monkeypatch.setattr(asyncio, "wait_for", recorded)
    asyncio.run(real_wait_for(srv.main_loop(), 60))  # a stop that did not wake the loop would hang here
    assert waits == [server.IDLE_TICK_S] * 3 and server.IDLE_TICK_S == 1.0 and srv.should_exit
    assert srv.server_state.default_headers and srv.server_state.default_headers[0][0] == b"date"


def test_the_connection_sweep_runs_while_connections_are_open_and_stops_with_the_last():
    """Deadlines are swept a few times a second while a connection is open; between scrapes nothing is."""
    import asyncio

    from exporter.server import Guard, Limits

    guard = Guard(Limits(header_timeout=0.25, idle_timeout=0.25))  # a sweep every 0.05 s

    class Connection:  # what the sweep reads of uvicorn's protocol (GuardedProtocol): an idle keep-alive
        host, phase, seen_phase, idle_since = "127.0.0.1", "idle", "idle", 0.0

        def __init__(self, loop):
            self.loop = loop

        def deadline(self, phase):
            return float("inf")

    async def scenario():
        conn = Connection(asyncio.get_running_loop())
        guard.admit(conn)
        first = guard._sweeper
        await asyncio.sleep(0.2)
        swept = guard.now > 0.0 and not first.done()  # sweeping while the connection is open
        guard.forget(conn)
        await asyncio.wait_for(first, 5)  # the last connection gone: the sweep ends
        guard.admit(conn)  # the next one starts it again
        again = guard._sweeper
        guard.forget(conn)
        await asyncio.wait_for(again, 5)
        return swept, first is not again, guard._sweeper

    assert asyncio.run(scenario()) == (True, True, None)
