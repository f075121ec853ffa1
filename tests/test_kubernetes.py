"""The Kubernetes base: rendered by kustomize (kubectl's), the built-in kinds validated against a
recent Kubernetes schema, the PrometheusRule checked by promtool and put through the same rule unit
tests as rules/, and the generated files compared with their sources."""
import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.helpers import ROOT

BASE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.35.0"  # DRA's GA release (resource.k8s.io/v1, which the exporter reads)
BUILT_IN = {"Namespace", "ServiceAccount", "Service", "DaemonSet", "ConfigMap", "ClusterRole", "ClusterRoleBinding"}
needs = lambda tool: pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} not installed (see .ci/run)")


@pytest.fixture(scope="module")
def rendered():
    done = subprocess.run(["kubectl", "kustomize", str(BASE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}


def test_generated_manifests_are_what_their_sources_make():
    done = subprocess.run([sys.executable, "tools/kubernetes_manifests.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@needs("kubectl")
def test_kustomize_renders_every_kind_into_one_namespace(rendered):
    kinds = {kind for kind, _ in rendered}
    assert kinds == BUILT_IN | {"PrometheusRule", "ServiceMonitor"}
    cluster_wide = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    assert all(d["metadata"].get("namespace") == "gpu-monitoring" for (k, _), d in rendered.items() if k not in cluster_wide)


@needs("kubectl")
def test_built_in_kinds_are_valid_kubernetes(rendered):
    import kubernetes_validate

    for (kind, name), doc in rendered.items():
        if kind in BUILT_IN:
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{kind}/{name}: {exc.message} at {list(exc.path)}")


@needs("kubectl")
def test_daemonset_runs_on_gpu_nodes_with_what_attribution_needs(rendered):
    spec = rendered[("DaemonSet", "gpu-spatial-exporter")]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["hostPID"] is True and spec["automountServiceAccountToken"] is True  # the DRA reads (rbac.yaml)
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in ("/host/proc", "/var/lib/kubelet/pod-resources", "/host/var/log/containers"):
        assert mounts[path]["readOnly"] is True, path
    assert "/run/nvidia/mps" in mounts  # the MPS control pipe is written to
    args = container["args"]
    assert "--kubelet-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in args and "--proc-root=/host/proc" in args
    assert container["resources"]["requests"] and container["resources"]["limits"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["livenessProbe"]["httpGet"]["path"] == container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    security = container["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"] and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False


@needs("kubectl")
def test_rbac_reads_dra_claims_and_slices_and_nothing_else(rendered):
    role = rendered[("ClusterRole", "gpu-spatial-exporter-dra-reader")]
    assert role["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceslices"],
                              "verbs": ["get", "list"]}]
    binding = rendered[("ClusterRoleBinding", "gpu-spatial-exporter-dra-reader")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "gpu-spatial-exporter-dra-reader"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-spatial-exporter",
                                    "namespace": "gpu-monitoring"}]
    assert not [k for k in rendered if k[0] in ("Role", "RoleBinding")]  # no other grant


@needs("kubectl")
def test_service_monitor_scrapes_the_exporter_without_clashing_labels(rendered):
    service = rendered[("Service", "gpu-spatial-exporter")]
    monitor = rendered[("ServiceMonitor", "gpu-spatial-exporter")]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert service["metadata"]["labels"][monitor["jobLabel"]] == "gpu-spatial-exporter"  # job= in the rules
    dropped = [r for r in monitor["endpoints"][0]["relabelings"] if r.get("action") == "labeldrop"]
    assert dropped and dropped[0]["regex"] == "namespace|pod|container"


@needs("kubectl")
def test_dashboard_configmaps_carry_the_generated_dashboards(rendered):
    for path in sorted((ROOT / "dashboards" / "generated").glob("*.json")):
        configmap = rendered[("ConfigMap", f"grafana-dashboard-{path.stem}")]
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(configmap["data"][path.name]) == json.loads(path.read_text())


@needs("kubectl")
@needs("promtool")
def test_prometheus_rule_passes_promtool_and_the_rule_unit_tests(rendered, tmp_path):
    rule = rendered[("PrometheusRule", "gpu-utilization")]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    tests = yaml.safe_load((ROOT / "tests" / "rules" / "alerts.test.yaml").read_text())
    tests["rule_files"] = [str(tmp_path / "rules.yaml")]
    (tmp_path / "alerts.test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run(["promtool", "test", "rules", str(tmp_path / "alerts.test.yaml")], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@needs("amtool")
def test_kube_prometheus_stack_values_hold_a_valid_alertmanager_config(tmp_path):
    values = yaml.safe_load((BASE / "generated" / "kube-prometheus-stack-values.yaml").read_text())
    (tmp_path / "alertmanager.yaml").write_text(yaml.safe_dump(values["alertmanager"]["config"]))
    done = subprocess.run(["amtool", "check-config", str(tmp_path / "alertmanager.yaml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(values["prometheus"]["prometheusSpec"]["externalLabels"]) == {"runbook_base_url", "grafana_url"}
