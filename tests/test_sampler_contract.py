"""The sampler contract (issue 38): the engine runs one list of samplers and knows none of them by kind.

A sampler of a kind the engine has never heard of (a "fan" reader) is added to the list: it ticks in its
own loop, its health is a gpu_exporter_collector_success series, its snapshot is published under its
name, "after NVML's first tick" and "in NVML's loop" are its own attributes, and stop() closes it.
NVML is the recorded H100 (exporter/nvml_replay.py)."""
from __future__ import annotations

import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.app import build_registry
from exporter.chain import build_view
from exporter.collectors.gpu import GpuCollector
from exporter.collectors.health import HealthCollector
from exporter.engine import Engine
from exporter.nvml_replay import ReplayNvml
from exporter.sampler import ProcessShare, ProcessWindow, Sampler, SamplerDefaults, SourceState, WorkloadSource
from exporter.samplers.ctxsw import ACTIVE, CtxswSampler, STANDBY
from exporter.samplers.dcgm import DcgmExporterSource
from exporter.samplers.gpm import GpmSource
from exporter.samplers.nvml import NvmlSampler
from exporter.snapshot import CollectorHealth, DeviceTelemetry, GpuIdentity, OK, Snapshot, SourceResult, SpatialReading
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


def test_describe_lists_what_collect_yields_so_a_family_registered_twice_is_refused():
    import dataclasses

    from exporter.collectors.gpu import GpuCollector
    from exporter.holders import Held, Holder, Holdings, HolderSampler
    from exporter.samplers.gpm import GpmSource
    from exporter.samplers.mps import MpsSnapshot
    from exporter.spool import SpoolStats
    from exporter.workloads import WorkloadAccountant

    device = nvml()

    class OneJob(HolderSampler):
        name = "onejob"

        def tick(self):
            self.holdings = Holdings(gpus={uuid: {Holder(hpc_job="7"): Held(1.0)} for uuid in device.telemetry})

    job = OneJob()
    engine = Engine(device, [GpmSource(device), job], workloads=WorkloadAccountant(sources=[CtxswSampler(device)]))
    engine.tick_devices()
    job.tick()
    snapshot = engine.publish()  # every part published: MPS and the spool too
    engine.snapshot = dataclasses.replace(snapshot, published={
        **snapshot.published, "mps": MpsSnapshot(default_active_thread_percentage=50.0), "spool": SpoolStats(1, 2, 3)})
    registry = build_registry(engine)
    for collector in registry._collector_to_names:
        assert [f.name for f in collector.collect()] == [f.name for f in collector.describe()], collector
    names = {name for names in registry._collector_to_names.values() for name in names}
    assert {"gpu_time_utilization_ratio", "mps_default_active_thread_ratio", "gpu_exporter_nsys_spool_files",
            "gpu_workload_held_share_ratio", "gpu_workload_ctxsw_state"} <= names
    with pytest.raises(ValueError, match="Duplicated"):
        registry.register(GpuCollector(engine))


def test_a_new_holder_kind_is_one_module_and_reaches_metrics_and_api(tmp_path):
    """tests/dummy_holder.py (LSF jobs) registered by its own module: its holders are workloads in /metrics
    and /api/v1/workloads, /api/v1/gpus lists what it holds, and the process series join its owners."""
    import json

    from exporter.nvml_replay import cut
    from tests.helpers import Exporter, http_get

    cut(FIXTURES / "nvml_h100_time_sliced.json", tmp_path / "nvml.json", frame=0)  # pids 417-420: 30/10/40/20 %
    (tmp_path / "jobs").write_text("417 77\n418 77\n419 88\n")
    with Exporter("--nvml-replay", str(tmp_path / "nvml.json"), "--no-mps", "--interval", "0.2", "--holders", "lsf",
                  "--lsf-job-file", str(tmp_path / "jobs"), module="tests.dummy_holder") as running:
        workloads = lambda: json.loads(http_get(running.url + "/api/v1/workloads")[1])["workloads"]
        found = wait_for(lambda: len(workloads()) == 2 and workloads(), 20, what="two LSF jobs")
        samples = parse_metrics(running.metrics())
        gpus = running.gpus()
    assert {(w["hpc_job"], w["held_share"], w["processes"]) for w in found} == {("lsf-77", 0.5, 2),
                                                                                       ("lsf-88", 0.5, 1)}
    held = {l["hpc_job"]: v for l, v in samples["gpu_workload_held_share_ratio"]}
    assert held == {"lsf-77": 0.5, "lsf-88": 0.5}
    assert sample_value(samples, "gpu_exporter_collector_success", collector="lsf") == 1.0
    process = {l["hpc_job"]: v for l, v in samples["gpu_process_sm_utilization_ratio"]}
    assert process == {"lsf-77": pytest.approx(0.4), "lsf-88": pytest.approx(0.4), "": pytest.approx(0.2)}
    listed = gpus["holders"]["lsf"]
    assert listed["error"] == "" and {h["hpc_job"] for held in listed["gpus"].values() for h in held} == {"lsf-77",
                                                                                                          "lsf-88"}
    assert listed["process_owners"]["419"]["hpc_job"] == "lsf-88"


def test_nvml_partial_failures_are_typed_and_survive_a_recording(tmp_path):
    """A health read of several NVML calls (exporter.nvml.PartialAnswer): values that answered, one line per
    call that failed otherwise than "not supported", through pynvml's own types and error codes (the
    driver's answers stand in: no GPU here), recorded and replayed unchanged."""
    import types

    import pynvml

    from exporter.nvml import FIELD_MEMORY_TEMP, FIELD_TOTAL_ENERGY_MJ, VIOLATION_FIELDS, Nvml, PartialAnswer
    from exporter.nvml_answers import HealthCounters
    from exporter.nvml_replay import RecordingNvml

    def field_values(handle, ids):
        out = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for value, field_id in zip(out, ids):
            value.fieldId, value.valueType = field_id, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            value.nvmlReturn = {FIELD_TOTAL_ENERGY_MJ: pynvml.NVML_SUCCESS, FIELD_MEMORY_TEMP: pynvml.NVML_ERROR_UNKNOWN,
                                VIOLATION_FIELDS["power"]: pynvml.NVML_SUCCESS}.get(field_id, pynvml.NVML_ERROR_NOT_SUPPORTED)
            value.value.ullVal = {FIELD_TOTAL_ENERGY_MJ: 5000, VIOLATION_FIELDS["power"]: 2_000_000_000}.get(field_id, 0)
        return out

    def fails(code):
        def call(*_):
            raise pynvml.NVMLError(code)
        return call

    driver = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("NVML", "c_"))})
    driver.nvmlDeviceGetHandleByIndex = lambda index: f"handle {index}"
    driver.nvmlDeviceGetFieldValues = field_values
    driver.nvmlDeviceGetEncoderUtilization = fails(pynvml.NVML_ERROR_UNKNOWN)
    driver.nvmlDeviceGetDecoderUtilization = fails(pynvml.NVML_ERROR_NOT_SUPPORTED)  # no error: left out
    nvml = Nvml.__new__(Nvml)
    nvml._nv, nvml._handles = driver, {}
    answer = nvml.health_counters(0)
    assert answer.values == HealthCounters(energy_joules=5.0, throttle_seconds={"power": 2.0})
    assert [line.split(":")[0] for line in answer.errors] == ["nvmlDeviceGetEncoderUtilization",
                                                              f"nvmlDeviceGetFieldValues field {FIELD_MEMORY_TEMP}"]
    recorder = RecordingNvml(nvml)
    assert recorder.health_counters(0) == answer
    recorder.save(tmp_path / "rec.json")
    replayed = ReplayNvml(tmp_path / "rec.json").health_counters(0)
    assert isinstance(replayed, PartialAnswer) and replayed == answer
    assert PartialAnswer.from_json(answer.to_json(), "health_counters") == answer


def test_holdings_json_lists_the_first_holders_and_counts_the_rest():
    from exporter.holders import API_HOLDERS_PER_GPU, EVEN_SPLIT, Held, Holder, Holdings

    def listed(n):
        holders = {Holder(user=f"u{i:04d}"): Held(round(1 / n, 9), EVEN_SPLIT) for i in range(n)}
        return Holdings(gpus={"GPU-a": holders}, owners={7: Holder(user="u0000")}).to_json()

    full = listed(API_HOLDERS_PER_GPU)
    assert len(full["gpus"]["GPU-a"]) == API_HOLDERS_PER_GPU and full["omitted"] == {}
    over = listed(API_HOLDERS_PER_GPU + 1)
    assert len(over["gpus"]["GPU-a"]) == API_HOLDERS_PER_GPU and over["omitted"] == {"GPU-a": 1}
    assert over["gpus"]["GPU-a"][0] == {"namespace": "", "pod": "", "container": "", "hpc_job": "", "claim": "",
                                        "user": "u0000", "held_share": round(1 / 257, 9),
                                        "held_share_basis": "even_split", "mig": []}
    assert over["process_owners"] == {"7": Holder(user="u0000").to_json()}


# -- exporter/engine.py and exporter/sampler.py (the sampler contract) ----------------------------------
def test_a_samplers_own_max_tick_seconds_keeps_a_long_tick_published_and_a_failure_clears_when_it_ticks_again():
    """Mutants: the deadline ignores the sampler's max_tick_seconds (a 3 s tick of a sampler allowed 600 s
    is withdrawn after the engine's 0.3 s); a crashed tick's failure never cleared by a good one."""
    import threading
    import time

    from exporter.engine import Engine
    from tests.helpers import wait_for
    from tests.test_sampler_contract import FanSampler, nvml

    class LongTicks(FanSampler):
        max_tick_seconds = 600.0

        def __init__(self, device):
            super().__init__(device, "long")
            self.go, self.waiting = threading.Event(), threading.Event()
            self.go.set()

        def tick(self):
            if not self.go.is_set():
                self.waiting.set()
                self.go.wait(60)
            super().tick()

    device = nvml()
    long = LongTicks(device)
    engine = Engine(device, [long], interval=0.05)
    engine.tick_deadline = 0.3
    engine.start()
    try:
        wait_for(lambda: "long" in engine.snapshot.published, 30, 0.05, "published")
        long.go.clear()
        assert long.waiting.wait(30)
        blocked = time.monotonic()
        # ten times the engine's deadline (the mutant withdraws after it), a fiftieth of the sampler's own
        wait_for(lambda: time.monotonic() - blocked > 3.0 and engine.publish(), 30, 0.1, "3 s into the long tick")
        assert "long" in engine.snapshot.published and engine.snapshot.health["long"].success
        long.go.set()
        long.fail = True
        wait_for(lambda: engine.snapshot.health["long"].error.startswith("tick failed"), 30, 0.05, "the failure")
        long.fail = False
        wait_for(lambda: engine.snapshot.health["long"].success, 30, 0.05, "a good tick clears it")
    finally:
        long.go.set()
        engine.stop()


def test_a_source_serves_a_gpu_only_while_ok_and_a_state_without_a_window_says_none():
    """Mutants: serves() true for any state (a DCGM in error would keep the live captures off the GPU); the
    contract's defaults (start at once, in a loop of its own); a state's JSON inventing a window."""
    from exporter.sampler import SamplerDefaults, serves
    from exporter.snapshot import SourceResult
    from exporter.vocabulary import ERROR, OK

    dcgm = type("Dcgm", (), {"results": {"GPU-aaaa": SourceResult(OK, ""), "GPU-bbbb": SourceResult(ERROR, "down")}})()
    assert serves({"dcgm": dcgm}, "dcgm", "GPU-aaaa") is True
    assert serves({"dcgm": dcgm}, "dcgm", "GPU-bbbb") is False and serves({"dcgm": dcgm}, "dcgm", "GPU-cccc") is False
    assert serves({}, "dcgm", "GPU-aaaa") is False
    assert (SamplerDefaults.after_nvml, SamplerDefaults.in_nvml_loop, SamplerDefaults.max_tick_seconds) == (False, False, 0.0)
    assert SourceState(STANDBY, "not yet").to_json() == {"state": STANDBY, "reason": "not yet", "window": None}
    assert SourceState(ACTIVE, "ok", 990.0, 1000.0).to_json()["window"] == [990.0, 1000.0]


def test_a_stuck_nvml_loop_publishes_no_telemetry():
    """Mutant: the views keep NVML's last telemetry while its loop is stuck (frozen values)."""
    import threading

    from exporter.engine import Engine
    from exporter.nvml_replay import ReplayNvml
    from exporter.samplers.nvml import NvmlSampler
    from tests.helpers import wait_for
    from tests.test_sampler_contract import RECORDING

    class Stalling(ReplayNvml):
        def __init__(self, path):
            super().__init__(path)
            self.go, self.stalled = threading.Event(), threading.Event()
            self.go.set()

        def __getattr__(self, method):
            call = super().__getattr__(method)
            if method != "memory":
                return call

            def stalling(*args):
                if not self.go.is_set():
                    self.stalled.set()
                    self.go.wait(60)
                return call(*args)
            return stalling

    backend = Stalling(RECORDING)
    engine = Engine(NvmlSampler(backend, interval=0.05), [], interval=0.05)
    engine.tick_deadline = 0.3
    engine.start()
    try:
        wait_for(lambda: engine.snapshot.gpus and engine.snapshot.gpus[0].telemetry is not None, 30, 0.05, "telemetry")
        backend.go.clear()
        assert backend.stalled.wait(30)
        wait_for(lambda: "tick stuck" in engine.snapshot.health["nvml"].error, 30, 0.05, "NVML's loop stuck")
        assert engine.publish().gpus[0].telemetry is None
    finally:
        backend.go.set()
        engine.stop()


PHASES_RECORDING = FIXTURES / "nvml_h100_phases.json"


# -- hidden idle, unknown ------------------------------------------------------------------------------
class _Published:
    """What the collectors read from an engine: its latest snapshot and the process-series setting."""

    process_series = ("container", 20)

    def __init__(self, snapshot):
        self.snapshot = snapshot


def test_unknown_hidden_idle_is_left_out_of_the_metrics():
    gpu = GpuIdentity(0, "GPU-hidden", "H100")
    # NVML's samples end long before the spatial window, and the source has no time side of its own.
    telemetry = DeviceTelemetry(gpu, taken_at=1000.0, gpu_samples=((1000.0, 0.1),), memory_samples=((1000.0, 0.1),))
    reading = SpatialReading("nsys", 100.0, 105.0, sm_active=0.25)
    view = build_view(gpu, telemetry, {"nsys": SourceResult(OK, "ok", reading)}, ("nsys",), {}, 1.0)
    assert view.hidden_idle is None
    registry = CollectorRegistry()
    registry.register(GpuCollector(_Published(Snapshot(1, 0.0, gpus=(view,)))))
    samples = parse_metrics(generate_latest(registry).decode())
    assert sample_value(samples, "gpu_sm_active_ratio", uuid="GPU-hidden", source="nsys") == 0.25
    assert sample_value(samples, "gpu_hidden_idle_sm_ratio", uuid="GPU-hidden", source="nsys") is None


# -- a sampler that raises every tick -------------------------------------------------------------------
class RaisingDcgm(DcgmExporterSource):
    """A real DCGM source whose read fails with an error its own handling does not expect."""

    def __init__(self, works_first: int = 0):
        super().__init__("http://127.0.0.1:9/metrics", interval=0.05)
        self.calls = 0
        self.works_first = works_first

    def tick(self):
        self.calls += 1
        if self.calls <= self.works_first:
            self.results = {}
            self.health = type(self.health)(True, 0.0)
            return
        raise RuntimeError("unexpected")


def _run_engine(sampler, caplog, seconds=0.8):
    nvml = NvmlSampler(ReplayNvml(PHASES_RECORDING), interval=0.05)
    engine = Engine(nvml, [GpmSource(nvml), sampler], interval=0.05)
    with caplog.at_level(logging.ERROR, logger="exporter.engine"):
        engine.start()
        try:
            wait_for(lambda: sampler.calls >= 5, 10, 0.05, "five ticks of the raising sampler")
            time.sleep(seconds)
            registry = CollectorRegistry()
            registry.register(HealthCollector(engine))
            return engine, parse_metrics(generate_latest(registry).decode())
        finally:
            engine.stop()


def test_a_sampler_that_raises_every_tick_keeps_being_called(caplog):
    sampler = RaisingDcgm()
    engine, samples = _run_engine(sampler, caplog)
    calls = sampler.calls
    assert calls >= 10  # still called after its first failure: its thread did not die
    assert sum("sampler dcgm" in r.getMessage() and "unexpected" in r.getMessage() for r in caplog.records) == 1
    assert sample_value(samples, "gpu_exporter_collector_success", collector="dcgm") == 0
    assert sample_value(samples, "gpu_exporter_collector_success", collector="nvml") == 1  # the others go on
    assert engine.snapshot.gpus and engine.snapshot.gpus[0].spatial is not None  # GPM serves the GPU


def test_a_sampler_that_worked_then_raises_reads_success_0(caplog):
    sampler = RaisingDcgm(works_first=2)
    _engine, samples = _run_engine(sampler, caplog)
    assert sample_value(samples, "gpu_exporter_collector_success", collector="dcgm") == 0
