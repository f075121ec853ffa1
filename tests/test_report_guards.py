"""Report rules no other test held (issue 27, "Tests that guard"); kept apart from tests/test_report.py.

- Rollups are turned into GPU-seconds with the rule group's own interval: a Prometheus whose rollups run
  every 30 s (rules loaded, so /api/v1/rules says 30) gives the scenario's GPU-hours from the rules.
  Mutation: `* interval` -> `* 60` in the rule query.
- Waste is the ledger's hidden idle plus time idle (docs/ledger.md). Mutations: either left out, the old
  held-idle added.
- Credentials are checked against Debian's Prometheus with basic auth (web config), so the guard runs
  wherever Prometheus does, not only where VictoriaMetrics is installed. Mutations: the basic auth
  header not sent, the 401 not told apart from other errors.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from gpu_spatial.report.summary import summarize, top_wasters
from tests.helpers import free_port, needs, wait_for
from tests.test_report import (check_groups, one_line_error, recording_rules_only, report_json, start_prometheus,
                               stop)
from tests.workload_scenario import DURATION, SCENARIO, write_openmetrics

STEP = 10.0
# bcrypt of "s3cret" (Prometheus' web config takes only hashes): python3 crypt.crypt("s3cret", "$2b$10$" + 22 chars)
S3CRET_BCRYPT = "$2b$10$abcdefghijklmnopqrstuu3KWNuWLhBnmgYfnzONPueahDuedC/lu"


def test_waste_is_the_ledgers_hidden_idle_plus_time_idle_never_the_allocation_views():
    """a: the old held-idle (1800 s) and hidden-idle (2700 s) are not waste any more; its ledger cells are:
    hidden idle 900 s + time idle 1800 s. b: busy 3600 s with no SM split: its waste is a lower bound (0)."""
    totals = {("a",): {("held", ""): 7200.0, ("held_idle", ""): 1800.0, ("busy", "nvml"): 3600.0,
                       ("sm_active", "exact"): 900.0, ("hidden_idle", "exact"): 2700.0,
                       ("ledger", "sm_active_work"): 1800.0, ("ledger", "hidden_idle"): 900.0,
                       ("ledger", "time_idle"): 1800.0},
              ("b",): {("held", ""): 3600.0, ("hidden_idle", "time_share"): 3600.0, ("ledger", "busy_unsplit"): 3600.0}}
    table = summarize(totals, ("namespace",)).set_index("namespace")
    assert table.loc["a", "waste_gpu_hours"] == pytest.approx(0.25 + 0.5)
    assert table.loc["a", "ledger_gpu_hours"] == pytest.approx(1.25) and not table.loc["a", "waste_is_lower_bound"]
    assert table.loc["b", "waste_gpu_hours"] == 0.0 and table.loc["b", "waste_is_lower_bound"]
    assert list(top_wasters(table.reset_index(), ["namespace"])["namespace"]) == ["a"]
    assert table.loc["(all)", "waste_gpu_hours"] == pytest.approx(0.75) and table.loc["(all)", "waste_is_lower_bound"]


@needs("prometheus", "promtool")
def test_rollups_evaluated_every_30_s_give_the_scenarios_gpu_hours(capsys):
    tmp = Path(tempfile.mkdtemp(prefix="report-30s-"))
    proc = None
    try:
        t0 = (time.time() // 3600) * 3600 - 3 * 3600
        with open(tmp / "scenario.om", "w") as fh:
            write_openmetrics(SCENARIO, t0, DURATION, STEP, fh)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "scenario.om"),
                        str(tmp / "tsdb")], check=True, capture_output=True)
        rules = recording_rules_only(tmp)
        groups = yaml.safe_load(rules.read_text())
        groups["groups"][0]["interval"] = "30s"
        rules.write_text(yaml.safe_dump(groups))
        proc, url = start_prometheus(tmp, {"global": {"scrape_interval": "15s"}})
        built = subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", f"--start={int(t0 - 600)}",
                                f"--end={int(t0 + DURATION + 600)}", "--eval-interval=30s", f"--url={url}",
                                f"--output-dir={tmp / 'rules'}", str(rules)], capture_output=True, text=True)
        stop(proc)
        proc = None
        assert built.returncode == 0, built.stderr
        for block in (tmp / "rules").iterdir():
            shutil.move(str(block), tmp / "tsdb" / block.name)
        # The report finds the 30 s spacing in the heartbeat's samples, not in the rules file.
        proc, url = start_prometheus(tmp, {"global": {"scrape_interval": "15s"}, "rule_files": [str(rules)]})
        store = {"url": url, "start": str(t0 - 60), "end": str(t0 + DURATION)}
        document = report_json(capsys, store, "--by", "namespace")
        assert document["source"]["rule_step_seconds"] == 30
        assert "rules" in {span["source"] for span in document["source"]["spans"]}
        check_groups(document, "namespace", coverage=False)
    finally:
        if proc is not None:
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@needs("prometheus")
def test_credentials_against_prometheus_with_basic_auth(capsys, tmp_path, monkeypatch):
    (tmp_path / "web.yaml").write_text(yaml.safe_dump({"basic_auth_users": {"report": S3CRET_BCRYPT}}))
    proc, url = None, None
    try:
        proc, url = start_prometheus_with_auth(tmp_path)
        (tmp_path / "token").write_text("not-the-token\n")
        (tmp_path / "wrong").write_text("report:guess\n")
        (tmp_path / "right").write_text("report:s3cret\n")
        for flags in ([], ["--bearer-token-file", str(tmp_path / "token")],
                      ["--basic-auth-file", str(tmp_path / "wrong")]):
            one_line_error(capsys, "--prometheus", url, "--last", "1h", *flags,
                           contains="refused the credentials (HTTP 401)")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", "--basic-auth-file", str(tmp_path / "right"),
                       contains="has no series of the gpu-spatial exporter")
        monkeypatch.setenv("GPU_SPATIAL_PROMETHEUS_BASIC_AUTH", "report:s3cret")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", contains="has no series of the gpu-spatial exporter")
    finally:
        if proc is not None:
            stop(proc)


def start_prometheus_with_auth(tmp: Path):
    """Prometheus behind basic auth: its readiness answers 401 until asked with the password."""
    import base64
    import urllib.request


    port = free_port()
    (tmp / "prometheus.yaml").write_text("global: {}\n")
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yaml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={tmp / 'web.yaml'}"],
                            stdout=open(tmp / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Basic " + base64.b64encode(b"report:s3cret").decode()}

    def ready():
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/-/ready", headers=auth), timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    wait_for(ready, 30, what="prometheus with basic auth ready")
    return proc, url
