"""The sampler contract (issue 38): the engine runs one list of samplers and knows none of them by kind.

A sampler of a kind the engine has never heard of (a "fan" reader) is added to the list: it ticks in its
own loop, its health is a gpu_exporter_collector_success series, its snapshot is published under its
name, "after NVML's first tick" and "in NVML's loop" are its own attributes, and stop() closes it.
NVML is the recorded H100 (exporter/nvml_replay.py)."""
from __future__ import annotations

import threading

import pytest
from prometheus_client import generate_latest

from exporter.app import build_registry
from exporter.engine import Engine
from exporter.nvml_replay import ReplayNvml
from exporter.sampler import ProcessShare, ProcessWindow, Sampler, SamplerDefaults, SourceState, WorkloadSource
from exporter.samplers.ctxsw import CtxswSampler
from exporter.samplers.nvml import NvmlSampler
from exporter.snapshot import CollectorHealth
from exporter.vocabulary import CTXSW
from tests.helpers import FIXTURES, parse_metrics, sample_value, wait_for

RECORDING = FIXTURES / "nvml_h100_quarter_sms_frame.json"


class FanSampler(SamplerDefaults):
    """A new kind: reads fan speeds, publishes them as its snapshot."""

    def __init__(self, nvml, name="fan", after_nvml=False, in_nvml_loop=False):
        self.name, self.interval = name, 0.05
        self.after_nvml, self.in_nvml_loop = after_nvml, in_nvml_loop
        self.health = CollectorHealth(False, 0.0, "not sampled yet")
        self._nvml = nvml
        self.gpus_seen: list[int] = []  # len(nvml.gpus) at each tick
        self.closed = threading.Event()
        self.fail = False

    def tick(self) -> None:
        self.gpus_seen.append(len(self._nvml.gpus))
        if self.fail:
            raise RuntimeError("fan controller gone")
        self.snapshot = {"rpm": 1200 + len(self.gpus_seen)}
        self.health = CollectorHealth(True, 0.001)

    def close(self) -> None:
        self.closed.set()


def nvml():
    return NvmlSampler(ReplayNvml(RECORDING), interval=0.05)


def test_a_new_kind_of_sampler_is_run_published_and_closed_by_the_engine_unchanged():
    device = nvml()
    fan = FanSampler(device)
    assert isinstance(fan, Sampler)
    engine = Engine(device, [fan], interval=0.05)
    engine.start()
    try:
        wait_for(lambda: engine.snapshot.published.get("fan") and engine.snapshot.gpus, 30, 0.05, "fan published")
    finally:
        engine.stop()
    assert fan.closed.is_set()
    assert engine.snapshot.published["fan"]["rpm"] > 1200
    samples = parse_metrics(generate_latest(build_registry(engine)).decode())
    assert sample_value(samples, "gpu_exporter_collector_success", collector="fan") == 1.0
    assert sample_value(samples, "gpu_exporter_collector_success", collector="nvml") == 1.0


def test_after_nvml_waits_for_the_gpus_and_its_absence_does_not():
    class SlowToList(ReplayNvml):
        def __init__(self, path):
            super().__init__(path)
            self.listed, self.asked = threading.Event(), threading.Event()

        def device_count(self):
            self.asked.set()
            self.listed.wait(60)
            return super().__getattr__("device_count")()

    backend = SlowToList(RECORDING)
    device = NvmlSampler(backend, interval=0.05)
    waiting, eager = FanSampler(device, "waiting", after_nvml=True), FanSampler(device, "eager")
    engine = Engine(device, [waiting, eager], interval=0.05)
    engine.start()
    try:
        assert backend.asked.wait(30)
        wait_for(lambda: eager.gpus_seen, 30, 0.05, "the eager sampler's first tick")
        assert waiting.gpus_seen == []  # NVML has not listed the GPUs yet: it waits
        backend.listed.set()
        wait_for(lambda: waiting.gpus_seen, 30, 0.05, "the waiting sampler's first tick")
    finally:
        backend.listed.set()
        engine.stop()
    assert eager.gpus_seen[0] == 0 and waiting.gpus_seen[0] == 1


def test_in_nvml_loop_ticks_before_nvml_and_shares_its_failures():
    device = nvml()
    inside = FanSampler(device, "inside", in_nvml_loop=True)
    engine = Engine(device, [inside], interval=0.05)
    assert [name for name, _, _ in engine.loops()] == ["nvml"]  # no loop of its own
    engine.tick_devices()
    assert inside.gpus_seen == [0]  # ticked before NVML's first tick listed the GPU
    engine.tick_devices()
    assert inside.gpus_seen == [0, 1]
    engine.publish()
    assert engine.snapshot.health["inside"].success
    inside.fail = True
    engine._tick("nvml", threading.Event())  # one tick of the loop as its thread runs it
    health = engine.publish().health
    assert health["inside"].error.startswith("tick failed") and health["nvml"].error == health["inside"].error


def test_two_samplers_of_one_name_are_refused():
    device = nvml()
    with pytest.raises(ValueError, match="share a collector name"):
        Engine(device, [FanSampler(device), FanSampler(device)])
    with pytest.raises(ValueError, match="share a collector name"):
        Engine(device, [FanSampler(device, "nvml")])


def test_the_ctxsw_source_is_a_workload_source_of_process_windows():
    source = CtxswSampler(nvml())
    assert isinstance(source, WorkloadSource) and source.basis == CTXSW
    window = ProcessWindow(basis=CTXSW, window_start=10.0, window_end=20.0, listed=frozenset({7, 8}),
                           shares={7: ProcessShare(time=0.25, sm=0.1)}, switch_overhead=0.05)
    source.readings["GPU-x"] = window
    assert source.fresh("GPU-x", 20.0 + source.max_age) is window
    assert source.fresh("GPU-x", 20.0 + source.max_age + 0.001) is None  # stale: gone
    assert window.covers({7, 8}) and not window.covers({7, 9})
    assert window.to_json() == {"basis": "ctxsw", "window": [10.0, 20.0], "listed": [7, 8],
                                "shares": {"7": {"time": 0.25, "sm": 0.1}}, "switch_overhead": 0.05}
    assert SourceState("active", "ok", 1.0, 2.0).to_json() == {"state": "active", "reason": "ok", "window": [1.0, 2.0]}
