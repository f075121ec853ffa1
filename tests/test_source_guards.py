"""Guards the verdicts rest on, each tested so that breaking it fails a test:
- DCGM frozen detection exempts all-zero values (an idle GPU's counters do not move, and are fresh):
  mutation `return any(values.values()) and ...` -> `return now - seen[1] >= ...` fails
  test_an_idle_gpus_all_zero_dcgm_values_are_not_frozen.
- hidden idle is left out, never 0, when one side of it is unknown: mutation in collectors/gpu.py
  (`view.hidden_idle or 0.0` without the None check) or in chain.py (`hidden = 0.0` when busy is
  unknown) fails test_unknown_hidden_idle_is_left_out_of_the_metrics.
- engine.py's per-sampler exception guard: without it the raising sampler's thread dies and
  test_a_sampler_that_raises_every_tick_keeps_being_called fails.
"""
import logging
import re
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.chain import build_view
from exporter.collectors.gpu import GpuCollector
from exporter.collectors.health import HealthCollector
from exporter.engine import Engine
from exporter.nvml_replay import ReplayNvml
from exporter.samplers.dcgm import DcgmExporterSource
from exporter.samplers.gpm import GpmSource
from exporter.samplers.nvml import NvmlSampler
from exporter.snapshot import ERROR, OK, DeviceTelemetry, GpuIdentity, Snapshot, SourceResult, SpatialReading
from tests.helpers import FIXTURES, parse_metrics, sample_value, wait_for
from tests.test_dcgm_chain import H100, KnownGpus

RECORDING = FIXTURES / "nvml_h100_phases.json"
PROFILING = re.compile(r"^(DCGM_FI_PROF_\w+\{[^}]*" + H100 + r"[^}]*\}) \S+$", re.M)


class StaticDcgmExporter:
    """A real HTTP server on 127.0.0.1 serving one fixed dcgm-exporter answer."""

    def __init__(self, body: str):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _ticked_state(text: str, frozen_after_s: float, seconds: float) -> str:
    server = StaticDcgmExporter(text)
    try:
        source = DcgmExporterSource(server.url, nvml=KnownGpus(), frozen_after_s=frozen_after_s)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            source.tick()
            time.sleep(0.05)
        return source.results[H100]
    finally:
        server.close()


@pytest.mark.parametrize("values, state", [("zero", OK), ("recorded", ERROR)])
def test_an_idle_gpus_all_zero_dcgm_values_are_not_frozen(values, state):
    """The same values for longer than --dcgm-frozen-after: frozen when non-zero, an idle GPU when all zero."""
    text = (FIXTURES / "dcgm_exporter_metrics.txt").read_text()
    if values == "zero":
        text = PROFILING.sub(r"\1 0", text)
        assert text.count(" 0\n") >= 5
    result = _ticked_state(text, frozen_after_s=0.3, seconds=0.8)
    assert result.state == state, result.reason
    if state == OK:
        assert result.reading.sm_active == 0.0 and result.reading.dram_active == 0.0


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
    nvml = NvmlSampler(ReplayNvml(RECORDING), interval=0.05)
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
