"""The dashboards on any Grafana and for backfilled exports (issue 27 item 9):
- no hard-coded datasource uid: every query goes through the `datasource` variable (the default
  Prometheus where provisioned, the one chosen at import), and __inputs declares the datasource;
- `$gpu` and `$host` list GPUs of a backfilled export (`nsys-ingest openmetrics` + `promtool tsdb
  create-blocks-from openmetrics`), which carries gpu_sm_active_ratio but no time utilization: checked
  against Debian's Prometheus on such blocks, with the label-values call Grafana makes;
- panels that can be empty say why (description and no-data text)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse

import pytest

from dashboards.common import queries
from tests.helpers import FIXTURES, ROOT, free_port, http_get, needs, wait_for

DASHBOARDS = {path.name: json.loads(path.read_text()) for path in sorted((ROOT / "dashboards" / "generated").glob("*.json"))}


def datasources(node):
    """Every "datasource" value anywhere in a dashboard."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and value is not None:
                yield value
            else:
                yield from datasources(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasources(item)


def panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


@pytest.mark.parametrize("name", DASHBOARDS)
def test_no_datasource_uid_to_edit_on_import(name):
    dashboard = DASHBOARDS[name]
    assert {json.dumps(d, sort_keys=True) for d in datasources(dashboard)} == {
        json.dumps({"type": "prometheus", "uid": "${datasource}"}, sort_keys=True)}
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    # the one input: what the import asks for, becoming the variable's value
    assert [(i["name"], i["type"], i["pluginId"]) for i in dashboard["__inputs"]] == [
        ("DS_PROMETHEUS", "datasource", "prometheus")]
    assert variable["current"]["value"] == "${DS_PROMETHEUS}" and json.dumps(dashboard).count("${DS_PROMETHEUS}") == 2
    assert '"uid": "prometheus"' not in json.dumps(dashboard)


def test_panels_that_can_be_empty_say_why():
    def no_data(dashboard, title):
        (panel,) = [p for p in panels(DASHBOARDS[dashboard]) if p["title"] == title]
        text = panel["fieldConfig"]["defaults"]["noValue"]
        assert text in panel["description"]
        return text

    assert "no GPM" in no_data("gpu-utilization.json", "GPU $gpu: SM occupancy and tensor activity")
    assert "backfilled" in no_data("gpu-utilization.json", "GPU $gpu: time vs spatial utilization")
    assert "MPS" in no_data("workloads.json", "Per workload: time share vs SM active")
    assert "no per-client time" in no_data("gpu-utilization.json", "Holders by their own hidden idle SMs (5m)")
    assert "MPS daemon" in no_data("mps-host-memory.json", "MPS clients and daemons")
    assert "--hpc-job-mapping-dir" in no_data("workloads.json", "Slurm jobs: GPU-hours over the range")


def variable_query(dashboard: str, name: str) -> str:
    (variable,) = [v for v in DASHBOARDS[dashboard]["templating"]["list"] if v["name"] == name]
    return variable["query"]


@needs("promtool")
@needs("prometheus")
def test_gpu_variable_lists_a_backfilled_export(tmp_path):
    export = FIXTURES / "h100_quarter_sms_50hz.sqlite"
    subprocess.run([sys.executable, "-m", "nsys_ingest", "openmetrics", str(export), "-o", str(tmp_path / "run.om")],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    data = tmp_path / "data"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "run.om"), str(data)],
                   check=True, capture_output=True, timeout=300)
    stamps = [float(line.rsplit(" ", 1)[1]) for line in (tmp_path / "run.om").read_text().splitlines()
              if line and not line.startswith("#")]
    port = free_port()
    (tmp_path / "prometheus.yaml").write_text("global: {}\n")
    server = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yaml'}", f"--storage.tsdb.path={data}",
                               f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def label_values(query: str) -> list[str]:
            """What Grafana asks for `label_values(selector, label)` over the dashboard's range, $host on All."""
            selector, label = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.replace("$host", ".*")).groups()
            params = urllib.parse.urlencode({"match[]": selector, "start": min(stamps) - 60, "end": max(stamps) + 60})
            status, body = http_get(f"http://127.0.0.1:{port}/api/v1/label/{label}/values?{params}")
            assert status == 200, body
            return json.loads(body)["data"]

        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/-/ready")[0] == 200, 60, 0.5, "Prometheus ready")
        for dashboard in ("gpu-utilization.json", "mps-host-memory.json"):
            assert label_values(variable_query(dashboard, "gpu")) == ["0"]
        # What the variable used to read: a backfilled export has no time utilization series.
        assert label_values('label_values(gpu_time_utilization_ratio{instance=~"$host"}, gpu)') == []
    finally:
        server.terminate()
        server.wait(10)


def test_the_stack_test_runs_the_variables():
    found = {q for d in DASHBOARDS.values() for _, q in queries(d)}
    assert variable_query("gpu-utilization.json", "gpu") in found
