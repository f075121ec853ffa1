"""The exporter's nsys source: replay, a watched directory, uploads, and live-mode refusals."""
import os
import shutil
import time
import urllib.request

import pytest

from exporter.samplers.nsys import NsysSource
from exporter.snapshot import OK, SourceResult, SpatialReading
from tests.helpers import FIXTURES, Exporter, parse_metrics, wait_for

QUARTER = FIXTURES / "h100_quarter_sms_50hz.sqlite"
UUID = "GPU-d0231d62-1fc0-6926-93e4-d1c04181c44b"


def test_replay_steps_through_the_export_in_a_loop():
    source = NsysSource(interval=0.5, replay=QUARTER)
    seen = []
    for _ in range(25):  # 20 buckets of 0.5 s: wraps around
        source.tick()
        seen.append(source.results[UUID].reading.sm_active)
    assert source.identities[UUID].model == "NVIDIA H100 80GB HBM3"
    assert max(seen) == pytest.approx(0.25, abs=0.01) and min(seen) == 0.0
    assert seen[20:] == seen[:5]
    reading = source.results[UUID].reading
    assert abs(reading.window_end - time.time()) < 2  # live stream: now, not the capture's time


def test_replay_of_a_bad_file_stops_with_a_clear_message(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_text("nope")
    with pytest.raises(SystemExit, match="is not a SQLite file"):
        NsysSource(replay=bad)


def test_watch_dir_publishes_the_newest_exports_last_window_with_its_capture_time(tmp_path):
    source = NsysSource(watch_dir=tmp_path, window_s=2.0)
    source.tick()
    assert source.results == {} and source.health.success
    shutil.copyfile(QUARTER, tmp_path / "a.sqlite")
    os.utime(tmp_path / "a.sqlite", (time.time() - 10, time.time() - 10))
    source.tick()
    result = source.results[UUID]
    assert result.state == OK and "a.sqlite" in result.reason
    assert result.reading.window_end < time.time() - 60  # the capture's own (old) time
    assert result.reading.window_end - result.reading.window_start == pytest.approx(2.0, abs=0.05)


def test_watch_dir_keeps_serving_after_a_bad_export(tmp_path):
    source = NsysSource(watch_dir=tmp_path)
    shutil.copyfile(QUARTER, tmp_path / "good.sqlite")
    os.utime(tmp_path / "good.sqlite", (time.time() - 20, time.time() - 20))
    source.tick()
    (tmp_path / "bad.sqlite").write_text("not sqlite")
    os.utime(tmp_path / "bad.sqlite", (time.time() - 10, time.time() - 10))
    source.tick()
    assert not source.health.success and "bad.sqlite" in source.health.error
    assert source.results[UUID].state == OK  # the last good window stays published


class _Source:
    def __init__(self, name, results):
        self.name, self.results = name, results


class _Nvml:
    gpus = [type("G", (), {"index": 0, "uuid": "GPU-a"})(), type("G", (), {"index": 1, "uuid": "GPU-b"})()]


def test_live_mode_refuses_gpus_that_dcgm_profiles_and_needs_nsys():
    reading = SpatialReading("dcgm", 0, 1, sm_active=0.5)
    dcgm = _Source("dcgm", {"GPU-a": SourceResult(OK, "ok", reading)})
    source = NsysSource(live=True, binary="nsys-not-installed", nvml=_Nvml(), other_sources={"dcgm": dcgm})
    targets, refused = source._live_targets()
    assert [g.uuid for g in targets] == ["GPU-b"]
    assert "dcgmi profile --pause" in refused["GPU-a"].reason
    source.tick()
    assert not source.health.success and "not found" in source.health.error


def test_a_live_capture_in_progress_ends_with_the_source(tmp_path, monkeypatch):
    """close() stops nsys and what it started at once (one runner with the ctxsw source), instead of the
    exporter's exit waiting for the window and nsys' two minutes of grace."""
    import threading

    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "calls.log"))
    source = NsysSource(live=True, binary=str(FIXTURES / "fake-nsys"), window_s=60, nvml=_Nvml())
    ticking = threading.Thread(target=source.tick)
    started = time.monotonic()
    ticking.start()
    wait_for(lambda: (tmp_path / "calls.log").exists(), 10, 0.05, "nsys profile started")
    source.close()
    ticking.join(20)
    assert not ticking.is_alive() and time.monotonic() - started < 30  # not the 60 s window
    assert "profile" in (tmp_path / "calls.log").read_text() and source.health.success


# -- through the real exporter ---------------------------------------------------------------------
def post(url, data: bytes, token=None):
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_replay_on_a_host_without_gpus_serves_the_contract():
    with Exporter("--no-nvml", "--no-mps", "--replay", str(QUARTER), "--interval", "0.5") as exporter:
        wait_for(lambda: "gpu_sm_active_ratio{" in exporter.metrics(), 10, what="replayed values")
        samples = parse_metrics(exporter.metrics())
        assert samples["gpu_sm_active_ratio"][0][0]["source"] == "nsys"
        assert samples["gpu_time_utilization_ratio"]  # GR active stands in for NVML here
        assert samples["gpu_spatial_sample_timestamp_seconds"][0][1] > time.time() - 5


def answer_before_the_body(port, length, token=None, path="/api/v1/nsys") -> int:
    """Announces a body and sends none of it: a wrong token or a size over the limit is answered at
    once, without reading the body (a client sending it would race the closing connection)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("POST", path)
    if token:
        conn.putheader("Authorization", f"Bearer {token}")
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    return conn.getresponse().status


def test_upload_needs_the_token_validates_and_lands_in_the_spool(tmp_path):
    spool = tmp_path / "spool"
    with Exporter("--no-nvml", "--no-mps", "--nsys-upload-token", "s3cret", "--nsys-spool-dir", str(spool),
                  "--nsys-upload-max-bytes", "4000000", "--interval", "0.5") as exporter:
        url = exporter.url + "/api/v1/nsys"
        size = QUARTER.stat().st_size
        assert answer_before_the_body(exporter.port, size) == 401
        assert answer_before_the_body(exporter.port, size, "wrong") == 401
        status, body = post(url, b"not an export", "s3cret")
        assert status == 400 and "not a SQLite file" in body
        assert answer_before_the_body(exporter.port, 5_000_000, "s3cret") == 413
        status, body = post(url, QUARTER.read_bytes(), "s3cret")
        assert status == 201 and UUID in body
        assert [p.suffix for p in spool.iterdir()] == [".sqlite"]  # nothing else kept, no partial files
        wait_for(lambda: "gpu_sm_active_ratio{" in exporter.metrics(), 15, what="uploaded window published")


def test_upload_is_disabled_without_a_token():
    with Exporter("--no-nvml", "--no-mps", "--interval", "0.5") as exporter:
        assert post(exporter.url + "/api/v1/nsys", QUARTER.read_bytes(), "x")[0] in (404, 405)
