"""NVML health series (dcgm-exporter's default set, issue 30) from the H200 recording
(tests/fixtures/nvml_h200_health.json: every figure below is read from it, so a new recording replaces
it without touching the tests), XID events injected through the replay, the source rules (unsupported
drops a value silently, a failing call is one log line, slow values stay off the per-tick path) and
PCIe/NVLink throughput from GPM or, without GPM, from NVML. The unit conversions inside exporter/nvml.py
(mJ, ns, MHz, KB/s) sit behind the replay boundary: bench/telemetry_compare.py checks them against
nvidia-smi on the device.

Mutations made by hand, each failing the test named (then restored):
- MiB/s not converted to bytes/s in exporter/samplers/gpm.py links(): test_every_health_series_matches...
- the XID watcher logging every event instead of every change: test_xid_events_from_the_replay_...
- slow-read errors dropped between reads (not kept in _SlowReads.errors): test_a_failing_slow_read_is_one_problem
- health_counters read every tick (health_every_s ignored): test_slow_values_stay_off_the_per_tick_path
- GPM preferred even where it measured no throughput (chain.links): test_without_gpm_pcie_and_nvlink_come_from_nvml
- XID series dropped with the rest of a lost GPU's: test_a_lost_gpu_keeps_its_xid_counts
- the sum of the power and thermal counters' growth instead of the larger: test_throttle_share_exact
"""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.collectors.gpu import GpuCollector
from exporter.engine import Engine
from exporter.nvml import CLOCK_EVENT_REASONS
from exporter.nvml_replay import RecordingNvml, ReplayNvml, cut
from exporter.samplers.gpm import GpmSource
from exporter.samplers.nvml import ERRORS_EVERY_S, HEALTH_EVERY_S, NvmlSampler, throttle_share
from tests.helpers import FIXTURES, ROOT, Exporter, http_get, parse_metrics, sample_value, wait_for
from tests.test_api import validate

H200 = FIXTURES / "nvml_h200_health.json"
MIB = 2**20
XID_WATCHED = {"0": None}  # GPU 0 registered for XID events


def one_frame(tmp_path, edit=None, frame=1):
    """Frame `frame` of the H200 recording, answered every tick; `edit(data)` changes it first."""
    path = tmp_path / f"h200_frame{frame}.json"
    cut(H200, path, frame=frame)
    if edit is not None:
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))
    return path


def health_replay(tmp_path):
    """The H200 recording's first frame with declared additions, so that every health family has a value
    (the golden file, the stack test's dashboards): XID events 94 and 13, and NVLink throughput in the
    GPM answer (the device's single-GPU VM has no NVLink: NVML answers Not Supported there)."""
    def edit(data):
        data["calls"]["xid_open"] = [{"value": XID_WATCHED}]
        data["xid_events"] = [{"after_s": 0.2, "index": 0, "xid": 94}, {"after_s": 0.4, "index": 0, "xid": 13}]
        for gpm in data["calls"]["gpm_metrics/0"]:
            gpm["value"].update(nvlink_tx=1024.0, nvlink_rx=2048.0)  # MiB/s, declared

    return one_frame(tmp_path, edit, frame=0)


def answer(path, key):
    return json.loads(path.read_text())["calls"][key][0]["value"]


def scrape(engine) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(engine))
    return parse_metrics(generate_latest(registry).decode())


def test_every_health_series_matches_its_recorded_answer(tmp_path):
    path = one_frame(tmp_path)
    with Exporter("--nvml-replay", str(path), "--no-mps", "--interval", "0.2") as running:
        def with_gpm_window():
            m = parse_metrics(running.metrics())
            return m if sample_value(m, "gpu_sm_active_ratio") is not None else None

        m = wait_for(with_gpm_window, 20, what="a GPM window")
        text = running.metrics()

    def value(name, **labels):
        return sample_value(m, name, **labels)

    memory = answer(path, "memory/0")
    assert value("gpu_memory_free_bytes") == memory["free"]
    assert value("gpu_memory_reserved_bytes") == memory["reserved"]
    assert value("gpu_memory_used_bytes") == memory["total"] - memory["free"]  # the driver's reservation included
    assert value("gpu_memory_clock_hertz") == answer(path, "memory_clock_hz/0")
    clocks = answer(path, "max_clocks/0")
    assert value("gpu_sm_clock_max_hertz") == clocks["sm_hz"]
    assert value("gpu_memory_clock_max_hertz") == clocks["memory_hz"]
    assert value("gpu_driver_info", driver_version=answer(path, "driver_version")) == 1
    bits = answer(path, "clock_event_reasons/0")
    for reason, bit in CLOCK_EVENT_REASONS.items():
        assert value("gpu_clock_event_reason_active", reason=reason) == (1.0 if bits & bit else 0.0), reason

    health = answer(path, "health_counters/0")
    assert value("gpu_energy_joules_total") == health["energy_joules"]
    assert value("gpu_memory_temperature_celsius") == health["memory_temperature_celsius"]
    assert value("gpu_encoder_utilization_ratio") == health["encoder_percent"] / 100
    assert value("gpu_decoder_utilization_ratio") == health["decoder_percent"] / 100
    assert {labels["reason"]: v for labels, v in m["gpu_clock_throttle_seconds_total"]} == health["throttle_seconds"]

    errors = answer(path, "memory_errors/0")
    assert value("gpu_pcie_replays_total") == errors["pcie_replays"]
    for key, count in errors["ecc"].items():
        error, scope = key.split("_")
        assert value("gpu_ecc_errors_total", error=error, scope=scope) == count
    rows = errors["remapped_rows"]
    assert value("gpu_remapped_rows_total", error="correctable") == rows["correctable"]
    assert value("gpu_remapped_rows_total", error="uncorrectable") == rows["uncorrectable"]
    assert value("gpu_row_remap_pending") == rows["pending"] and value("gpu_row_remap_failure") == rows["failure"]

    gpm = answer(path, "gpm_metrics/0")  # MiB/s over the GPM window
    for family, prefix in (("gpu_pcie_throughput_bytes_per_second", "pcie"),
                           ("gpu_nvlink_throughput_bytes_per_second", "nvlink")):
        for direction in ("tx", "rx"):
            recorded = gpm.get(f"{prefix}_{direction}")
            got = value(family, direction=direction, source="gpm")
            assert got == (None if recorded is None else pytest.approx(recorded * MIB)), (family, direction)
    for family in ("gpu_energy_joules", "gpu_clock_throttle_seconds", "gpu_pcie_replays", "gpu_ecc_errors",
                   "gpu_remapped_rows", "gpu_xid_errors"):
        assert f"# TYPE {family}_total counter" in text, family
    if shutil.which("promtool"):
        done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_xid_events_from_the_replay_are_counted_per_xid_and_logged_once_per_change(tmp_path):
    events = [{"after_s": 0.3, "index": 0, "xid": 94}, {"after_s": 0.6, "index": 0, "xid": 63},
              {"after_s": 0.8, "index": 0, "xid": 63}]

    def edit(data):
        data["calls"]["xid_open"] = [{"value": XID_WATCHED}]
        data["xid_events"] = events

    path = one_frame(tmp_path, edit)
    with Exporter("--nvml-replay", str(path), "--no-mps", "--interval", "0.2") as running:
        def all_three():
            m = parse_metrics(running.metrics())
            return m if sample_value(m, "gpu_xid_errors_total", xid="63") == 2 else None

        m = wait_for(all_three, 20, what="three XID events")
        assert sample_value(m, "gpu_xid_errors_total", xid="94") == 1
        assert sample_value(m, "gpu_xid_last_code") == 63
        status, body = http_get(running.url + "/api/v1/gpus")
        telemetry = validate("/api/v1/gpus", status, body)["gpus"][0]["telemetry"]  # against docs/openapi.json
        assert telemetry["xid_counts"] == {"63": 2, "94": 1} and telemetry["last_xid"] == 63
        assert telemetry["health"]["driver_version"] == answer(path, "driver_version")
        log = running.log()
    assert sum("XID 94" in line for line in log.splitlines()) == 1
    assert sum("XID 63" in line for line in log.splitlines()) == 1  # two events, one change


def test_a_gpu_without_xid_events_publishes_no_xid_series(tmp_path, caplog):
    def edit(data):
        data["calls"]["xid_open"] = [{"value": {"0": "Not Supported"}}]

    sampler = NvmlSampler(ReplayNvml(one_frame(tmp_path, edit)), interval=0.1)
    with caplog.at_level(logging.INFO):
        sampler.tick()
        wait_for(lambda: sampler.xid.watched, 10, 0.02, "the XID watcher opened")
        sampler.tick()
    sampler.close()
    assert sampler.telemetry[next(iter(sampler.telemetry))].xid_counts == ()
    assert sum("XID events unavailable on this GPU: Not Supported" in r.getMessage() for r in caplog.records) == 1


def _unsupported(call):
    return {"error": "Not Supported", "call": call, "gpu_lost": False, "unsupported": True}


def test_unsupported_drops_its_values_without_an_error_and_is_logged_once(tmp_path, caplog):
    def edit(data):
        data["calls"]["health_counters/0"] = [_unsupported("health_counters")]
        data["calls"]["memory_clock_hz/0"] = [_unsupported("memory_clock_hz")]

    sampler = NvmlSampler(ReplayNvml(one_frame(tmp_path, edit)), interval=0.1)
    sampler.health_every_s = 0.0  # read at every tick: each could log
    engine = Engine(sampler, interval=0.1)
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            engine.tick_devices()
    engine.publish()
    m = scrape(engine)
    sampler.close()
    assert sampler.health.success
    for family in ("gpu_energy_joules_total", "gpu_clock_throttle_seconds_total", "gpu_encoder_utilization_ratio",
                   "gpu_memory_temperature_celsius", "gpu_memory_clock_hertz"):
        assert family not in m, family
    assert "gpu_ecc_errors_total" in m and "gpu_power_watts" in m  # the rest stays
    for call in ("health_counters", "memory_clock_hz"):
        assert sum(f"{call}: Not Supported" in r.getMessage() for r in caplog.records) == 1, call


def test_a_failing_slow_read_is_one_problem_and_drops_only_its_values(tmp_path, caplog):
    """One of memory_errors' calls fails: the others' values stay, nvml success is 0 while it fails
    (between its minute reads too), and it is logged once, not once per read or per tick."""
    def edit(data):
        errors = dict(answer_of(data, "memory_errors/0"))
        errors.pop("remapped_rows")
        errors["_errors"] = ["nvmlDeviceGetRemappedRows: Unknown Error"]
        data["calls"]["memory_errors/0"] = [{"value": errors}]

    sampler = NvmlSampler(ReplayNvml(one_frame(tmp_path, edit)), interval=0.1)
    engine = Engine(sampler, interval=0.1)
    with caplog.at_level(logging.INFO):
        for i in range(6):
            sampler.errors_every_s = 0.0 if i < 3 else ERRORS_EVERY_S  # read three times, then carried
            engine.tick_devices()
            assert not sampler.health.success and "Unknown Error" in sampler.health.error
    engine.publish()
    m = scrape(engine)
    sampler.close()
    assert "gpu_remapped_rows_total" not in m and "gpu_row_remap_failure" not in m
    assert sample_value(m, "gpu_ecc_errors_total", error="corrected", scope="aggregate") is not None
    logged = [r.getMessage() for r in caplog.records if "Unknown Error" in r.getMessage()]
    assert len(logged) == 1, logged
    assert not any("recovered" in r.getMessage() for r in caplog.records)


def answer_of(data, key):
    return data["calls"][key][0]["value"]


class Counting:
    """Counts the calls a sampler makes of each backend method."""

    def __init__(self, backend):
        self.backend = backend
        self.calls = Counter()

    def __getattr__(self, method):
        fn = getattr(self.backend, method)

        def call(*args):
            self.calls[method] += 1
            return fn(*args)

        return call


def test_slow_values_stay_off_the_per_tick_path(tmp_path):
    assert HEALTH_EVERY_S >= 10 and ERRORS_EVERY_S >= 60
    backend = Counting(ReplayNvml(one_frame(tmp_path)))
    sampler = NvmlSampler(backend, interval=0.1)
    started = time.monotonic()
    for _ in range(20):
        sampler.tick()
    elapsed = time.monotonic() - started
    sampler.close()
    n = backend.calls
    assert n["memory_clock_hz"] == n["clock_event_reasons"] == n["power_watts"] == 20  # the per-tick reads
    assert 1 <= n["health_counters"] <= 1 + elapsed // HEALTH_EVERY_S
    assert 1 <= n["memory_errors"] <= 1 + elapsed // ERRORS_EVERY_S
    assert n["driver_version"] == n["max_clocks"] == n["gpm_support"] == 1  # once: they worked
    assert n["nvml_throughput"] == 0  # GPM measures PCIe and NVLink on this GPU


def test_without_gpm_pcie_and_nvlink_come_from_nvml(tmp_path):
    """NVML's PCIe sample as it is; NVLink from its byte counters between two reads, over the time
    between them (bounded by the test's own clock around each tick)."""
    first = {"pcie_tx_bytes_per_second": 1024000.0, "pcie_rx_bytes_per_second": 2048000.0,
             "nvlink_tx_bytes": 1e9, "nvlink_rx_bytes": 3e9}
    second = {**first, "pcie_tx_bytes_per_second": 4096000.0, "nvlink_tx_bytes": 2e9, "nvlink_rx_bytes": 3.5e9}

    def edit(data):
        data["calls"]["gpm_support/0"] = [{"value": {"supported": False, "reason": "GPM needs Hopper"}}]
        data["calls"].pop("gpm_metrics/0")
        data["calls"]["nvml_throughput/0"] = [{"value": first}, {"value": second}]

    sampler = NvmlSampler(ReplayNvml(one_frame(tmp_path, edit)), interval=0.1)
    sampler.health_every_s = 0.0
    engine = Engine(sampler, [GpmSource(sampler)], interval=0.1)
    before_first = time.monotonic()
    engine.tick_devices()
    after_first = time.monotonic()
    time.sleep(0.05)
    before_second = time.monotonic()
    engine.tick_devices()
    after_second = time.monotonic()
    links = engine.publish().gpus[0].links
    sampler.close()
    assert links.source == "nvml"
    assert links.pcie_tx == 4096000.0 and links.pcie_rx == 2048000.0
    assert 1e9 / (after_second - before_first) <= links.nvlink_tx <= 1e9 / (before_second - after_first)
    assert 0.5e9 / (after_second - before_first) <= links.nvlink_rx <= 0.5e9 / (before_second - after_first)
    m = scrape(engine)
    assert sample_value(m, "gpu_pcie_throughput_bytes_per_second", direction="tx", source="nvml") == 4096000.0


def test_a_lost_gpu_keeps_its_xid_counts(tmp_path):
    """XID 79 (fallen off the bus) and then every call answers GPU_IS_LOST: the GPU's values go, the
    XID that says why stays."""
    lost = {"error": "GPU is lost", "call": "nvmlDeviceGetPowerUsage", "gpu_lost": True, "unsupported": False}

    def edit(data):
        data["calls"]["xid_open"] = [{"value": XID_WATCHED}]
        data["xid_events"] = [{"after_s": 0.0, "index": 0, "xid": 79}]
        data["calls"]["power_watts/0"] = [data["calls"]["power_watts/0"][0]] + [lost] * 100

    sampler = NvmlSampler(ReplayNvml(one_frame(tmp_path, edit)), interval=0.1)
    engine = Engine(sampler, interval=0.1)
    engine.tick_devices()
    wait_for(lambda: sampler.xid.events(0)[0], 10, 0.02, "XID 79 counted")
    engine.tick_devices()  # power answers GPU_IS_LOST
    engine.publish()
    m = scrape(engine)
    sampler.close()
    assert "gpu_power_watts" not in m and "gpu_energy_joules_total" not in m
    assert sample_value(m, "gpu_xid_errors_total", xid="79") == 1 and sample_value(m, "gpu_xid_last_code") == 79


def test_throttle_share_exact():
    """The larger growth of the power and thermal violation counters over the time between two reads:
    power ran 4 of 10 s and thermal 3 (overlapping, as both limits may hold at once): 0.4, not 0.7."""
    before = (100.0, {"power": 32.0, "thermal": 5.0, "low_utilization": 0.0})
    share, after = throttle_share(before, {"power": 36.0, "thermal": 8.0, "low_utilization": 9.0}, 110.0)
    assert share == 0.4 and after == (110.0, {"power": 36.0, "thermal": 8.0, "low_utilization": 9.0})
    assert throttle_share(None, {"power": 1.0}, 5.0) == (None, (5.0, {"power": 1.0}))  # the first read
    assert throttle_share(before, {"power": 20.0}, 110.0)[0] == 0.0  # counters restarted with the driver
    assert throttle_share(before, {"power": 99.0}, 110.0)[0] == 1.0
    assert throttle_share(before, {}, 110.0) == (None, None)  # not supported: no share, no baseline


def test_a_call_made_on_some_ticks_only_does_not_cut_the_recording():
    """Streams are aligned on the calls made every tick (GPM answers from its second tick on); the
    instant rate, read once before NVML has samples, must not cut a recording down to one tick."""
    recorder = RecordingNvml(live=None)
    recorder.calls = {"memory/0": [1, 2, 3, 4], "gpm_metrics/0": [2, 3, 4], "utilization_rates/0": [1],
                      "process_utilization/0": [3], "identity/0": ["GPU-x"], "driver_version": ["580"]}
    assert recorder.aligned_calls() == {"memory/0": [2, 3, 4], "gpm_metrics/0": [2, 3, 4], "utilization_rates/0": [1],
                                        "process_utilization/0": [3], "identity/0": ["GPU-x"], "driver_version": ["580"]}


@pytest.mark.parametrize("events", [{"after_s": 1}, [{"after_s": "soon", "index": 0, "xid": 79}],
                                    [{"after_s": 1.0, "index": -1, "xid": 79}], [{"after_s": 1.0, "index": 0}]])
def test_a_replay_with_broken_xid_events_is_one_line_and_exit_2(tmp_path, events):
    path = one_frame(tmp_path, lambda data: data.update(xid_events=events))
    done = subprocess.run([sys.executable, "-m", "exporter", "--nvml-replay", str(path), "--port", "0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "xid_events" in done.stderr
