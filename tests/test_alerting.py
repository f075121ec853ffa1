"""Alerts that reach a person, with real parts: Debian's Prometheus (our rules, `for:` shortened) and
Alertmanager (deploy/alertmanager.yaml with the receiver pointed at a webhook inside this test and
the waits shortened), the exporter replaying the hidden-idle and the saturated H100 exports."""
import json
import shutil
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.helpers import FIXTURES, ROOT, Exporter, Prometheus, free_port, http_get, wait_for

CONFIG = ROOT / "deploy" / "alertmanager.yaml"
needs = lambda tool: pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} not installed (see .ci/run)")


@needs("amtool")
def test_alertmanager_config_is_valid():
    done = subprocess.run(["amtool", "check-config", str(CONFIG)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_runbook_and_a_runbook_url():
    rules = yaml.safe_load((ROOT / "rules" / "gpu-utilization.rules.yaml").read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"] if "alert" in r):
        name = rule["alert"]
        assert rule["annotations"]["runbook_url"].endswith(f"/{name}.md"), name
        text = (ROOT / "docs" / "runbooks" / f"{name}.md").read_text()
        for heading in ("## What it means", "## Confirm", "## Likely causes", "## What to do", "## Silence"):
            assert heading in text, f"{name}: no {heading}"


class Webhook:
    """An HTTP receiver of Alertmanager's webhook notifications."""

    def __init__(self):
        self.notifications: list[dict] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, status: str | None = None, since: int = 0) -> list[dict]:
        return [a for n in self.notifications[since:] for a in n["alerts"] if status is None or a["status"] == status]

    def stop(self):
        self.server.shutdown()


class Alertmanager:
    def __init__(self, tmp, webhook_url: str):
        config = yaml.safe_load(CONFIG.read_text())
        config["receivers"][0]["webhook_configs"][0]["url"] = webhook_url
        for route in [config["route"], *config["route"].get("routes", [])]:
            route.update({"group_wait": "1s", "group_interval": "1s"})
        (tmp / "alertmanager.yaml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "alertmanager.log", "w")
        # one Alertmanager, no peers: no cluster, so its notifications do not wait for gossip to settle (10 s)
        self.proc = subprocess.Popen(
            ["prometheus-alertmanager", f"--config.file={tmp / 'alertmanager.yaml'}", f"--storage.path={tmp / 'am'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: http_get(self.url + "/-/ready", timeout=1)[0] == 200, 30, 0.2, "alertmanager ready")

    def post(self, alerts: list[dict]) -> None:
        request = urllib.request.Request(self.url + "/api/v2/alerts", data=json.dumps(alerts).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=5).close()

    def states(self) -> dict[str, str]:
        return {a["labels"]["alertname"]: a["status"]["state"] for a in json.loads(http_get(self.url + "/api/v2/alerts")[1])}

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


@needs("prometheus")
@needs("prometheus-alertmanager")
def test_hidden_idle_reaches_the_webhook_and_exporter_down_silences_the_rest(tmp_path):
    webhook = Webhook()
    alertmanager = Alertmanager(tmp_path, webhook.url)
    prometheus = None
    try:
        # the hidden-idle replay's steady phase (tests/test_replay_showcase.py): the condition holds on every
        # step, so the alert fires once and stays instead of coming and going with the capture's idle ends
        with Exporter("--no-nvml", "--no-mps", "--replay", str(FIXTURES / "h100_quarter_sms_steady_50hz.sqlite"),
                      "--interval", "0.5") as hidden, \
             Exporter("--no-nvml", "--no-mps", "--replay", str(FIXTURES / "h100_matmul_50hz.sqlite"),
                      "--interval", "0.5") as busy:
            hidden_target, busy_target = f"127.0.0.1:{hidden.port}", f"127.0.0.1:{busy.port}"
            prometheus = Prometheus(tmp_path, {"gpu-spatial-exporter": [hidden_target, busy_target]},
                                    alertmanager=f"127.0.0.1:{alertmanager.port}", target_labels={"node": "gpu-host"},
                                    external_labels={"runbook_base_url": "https://runbooks.example.org/gpu",
                                                     "grafana_url": "https://grafana.example.org"})

            def hidden_idle():
                return [a for a in webhook.alerts("firing") if a["labels"]["alertname"] == "HiddenIdleSMs"]

            (alert, *more) = wait_for(hidden_idle, 90, 0.5, "HiddenIdleSMs at the webhook")
            labels, notes = alert["labels"], alert["annotations"]
            assert labels["instance"] == hidden_target and labels["severity"] == "warning"
            assert labels["gpu"] == "0" and labels["uuid"].startswith("GPU-") and labels["node"] == "gpu-host"
            assert "runbook_base_url" not in labels and "grafana_url" not in labels  # annotations only
            assert notes["runbook_url"] == "https://runbooks.example.org/gpu/HiddenIdleSMs.md"
            assert notes["dashboard_url"] == (f"https://grafana.example.org/d/gpu-time-vs-spatial?"
                                              f"var-host={hidden_target}&var-gpu=0")
            assert notes["spatial_source"] == "nsys" and notes["sm_active"].endswith("%")
            assert notes["diagnosis"] == "small_kernels" and notes["sharing_mode"] == "unknown"  # a replay: no NVML
            assert float(notes["time_utilization"].rstrip("%")) >= 80
            assert all(a["labels"]["instance"] == hidden_target for a in hidden_idle())  # never the saturated GPU

            # The exporter goes away: ExporterDown arrives, and nothing else starts firing for it.
            seen = len(webhook.notifications)
            hidden.__exit__(None, None, None)

            def exporter_down():
                return [a for a in webhook.alerts("firing", since=seen) if a["labels"]["alertname"] == "ExporterDown"]

            (down, *_) = wait_for(exporter_down, 90, 0.5, "ExporterDown at the webhook")
            assert down["labels"]["instance"] == hidden_target
            assert down["annotations"]["runbook_url"] == "https://runbooks.example.org/gpu/ExporterDown.md"
            time.sleep(3)  # a few group intervals: anything else firing would have arrived
            others = {a["labels"]["alertname"] for a in webhook.alerts("firing", since=seen)} - {"ExporterDown"}
            assert not others, others
    finally:
        if prometheus:
            prometheus.stop()
        alertmanager.stop()
        webhook.stop()


@needs("prometheus-alertmanager")
def test_inhibitions_as_configured(tmp_path):
    """Each inhibition rule with real Alertmanager: the alerts it must silence are suppressed, the
    same alerts elsewhere (another instance, GPU or node) are not."""
    webhook = Webhook()
    alertmanager = Alertmanager(tmp_path, webhook.url)
    gpu = {"instance": "h1:9478", "job": "gpu-spatial-exporter", "node": "h1", "gpu": "0", "uuid": "GPU-a"}
    cases = [
        ({"alertname": "ExporterDown", "instance": "h1:9478", "job": "gpu-spatial-exporter"},
         [{"alertname": "HiddenIdleSMs", **gpu}, {"alertname": "ExporterCollectorFailing", "collector": "nvml", **gpu},
          {"alertname": "MPSDaemonMajorPageFaults", "role": "server", "user": "root", **gpu}],
         [{"alertname": "HiddenIdleSMs", **gpu, "instance": "h2:9478"}]),
        ({"alertname": "SpatialSourceStuck", **gpu},
         [{"alertname": "HiddenIdleSMs", **gpu}],
         [{"alertname": "HiddenIdleSMs", **gpu, "uuid": "GPU-b", "gpu": "1"}]),
        ({"alertname": "SpatialSourceMissing", **gpu},
         [{"alertname": "HiddenIdleSMs", **gpu}],
         [{"alertname": "HiddenIdleSMs", **gpu, "uuid": "GPU-b", "gpu": "1"}]),
        # A critical XID silences the GPU's utilization alerts; a warning XID (63, 94) does not.
        ({"alertname": "GPUXidNeedsAttention", "severity": "critical", "xid": "79", **gpu},
         [{"alertname": "HiddenIdleSMs", **gpu}, {"alertname": "SpatialSourceStuck", **gpu},
          {"alertname": "SpatialSourceMissing", **gpu}],
         [{"alertname": "HiddenIdleSMs", **gpu, "uuid": "GPU-b", "gpu": "1"},
          {"alertname": "GPUHeldIdle", **gpu, "namespace": "team-a", "pod": "p", "container": "c"}]),
        ({"alertname": "GPUXidNeedsAttention", "severity": "warning", "xid": "63", **gpu},
         [],
         [{"alertname": "HiddenIdleSMs", **gpu}]),
        ({"alertname": "GPULost", "severity": "critical", **gpu},
         [{"alertname": "SpatialSourceMissing", **gpu}, {"alertname": "HiddenIdleSMs", **gpu},
          {"alertname": "ExporterCollectorFailing", **gpu, "collector": "nvml"}],
         [{"alertname": "SpatialSourceMissing", **gpu, "uuid": "GPU-b", "gpu": "1"},
          {"alertname": "ExporterCollectorFailing", **gpu, "collector": "kubelet"}]),
        ({"alertname": "MPSDaemonMajorPageFaults", "instance": "h1:9478", "node": "h1", "role": "server", "user": "u"},
         [{"alertname": "HostSwapping", "instance": "h1:9100", "job": "node-exporter", "node": "h1"}],
         [{"alertname": "HostSwapping", "instance": "h2:9100", "job": "node-exporter", "node": "h2"}]),
    ]
    try:
        for number, (source, silenced, spared) in enumerate(cases):
            for alert in (source, *silenced, *spared):  # each case on hosts of its own
                alert["case"] = str(number)
                for name in ("instance", "node"):
                    if name in alert:
                        alert[name] = f"case{number}-{alert[name]}"
            alertmanager.post([{"labels": a} for a in (source, *silenced, *spared)])

            def states():
                found = json.loads(http_get(alertmanager.url + "/api/v2/alerts?filter=" +
                                            urllib.request.quote(f'case="{number}"'))[1])
                return {tuple(sorted(a["labels"].items())): a["status"]["state"] for a in found}

            key = lambda a: tuple(sorted(a.items()))
            want = {key(source): "active", **{key(a): "suppressed" for a in silenced},
                    **{key(a): "active" for a in spared}}
            wait_for(lambda: states() == want, 15, 0.2, f"inhibition case {number}: {source['alertname']}")
    finally:
        alertmanager.stop()
        webhook.stop()


# -- rules ---------------------------------------------------------------------------------------------
@needs("promtool")
def test_alert_thresholds_hold_at_their_boundaries():
    """tests/rules/thresholds.test.yaml. Mutations: HiddenIdleSMs `>= 0.8` -> `> 0.8`, `<= 0.5` -> `< 0.5`."""
    done = subprocess.run(["promtool", "test", "rules", "tests/rules/thresholds.test.yaml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
