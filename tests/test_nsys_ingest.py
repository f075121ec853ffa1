"""nsys_ingest on real H100 exports (tests/fixtures/h100_*.sqlite) and synthetic variants of them."""
import json
import shutil
import sqlite3
import subprocess
import sys

import pytest

from nsys_ingest.analysis import bucket_means, summarise
from nsys_ingest.names import clock_scale, normalise
from nsys_ingest.openmetrics import write_openmetrics
from nsys_ingest.reader import Export
from tests import synthetic_exports as synth
from tests.helpers import FIXTURES, ROOT

QUARTER = FIXTURES / "h100_quarter_sms_50hz.sqlite"
PHASES = FIXTURES / "h100_phases_100hz.sqlite"
SPIN = FIXTURES / "h100_spin_200hz.sqlite"
MATMUL = FIXTURES / "h100_matmul_50hz.sqlite"


def gpu0(path, **kw):
    with Export(path) as export:
        return summarise(export, **kw)["gpus"][0]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "nsys_ingest", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={"NSYS_INGEST_NO_PROGRESS": "1", "PATH": "/usr/bin:/bin"})


# -- real exports ----------------------------------------------------------------------------------
def test_quarter_sms_spin_reads_busy_in_time_and_a_quarter_in_space():
    g = gpu0(QUARTER)
    assert g["time"]["gr_active"]["p50"] >= 0.99
    assert g["spatial"]["sm_active"]["p50"] == pytest.approx(0.25, abs=0.01)
    assert g["hidden_idle"]["p50"] == pytest.approx(0.75, abs=0.01)
    assert g["busy_but_idle_share"] > 0.8
    assert g["uuid"].startswith("GPU-")


def test_shared_fixture_phases_by_window():
    # 200 Hz: idle, 33 of 132 SMs (~1.1-2.0 s), idle, all 132 SMs (~2.6-4.0 s): shared/device-nsys.md
    quarter = gpu0(SPIN, start_ns=int(1.2e9), end_ns=int(1.9e9))
    full = gpu0(SPIN, start_ns=int(3.0e9), end_ns=int(3.8e9))
    assert quarter["time"]["gr_active"]["mean"] > 0.95 and quarter["spatial"]["sm_active"]["mean"] == pytest.approx(0.24, abs=0.02)
    assert full["spatial"]["sm_active"]["mean"] > 0.95 and full["hidden_idle"]["mean"] < 0.03


def test_matmul_runs_tensor_cores_on_every_sm():
    g = gpu0(MATMUL, start_ns=int(7e9), end_ns=int(13e9))
    assert g["spatial"]["tensor_active"]["mean"] > 0.85 and g["spatial"]["sm_active"]["mean"] > 0.9


def test_clock_metrics_labelled_mhz_hold_hertz():
    with Export(QUARTER) as export:
        clocks = [m for m in export.metrics if m.quantity == "gpc_clock_hertz"]
        assert clocks and clocks[0].scale == 1.0  # 840000125 "MHz" is 840 MHz in hertz
    assert clock_scale([1980, 1755]) == 1e6 and clock_scale([1_980_000_000]) == 1.0


@pytest.mark.parametrize("chunk_rows", [997, 50_000])
def test_chunked_reading_gives_exactly_the_one_shot_result(chunk_rows):
    with Export(PHASES) as export:
        assert summarise(export, chunk_rows=chunk_rows) == summarise(export, chunk_rows=10_000_000)
        small = bucket_means(export, 0.5, chunk_rows=chunk_rows)
        whole = bucket_means(export, 0.5, chunk_rows=10_000_000)
        assert small.round(12).equals(whole.round(12))


def test_wall_clock_window_equals_relative_window():
    with Export(QUARTER) as export:
        start = export.start_ns / 1e9
    relative = cli("summary", QUARTER, "--start", "2", "--end", "5", "--json")
    from datetime import datetime, timezone

    iso = lambda s: datetime.fromtimestamp(start + s, tz=timezone.utc).isoformat()
    wall = cli("summary", QUARTER, "--start", iso(2), "--end", iso(5), "--json")
    assert relative.returncode == 0 and wall.returncode == 0, relative.stderr + wall.stderr
    a, b = json.loads(relative.stdout)["gpus"][0], json.loads(wall.stdout)["gpus"][0]
    assert abs(a["samples"] - b["samples"]) <= 1
    assert a["spatial"]["sm_active"]["p50"] == b["spatial"]["sm_active"]["p50"]


# -- names, eras, GPUs -----------------------------------------------------------------------------
@pytest.mark.parametrize("name, expected", [
    ("SMs Active [Throughput %]", ("sm_active", "percent")),
    ("SM Active", ("sm_active", "percent")),
    ("SMs Active", ("sm_active", "percent")),
    ("Compute Warps In Flight", ("sm_occupancy", "percent")),
    ("Compute Warps in Flight [Throughput %]", ("sm_occupancy", "percent")),
    ("Compute Warps in Flight [Avg]", ("compute_warps_in_flight_avg", "raw")),
    ("DRAM Read Throughput", ("dram_read", "percent")),
    ("DRAM Read Bandwidth [Throughput %]", ("dram_read", "percent")),
    ("GPC Clock Frequency [MHz]", ("gpc_clock_hertz", "clock")),
    ("NVLink RX Responses User Data [Throughput %]", ("nvlink_rx_responses_user_data_throughput_pct", "raw")),
])
def test_names_normalise_across_versions_and_chips(name, expected):
    assert normalise(name) == expected


def test_old_schema_era_reads_like_the_new_one(tmp_path):
    old = synth.old_era(QUARTER, tmp_path / "old.sqlite")
    with Export(old) as export:
        assert export.era == "generic_events"
    new, got = gpu0(QUARTER), gpu0(old)
    for section in ("time", "spatial"):
        for q, stats in new[section].items():
            assert got[section][q] == stats, q
    assert got["hidden_idle"] == new["hidden_idle"]


@pytest.mark.parametrize("chunk_rows", [333, 1_000_000])
def test_old_era_chunks_agree(tmp_path, chunk_rows):
    old = synth.old_era(QUARTER, tmp_path / "old.sqlite")
    with Export(old) as export:
        assert summarise(export, chunk_rows=chunk_rows) == summarise(export, chunk_rows=10_000_000)


def test_other_chips_metric_names(tmp_path):
    renamed = synth.renamed(PHASES, tmp_path / "renamed.sqlite")
    assert gpu0(renamed)["spatial"] == gpu0(PHASES)["spatial"]


def test_two_gpus_are_joined_on_type_and_metric_id(tmp_path):
    both = synth.two_gpus(QUARTER, tmp_path / "two.sqlite")
    with Export(both) as export:
        summary = summarise(export)
        assert [g["gpu"] for g in summary["gpus"]] == [0, 1]
        g0, g1 = summary["gpus"]
        assert g1["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
        assert g1["spatial"]["sm_active"]["p50"] == pytest.approx(g0["spatial"]["sm_active"]["p50"] / 2, abs=0.011)
        assert g1["time"] == g0["time"]


# -- outputs ---------------------------------------------------------------------------------------
def test_summary_cli_prints_a_table():
    done = cli("summary", QUARTER)
    assert done.returncode == 0, done.stderr
    assert "space: sm active" in done.stdout and "busy in time but idle in space" in done.stdout


def test_plot_writes_a_png(tmp_path):
    done = cli("plot", PHASES, "-o", tmp_path / "t.png")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("chunk_rows", [1001, 1_000_000])
def test_openmetrics_is_valid_and_chunk_independent(tmp_path, chunk_rows):
    out = tmp_path / "a.om"
    with Export(QUARTER) as export:
        n = write_openmetrics(export, out, chunk_rows=chunk_rows)
    text = out.read_text()
    assert text.endswith("# EOF\n") and n > 1000
    assert 'source="nsys"' in text and "gpu_sm_active_ratio{" in text
    ref = tmp_path / "b.om"
    with Export(QUARTER) as export:
        write_openmetrics(export, ref, chunk_rows=10_000_000)
    assert ref.read_text() == text


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_openmetrics_backfills_with_promtool(tmp_path):
    out = tmp_path / "q.om"
    assert cli("openmetrics", QUARTER, "-o", out).returncode == 0
    done = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(out), str(tmp_path / "tsdb")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "gpu_sm_active_ratio" not in done.stderr


def test_scrub_removes_environment_keeps_metrics(tmp_path):
    dirty = tmp_path / "dirty.sqlite"
    shutil.copyfile(QUARTER, dirty)
    con = sqlite3.connect(dirty)
    con.execute("insert into StringIds values (999001, 'AWS_SECRET_ACCESS_KEY=abc123')")
    con.execute("insert into StringIds values (999002, '/home/alice/secret-project/train.py')")
    con.execute("insert into META_DATA_CAPTURE values ('PROCESS_0:COMMAND', 'python3 /home/alice/x.py --token s3cr3t')")
    con.execute("insert into META_DATA_EXPORT values ('EXPORT_HOST', 'alice-workstation')")
    con.execute("insert into StringIds values (999003, 'ran on alice-workstation')")
    con.commit()
    con.close()
    clean = tmp_path / "clean.sqlite"
    done = cli("scrub", dirty, "-o", clean)
    assert done.returncode == 0, done.stderr
    raw = clean.read_bytes()
    for secret in (b"abc123", b"/home/alice", b"s3cr3t", b"alice-workstation", b"secret-project"):
        assert secret not in raw, secret
    assert b"train.py" in raw  # file names stay, where they live goes
    assert gpu0(clean) == {**gpu0(dirty)}


# -- bad input: one line, exit 2, no traceback ---------------------------------------------------------
@pytest.mark.parametrize("make, words", [
    (lambda d: _write(d / "x.sqlite", b"hello"), "is not a SQLite file"),
    (lambda d: _write(d / "t.sqlite", QUARTER.read_bytes()[:40000]), "truncated or corrupt"),
    (lambda d: synth.without_gpu_metrics(QUARTER, d / "n.sqlite"), "profile with --gpu-metrics-devices=all"),
    (lambda d: synth.empty_gpu_metrics(QUARTER, d / "e.sqlite"), "tables are empty"),
    (lambda d: _other_db(d / "o.sqlite"), "unknown schema"),
    (lambda d: _write(d / "r.nsys-rep", b"x"), "nsys is not on the PATH"),
    (lambda d: d / "missing.sqlite", "no such file"),
])
def test_bad_input_gets_one_clear_line(tmp_path, make, words):
    done = cli("summary", make(tmp_path))
    assert done.returncode == 2
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _other_db(path):
    con = sqlite3.connect(path)
    con.execute("create table users (name text)")
    con.commit()
    con.close()
    return path


def test_busy_but_idle_counts_gr_active_of_exactly_80_percent(tmp_path):
    """`summary`'s busy-but-idle share: GR active >= 0.8 and SM active <= 0.5, both at the boundary.
    Mutation: `gr >= BUSY_GR` -> `>`."""

    def share(gr, sm):
        path = synth.metric_phases(FIXTURES / "h100_diag_matmul.sqlite", tmp_path / f"{gr}_{sm}.sqlite",
                                   [(0, 2, {"GR Active": gr, "SMs Active": sm})])
        with Export(path) as export:
            (gpu,) = summarise(export)["gpus"]
        return gpu["busy_but_idle_share"]

    assert (share(80, 50), share(79, 50), share(80, 51)) == (1.0, 0.0, 0.0)
