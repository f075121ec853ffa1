"""DCGM source against a real HTTP server on 127.0.0.1, and the per-GPU source chain."""
import itertools
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from exporter.chain import choose_source
from exporter.engine import Engine
from exporter.nvml_replay import ReplayNvml
from exporter.samplers.dcgm import DcgmExporterSource, parse_exposition, quantity_of
from exporter.samplers.gpm import GpmSource
from exporter.samplers.nvml import NvmlSampler
from exporter.snapshot import ERROR, OK, PENDING, UNSUPPORTED, SourceResult, SpatialReading
from tests.helpers import FIXTURES, free_port

TEXT = (FIXTURES / "dcgm_exporter_metrics.txt").read_text()
H100 = "GPU-b2071921-9a0c-9128-f80c-5300b638b846"
T4 = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"


class FakeDcgmExporter:
    """A real HTTP server whose behaviour the test switches: ok, slow, drip, garbage, error, not loaded."""

    def __init__(self):
        self.mode = "ok"
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if outer.mode == "slow":  # answers only when the test ends: the source's timeout must end the wait
                    outer.released.wait(60)
                if outer.mode == "drip":  # a byte every 0.1 s: every read returns, only a whole-request deadline ends it
                    self.send_response(200)
                    self.end_headers()
                    for byte in TEXT.encode()[:100]:
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.1)
                    return
                body, status = {
                    "ok": (TEXT, 200), "slow": (TEXT, 200), "garbage": ("<html>{not prometheus</html>\x00", 200),
                    "error": ("internal error", 500),
                    "not_loaded": ("Not collecting DCP metrics: This request is serviced by a module of DCGM "
                                   "that is not currently loaded", 200),
                }[outer.mode]
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                try:
                    self.wfile.write(body.encode())
                except BrokenPipeError:
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dcgm():
    server = FakeDcgmExporter()
    yield server
    server.close()


class KnownGpus:
    gpus = [type("G", (), {"uuid": H100})(), type("G", (), {"uuid": T4})()]


def test_parses_profiling_fields_by_uuid():
    gpus = parse_exposition(TEXT)
    assert set(gpus) == {H100}  # the T4 has no profiling fields at all
    assert gpus[H100]["sm_active"] == pytest.approx(0.249451)
    assert gpus[H100]["graphics_engine_active"] == pytest.approx(0.997904)
    assert gpus[H100]["index"] == "0" and gpus[H100]["model"] == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("name, expected", [
    ("DCGM_FI_PROF_SM_ACTIVE", ("sm_active", 1.0)),
    ("DCGM_FI_PROF_SM_ACTIVE_RATIO", ("sm_active", 1.0)),
    ("DCGM_FI_PROF_SM_OCCUPANCY_PERCENT", ("sm_occupancy", 0.01)),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", ("tensor_active", 1.0)),
    ("DCGM_FI_DEV_GPU_UTIL", None),
    ("DCGM_FI_PROF_SM_ACTIVE_bucket", None),
])
def test_legacy_and_renamed_field_names(name, expected):
    assert quantity_of(name) == expected


def test_source_reads_the_endpoint_and_marks_gpus_without_profiling(dcgm):
    source = DcgmExporterSource(dcgm.url, timeout=1.0, nvml=KnownGpus())
    source.tick()
    assert source.results[H100].state == OK
    assert source.results[H100].reading.sm_active == pytest.approx(0.249451)
    assert source.results[T4].state == UNSUPPORTED and "profiling" in source.results[T4].reason
    assert source.health.success


@pytest.mark.parametrize("mode, state, words", [
    ("slow", ERROR, "did not answer within"),
    ("drip", ERROR, "did not answer within 0.5 s"),  # issue 39: the timeout was per read (10 s of drip)
    ("garbage", ERROR, "not Prometheus text"),
    ("error", ERROR, "HTTP 500"),
    ("not_loaded", UNSUPPORTED, "not loaded"),
])
def test_broken_endpoints_become_source_states(dcgm, mode, state, words):
    dcgm.mode = mode
    source = DcgmExporterSource(dcgm.url, timeout=0.5, nvml=KnownGpus())
    started = time.monotonic()
    source.tick()
    # the 0.5 s timeout ends the wait, not the server (which holds the slow answer for 60 s): a generous
    # bound, since a busy CI machine may take seconds where an idle one takes 0.5
    assert time.monotonic() - started < 20
    assert source.results[H100].state == state and words in source.results[H100].reason


def test_a_down_endpoint_is_an_error():
    source = DcgmExporterSource(f"http://127.0.0.1:{free_port()}/metrics", timeout=0.5, nvml=KnownGpus())
    source.tick()
    assert source.results[H100].state == ERROR and "unreachable" in source.results[H100].reason
    assert not source.health.success


def test_engine_falls_back_to_gpm_when_dcgm_fails_and_back_when_it_recovers(dcgm):
    backend = ReplayNvml(FIXTURES / "nvml_h100_quarter_sms_frame.json")
    nvml = NvmlSampler(backend, interval=0.2)
    source = DcgmExporterSource(dcgm.url, timeout=0.3, nvml=nvml)
    engine = Engine(nvml, [GpmSource(nvml), source], interval=0.2)
    for _ in range(2):
        engine.tick_devices()
    source.tick()

    def states():
        view = engine.publish().gpus[0]
        return view.spatial.source, {s.source: s.state for s in view.sources}

    assert states() == ("dcgm", {"dcgm": "active", "gpm": "standby", "nsys": "unsupported"})
    dcgm.mode = "garbage"
    source.tick()
    assert states() == ("gpm", {"dcgm": "error", "gpm": "active", "nsys": "unsupported"})
    dcgm.mode = "ok"
    source.tick()
    assert states()[0] == "dcgm"


# -- the chain over every combination --------------------------------------------------------------
READING = {name: SpatialReading(name, 0.0, 1.0, sm_active=0.5) for name in ("dcgm", "gpm", "nsys")}
KINDS = ("ok", "pending", "unsupported", "error", "absent")


def result(name, kind):
    if kind == "absent":
        return None
    return SourceResult({"ok": OK, "pending": PENDING, "unsupported": UNSUPPORTED, "error": ERROR}[kind],
                        f"{name} {kind}", READING[name] if kind == "ok" else None)


@pytest.mark.parametrize("kinds", list(itertools.product(KINDS, repeat=3)))
def test_chain_picks_the_first_working_source_and_explains_the_rest(kinds):
    order = ("dcgm", "gpm", "nsys")
    results = {name: result(name, kind) for name, kind in zip(order, kinds)}
    active, statuses = choose_source(order, results, {"dcgm": "not configured"})
    first_ok = next((name for name, kind in zip(order, kinds) if kind == "ok"), None)
    assert (active.reading.source if active else None) == first_ok
    assert [s.source for s in statuses] == list(order)
    assert sum(s.state == "active" for s in statuses) == (1 if first_ok else 0)
    for status, kind in zip(statuses, kinds):
        absent = "disabled" if status.source == "dcgm" else "unsupported"  # dcgm: not configured
        expected = {"ok": "active" if status.source == first_ok else "standby", "pending": "standby",
                    "unsupported": "unsupported", "error": "error", "absent": absent}[kind]
        assert status.state == expected and status.reason


def test_chain_order_is_configurable():
    results = {name: result(name, "ok") for name in ("dcgm", "gpm", "nsys")}
    active, _ = choose_source(("nsys", "gpm"), results, {})
    assert active.reading.source == "nsys"


def test_dcgm_values_are_frozen_after_exactly_the_frozen_time():
    """Mutation: `now - first seen >= frozen_after_s` -> `>`."""
    source = DcgmExporterSource("http://127.0.0.1:9/metrics", frozen_after_s=30.0)
    values = {"sm_active": 0.25, "sm_occupancy": 0.1}
    assert not source._frozen("GPU-aaaa", values, 1000.0)  # first seen
    assert not source._frozen("GPU-aaaa", values, 1029.5)
    assert source._frozen("GPU-aaaa", values, 1030.0)  # exactly 30 s unchanged
    assert not source._frozen("GPU-aaaa", {**values, "sm_active": 0.26}, 1031.0)  # moved: the clock restarts


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
