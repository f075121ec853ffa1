"""End to end, node_exporter style: the real exporter on 127.0.0.1 with NVML answers recorded on the
device's H100 (tests/fixtures/nvml_h100_quarter_sms_frame.json: 33 of 132 SMs spinning) and the fake
proc tree; its full /metrics must match tests/fixtures/golden_metrics.prom.

Regenerate after an intended change: UPDATE_GOLDEN=1 pytest tests/test_exporter_e2e.py
"""
import math
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from tests.helpers import http_get, FIXTURES, Exporter, parse_metrics, wait_for
from tests.kubelet_server import GPU, SLICED_UUID, kubernetes_node, pod

GOLDEN = FIXTURES / "golden_metrics.prom"
GOLDEN_K8S = FIXTURES / "golden_metrics_k8s.prom"
GOLDEN_HEALTH = FIXTURES / "golden_metrics_health.prom"
VOLATILE = ("gpu_exporter_collector_duration_seconds", "gpu_spatial_sample_timestamp_seconds")
REPLAY_ARGS = ("--nvml-replay", str(FIXTURES / "nvml_h100_quarter_sms_frame.json"),
               "--proc-root", str(FIXTURES / "proc"), "--mps-control-binary", str(FIXTURES / "fake-mps-control"),
               "--interval", "0.2")


def normalise(text: str) -> str:
    """Drops the exporter's own process_* metrics and masks values that are wall time or durations."""
    lines = []
    for line in text.splitlines():
        if re.match(r"^(# (HELP|TYPE) )?process_", line):
            continue
        if line.startswith(VOLATILE) or re.match(r"^gpu_(workload_(\w+_gpu_seconds_(total|created)|idle_seconds)|"
                                                 r"ledger_\w+_seconds_(total|created))\{", line):
            line = line.rsplit(" ", 1)[0] + " <volatile>"
        lines.append(line)
    return "\n".join(lines) + "\n"


def matches_golden(running: Exporter, golden) -> tuple[str, str]:
    """(normalised /metrics, the raw text) once they equal `golden`, else as last read after 20 s, for the
    assertion to show the difference: a counter comes a tick after what it counts (a workload's after its
    pod), so on a busy machine the first snapshot with every reading may still lack some. With
    UPDATE_GOLDEN the file is rewritten from a snapshot taken ten ticks on."""
    if os.environ.get("UPDATE_GOLDEN"):
        time.sleep(2)
        golden.write_text(normalise(running.metrics()))
    last = {}

    def read():
        last["text"] = running.metrics()
        last["got"] = normalise(last["text"])
        return last["got"] == golden.read_text()

    try:
        wait_for(read, 20, 0.2, f"/metrics equal to {golden.name}")
    except TimeoutError:
        pass
    return last["got"], last["text"]


@pytest.fixture(scope="module")
def exporter():
    with Exporter(*REPLAY_ARGS) as running:
        wait_for(lambda: running.gpus()["gpus"] and running.gpus()["gpus"][0]["spatial"]
                 and running.gpus()["mps"]["clients"], 20, what="first full snapshot")
        yield running


def test_metrics_match_the_golden_file(exporter):
    got, _text = matches_golden(exporter, GOLDEN)
    assert got == GOLDEN.read_text()


def test_quarter_of_the_sms_reads_busy_in_time_and_a_quarter_in_space(exporter):
    samples = parse_metrics(exporter.metrics())
    assert samples["gpu_time_utilization_ratio"][0][1] == pytest.approx(0.997904)  # GPM GRAPHICS_UTIL of the frame
    (labels, sm_active), = samples["gpu_sm_active_ratio"]
    assert labels["source"] == "gpm" and sm_active == pytest.approx(0.2495, abs=1e-3)
    busy = samples["gpu_time_utilization_ratio"][0][1]  # the same GPM window as the SM activity
    assert samples["gpu_hidden_idle_sm_ratio"][0][1] == pytest.approx(busy - sm_active, abs=1e-6)
    states = {(l["source"], l["state"]): v for l, v in samples["gpu_spatial_source_state"]}
    assert states[("gpm", "active")] == 1 and states[("dcgm", "disabled")] == 1  # not configured
    assert states[("nsys", "disabled")] == 1


def test_no_nan_and_contract_labels(exporter):
    for name, rows in parse_metrics(exporter.metrics()).items():
        for labels, value in rows:
            assert not math.isnan(value), name
            if name.startswith("gpu_") and not name.startswith("gpu_exporter_"):
                assert {"gpu", "uuid", "model"} <= set(labels), name


def test_api_serves_the_same_snapshot_with_reasons(exporter):
    body = exporter.gpus()
    gpu = body["gpus"][0]
    assert gpu["uuid"].startswith("GPU-") and gpu["time_utilization"] == pytest.approx(0.997904)
    reasons = {s["source"]: s["reason"] for s in gpu["sources"]}
    assert "--dcgm-exporter-url" in reasons["dcgm"]
    assert body["collectors"]["nvml"]["success"] is True


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_check_metrics_is_silent(exporter):
    done = subprocess.run(["promtool", "check", "metrics"], input=exporter.metrics(), capture_output=True, text=True)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_healthz(exporter):
    from tests.helpers import http_get

    status, body = http_get(exporter.url + "/healthz")
    assert status == 200 and b'"ok"' in body


def test_no_gpu_host_still_serves():
    with Exporter("--interval", "0.2", "--proc-root", str(FIXTURES / "proc"),
                  env={"LD_LIBRARY_PATH": "/nonexistent"}) as running:
        body = running.gpus()
        assert body["gpus"] == []
        text = running.metrics()
        assert 'gpu_exporter_collector_success{collector="nvml"} 0.0' in text
        assert "mps_daemon_up" in text
    assert running.log().count("NVML unavailable") == 1  # one clear line, not one per tick


def test_kubernetes_node_metrics_match_their_golden_file(tmp_path):
    """A GPU node of a cluster: 4 time-sliced processes recorded on the H100, two pods holding
    replicas of it, processes attributed to their containers through their cgroups."""
    server, args = kubernetes_node(tmp_path)
    server.service.allocatable = [(GPU, [f"{SLICED_UUID}::{n}" for n in range(4)])]
    server.start()
    try:
        with Exporter(*args) as running:
            # The pods arrive once the GPU has its spatial reading: a tick that credits holders before it
            # makes their busy_unsplit cells, which exist or not by which of the two came first (under
            # load the GPM window won, on a quiet machine the kubelet's list).
            wait_for(lambda: running.gpus()["gpus"][0]["spatial"], 20, what="the GPU's spatial reading")
            server.service.pods = [pod("team-a", "train-0", {"trainer": [(GPU, [f"{SLICED_UUID}::0"])]}),
                                   pod("team-b", "notebook", {"nb": [(GPU, [f"{SLICED_UUID}::1"])]})]
            wait_for(lambda: running.gpus()["gpus"][0]["pods"]
                     and running.gpus()["kubelet"]["process_owners"] and
                     len(json.loads(http_get(running.url + "/api/v1/workloads")[1])["workloads"]) == 2,
                     20, what="pods, owners and workloads")
            got, text = matches_golden(running, GOLDEN_K8S)
    finally:
        server.stop()
    assert got == GOLDEN_K8S.read_text()
    if shutil.which("promtool"):
        done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_h200_health_metrics_match_their_golden_file(tmp_path):
    """Every health family (docs/metrics.md, GPU: health) from the H200 recording's first frame, with XID
    events and NVLink throughput declared on top (tests/test_health.py, health_replay)."""
    from tests.test_health import health_replay

    with Exporter("--nvml-replay", str(health_replay(tmp_path)), "--no-mps", "--interval", "0.2") as running:
        wait_for(lambda: 'xid="13"' in running.metrics() and "gpu_nvlink_throughput_bytes_per_second{" in running.metrics(),
                 20, what="XIDs and a GPM window")
        got, _text = matches_golden(running, GOLDEN_HEALTH)
    assert got == GOLDEN_HEALTH.read_text()
