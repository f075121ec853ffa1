"""The JSON API over real HTTP: every answer validates against the committed OpenAPI schema
(docs/openapi.json), unknown GPUs get 404 with why, the POST routes share the upload's rules, and
the newcomer's stumbles of issue 20 (items 3, 4, 7) stay fixed."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from tests.helpers import FIXTURES, ROOT, Exporter, http_get, parse_metrics, wait_for
from tests.kubelet_server import GPU, SLICED_UUID, kubernetes_node, pod
from tests.test_exporter_e2e import REPLAY_ARGS
from tests.test_nsys_source import QUARTER, UUID, answer_before_the_body, post

SCHEMA = json.loads((ROOT / "docs" / "openapi.json").read_text())
DIAG_EXPORTS = sorted(FIXTURES.glob("h100_diag_*.sqlite"))


def validate(path: str, status: int, body: bytes, method: str = "get") -> dict:
    """The body parsed, after checking it against the schema the OpenAPI document gives `path`'s
    answer with this status."""
    answer = SCHEMA["paths"][path][method]["responses"][str(status)]
    schema = {**answer["content"]["application/json"]["schema"], "components": SCHEMA["components"]}
    data = json.loads(body)
    Draft202012Validator(schema).validate(data)
    return data


def get(exporter, path: str, template: str | None = None, expect: int = 200) -> dict:
    status, body = http_get(exporter.url + path)
    assert status == expect, body
    return validate(template or path, status, body)


def test_committed_schema_is_what_the_app_serves():
    done = subprocess.run([sys.executable, "-m", "exporter.openapi", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_the_validator_rejects_what_the_schema_forbids():
    """The checks below mean something only if a wrong answer fails them."""
    with pytest.raises(Exception, match="is not of type|is a required property"):
        validate("/healthz", 200, json.dumps({"status": "ok", "snapshot_age_seconds": "1", "gpus": 0}).encode())
    with pytest.raises(Exception, match="is not one of"):
        validate("/healthz", 200, json.dumps({"status": "fine", "snapshot_age_seconds": 1, "gpus": 0}).encode())


@pytest.fixture(scope="module")
def exporter():
    with Exporter(*REPLAY_ARGS) as running:
        wait_for(lambda: running.gpus()["gpus"] and running.gpus()["gpus"][0]["diagnosis"]
                 and running.gpus()["mps"]["clients"], 20, what="first full snapshot")
        yield running


def test_every_endpoint_answers_what_the_schema_says(exporter):
    health = get(exporter, "/healthz")
    assert health["status"] == "ok" and health["gpus"] == 1 and "reason" not in health
    body = get(exporter, "/api/v1/gpus")
    gpu = body["gpus"][0]
    assert gpu["time_utilization"] == pytest.approx(0.997904) and gpu["time_utilization_source"] == "gpm"
    assert gpu["spatial"]["source"] == "gpm" and gpu["diagnosis"]["verdict"]
    assert body["mps"]["daemons"] and body["collectors"]["nvml"]["success"] is True
    by_index = get(exporter, "/api/v1/gpus/0", "/api/v1/gpus/{gpu}")
    by_uuid = get(exporter, f"/api/v1/gpus/{gpu['uuid']}", "/api/v1/gpus/{gpu}")
    assert by_index["uuid"] == by_uuid["uuid"] == gpu["uuid"] and by_index["index"] == 0
    assert get(exporter, "/api/v1/workloads")["workloads"] == []  # outside Kubernetes and Slurm: no holders


@pytest.mark.parametrize("name", ["1", "GPU-nope", "-1", "0x0"])
def test_an_unknown_gpu_is_404_with_the_known_ones(exporter, name):
    body = get(exporter, f"/api/v1/gpus/{name}", "/api/v1/gpus/{gpu}", expect=404)
    assert repr(name) in body["error"] and "known GPUs: 0 (GPU-" in body["error"]


def test_docs_and_schema_are_served(exporter):
    status, body = http_get(exporter.url + "/openapi.json")
    assert status == 200 and json.loads(body) == SCHEMA
    status, body = http_get(exporter.url + "/docs")
    assert status == 200 and b"/openapi.json" in body


def test_pods_and_process_owners_validate(tmp_path):
    server, args = kubernetes_node(tmp_path)
    server.service.pods = [pod("team-a", "train-0", {"trainer": [(GPU, [f"{SLICED_UUID}::0"])]})]
    server.start()
    try:
        with Exporter(*args) as running:
            wait_for(lambda: running.gpus()["gpus"][0]["pods"] and running.gpus()["kubelet"]["process_owners"],
                     20, what="pods and owners")
            body = get(running, "/api/v1/gpus")
    finally:
        server.stop()
    assert body["gpus"][0]["pods"][0]["pod"] == "train-0" and body["gpus"][0]["sharing_mode"] == "time_sliced"


# -- uploads and diagnose: one set of rules -------------------------------------------------------
@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uploads")
    (tmp / "tmp").mkdir()
    with Exporter("--no-nvml", "--no-mps", "--nsys-upload-token", "s3cret", "--nsys-spool-dir", str(tmp / "spool"),
                  "--nsys-upload-max-bytes", "4000000", "--interval", "0.5",
                  env={"TMPDIR": str(tmp / "tmp")}) as running:
        running.tmp = tmp
        yield running


ROUTES = ("/api/v1/nsys", "/api/v1/diagnose")


def both(exporter, data: bytes, token) -> list[tuple[int, str]]:
    return [post(exporter.url + route, data, token) for route in ROUTES]


def test_bad_uploads_get_the_same_answer_on_both_routes(uploads):
    answers = both(uploads, b"not an export", "s3cret")
    assert answers[0] == answers[1] and answers[0][0] == 400 and "not a SQLite file" in answers[0][1]
    for route in ROUTES:
        validate(route, 400, answers[0][1].encode(), "post")
    for token in (None, "wrong"):
        answers = both(uploads, QUARTER.read_bytes()[:4096], token)  # small: sent whole before the answer
        assert answers[0] == answers[1] and answers[0][0] == 401
        validate("/api/v1/diagnose", 401, answers[0][1].encode(), "post")
    size = QUARTER.stat().st_size
    for length, token, status in ((size, None, 401), (5_000_000, "s3cret", 413)):
        assert [answer_before_the_body(uploads.port, length, token, route) for route in ROUTES] == [status] * 2


@pytest.mark.parametrize("export", DIAG_EXPORTS, ids=lambda p: p.stem)
def test_diagnose_answers_what_the_cli_prints_and_keeps_nothing(uploads, export):
    status, body = post(uploads.url + "/api/v1/diagnose", export.read_bytes(), "s3cret")
    assert status == 200, body
    served = validate("/api/v1/diagnose", 200, body.encode(), "post")
    done = subprocess.run([sys.executable, "-m", "nsys_ingest", "diagnose", "--json", str(export)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    printed = json.loads(done.stdout)
    assert {**served, "file": None} == {**printed, "file": None} and served["gpus"][0]["verdict"]
    spool = uploads.tmp / "spool"
    assert list((uploads.tmp / "tmp").iterdir()) == [] and not (spool.exists() and list(spool.iterdir()))


def test_upload_answer_validates(tmp_path):
    with Exporter("--no-nvml", "--no-mps", "--nsys-upload-token", "s3cret", "--nsys-spool-dir", str(tmp_path),
                  "--interval", "0.5") as running:
        status, body = post(running.url + "/api/v1/nsys", QUARTER.read_bytes(), "s3cret")
        assert status == 201
        assert validate("/api/v1/nsys", 201, body.encode(), "post")["gpus"] == [UUID]


def test_without_a_token_the_post_routes_say_how_to_enable_them():
    with Exporter("--no-nvml", "--no-mps", "--interval", "0.5") as running:
        for route in ROUTES:
            status, body = post(running.url + route, QUARTER.read_bytes()[:4096], "x")
            assert status == 404 and "--nsys-upload-token" in validate(route, 404, body.encode(), "post")["error"]


# -- issue 20, newcomer items -----------------------------------------------------------------------
def test_item3_time_utilization_says_where_it_comes_from(exporter):
    """GPM's busy time where GPM serves the GPU, NVML's samples where it does not; replayed without NVML,
    the time utilization is the export's GR Active; each says so."""
    nvml = parse_metrics(exporter.metrics())["gpu_time_utilization_source_info"]
    assert [(labels["source"], value) for labels, value in nvml] == [("gpm", 1.0)]
    with Exporter("--nvml-replay", str(FIXTURES / "nvml_h100_quarter_sms_frame.json"), "--no-mps", "--spatial-sources", "nsys",
                  "--interval", "0.5") as running:
        wait_for(lambda: "gpu_time_utilization_ratio{" in running.metrics(), 10, what="NVML's samples")
        samples = parse_metrics(running.metrics())
        assert [(l["source"], v) for l, v in samples["gpu_time_utilization_source_info"]] == [("nvml", 1.0)]
        assert samples["gpu_time_utilization_ratio"][0][1] == pytest.approx(0.99)
    with Exporter("--no-nvml", "--no-mps", "--replay", str(QUARTER), "--interval", "0.5") as running:
        wait_for(lambda: "gpu_time_utilization_ratio{" in running.metrics(), 10, what="replayed values")
        samples = parse_metrics(running.metrics())
        assert [(l["source"], v) for l, v in samples["gpu_time_utilization_source_info"]] == [("nsys", 1.0)]
        assert get(running, "/api/v1/gpus")["gpus"][0]["time_utilization_source"] == "nsys"


def test_item3_docs_say_a_replay_is_stamped_now_and_where_time_comes_from():
    readme = (ROOT / "docs" / "exporter.md").read_text()
    assert "gpu_time_utilization_source_info" in readme
    row = next(line for line in readme.splitlines() if line.startswith("| `gpu_spatial_sample_timestamp_seconds"))
    assert "replay" in row and "current time" in row


def test_item4_sources_not_configured_read_disabled_and_reasons_say_it_once():
    with Exporter("--no-mps", "--replay", str(QUARTER), "--interval", "0.5",
                  env={"LD_LIBRARY_PATH": "/nonexistent"}) as running:
        wait_for(lambda: running.gpus()["gpus"], 10, what="the replayed GPU")
        sources = {s["source"]: s for s in get(running, "/api/v1/gpus")["gpus"][0]["sources"]}
        samples = parse_metrics(running.metrics())
    assert sources["dcgm"]["state"] == "disabled" and "not configured" in sources["dcgm"]["reason"]
    assert sources["nsys"]["state"] == "active"
    gpm = sources["gpm"]  # configured (the default), but this host has no NVML
    assert gpm["state"] == "unsupported" and gpm["reason"].count("NVML unavailable") == 1
    assert "libnvidia-ml" in gpm["reason"]
    states = {(l["source"], l["state"]): v for l, v in samples["gpu_spatial_source_state"] if v == 1}
    assert ("dcgm", "disabled") in states and ("gpm", "unsupported") in states


def test_item7_healthz_says_no_gpu_and_fails_only_where_a_gpu_was_asked_for():
    with Exporter("--no-nvml", "--no-mps", "--interval", "0.5") as running:
        body = get(running, "/healthz")
        assert body["status"] == "no_gpu" and body["gpus"] == 0 and "--no-nvml" in body["reason"]
    with Exporter("--no-mps", "--interval", "0.5", env={"LD_LIBRARY_PATH": "/nonexistent"}) as running:
        body = get(running, "/healthz", expect=503)
        assert body["status"] == "no_gpu" and "pass --no-nvml" in body["reason"]
    warning = [line for line in running.log().splitlines() if "NVML unavailable" in line]
    assert len(warning) == 1 and "--no-nvml" in warning[0]


def test_item7_quick_start_runs_the_installed_exporter_without_test_dependencies():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in quick.split("```sh", 1)[1].split("```", 1)[0].splitlines() if line.strip()]
    assert commands[0].startswith("pip install . && gpu-spatial-exporter") and "[test]" not in commands[0]
    assert commands[1].startswith("bash .ci/run")


def test_fastapi_is_loaded_only_for_the_first_request_that_needs_it():
    """A node that is only scraped and probed never pays FastAPI's and pydantic's memory."""
    def loaded(running) -> bool:
        return "_pydantic_core" in Path(f"/proc/{running.proc.pid}/maps").read_text()

    with Exporter("--no-nvml", "--no-mps", "--interval", "0.5") as running:
        for _ in range(3):
            running.metrics()
            assert http_get(running.url + "/healthz")[0] == 200
        assert not loaded(running)
        get(running, "/api/v1/gpus")
        assert loaded(running)


def test_models_keep_every_field_of_the_snapshot_records_they_serve():
    """FastAPI drops what a response model does not declare: a field added to a record must be added
    to its model too (and to docs/openapi.json), or clients never see it."""
    import dataclasses

    from exporter import api_models, snapshot
    from exporter.samplers import kubelet, mps
    from exporter.spool import SpoolStats
    from exporter.workloads import Holder, WorkloadView, _Account
    from nsys_ingest import verdicts

    pairs = [(snapshot.SpatialReading, api_models.SpatialReading), (snapshot.SourceStatus, api_models.SourceStatus),
             (snapshot.ProcessUtilization, api_models.ProcessUtilization),
             (snapshot.ComputeProcess, api_models.ComputeProcess), (snapshot.MigDevice, api_models.MigDevice),
             (snapshot.CollectorHealth, api_models.CollectorHealth), (mps.DaemonStats, api_models.MpsDaemon),
             (mps.MpsSnapshot, api_models.Mps), (kubelet.PodRef, api_models.PodRef),
             (SpoolStats, api_models.SpoolStats), (verdicts.Evidence, api_models.Evidence)]
    for record, model in pairs:
        assert {f.name for f in dataclasses.fields(record)} == set(model.model_fields), record.__name__
    assert set(Holder().to_json()) == set(api_models.HolderRef.model_fields)
    from exporter.sampler import ProcessShare
    from exporter.workloads import CuptiGpu

    share = ProcessShare(time=0.5, sm=0.25, parts=(("kernel_busy", 0.5),), record_path="native")
    assert set(share.to_json()) == set(api_models.CuptiClient.model_fields)
    cupti = CuptiGpu((0.0, 1.0), 0.5, 0.25, 1.0, 0.25, 1, 0, ((7, share),)).to_json()
    assert set(cupti) <= set(api_models.CuptiGpu.model_fields)
    assert {f.name for f in dataclasses.fields(verdicts.Verdict)} | {"evidence"} == set(api_models.Diagnosis.model_fields)
    counters = _Account(created=0.0).counters  # what every workload record carries
    record = WorkloadView(holder=Holder(), gpu=snapshot.GpuIdentity(0, "GPU-a", "H100"), held_share=1.0, processes=0,
                          pids=(), time_share=None, time_share_reason="", sm_active=None, sm_active_basis=None,
                          idle_seconds=0.0, held_idle=False, counters=counters, created=0.0)
    assert set(record.to_json()) == set(api_models.Workload.model_fields)
    assert set(counters) == set(api_models.WorkloadGpuSeconds.model_fields)
    from exporter.holders import Held, Holdings

    held = Holdings(gpus={"GPU-a": {Holder(user="u"): Held(1.0)}}, owners={7: Holder(user="u")}).to_json()
    assert set(held) == set(api_models.HolderKind.model_fields)
    assert set(held["gpus"]["GPU-a"][0]) == set(api_models.HeldShare.model_fields)
