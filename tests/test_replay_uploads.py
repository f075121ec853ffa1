"""An exporter replaying an export next to NVML, and uploads (issue 27 items 12 and 13):
- the export's GPU gets an index of its own after NVML's (top showed two GPUs numbered 0);
- an upload to an exporter running --replay is refused with 409 and one line (it used to be stored
  and never published), POST /api/v1/diagnose still answers, and the start says so once;
- every GPU of an uploaded export is listed and published, also one whose samples end earlier, and
  one whose first event (old schema era) holds a clock only.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import tests.synthetic_exports as synth
from tests.helpers import FIXTURES, ROOT, Exporter, http_get, parse_metrics, wait_for
from tests.test_api import validate
from tests.test_nsys_source import QUARTER, UUID, post

NVML_PHASES = FIXTURES / "nvml_h100_phases.json"
NVML_UUID = "GPU-b2071921-9a0c-9128-f80c-5300b638b846"
REPLAYING = ("this exporter replays {} (--replay) and publishes no other export: uploads are refused (409), "
             "--nsys-watch-dir and --nsys-live are not read; POST /api/v1/diagnose still answers. Send exports to "
             "an exporter without --replay")


def gpus(exporter) -> dict[str, int]:
    status, body = http_get(exporter.url + "/api/v1/gpus")
    assert status == 200
    return {gpu["uuid"]: gpu["index"] for gpu in json.loads(body)["gpus"]}


def test_replayed_gpu_is_numbered_after_nvmls_and_uploads_are_refused(tmp_path):
    with Exporter("--no-mps", "--nvml-replay", str(NVML_PHASES), "--replay", str(QUARTER), "--interval", "0.5",
                  "--nsys-upload-token", "s3cret", "--nsys-spool-dir", str(tmp_path)) as exporter:
        assert wait_for(lambda: len(gpus(exporter)) == 2, 20, what="both GPUs") and gpus(exporter) == {
            NVML_UUID: 0, UUID: 1}
        wait_for(lambda: "gpu_sm_active_ratio{" in exporter.metrics(), 20, what="replayed values")
        (labels, _), = [s for s in parse_metrics(exporter.metrics())["gpu_sm_active_ratio"] if s[0]["uuid"] == UUID]
        assert labels["gpu"] == "1"
        status, body = post(exporter.url + "/api/v1/nsys", QUARTER.read_bytes(), "s3cret")
        assert (status, json.loads(body)) == (409, {"error": REPLAYING.format(QUARTER)})
        validate("/api/v1/nsys", 409, body.encode(), "post")  # as docs/openapi.json documents it
        assert list(tmp_path.iterdir()) == []  # nothing stored
        status, _ = post(exporter.url + "/api/v1/diagnose", QUARTER.read_bytes(), "s3cret")
        assert status == 200
        log = exporter.log()
    assert log.count(REPLAYING.format(QUARTER)) == 1, log
    assert f"nsys upload: refused ({QUARTER.stat().st_size} bytes): --replay publishes no other export" in log


def test_top_numbers_the_replayed_gpu_after_nvmls():
    done = subprocess.run([sys.executable, "-m", "gpu_spatial", "top", "--replay", str(QUARTER), "--nvml-replay",
                           str(NVML_PHASES), "--no-mps", "--once", "--size", "100x20"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line[2] for line in done.stdout.splitlines()[1:3]]
    assert rows == ["0", "1"], done.stdout


def test_every_gpu_of_an_upload_is_listed_and_published_even_one_that_stopped_early(tmp_path):
    """Two GPUs without UUIDs in the old schema era; GPU 1's samples end 6 s before GPU 0's, so the
    export's last 5 s hold none of them: GPU 1 gets its own last window."""
    two = old_era_two_gpus(tmp_path, "delete from TARGET_INFO_GPU; "
                                     "delete from GENERIC_EVENTS where typeId = {type1} and timestamp > 3000000000;")
    with uploads(tmp_path) as exporter:
        status, body = post(exporter.url + "/api/v1/nsys", two.read_bytes(), "s3cret")
        assert status == 201, body
        assert json.loads(body)["gpus"] == ["nsys-gpu-0", "nsys-gpu-1"]
        wait_for(lambda: len(gpus(exporter)) == 2, 30, what="both uploaded GPUs published")
        assert gpus(exporter) == {"nsys-gpu-0": 0, "nsys-gpu-1": 1}


def old_era_two_gpus(tmp_path, script: str):
    """synth.two_gpus in the old schema era, edited by `script` ({type1}: GPU 1's event type)."""
    two = synth.old_era(synth.two_gpus(QUARTER, tmp_path / "two.sqlite"), tmp_path / "old.sqlite")
    con = sqlite3.connect(two)
    (type1,) = con.execute("select max(typeId) from GENERIC_EVENTS").fetchone()
    con.executescript(script.format(type1=type1))
    con.close()
    return two


def uploads(tmp_path):
    return Exporter("--no-nvml", "--no-mps", "--nsys-upload-token", "s3cret", "--nsys-spool-dir",
                    str(tmp_path / "spool"), "--interval", "0.5")


def test_an_old_era_gpu_whose_first_event_holds_a_clock_only_is_listed(tmp_path):
    """nsys up to 2023.3 (GENERIC_EVENTS): a GPU's metric names came from its first event alone, so a GPU
    whose first event held only its clock had no GR or SM activity: the upload listed GPU 0 alone.
    Mutation: CATALOGUE_EVENTS 32 -> 1."""
    two = old_era_two_gpus(tmp_path, "create table rest as select * from GENERIC_EVENTS; delete from GENERIC_EVENTS; "
                                     "insert into GENERIC_EVENTS select min(rawTimestamp) - 1, min(timestamp) - 1, typeId, "
                                     "'{{\"GPC Clock Frequency\": 1400}}' from rest where typeId = {type1}; "
                                     "insert into GENERIC_EVENTS select * from rest; drop table rest;")
    with uploads(tmp_path) as exporter:
        status, body = post(exporter.url + "/api/v1/nsys", two.read_bytes(), "s3cret")
        assert status == 201, body
        assert json.loads(body)["gpus"] == ["GPU-11111111-2222-3333-4444-555555555555", UUID]
    done = subprocess.run([sys.executable, "-m", "nsys_ingest", "summary", str(two)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert [line.split(" (")[0] for line in done.stdout.splitlines() if line.startswith("GPU ")] == [
        "GPU 0 NVIDIA H100 80GB HBM3", "GPU 1 NVIDIA H100 80GB HBM3"]
