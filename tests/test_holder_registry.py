"""A holder kind declares its labels and every view reads them from the registry (exporter/holders.py KINDS,
issue 44): a kind with labels of its own (tests/ray_holder.py, registered from the test suite only) is right in
/metrics, the JSON API and its schema, the process series' owners, the report's --by and top; the rules and
dashboards join on exactly the registered labels."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from exporter import holders
from exporter.holders import CAPACITY, EVEN_SPLIT, Held, Holder, Holdings, MIG, REPLICAS, WHOLE, join_gpu, join_owners
from tests.helpers import FIXTURES, ROOT, Exporter, http_get, parse_metrics, wait_for
from tests.test_ctxsw_live import Nvml

RAY = {"ray": "tests.ray_holder"}


@pytest.fixture
def ray_registered(monkeypatch):
    monkeypatch.setattr(holders, "KINDS", {**holders.KINDS, **RAY})


def test_a_kind_with_labels_of_its_own_reaches_metrics_api_schema_process_owners_and_top(tmp_path, ray_registered):
    from exporter.nvml_replay import cut

    cut(FIXTURES / "nvml_h100_time_sliced.json", tmp_path / "nvml.json", frame=0)  # pids 417-420: 30/10/40/20 %
    (tmp_path / "actors").write_text("417 j1 a\n418 j1 a\n419 j1 b\n")  # two actors of one job
    with Exporter("--nvml-replay", str(tmp_path / "nvml.json"), "--no-mps", "--interval", "0.2", "--holders", "ray",
                  "--ray-actor-file", str(tmp_path / "actors"), module="tests.ray_holder") as running:
        def workloads():
            return json.loads(http_get(running.url + "/api/v1/workloads")[1])["workloads"]

        found = wait_for(lambda: len(workloads()) == 2 and workloads(), 20, what="two Ray actors")
        samples = parse_metrics(running.metrics())
        gpus = running.gpus()
        schemas = json.loads(http_get(running.url + "/openapi.json")[1])["components"]["schemas"]
    assert {(w["ray_job"], w["ray_actor"], w["held_share"], w["processes"]) for w in found} == {
        ("j1", "a", 0.5, 2), ("j1", "b", 0.5, 1)}
    held = {(l["ray_job"], l["ray_actor"]): v for l, v in samples["gpu_workload_held_share_ratio"]}
    assert held == {("j1", "a"): 0.5, ("j1", "b"): 0.5}
    # each actor's processes under its own owner, not summed into one nor left unowned
    process = {(l["ray_job"], l["ray_actor"]): v for l, v in samples["gpu_process_sm_utilization_ratio"]}
    assert process == {("j1", "a"): pytest.approx(0.4), ("j1", "b"): pytest.approx(0.4), ("", ""): pytest.approx(0.2)}
    assert gpus["holders"]["ray"]["process_owners"]["419"]["ray_actor"] == "b"
    for model in ("Workload", "HolderRef", "HeldShare"):
        assert {"ray_job", "ray_actor", "namespace", "hpc_job"} <= set(schemas[model]["properties"]), model
    assert schemas["HolderRef"]["properties"]["ray_actor"]["description"] == "the Ray actor holding the GPU"
    # top, from the same API: each process's holder and the GPU's holders, named by the kind's own labels
    from gpu_spatial.top.state import gpu_from_json

    gpu = gpu_from_json(0, gpus["gpus"][0], gpus, None)
    assert {p.pid: p.holder for p in gpu.processes} == {417: "a", 418: "a", 419: "b", 420: ""}
    assert sorted(gpu.holders) == ["a", "b"]


def test_a_label_no_kind_declares_is_refused_where_the_holder_is_built(ray_registered, monkeypatch):
    assert Holder(ray_job="j", ray_actor="a").to_json()["ray_actor"] == "a"
    monkeypatch.setattr(holders, "KINDS", {k: v for k, v in holders.KINDS.items() if k not in RAY})
    with pytest.raises(ValueError, match="no holder kind declares the label.* ray_actor"):
        Holder(ray_actor="a")
    with pytest.raises(TypeError, match="at most 6 labels"):
        Holder(*"abcdefg")
    assert Holder(*"abcdef").labels() == list("abcdef")  # positional: the registered order


def test_holders_sort_by_the_registered_label_order():
    # namespace before pod: ("a", "z") before ("b", "a") though "a" < "z" in pod
    assert sorted([Holder("b", "a"), Holder("a", "z"), Holder(user="u"), Holder(hpc_job="j")]) == [
        Holder(user="u"), Holder(hpc_job="j"), Holder("a", "z"), Holder("b", "a")]


def test_a_label_two_kinds_declare_keeps_the_first_kinds_meaning(monkeypatch):
    monkeypatch.setattr(holders, "KINDS", {**holders.KINDS, "lsf": "tests.dummy_holder"})  # an hpc_job too
    assert holders.labels().count("hpc_job") == 1
    assert holders.label_meanings()["hpc_job"] == "the batch job (Slurm job ID) holding the GPU"


def test_a_claim_is_not_its_processes_owner():
    held = Holder("ml", "train", "c", claim="gpu-0")
    assert held.owner() == Holder("ml", "train", "c") and held.owner().claim == ""
    assert holders.owner_labels() == ("namespace", "pod", "container", "hpc_job", "user")
    assert Holder(user="u").owner() == Holder(user="u")


def test_report_and_top_read_a_registered_kinds_labels(ray_registered):
    from gpu_spatial.report import parser
    from gpu_spatial.report.account import GPU_GROUPS, Plan, group_labels

    by = parser()._option_string_actions["--by"].choices
    assert {"ray_job", "ray_actor", "namespace", "pod", "claim", "hpc_job", "user", *GPU_GROUPS} == set(by)
    assert group_labels()["pod"] == ("namespace", "pod") and group_labels()["ray_actor"] == ("ray_actor",)
    # a grouping of one label is rolled up by the rules generated with it registered; a pod needs its namespace
    assert Plan("ray_actor").rules_unusable() is None
    assert Plan("pod").rules_unusable() == "no recording rule groups by pod"  # the counters answer
    assert holders.holder_name({"ray_job": "j1", "ray_actor": "a"}) == "a"
    assert holders.holder_name({"namespace": "ml", "pod": "train-0", "container": "c", "claim": "gpu-0"}) == \
        "train-0 (claim gpu-0)"
    assert holders.holder_name({"user": "alice"}) == "user alice"
    assert holders.holder_name({"pod": 7, "other": "x"}) == ""  # the API is another process's: not trusted


def test_top_joins_the_process_owners_of_every_kind():
    from gpu_spatial.top.state import _gpu_holders, _process_owners

    snapshot = {"holders": {"kubelet": {"process_owners": {"7": {"namespace": "ml", "pod": "p", "container": "c"}},
                                        "gpus": {"GPU-a": [{"namespace": "ml", "pod": "p", "container": "c"}]}},
                            "slurm": {"process_owners": {"7": {"hpc_job": "42"}, "8": {"hpc_job": "42"}},
                                      "gpus": {"GPU-a": [{"hpc_job": "42"}]}}}}
    assert _process_owners(snapshot) == {7: "p", 8: "hpc_job 42"}  # the first kind listing a pid keeps it
    assert _gpu_holders(snapshot, "GPU-a") == ["p", "hpc_job 42"]
    old = {"kubelet": {"process_owners": {"7": {"namespace": "ml", "pod": "p", "container": "c"}}}}
    assert _process_owners(old) == {7: "p"}  # an exporter from before `holders`


def test_rules_and_dashboards_join_on_every_registered_holder_label():
    """A join or a lookup that misses a holder label matches several holders' series (or fails many-to-many)."""
    every = {"instance", "uuid", *holders.labels()}
    rules = (ROOT / "rules" / "gpu-utilization.rules.yaml").read_text()
    lookups = re.findall(r"printf \"gpu_workload_\w+\{([^}]*)\}", rules)
    assert len(lookups) == 2
    for selector in lookups:
        assert {part.split("=")[0] for part in selector.split(",")} == every
    dashboard = (ROOT / "dashboards" / "generated" / "workloads.json").read_text()
    joins = re.findall(r"on \((instance, uuid, [^)]*)\)", dashboard)
    assert joins and all(set(map(str.strip, join.split(","))) == every for join in joins)


def test_the_report_rollups_are_the_shipped_rules():
    """ruled() names a --by choice whose rollups the shipped rules record, for every quantity read."""
    from gpu_spatial.report.account import QUANTITIES, rollup, rule_label, ruled

    groups = yaml.safe_load((ROOT / "rules" / "gpu-utilization.rules.yaml").read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    assert set(ruled()) == {"namespace", "claim", "hpc_job", "user", "node", "model"}  # not pod: it needs its namespace
    for by in ruled():
        assert {rollup(rule_label(by), q) for q in (*QUANTITIES, "ledger")} <= recorded, by
    holder_rollups = {name.split(":")[0] for name in recorded if name.endswith("_gpu_seconds:rate5m")}
    assert holder_rollups - {"instance", "model"} <= set(holders.labels())


# -- rules and dashboards generated from the registry (dashboards/rules.py, dashboards/workloads.py) -------------
RULES_FILE = ROOT / "rules" / "gpu-utilization.rules.yaml"


def _generated() -> tuple[str, str, str]:
    """The rules file, the workloads and the GPU utilization dashboards as `python3 -m dashboards` makes them from
    the registry now."""
    from dashboards import gpu_utilization, rules, workloads
    from dashboards.__main__ import render

    return rules.render(RULES_FILE.read_text()), render(workloads), render(gpu_utilization)


def test_regenerating_the_rules_and_dashboards_gives_the_committed_files_byte_for_byte():
    made_rules, made_workloads, made_utilization = _generated()
    assert made_rules == RULES_FILE.read_text()
    assert made_workloads == (ROOT / "dashboards" / "generated" / "workloads.json").read_text()
    assert made_utilization == (ROOT / "dashboards" / "generated" / "gpu-utilization.json").read_text()


def test_a_registered_kind_is_rolled_up_named_looked_up_and_tabled_in_what_the_generator_makes(ray_registered, tmp_path):
    """The Ray kind, registered from the test suite only: its one-label groupings rolled up (exact rules), the alert
    naming an actor by its labels after the kinds before it and looking its series up on its labels too, the dashboard's
    table of actors, joins and legends; promtool takes the rules. Mutants: a grouping of several labels ruled; a kind's
    label left out of the lookups; the alert's kinds nested in another order."""
    import shutil
    import subprocess

    made_rules, made_dashboard, made_utilization = _generated()
    assert made_rules != RULES_FILE.read_text()
    recorded = {rule["record"]: rule["expr"] for group in yaml.safe_load(made_rules)["groups"] for rule in group["rules"]
                if group["name"] == "gpu-workload-recording"}
    assert recorded["ray_actor:gpu_workload_busy_gpu_seconds:rate5m"] == \
        "sum by (ray_actor, basis) (increase(gpu_workload_busy_gpu_seconds_total[5m])) / 300"
    assert recorded["ray_job:gpu_workload_held_without_sm_active_gpu_seconds:rate5m"] == (
        "sum by (ray_job) (increase(gpu_workload_held_gpu_seconds_total[5m]) unless ignoring (basis) "
        "increase(gpu_workload_sm_active_gpu_seconds_total[5m])) / 300")
    assert recorded["ray_actor:gpu_workload_ledger_gpu_seconds:rate5m"] == \
        "sum by (ray_actor, cell) (increase(gpu_workload_ledger_gpu_seconds_total[5m])) / 300"
    assert not any(name.startswith(("pod:", "container:")) for name in recorded)
    assert len(recorded) == 1 + 9 * 8 + 4  # heartbeat; 9 rollups of node, model and six holder groupings; GPU ledgers
    held_idle = next(rule for group in yaml.safe_load(made_rules)["groups"] for rule in group["rules"]
                     if rule.get("alert") == "GPUHeldIdle")["annotations"]
    assert held_idle["summary"].startswith(
        "{{ with $labels.container }}{{ $labels.namespace }}/{{ $labels.pod }}/{{ $labels.container }}"
        "{{ with $labels.claim }} (claim {{ . }}){{ end }}{{ else }}{{ with $labels.hpc_job }}Slurm job {{ . }}{{ else }}"
        "{{ with $labels.user }}user {{ . }}{{ else }}{{ with $labels.ray_actor }}{{ $labels.ray_job }}/"
        "{{ $labels.ray_actor }}{{ end }}{{ end }}{{ end }}{{ end }} holds GPU")
    assert "ray_job='%s',ray_actor='%s'}\" $labels.instance" in held_idle["idle_for"]
    assert held_idle["held_share"].count("$labels.ray_actor") == 1
    assert "Ray actors: GPU-hours over the range" in made_dashboard
    assert "sum by (ray_actor) (increase(gpu_workload_held_gpu_seconds_total{instance=~\\\"$host\\\", ray_actor!=" in made_dashboard
    assert "{{namespace}}/{{pod}}{{hpc_job}}{{user}}{{ray_job}}/{{ray_actor}} time" in made_dashboard
    assert "on (instance, uuid, namespace, pod, container, claim, hpc_job, user, ray_job, ray_actor)" in made_dashboard
    assert "sum by (instance, gpu, namespace, pod, container, claim, hpc_job, user, ray_job, ray_actor, basis)" in \
        made_utilization  # holders by their own hidden idle
    if shutil.which("promtool"):
        (tmp_path / "rules.yaml").write_text(made_rules)
        done = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


# -- exporter/holders.py -------------------------------------------------------------------------------
def test_where_two_kinds_claim_one_pid_the_first_kind_keeps_it_and_a_failed_kind_says_nothing():
    """Mutants: join_owners lets the later kind win (417 becomes a Unix user's, not the Slurm job's); the
    `not h.error` checks dropped (a failed sampler's holders and owners still count)."""
    job, user, ghost = Holder(hpc_job="4242"), Holder(user="alice"), Holder(user="ghost")
    slurm = Holdings(gpus={"GPU-aaaa": {job: Held(1.0)}}, owners={417: job})
    users = Holdings(gpus={"GPU-aaaa": {user: Held(1.0)}}, owners={417: user, 418: user})
    failed = Holdings(gpus={"GPU-aaaa": {ghost: Held(1.0)}}, owners={419: ghost}, error="stale")
    assert join_owners([slurm, users, failed]) == {417: job, 418: user}
    assert join_owners([users, slurm]) == {417: user, 418: user}
    assert join_gpu("GPU-aaaa", [slurm, users, failed]) == {job: Held(1.0), user: Held(1.0)}


def test_holder_kinds_are_built_in_their_order_users_only_without_a_scheduler_or_when_named(tmp_path):
    """Mutants: KINDS reordered (Slurm's owners would win over the kubelet's); users beside a scheduler under
    --holders auto; --holders none building some; `explicit` inverted (users of this host's /proc for a
    replay under auto, none when named)."""
    from exporter.config import parse_args
    from exporter.holders import build_holders
    from tests.helpers import FIXTURES

    (tmp_path / "map").mkdir()
    replay = ["--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), "--kubernetes-api", "off"]
    schedulers = ["--kubelet-socket", str(tmp_path / "kubelet.sock"), "--hpc-job-mapping-dir", str(tmp_path / "map")]

    def kinds(*flags):
        return [s.name for s in build_holders(parse_args([*replay, *flags]), Nvml())]

    assert kinds(*schedulers, "--proc-root", str(tmp_path), "--holders", "auto") == ["kubelet", "slurm"]
    assert kinds(*schedulers, "--proc-root", str(tmp_path), "--holders", "users,slurm") == ["slurm", "users"]
    assert kinds(*schedulers, "--holders", "none") == []
    assert kinds("--kubelet-socket", "none", "--holders", "auto") == []  # a replay against this host's /proc
    assert kinds("--kubelet-socket", "none", "--proc-root", str(tmp_path), "--holders", "auto") == ["users"]
    assert kinds("--kubelet-socket", "none", "--holders", "users") == ["users"]  # named: the user's call


def test_the_weakest_basis_of_several_is_said_from_whole_to_even_split():
    """Mutants: the bases' order (capacity after even split); the strongest said instead of the weakest."""
    from exporter.holders import weakest_basis

    assert weakest_basis([CAPACITY, EVEN_SPLIT]) == EVEN_SPLIT
    assert weakest_basis([WHOLE, MIG]) == MIG and weakest_basis([MIG, REPLICAS]) == REPLICAS
    assert weakest_basis([REPLICAS, CAPACITY]) == CAPACITY and weakest_basis([]) == WHOLE


# -- gpu_pod_info and gpu_pods: the one join, not the kubelet's own snapshot ---------------------------------
class _Published:
    """What the collectors read from an engine: its latest snapshot, the process-series setting, the holder limit."""

    process_series = ("container", 20)

    def __init__(self, snapshot, series_limit=None):
        self.snapshot = snapshot
        self.workloads = type("Accountant", (), {"series_limit": series_limit})()


def _pod_series(holdings: dict, series_limit=None) -> tuple[dict, dict]:
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.collectors.gpu import GpuCollector
    from exporter.snapshot import GpuIdentity, GpuView, Snapshot

    views = tuple(GpuView(GpuIdentity(i, uuid, "H100"), None, None, None, None, None, None, ())
                  for i, uuid in enumerate(("GPU-a", "GPU-b", "GPU-c")))
    registry = CollectorRegistry()
    registry.register(GpuCollector(_Published(Snapshot(1, 0.0, gpus=views, holdings=holdings), series_limit)))
    samples = parse_metrics(generate_latest(registry).decode())
    info = {(l["uuid"], l["namespace"], l["pod"], l["container"], l["resource"]): v for l, v in samples.get("gpu_pod_info", [])}
    return info, {l["uuid"]: v for l, v in samples.get("gpu_pods", [])}


def test_gpu_pod_info_is_the_joined_holders_that_are_pods_once_per_resource_and_gpu_pods_0_where_none_holds():
    """The kubelet's holdings (no KubeletSnapshot at all), a Slurm job beside them: each container once per
    resource it holds the GPU through (its claim is no series), a GPU the kubelet found held by none reads
    gpu_pods 0, a GPU it did not answer for has neither; a failed kubelet withdraws them all. Mutants: the
    pods counted by container or by series; the error check dropped; another kind's
    holders listed."""
    both = Holder("ml", "train", "c", claim="gpu-0")
    kubelet = Holdings(gpus={"GPU-a": {Holder("ml", "nb", "c"): Held(0.25, REPLICAS, resources=("nvidia.com/gpu",)),
                                       Holder("ml", "nb", "d"): Held(0.25, REPLICAS, resources=("nvidia.com/gpu",)),
                                       both: Held(0.5, CAPACITY, resources=("gpu.nvidia.com", "nvidia.com/gpu"))},
                             "GPU-b": {}})
    slurm = Holdings(gpus={"GPU-a": {Holder(hpc_job="42"): Held(1.0)}, "GPU-c": {Holder(hpc_job="43"): Held(1.0)}})
    info, pods = _pod_series({"kubelet": kubelet, "slurm": slurm})
    assert info == {("GPU-a", "ml", "nb", "c", "nvidia.com/gpu"): 1.0, ("GPU-a", "ml", "nb", "d", "nvidia.com/gpu"): 1.0,
                    ("GPU-a", "ml", "train", "c", "gpu.nvidia.com"): 1.0,
                    ("GPU-a", "ml", "train", "c", "nvidia.com/gpu"): 1.0}
    assert pods == {"GPU-a": 2.0, "GPU-b": 0.0}  # GPU-c: no kind of pods answered for it
    assert set(kubelet.to_json()["gpus"]) == {"GPU-a"}  # the API lists what is held, as before
    assert _pod_series({"kubelet": Holdings(gpus=kubelet.gpus, error="gone"), "slurm": slurm}) == ({}, {})
    # beyond the holder limit the rest is one pod="other" series with their count; gpu_pods counts them all
    info, pods = _pod_series({"kubelet": kubelet}, series_limit=2)
    assert len(info) == 3 and info[("GPU-a", "", "other", "", "")] == 2.0 and pods["GPU-a"] == 2.0
