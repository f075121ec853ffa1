"""docs/metrics.md is the metric contract: every family the real exporter publishes must be in it
(the Workloads table included), and every family it documents outside Workloads is published."""
import re
import shutil

import pytest

from tests.helpers import ROOT, Exporter, wait_for
from tests.kubelet_server import GPU, SLICED_UUID, kubernetes_node, pod
from tests.test_exporter_e2e import REPLAY_ARGS
from tests.test_nsys_source import QUARTER

CONTRACT = ROOT / "docs" / "metrics.md"


def documented(text: str) -> set[str]:
    """Metric names in the first column of the contract's tables."""
    return set(re.findall(r"^\| `([a-z_:][a-z0-9_:]*)(?:\{[^`]*\})?` \|", text, re.M))


def published(text: str) -> set[str]:
    """Family names in exposition text, as the contract writes them: counters with `_total`; the
    `_created` series every counter has belong to their counter."""
    names = set()
    for name in re.findall(r"^# TYPE (\S+) \S+$", text, re.M):
        if name.endswith("_created") and f"# TYPE {name[:-len('_created')]}_total counter" in text:
            continue
        names.add(name)
    return names


def undocumented(text: str, contract: str) -> set[str]:
    return published(text) - documented(contract)


@pytest.fixture(scope="module")
def exposition(tmp_path_factory) -> str:
    """/metrics of two real exporters that between them publish nearly every family: NVML recorded on
    the H100 with GPM, MPS daemons, an nsys replay and the upload spool; and a Kubernetes node with
    pods, a kubelet and per-container process series."""
    tmp = tmp_path_factory.mktemp("contract")
    (tmp / "spool").mkdir()  # an earlier upload: a replaying exporter refuses new ones (409)
    shutil.copyfile(QUARTER, tmp / "spool" / "upload-20261101T000000-0123abcd.sqlite")
    with Exporter(*REPLAY_ARGS, "--replay", str(QUARTER), "--nsys-upload-token", "s3cret",
                  "--nsys-spool-dir", str(tmp / "spool")) as running:
        wait_for(lambda: "gpu_exporter_nsys_spool_files 1" in running.metrics()
                 and "mps_server_clients{" in running.metrics() and "gpu_diagnosis{" in running.metrics(),
                 20, what="spool, MPS and diagnosis")
        text = running.metrics()
    server, args = kubernetes_node(tmp)
    server.service.pods = [pod("team-a", "train-0", {"trainer": [(GPU, [f"{SLICED_UUID}::0"])]})]
    server.start()
    try:
        with Exporter(*args) as running:
            wait_for(lambda: "gpu_pod_info{" in running.metrics(), 20, what="pods")
            text += running.metrics()
    finally:
        server.stop()
    return text


def test_every_published_family_is_in_the_contract(exposition):
    missing = undocumented(exposition, CONTRACT.read_text())
    assert not missing, f"published but not in docs/metrics.md: {sorted(missing)}"


def test_a_family_missing_from_the_contract_fails(exposition):
    contract = CONTRACT.read_text()
    assert undocumented(exposition, contract.replace("| `gpu_power_watts` |", "| power |")) == {"gpu_power_watts"}
    counter_gone = contract.replace("| `mps_daemon_cpu_seconds_total` |", "| cpu |")
    assert undocumented(exposition, counter_gone) == {"mps_daemon_cpu_seconds_total"}  # its _created goes with it


def test_workload_names_are_read_from_their_table():
    names = documented(CONTRACT.read_text())
    assert {"gpu_workload_held_share_ratio", "gpu_workload_sm_active_ratio",
            "gpu_workload_held_idle_gpu_seconds_total"} <= names


def test_every_documented_family_outside_workloads_is_published(exposition):
    """No stale rows, and none of the contract left unchecked because the runs above stopped
    publishing it (the workload families come with the workloads themselves)."""
    contract = CONTRACT.read_text().split("\n## Workloads", 1)[0]
    stale = documented(contract) - published(exposition)
    assert not stale, f"in docs/metrics.md but not published: {sorted(stale)}"
