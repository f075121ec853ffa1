"""Sampler windows, hidden idle, and the error paths of the NVML boundary."""
import json
import logging

import pytest

from exporter.chain import build_view
from exporter.engine import Engine
from exporter.nvml_replay import ReplayNvml
from exporter.sampler import SamplerDefaults
from exporter.samplers.gpm import GpmSource
from exporter.samplers.nvml import NvmlSampler, window_mean
from exporter.snapshot import OK, DeviceTelemetry, GpuIdentity, SourceResult, SpatialReading
from tests.helpers import FIXTURES, wait_for

RECORDING = FIXTURES / "nvml_h100_phases.json"
GPU = GpuIdentity(0, "GPU-test", "H100")


# -- windows --------------------------------------------------------------------------------------
SAMPLES = [(10.2, 0.0), (10.4, 0.5), (10.6, 1.0), (10.8, 1.0)]


def test_window_mean_averages_samples_ending_inside_the_window():
    assert window_mean(SAMPLES, 10.3, 10.8) == pytest.approx((0.5 + 1.0 + 1.0) / 3)


def test_window_shorter_than_the_sample_period_takes_the_sample_that_covers_it():
    assert window_mean(SAMPLES, 10.41, 10.5) == 1.0  # the 10.6 sample covers (10.4, 10.6]


def test_window_after_the_last_sample_takes_a_recent_one_but_never_a_stale_one():
    assert window_mean(SAMPLES, 11.0, 11.5) == 1.0
    assert window_mean(SAMPLES, 20.0, 21.0) is None


def test_repeated_nvml_samples_are_counted_once():
    from collections import deque

    history = deque()
    NvmlSampler._remember(history, 100.0, [[0.8, 10.0], [0.6, 20.0], [0.4, 30.0]])
    NvmlSampler._remember(history, 100.2, [[0.8, 20.0], [0.6, 30.0], [0.4, 40.0], [0.2, 50.0]])
    assert [round(t, 3) for t, _ in history] == [99.2, 99.4, 99.6, 99.8, 100.0]
    assert [v for _, v in history] == [0.1, 0.2, 0.3, 0.4, 0.5]


# -- hidden idle ----------------------------------------------------------------------------------
def telemetry(samples):
    return DeviceTelemetry(GPU, taken_at=samples[-1][0], gpu_samples=tuple(samples), memory_samples=tuple(samples))


def view(samples, reading, order=("gpm",)):
    return build_view(GPU, telemetry(samples) if samples else None, {"gpm": SourceResult(OK, "ok", reading)},
                      order, {}, 1.0)


def test_hidden_idle_is_time_minus_sm_active_over_the_spatial_window():
    reading = SpatialReading("gpm", 9.0, 10.0, sm_active=0.25)
    v = view([(9.5, 0.98), (10.0, 1.0), (11.0, 0.0)], reading)
    assert v.hidden_idle == pytest.approx(0.99 - 0.25)  # (9, 10], not the later idle sample
    assert v.spatial.sm_active == 0.25


def test_hidden_idle_never_goes_negative():
    v = view([(10.0, 0.5)], SpatialReading("gpm", 9.0, 10.0, sm_active=0.9))
    assert v.hidden_idle == 0.0


def test_a_window_nvml_does_not_cover_uses_the_sources_own_time_side_or_nothing():
    old = SpatialReading("nsys", 100.0, 105.0, sm_active=0.25, time_utilization=0.99)
    v = view([(1000.0, 0.1)], old, order=("gpm",))
    assert v.hidden_idle == pytest.approx(0.74)
    assert v.time_utilization == pytest.approx(0.1)  # time utilization stays NVML's, now
    v = view([(1000.0, 0.1)], SpatialReading("nsys", 100.0, 105.0, sm_active=0.25))
    assert v.hidden_idle is None


def test_a_gpu_only_an_export_knows_takes_time_utilization_from_gr_active():
    v = view(None, SpatialReading("nsys", 100.0, 105.0, sm_active=0.25, time_utilization=0.99))
    assert v.time_utilization == 0.99 and v.hidden_idle == pytest.approx(0.74)


# -- error paths at the NVML boundary -------------------------------------------------------------
def recording_with(tmp_path, edit) -> ReplayNvml:
    data = json.loads(RECORDING.read_text())
    edit(data["calls"])
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(data))
    return ReplayNvml(path)


def error(call, reason, lost=False):
    return {"error": reason, "call": call, "gpu_lost": lost, "unsupported": False}


def test_a_failing_call_is_na_for_its_value_and_fails_the_collector(tmp_path, caplog):
    def edit(calls):
        calls["power_watts/0"] = [error("nvmlDeviceGetPowerUsage", "Unknown Error")]

    sampler = NvmlSampler(recording_with(tmp_path, edit), interval=0.5)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            sampler.tick()
    tel = sampler.telemetry["GPU-b2071921-9a0c-9128-f80c-5300b638b846"]
    assert tel.power_watts is None and tel.memory_total_bytes > 0 and not tel.lost
    assert not sampler.health.success and "Unknown Error" in sampler.health.error
    assert sum("Unknown Error" in r.message for r in caplog.records) == 1  # logged once, not per tick


def test_a_gpu_lost_mid_run_stops_its_series_and_keeps_serving(tmp_path, caplog):
    def edit(calls):
        calls["memory/0"] = calls["memory/0"][:2] + [error("nvmlDeviceGetMemoryInfo", "GPU is lost", lost=True)]

    sampler = NvmlSampler(recording_with(tmp_path, edit), interval=0.5)
    with caplog.at_level(logging.ERROR):
        for _ in range(6):
            sampler.tick()
    tel = next(iter(sampler.telemetry.values()))
    assert tel.lost and not sampler.health.success
    assert sum("GPU lost" in r.message for r in caplog.records) == 1


def test_unsupported_values_are_not_failures(tmp_path):
    def edit(calls):
        calls["temperature_celsius/0"] = [{**error("nvmlDeviceGetTemperature", "Not Supported"), "unsupported": True}]

    sampler = NvmlSampler(recording_with(tmp_path, edit), interval=0.5)
    sampler.tick()
    assert sampler.health.success
    assert next(iter(sampler.telemetry.values())).temperature_celsius is None


def test_gpm_nan_is_no_value(tmp_path):
    def edit(calls):
        calls["gpm_metrics/0"] = [{"value": {**calls["gpm_metrics/0"][20]["value"], "sm_occupancy": float("nan")}}]

    backend = recording_with(tmp_path, edit)
    nvml, gpm = NvmlSampler(backend, interval=0.5), GpmSource()
    nvml.tick()
    gpm.sample(backend, nvml.gpus)
    reading = next(iter(gpm.results.values())).reading
    assert reading.sm_occupancy is None and reading.sm_active == pytest.approx(0.2495, abs=1e-3)


def test_gpm_unsupported_says_why(tmp_path):
    def edit(calls):
        calls["gpm_support/0"] = [{"value": {"supported": False, "reason": "GPM is not supported on this GPU (needs Hopper or newer)"}}]

    backend = recording_with(tmp_path, edit)
    nvml, gpm = NvmlSampler(backend, interval=0.5), GpmSource()
    nvml.tick()
    gpm.sample(backend, nvml.gpus)
    result = next(iter(gpm.results.values()))
    assert result.state == "unsupported" and "Hopper" in result.reason


def test_nvml_missing_is_retried_and_logged_once(caplog):
    from exporter.nvml import NvmlError

    attempts = []

    def factory():
        attempts.append(1)
        raise NvmlError("nvmlInit", "libnvidia-ml.so.1 not found")

    sampler = NvmlSampler(factory=factory)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            sampler.tick()
    assert len(attempts) == 1  # retried every 30 s, not every tick
    assert not sampler.health.success and sampler.gpus == ()
    assert sum("not found" in r.message for r in caplog.records) == 1


def test_a_crashing_sampler_never_stops_the_others(tmp_path):
    class Broken(SamplerDefaults):
        name, interval = "dcgm", 0.1
        results = {}
        health = None

        def tick(self):
            raise RuntimeError("boom")

    backend = ReplayNvml(RECORDING)
    nvml = NvmlSampler(backend, interval=0.1)
    engine = Engine(nvml, [GpmSource(nvml), Broken()], interval=0.1)
    engine.spatial["dcgm"].health = engine.nvml.health
    engine.start()
    try:  # a condition with a generous bound, not 0.6 s of sleep (a busy machine ticks later)
        wait_for(lambda: engine.snapshot.gpus and engine.snapshot.gpus[0].spatial is not None, 60, 0.05,
                 "GPM's values published beside the crashing sampler")
    finally:
        engine.stop()


def test_recordings_stay_aligned_between_gpm_and_utilization_streams():
    calls = json.loads(RECORDING.read_text())["calls"]
    assert len(calls["gpm_metrics/0"]) == len(calls["utilization_samples/0"])


def test_recorder_trims_streams_so_gpm_windows_pair_with_their_own_samples():
    from exporter.nvml_replay import RecordingNvml

    recorder = RecordingNvml(None)
    recorder.calls = {
        "identity/0": [{"value": {"uuid": "GPU-x", "model": "m"}}],
        "utilization_samples/0": [{"value": i} for i in range(5)],
        "memory/0": [{"value": i} for i in range(5)],
        "gpm_metrics/0": [{"value": i} for i in range(2, 5)],  # answers from the third tick on
    }
    aligned = recorder.aligned_calls()
    assert [a["value"] for a in aligned["utilization_samples/0"]] == [2, 3, 4]
    assert [a["value"] for a in aligned["gpm_metrics/0"]] == [2, 3, 4]
    assert aligned["identity/0"] == recorder.calls["identity/0"]
