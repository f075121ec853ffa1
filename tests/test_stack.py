"""The monitoring stack with its real parts: promtool, docker-compose's own validation, the
dashboards' code, and an end-to-end run of the exporter (replaying real H100 exports), Debian's
Prometheus with our rules and node-exporter, where every dashboard query must return data and
HiddenIdleSMs must fire on the hidden-idle replay only."""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dashboards.common import queries
from tests.helpers import FIXTURES, RULES, ROOT, Exporter, Prometheus, free_port, shorten_for, side_by_side, wait_for
from tests.kubelet_server import SLICED_UUID, KubeletServer, pod
from tests.test_cupti import traced_mps_client
from tests.test_health import health_replay

DASHBOARDS = sorted((ROOT / "dashboards" / "generated").glob("*.json"))
needs = lambda tool: pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} not installed (see .ci/run)")


def run(*cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


@needs("promtool")
def test_promtool_checks_config_rules_and_rule_unit_tests():
    for cmd in (["promtool", "check", "config", "prometheus.yaml"], ["promtool", "check", "rules", str(RULES)],
                ["promtool", "test", "rules", "tests/rules/alerts.test.yaml", "tests/rules/workload_rollups.test.yaml"]):
        done = run(*cmd)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    alerts = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    tests = yaml.safe_load((ROOT / "tests" / "rules" / "alerts.test.yaml").read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    for alert in alerts:
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"{alert}: no firing case"
        # quiet: an eval with no alert, or a firing eval that leaves out some of the series given
        assert any(not c["exp_alerts"] for c in mine) or alert in ("MPSDaemonMajorPageFaults", "HostSwapping",
                                                                     "ExporterCollectorFailing"), f"{alert}: no quiet case"


@needs("docker-compose")
def test_compose_file_is_valid_and_complete():
    done = subprocess.run(["docker-compose", "-f", "docker-compose.yaml", "config"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "GRAFANA_ADMIN_PASSWORD": "test"})  # required (issue 17)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    services = config["services"]
    assert set(services) == {"dcgm-exporter", "gpu-spatial-exporter", "node-exporter", "prometheus", "alertmanager",
                             "grafana", "victoria-metrics", "runbooks", "gpu-spatial-exporter-demo"}
    assert services["alertmanager"]["image"].startswith("prom/alertmanager:v")  # pinned
    assert all("healthcheck" in s for s in services.values())
    assert "SYS_ADMIN" in services["dcgm-exporter"]["cap_add"]
    assert "1000" in services["dcgm-exporter"]["command"]
    for name in ("dcgm-exporter", "gpu-spatial-exporter"):
        assert services[name]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert set(config["volumes"]) == {"prometheus-data", "alertmanager-data", "grafana-data", "victoria-metrics-data"}
    vm_port = services["victoria-metrics"]["ports"][0]  # a string or a mapping, by compose version
    assert (vm_port.get("host_ip") if isinstance(vm_port, dict) else vm_port.split(":")[0]) == "127.0.0.1"
    counters = (ROOT / "deploy" / "dcgm-counters.csv").read_text().splitlines()
    assert any(line.startswith("DCGM_FI_PROF_SM_ACTIVE,") for line in counters)
    assert any(line.startswith("DCGM_FI_PROF_SM_OCCUPANCY,") for line in counters)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER (?!root)", dockerfile, re.M)


def compose_services(profile: str) -> dict:
    """The services `docker compose --profile PROFILE up` starts, from docker-compose's own rendering of the
    file (Debian's docker-compose 1.29 renders every profile: the selection is compose's documented rule)."""
    done = subprocess.run(["docker-compose", "-f", "docker-compose.yaml", "config"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "GRAFANA_ADMIN_PASSWORD": "test"})
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    return {name: s for name, s in services.items() if not s.get("profiles") or profile in s["profiles"]}


@needs("docker-compose")
def test_compose_profiles_gpu_and_demo_start_what_they_need():
    """`--profile demo` reserves no GPU, so it starts on any machine; each profile brings one exporter that
    Prometheus reaches as gpu-spatial-exporter; nothing depends on a service its profile leaves out."""
    shared = {"node-exporter", "prometheus", "alertmanager", "grafana", "victoria-metrics", "runbooks"}
    for profile, exporters in (("gpu", {"dcgm-exporter", "gpu-spatial-exporter"}), ("demo", {"gpu-spatial-exporter-demo"})):
        services = compose_services(profile)
        assert set(services) == shared | exporters
        for name, service in services.items():
            assert set(service.get("depends_on") or ()) <= set(services), (profile, name)
    demo = compose_services("demo")
    assert not any("devices" in s.get("deploy", {}).get("resources", {}).get("reservations", {}) for s in demo.values())
    exporter = demo["gpu-spatial-exporter-demo"]
    assert exporter["networks"]["default"]["aliases"] == ["gpu-spatial-exporter"]
    mounts = dict(reversed(v.split(":")[:2]) if isinstance(v, str) else (v["target"], v["source"])
                  for v in exporter["volumes"])
    replay = next(a.split("=", 1)[1] for a in exporter["command"] if a.startswith("--replay="))
    assert Path(mounts[replay]).is_file() and Path(mounts[replay]).name == "h100_quarter_sms_steady_50hz.sqlite"


@needs("docker-compose")
@needs("prometheus")
def test_the_demo_profile_fires_hidden_idle_with_the_stacks_own_prometheus_config(tmp_path):
    """The demo exporter's command as compose gives it (the replay path mapped back to the repository), scraped
    by prometheus.yaml itself (targets pointed at 127.0.0.1, every second, the alerts' for: cut to 3 s):
    HiddenIdleSMs fires on its GPU, ExporterDown does not, though dcgm-exporter's target stays down."""
    exporter = compose_services("demo")["gpu-spatial-exporter-demo"]
    mounts = {v["target"]: v["source"] for v in exporter["volumes"]} if isinstance(exporter["volumes"][0], dict) else \
        {v.split(":")[1]: v.split(":")[0] for v in exporter["volumes"]}
    args = [a for a in exporter["command"] if not a.startswith("--listen-address")]
    args = [f"--replay={mounts[a.split('=', 1)[1]]}" if a.startswith("--replay=") else a for a in args]
    config = yaml.safe_load((ROOT / "prometheus.yaml").read_text())
    (tmp_path / "rules.yaml").write_text(shorten_for(RULES.read_text()))
    config["rule_files"] = [str(tmp_path / "rules.yaml")]
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config.pop("remote_write")
    config["alerting"]["alertmanagers"] = []
    prometheus = None
    with Exporter(*args, "--interval", "0.5") as demo:
        for job in config["scrape_configs"]:
            job["scrape_interval"] = "1s"
            for static in job["static_configs"]:
                static["targets"] = [f"127.0.0.1:{demo.port}" if t == "gpu-spatial-exporter:9478" else
                                     f"127.0.0.1:{free_port()}" for t in static["targets"]]  # the rest: down
        (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump(config))
        try:
            prometheus = Prometheus.from_config(tmp_path)
            firing = wait_for(lambda: prometheus.query('ALERTS{alertname="HiddenIdleSMs", alertstate="firing"}'),
                              120, 0.5, "HiddenIdleSMs on the demo")
            assert [a["metric"]["instance"] for a in firing] == [f"127.0.0.1:{demo.port}"]
            assert prometheus.query('up{job="dcgm-exporter"} == 0')
            assert prometheus.query('ALERTS{alertname="ExporterDown"}') == []
        finally:
            if prometheus:
                prometheus.stop()


def test_dashboards_json_is_what_the_code_builds():
    done = run(sys.executable, "-m", "dashboards", "--check")
    assert done.returncode == 0, done.stderr


# Families a dashboard uses that only a condition no golden replay has publishes, and where a test gives them data.
CONDITIONAL = {
    "gpu_workload_cupti_sm_estimate_ratio": "MPS clients that trace (gpu_trace's client): tests/test_cupti.py end to "
                                            "end, and the traced client of test_stack_end_to_end",
}


def test_every_metric_a_dashboard_or_rule_uses_is_in_the_golden_output():
    lines = [line for name in ("golden_metrics.prom", "golden_metrics_k8s.prom", "golden_metrics_health.prom")
             for line in (FIXTURES / name).read_text().splitlines() if line]
    golden = {line.split("{")[0].split(" ")[0] for line in lines if not line.startswith("#")}
    declared = {line.split(" ")[2] for line in lines if line.startswith("# HELP ")}
    exprs = [q for d in DASHBOARDS for _, q in queries(json.loads(d.read_text()))]
    exprs += [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:gpu|mps)_[a-z_]+)\b", e)}
    used -= {"gpu_exporter"}  # a prefix inside names, not a name
    # a conditional family is still one the exporter declares, and one a dashboard or rule still uses
    assert set(CONDITIONAL) <= declared & used - golden, sorted(set(CONDITIONAL) - (declared & used - golden))
    missing = sorted(m for m in used if m not in golden and m not in CONDITIONAL)
    assert not missing, f"not in tests/fixtures/golden_metrics*.prom: {missing}"


# -- end to end ------------------------------------------------------------------------------------
def as_promql(expr: str) -> str:
    """A dashboard query as Grafana would send it with every variable on All."""
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", expr)
    if match:
        expr = f"count by ({match.group(2)}) ({match.group(1)})"
    for var, value in (("$__rate_interval", "10s"), ("$__range", "1h"), ("$host", ".*"), ("$gpu", ".*"), ("$node", ".*")):
        expr = expr.replace(var, value)
    return expr


@needs("prometheus")
@needs("prometheus-node-exporter")
def test_stack_end_to_end(tmp_path):
    node_port = free_port()
    node = subprocess.Popen(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{node_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mps = ("--proc-root", str(FIXTURES / "proc"), "--mps-control-binary", str(FIXTURES / "fake-mps-control"))
    prometheus = None
    # A Kubernetes node: NVML answers recorded while 4 processes time-sliced the H100, and a kubelet.
    kubelet = KubeletServer(str(tmp_path / "kubelet.sock"))
    kubelet.service.pods = [pod("team-a", "train-0", {"trainer": [("nvidia.com/gpu", [f"{SLICED_UUID}::0"])]}),
                            pod("team-b", "notebook", {"nb": [("nvidia.com/gpu", [f"{SLICED_UUID}::1"])]})]
    kubelet.service.allocatable = [("nvidia.com/gpu", [f"{SLICED_UUID}::{n}" for n in range(4)])]
    kubelet.start()
    jobs = tmp_path / "jobs"  # and a Slurm job holding GPU 0 through the job mapping directory
    jobs.mkdir()
    (jobs / "0").write_text("4242\n")
    (tmp_path / "cupti").mkdir()
    try:
        with traced_mps_client(tmp_path / "cupti") as (_, cupti_args), side_by_side(
                Exporter("--no-nvml", "--replay", str(FIXTURES / "h100_quarter_sms_50hz.sqlite"), "--interval", "0.5",
                         *mps),
                Exporter("--no-nvml", "--no-mps", "--replay", str(FIXTURES / "h100_matmul_50hz.sqlite"),
                         "--interval", "0.5"),
                Exporter("--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), "--no-mps", "--interval", "0.5",
                         "--kubelet-socket", kubelet.path, "--kubelet-interval", "0.5",
                         "--hpc-job-mapping-dir", str(jobs), "--held-idle-after", "3s"),
                Exporter("--nvml-replay", str(health_replay(tmp_path)), "--no-mps", "--interval", "0.5"),
                Exporter("--interval", "0.5", *cupti_args)) as (hidden, busy, k8s, h200, traced):
            # h200: the health row's data; traced: an MPS client that traces (the cupti SM estimate's data)
            targets = [f"127.0.0.1:{e.port}" for e in (hidden, busy, k8s, h200, traced)]
            prometheus = Prometheus(tmp_path, {"gpu-spatial-exporter": targets,
                                               "node-exporter": [f"127.0.0.1:{node_port}"]})
            wait_for(lambda: len([r for r in prometheus.query("up == 1")]) == 6, 60, 0.5, "six targets up")
            wait_for(lambda: prometheus.query("gpu_workload_cupti_sm_estimate_ratio"), 60, 0.5, "a traced client's window")

            def without_data():
                empty = []
                for dashboard in DASHBOARDS:
                    for title, expr in queries(json.loads(dashboard.read_text())):
                        if "node_pressure_" in expr and not os.path.exists("/proc/pressure/memory"):
                            continue  # this kernel has no pressure stall information to export
                        if not prometheus.query(as_promql(expr)):
                            empty.append(f"{dashboard.name}: {title}: {expr}")
                return empty

            # rate() windows and the shortened for: of the alerts fill in: every query has data, soon or never
            empty = []

            def filled():
                empty[:] = without_data()
                return not empty

            with contextlib.suppress(TimeoutError):
                wait_for(filled, 60, 0.5, "every dashboard query with data")
            assert not empty, "queries without data:\n" + "\n".join(empty)

            def firing():
                return {r["metric"]["instance"] for r in
                        prometheus.query('ALERTS{alertname="HiddenIdleSMs", alertstate="firing"}')}

            # the quarter-SM replay, the time-sliced node (SM active 0.06) and the MPS node (GPM: busy 1.00,
            # SM active 0.24), never the matmul one. The quarter-SM replay loops through idle phases, so its
            # alert comes and goes: collect every target seen firing.
            seen = set()
            hidden_idle = {targets[0], targets[2], targets[4]}

            def all_seen():
                seen.update(firing())
                return seen >= hidden_idle

            wait_for(all_seen, 40, 1, "HiddenIdleSMs firing on the hidden-idle targets")
            assert seen == hidden_idle
            stuck = prometheus.query('ALERTS{alertname="SpatialSourceStuck", alertstate="firing"}')
            assert not stuck
    finally:
        if prometheus:
            prometheus.stop()
        kubelet.stop()
        node.terminate()
        node.wait(10)
