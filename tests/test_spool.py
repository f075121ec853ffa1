"""Retention of the upload spool: count, bytes and age; oldest first; the published export and
files the exporter did not name are never removed."""
import os
import time

from exporter.spool import PARTIAL_MAX_AGE_S, Retention, SpoolRetention
from tests.helpers import Exporter, parse_metrics, sample_value, wait_for
from tests.test_nsys_source import QUARTER, post

BIG = Retention(max_files=100, max_bytes=10**12, max_age_s=10**9)


def upload_file(spool, name, size, age_s, now):
    path = spool / name
    path.write_bytes(b"x" * size)
    os.utime(path, (now - age_s, now - age_s))
    return path


def names(spool):
    return sorted(p.name for p in spool.iterdir())


def test_count_limit_removes_oldest_first(tmp_path):
    now = time.time()
    for i in range(5):
        upload_file(tmp_path, f"upload-{i}.sqlite", 10, 50 - i, now)
    retention = SpoolRetention(tmp_path, Retention(3, 10**9, 10**9))
    retention.tick()
    assert names(tmp_path) == ["upload-2.sqlite", "upload-3.sqlite", "upload-4.sqlite"]
    assert (retention.stats.files, retention.stats.bytes, retention.stats.removed) == (3, 30, 2)


def test_bytes_and_age_limits(tmp_path):
    now = time.time()
    upload_file(tmp_path, "upload-old.sqlite", 10, 3 * 86400, now)
    upload_file(tmp_path, "upload-a.sqlite", 400, 30, now)
    upload_file(tmp_path, "upload-b.sqlite", 400, 20, now)
    upload_file(tmp_path, "upload-c.sqlite", 400, 10, now)
    SpoolRetention(tmp_path, Retention(100, 1000, 86400)).tick()
    assert names(tmp_path) == ["upload-b.sqlite", "upload-c.sqlite"]  # old by age, then a by bytes


def test_published_and_newest_exports_are_never_removed(tmp_path):
    now = time.time()
    published = upload_file(tmp_path, "upload-0.sqlite", 10, 100, now)
    for i in range(1, 4):
        upload_file(tmp_path, f"upload-{i}.sqlite", 10, 100 - i, now)
    SpoolRetention(tmp_path, Retention(0, 0, 0), published=lambda: published).tick()
    assert names(tmp_path) == ["upload-0.sqlite", "upload-3.sqlite"]


def test_only_the_exporters_own_uploads_and_abandoned_partials_go(tmp_path):
    now = time.time()
    upload_file(tmp_path, "capture-by-a-user.sqlite", 10, 10**6, now)
    upload_file(tmp_path, ".upload-abandoned.part", 10, PARTIAL_MAX_AGE_S + 60, now)
    upload_file(tmp_path, ".upload-streaming.part", 10, 5, now)
    SpoolRetention(tmp_path, Retention(0, 0, 0)).tick()
    assert names(tmp_path) == [".upload-streaming.part", "capture-by-a-user.sqlite"]


def test_a_missing_spool_directory_is_reported_not_raised(tmp_path):
    retention = SpoolRetention(tmp_path / "gone", BIG)
    retention.tick()  # a missing directory holds no uploads
    assert retention.health.success and retention.stats.files == 0


def test_uploads_past_the_limit_are_removed_and_counted(tmp_path):
    spool = tmp_path / "spool"
    with Exporter("--no-nvml", "--no-mps", "--nsys-upload-token", "s3cret", "--nsys-spool-dir", str(spool),
                  "--nsys-spool-max-files", "2", "--nsys-spool-max-bytes", "1G", "--nsys-spool-max-age", "7d",
                  "--interval", "0.5") as exporter:
        for _ in range(4):
            assert post(exporter.url + "/api/v1/nsys", QUARTER.read_bytes(), "s3cret")[0] == 201
        assert len(list(spool.glob("upload-*.sqlite"))) == 2

        def spool_metrics():
            m = parse_metrics(exporter.metrics())
            return m if sample_value(m, "gpu_exporter_nsys_spool_removed_total") == 2 else None

        m = wait_for(spool_metrics, 15, 0.2, "spool metrics")
        assert sample_value(m, "gpu_exporter_nsys_spool_files") == 2
        assert sample_value(m, "gpu_exporter_nsys_spool_bytes") == 2 * QUARTER.stat().st_size
        assert sample_value(m, "gpu_exporter_collector_success", collector="spool") == 1
