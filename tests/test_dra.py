"""DRA claims as holders: NVIDIA's DRA device names, held shares of whole, MIG and shared devices (with
and without the API server), and end to end with a real PodResources gRPC server serving
dynamic_resources, a small Kubernetes API server on 127.0.0.1, and the real exporter over HTTP
replaying NVML answers recorded on the H100 (minor number 0)."""
import json
import shutil
import subprocess
import time

import pytest

from exporter import kubernetes_api
from exporter.holders import CAPACITY, EVEN_SPLIT, MIG, REPLICAS, WHOLE, Held, Holder
from exporter.kubernetes_api import ApiError, Endpoint, KubernetesApi, endpoint, quantity
from exporter.kubernetes_api import FORGET_AFTER_S, SLICES_EVERY_S
from exporter.samplers.dra import (MAX_CONTAINERS, MAX_DEVICES, ApiView, DraDevices, NvidiaDeviceNames, attribute_claims,
                                   NVIDIA_DRIVER, capacity_ratio, merge)
from exporter.snapshot import DeviceTelemetry, GpuIdentity, MigDevice
from tests.helpers import Exporter, http_get, parse_metrics, wait_for
from tests.kubelet_server import GPU, SLICED_UUID as UUID, claim_pod, kubernetes_node, pod
from tests.kubernetes_api_server import DRIPS, FakeApiServer, claim, device, empty_objects, nested, resource_slice
from tests.test_kubelet import node, pods_of, scrape  # noqa: F401 - node: a Kubernetes node with a real PodResources server

A, B, C = "GPU-aaaa", "GPU-bbbb", "GPU-cccc"


# -- the driver's device names ---------------------------------------------------------------------
@pytest.mark.parametrize("name, parsed", [
    ("gpu-0", (0, None)), ("gpu-12", (12, None)),
    ("gpu-3-mig-9-4-4", (3, (9, 4, 4))),                 # v25.3 .. v25.8: profile ID, start, size
    ("gpu-3-mig-3g40gb-9-4", (3, (9, 4, None))),         # v25.12 on: profile name, profile ID, start
    ("gpu-0-mig-1g10gb-me-20-6", (0, (20, 6, None))),    # "1g.10gb+me" made a DNS label by the driver
    ("gpu-vfio-0", None), ("gpu-", None), ("GPU-0", None), ("gpu-0-mig-x", None), ("", None),
    ("gpu-" + "9" * 7, None), ("gpu-0-mig-" + "a" * 200 + "-1-2", None), ("nvidia.com/gpu-0", None),
])
def test_nvidia_dra_device_names(name, parsed):
    assert NvidiaDeviceNames.parse(name) == parsed


def node_gpus(api=ApiView()):
    """GPU 0 (minor 0) whole, GPU 1 (minor 1) with an H100's 3g.40gb (60 SMs, profile 9, placement 0-3)
    and 1g.10gb (16 SMs, profile 19, placement 6) MIG devices, GPU 2 without a minor number."""
    gpus = (GpuIdentity(0, A, "H100", 0), GpuIdentity(1, B, "H100", 1), GpuIdentity(2, C, "H100"))
    telemetry = {B: DeviceTelemetry(gpus[1], 0.0, mig_enabled=True, mig_sm_count=132, mig_devices=(
        MigDevice("MIG-big", 1, 0, 60, 9, 0, 4), MigDevice("MIG-small", 2, 0, 16, 19, 6, 1)))}
    return DraDevices(gpus, telemetry, api)


def test_names_resolve_to_this_nodes_gpus_and_mig_devices():
    devices = node_gpus()
    assert devices.resolve("node-a", "gpu-0") == (A, None)
    assert devices.resolve("node-a", "gpu-1-mig-3g40gb-9-0") == (B, "MIG-big")
    assert devices.resolve("node-a", "gpu-1-mig-9-0-4") == (B, "MIG-big")
    assert devices.resolve("node-a", "gpu-1-mig-19-6-1") == (B, "MIG-small")
    assert "no MIG device of profile 19 at placement 6" in devices.resolve("node-a", "gpu-1-mig-19-6-2")  # size differs
    assert "no GPU with minor number 7" in devices.resolve("node-a", "gpu-7")
    assert "not a device name" in devices.resolve("node-a", "tpu-0")
    # The API server's uuid attribute wins over the name, and names GPUs without a minor number.
    devices = node_gpus(ApiView(uuids={("node-a", "gpu-2"): C, ("node-a", "odd"): "MIG-small",
                                       ("node-a", "gpu-0"): "GPU-elsewhere"}))
    assert devices.resolve("node-a", "gpu-2") == (C, None)
    assert devices.resolve("node-a", "odd") == (B, "MIG-small")
    assert "'GPU-elsewhere' is no GPU on this node" in devices.resolve("node-a", "gpu-0")


def held_of(found):
    return {(gpu, owner): value[:2] for gpu, owners in found.held.items() for owner, value in owners.items()}


def test_whole_mig_and_shared_devices_and_what_is_not_a_gpu():
    answer = [
        claim_pod("ml", "train", {"main": [("train-gpu", [("gpu-0", None)])]}),
        claim_pod("ml", "infer", {"srv": [("infer-mig", [("gpu-1-mig-3g40gb-9-0", None)])]}),
        claim_pod("nb", "x", {"c": [("x-gpu", [("gpu-1-mig-19-6-1", "s1")])]}),
        claim_pod("nb", "y", {"c": [("y-gpu", [("gpu-1-mig-19-6-1", "s2")])]}),
        claim_pod("nb", "z", {"c": [("z-gpu", [("gpu-1-mig-19-6-1", "s3")])]}),
        claim_pod("net", "nic", {"c": [("nic", [("eth0", None)], "sriov.example.com")]}),
        claim_pod("bad", "ghost", {"c": [("ghost", [("gpu-7", None)])]}),
        claim_pod("bad", "junk", {"c": [("junk", [("gpu-0;rm -rf /", None)])]}),
    ]
    found = attribute_claims(answer, node_gpus())
    held = held_of(found)
    assert held[(A, ("ml", "train", "main"))] == (1.0, WHOLE)
    assert held[(B, ("ml", "infer", "srv"))] == (round(60 / 132, 9), MIG)
    for name in "xyz":  # three allocations of one 1g.10gb device: an even split without the API server
        assert held[(B, ("nb", name, "c"))] == (round(16 / 132 / 3, 9), EVEN_SPLIT)
    assert found.held[B][("ml", "infer", "srv")][2] == ("MIG-big",)  # held whole: its instance's SMs are its own
    assert found.held[B][("nb", "x", "c")][2] == ()
    assert found.held[A][("ml", "train", "main")][3] == "train-gpu"
    assert found.other_drivers == {"sriov.example.com"}
    assert len(found.problems) == 2
    assert "'gpu-7'" in found.problems[0] and "bad/ghost" in found.problems[0] and "minor number 7" in found.problems[0]
    assert "not a device name" in found.problems[1]
    assert found.shared == {("nb", f"{n}-gpu", "node-a", "gpu-1-mig-19-6-1", f"s{i}") for i, n in enumerate("xyz", 1)}


def test_consumed_capacity_from_the_api_server_and_containers_sharing_one_allocation():
    answer = [claim_pod("nb", n, {"c": [(f"{n}-gpu", [("gpu-0", s)])]}) for n, s in (("x", "s1"), ("y", "s2"), ("z", "s3"))]
    api = ApiView(capacity={("node-a", "gpu-0"): {"shares": 4.0, "memory": 80 * 2**30}},
                  consumed={("nb", "x-gpu", "node-a", "gpu-0", "s1"): {"shares": 1.0},
                            ("nb", "y-gpu", "node-a", "gpu-0", "s2"): {"shares": 1.0},
                            ("nb", "z-gpu", "node-a", "gpu-0", "s3"): {"shares": 2.0}})
    held = held_of(attribute_claims(answer, node_gpus(api)))
    assert held == {(A, ("nb", "x", "c")): (0.25, CAPACITY), (A, ("nb", "y", "c")): (0.25, CAPACITY),
                    (A, ("nb", "z", "c")): (0.5, CAPACITY)}
    # memory where the device offers no shares; an allocation the API server does not know: even split for all
    api = ApiView(capacity={("node-a", "gpu-0"): {"memory": 80.0}},
                  consumed={("nb", "x-gpu", "node-a", "gpu-0", "s1"): {"memory": 20.0},
                            ("nb", "y-gpu", "node-a", "gpu-0", "s2"): {"memory": 40.0},
                            ("nb", "z-gpu", "node-a", "gpu-0", "s3"): {"memory": 20.0}})
    assert held_of(attribute_claims(answer, node_gpus(api)))[(A, ("nb", "y", "c"))] == (0.5, CAPACITY)
    del api.consumed[("nb", "z-gpu", "node-a", "gpu-0", "s3")]
    assert set(held_of(attribute_claims(answer, node_gpus(api))).values()) == {(round(1 / 3, 9), EVEN_SPLIT)}
    # One claim listed by two containers of a pod (and a sidecar without it): half each.
    answer = [claim_pod("ml", "p", {"a": [("shared", [("gpu-0", None)])], "b": [("shared", [("gpu-0", None)])],
                                    "log": []})]
    assert held_of(attribute_claims(answer, node_gpus())) == {(A, ("ml", "p", "a")): (0.5, EVEN_SPLIT),
                                                             (A, ("ml", "p", "b")): (0.5, EVEN_SPLIT)}


def test_a_container_holding_a_gpu_both_ways_is_one_holder_and_claims_beside_device_plugin_gpus():
    answer = [claim_pod("ml", "p", {"c": [("big", [("gpu-1-mig-9-0-4", None)]), ("small", [("gpu-1-mig-19-6-1", None)])]}),
              claim_pod("ml", "q", {"c": [("q-gpu", [("gpu-0", "s1")])]})]
    device_plugin = {A: {Holder("ml", "q", "c"): Held(0.5, REPLICAS, resources=("nvidia.com/gpu.shared",))},
                     C: {Holder("ml", "dp", "c"): Held(1.0)}}
    merged = merge(device_plugin, attribute_claims(answer, node_gpus()))
    assert merged[C] == {Holder("ml", "dp", "c"): Held(1.0, WHOLE)}  # a device-plugin GPU beside claim GPUs
    # 0.5 + 1 (one share), capped; held through both: gpu_pod_info has a series of each resource
    assert merged[A] == {Holder("ml", "q", "c", claim="q-gpu"): Held(1.0, EVEN_SPLIT, resources=(NVIDIA_DRIVER, "nvidia.com/gpu.shared"))}
    assert merged[B] == {Holder("ml", "p", "c", claim="big,small"): Held(round(76 / 132, 9), MIG, ("MIG-big", "MIG-small"),
                                                                          (NVIDIA_DRIVER,))}


def test_a_kubelet_listing_too_many_containers_or_devices_costs_a_bounded_pass():
    """10^5 claims once took the exporter from 166 to 299 MB and scrapes to 720 ms: the first
    MAX_CONTAINERS containers and MAX_DEVICES devices are read, the rest counted in one problem."""
    many = [claim_pod("ns", f"p{i}", {"c": [(f"c{i}", [("gpu-0", f"s{i}")])]}) for i in range(MAX_CONTAINERS + 1)]
    found = attribute_claims(many, node_gpus())
    assert len(found.held[A]) == MAX_CONTAINERS and len(found.shared) == MAX_CONTAINERS
    assert ("ns", f"p{MAX_CONTAINERS - 1}", "c") in found.held[A] and ("ns", f"p{MAX_CONTAINERS}", "c") not in found.held[A]
    assert found.problems == []  # the kubelet sampler's attribute() names the containers left out, once
    one = [claim_pod("ns", "p", {"c": [("big", [("gpu-0", f"s{i}") for i in range(MAX_DEVICES)])]})]
    assert attribute_claims(one, node_gpus()).problems == []  # exactly the bound
    one = [claim_pod("ns", "p", {"c": [("big", [("gpu-0", f"s{i}") for i in range(MAX_DEVICES + 1)])]})]
    found = attribute_claims(one, node_gpus())
    assert len(found.shared) == MAX_DEVICES
    assert found.problems == [f"the kubelet lists {MAX_DEVICES + 1} DRA devices: only the first {MAX_DEVICES} are read"]
    # as many claims of devices this node lacks: ten named, the rest counted, so the log line stays short
    ghosts = [claim_pod("ns", f"g{i}", {"c": [(f"g{i}", [(f"gpu-{100 + i}", None)])]}) for i in range(1000)]
    problems = attribute_claims(ghosts, node_gpus()).problems
    assert len(problems) == 11 and problems[-1] == "and 990 more DRA devices that are no GPU here"


@pytest.mark.parametrize("text, value", [("80Gi", 80 * 2**30), ("4", 4.0), ("500m", 0.5), ("1e3", 1000.0),
                                         ("10G", 1e10), ("1.5Ki", 1536.0), ("", None), ("4 cats", None),
                                         ("-1", None), (4, None), ("9" * 70, None), ("1Ei", 2.0**60), ("2E", 2e18),
                                         ("2E3", 2000.0), ("1E+2", 100.0), ("1e-2", 0.01), ("1Ki2", None)])
def test_quantities(text, value):
    assert quantity(text) == value


def test_endpoint_from_flags_and_the_service_account(tmp_path):
    assert endpoint("off") is None
    assert endpoint("auto", {}, str(tmp_path)) is None  # outside a pod
    (tmp_path / "token").write_text("t0ken\n")
    (tmp_path / "ca.crt").write_text("x")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert endpoint("auto", env, str(tmp_path)) == Endpoint("https://10.0.0.1:443", str(tmp_path / "token"),
                                                            str(tmp_path / "ca.crt"))
    assert endpoint("auto", {"KUBERNETES_SERVICE_HOST": "fd00::1"}, str(tmp_path)).url == "https://[fd00::1]:443"
    assert endpoint("http://127.0.0.1:8001/", {}, str(tmp_path / "none")) == Endpoint("http://127.0.0.1:8001", None, None)


# -- the API reader against a real HTTP server ------------------------------------------------------
@pytest.fixture()
def api_server():
    server = FakeApiServer().start()
    yield server
    server.stop()


SHARED = {("nb", "x-gpu", "node-a", "gpu-0", "s1"), ("nb", "y-gpu", "node-a", "gpu-0", "s2")}


def shared_gpu(server):
    server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4", memory="80Gi")]),
                     resource_slice("node-b", "node-b", [device("gpu-0", "GPU-other")])]
    server.claims = {("nb", "x-gpu"): claim("nb", "x-gpu", [("node-a", "gpu-0", "s1", {"shares": "1"})]),
                     ("nb", "y-gpu"): claim("nb", "y-gpu", [("node-a", "gpu-0", "s2", {"shares": "3"})])}


def test_the_reader_lists_this_nodes_slices_gets_shared_claims_and_reads_them_once(api_server):
    shared_gpu(api_server)
    reader = KubernetesApi(Endpoint(api_server.url, None, None), node_name="node-a")
    view = reader.view({("node-a", "gpu-0")}, SHARED)
    assert view.uuids == {("node-a", "gpu-0"): UUID}
    assert view.capacity[("node-a", "gpu-0")] == {"shares": 4.0, "memory": 80 * 2**30}
    assert view.consumed[("nb", "y-gpu", "node-a", "gpu-0", "s2")] == {"shares": 3.0}
    assert reader.health.success
    assert "fieldSelector=spec.driver%3Dgpu.nvidia.com%2Cspec.nodeName%3Dnode-a" in api_server.requests[0]
    before = len(api_server.requests)
    assert reader.view({("node-a", "gpu-0")}, SHARED) == view  # allocations never change: no request
    assert len(api_server.requests) == before
    # a claim that leaves is forgotten
    left = {("nb", "y-gpu", "node-a", "gpu-0", "s2")}
    assert set(reader.view({("node-a", "gpu-0")}, left).consumed) == left


HOSTILE = {  # attack -> what the reader's one line says
    "slow": "slower than its deadline", "403": "RBAC", "garbage": "not JSON", "list": "not a JSON object",
    "huge": "answer over 8388608 bytes", "nested": "JSON nested too deeply",
    "empty_objects": "JSON of more than 200000 values",
    **{f"drip_{what}": "slower than its deadline" for what in DRIPS},
}


def hostile(server, attack):
    if attack == "slow":
        server.delay = 1.5
    elif attack == "403":
        server.status = 403
    elif attack == "garbage":
        server.body = b"<html>not json"
    elif attack == "huge":
        server.body = b"[" + b"1," * (5 * 1024 * 1024) + b"1]"
    elif attack == "list":
        server.body = b"[]"
    elif attack == "nested":
        server.body = nested(100_000)
    elif attack == "empty_objects":  # 2.8 million dicts once parsed
        server.body = empty_objects(8 * 1024 * 1024 - 64)
    elif attack.startswith("drip_"):  # a whole answer would take 10 s (its headers 80 s)
        server.drip = (attack.removeprefix("drip_"), 0.02)


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_api_server_is_one_line_a_back_off_and_an_even_split(api_server, attack, caplog):
    shared_gpu(api_server)
    hostile(api_server, attack)
    reader = KubernetesApi(Endpoint(api_server.url, None, None), timeout=1.0, budget=1.0)
    view = reader.view({("node-a", "gpu-0")}, SHARED)
    assert view == ApiView() and not reader.health.success
    assert HOSTILE[attack] in reader.health.error
    assert len(api_server.requests) == 1  # the first failure ends the tick
    for _ in range(3):  # backed off: no request, no new line
        reader.view({("node-a", "gpu-0")}, SHARED)
    assert len(api_server.requests) == 1
    lines = [r for r in caplog.records if "kubernetes api" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


@pytest.mark.parametrize("timeout, budget", [(0.5, 600.0), (600.0, 0.5)])
def test_a_request_ends_by_its_own_deadline_and_by_the_ticks(api_server, timeout, budget):
    """Headers dripped a byte every 0.02 s (80 s in all): the request's deadline (2 s by default) and
    the tick's budget (3 s) each end it, whichever comes first, however slowly the bytes come."""
    shared_gpu(api_server)
    api_server.drip = ("headers", 0.02)
    reader = KubernetesApi(Endpoint(api_server.url, None, None), timeout=timeout, budget=budget)
    reader.view({("node-a", "gpu-0")}, SHARED)
    assert "slower than its deadline" in reader.health.error


def test_what_an_answer_parses_into_is_bounded_before_it_is_parsed(api_server):
    """8 MB of `{"items":[{},{},...]}` took the exporter from 53 to 274 MB: its values are counted
    before parsing, so reading it costs about the answer's bytes, not its 2.8 million dicts."""
    import tracemalloc

    shared_gpu(api_server)
    hostile(api_server, "empty_objects")
    reader = KubernetesApi(Endpoint(api_server.url, None, None), timeout=30, budget=30)
    tracemalloc.start()
    try:
        reader.view({("node-a", "gpu-0")}, SHARED)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "JSON of more than" in reader.health.error
    assert peak < 2 * 8 * 2**20  # parsed, it is over 150 MB


def test_a_quantity_at_the_edges_of_its_suffixes(api_server):
    """`1Ei` and `2E` are valid quantities (an exbibyte, two exa), once a ValueError that escaped the
    reader; a consumed capacity above the device's counts as the whole device."""
    shared_gpu(api_server)
    api_server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="1Ei")])]
    api_server.claims[("nb", "x-gpu")] = claim("nb", "x-gpu", [("node-a", "gpu-0", "s1", {"shares": "2E"})])
    reader = KubernetesApi(Endpoint(api_server.url, None, None), node_name="node-a")
    view = reader.view({("node-a", "gpu-0")}, SHARED)
    assert reader.health.success
    assert view.capacity[("node-a", "gpu-0")] == {"shares": 2.0 ** 60}
    assert view.consumed[("nb", "x-gpu", "node-a", "gpu-0", "s1")] == {"shares": 2e18}
    assert capacity_ratio(view.capacity[("node-a", "gpu-0")], view.consumed[("nb", "x-gpu", "node-a", "gpu-0", "s1")]) == 1.0


def test_any_exception_reading_an_answer_is_the_readers_error(api_server, monkeypatch, caplog):
    """Not only the errors the reader foresees: whatever reading an answer raises is one line, success
    0 and a back-off, never an exception out of the kubelet's tick."""
    import exporter.kubernetes_api

    def overflow(text):
        raise OverflowError("int too large to convert to float")

    shared_gpu(api_server)
    monkeypatch.setattr(exporter.kubernetes_api, "quantity", overflow)
    reader = KubernetesApi(Endpoint(api_server.url, None, None), node_name="node-a")
    assert reader.view({("node-a", "gpu-0")}, SHARED) == ApiView() and not reader.health.success
    assert "reading its answer: OverflowError: int too large" in reader.health.error
    reader.view({("node-a", "gpu-0")}, SHARED)
    assert len(api_server.requests) == 1
    assert len([r for r in caplog.records if "kubernetes api" in r.getMessage()]) == 1


def self_signed(folder, name):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(folder / f"{name}.key"),
                    "-out", str(folder / f"{name}.crt")], check=True, capture_output=True, timeout=60)
    return str(folder / f"{name}.crt"), str(folder / f"{name}.key")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_in_a_pod_the_service_account_token_and_ca_are_used(tmp_path):
    """--kubernetes-api auto in a pod: HTTPS to KUBERNETES_SERVICE_HOST/PORT, verified against the
    service account's CA, the token as a bearer; a server the CA did not sign is refused (one line)."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    cert, key = self_signed(tmp_path, "apiserver")
    shutil.copyfile(cert, account / "ca.crt")
    (account / "token").write_text("the-token\n")
    server = FakeApiServer(tls=(cert, key)).start()
    shared_gpu(server)
    try:
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
        reader = KubernetesApi(endpoint("auto", env, str(account)), node_name="node-a")
        assert reader.view({("node-a", "gpu-0")}, SHARED).uuids == {("node-a", "gpu-0"): UUID}
        assert set(server.authorizations) == {"Bearer the-token"}
        other_ca, _ = self_signed(tmp_path, "other")
        shutil.copyfile(other_ca, account / "ca.crt")
        stranger = KubernetesApi(endpoint("auto", env, str(account)))
        assert stranger.view({("node-a", "gpu-0")}, SHARED) == ApiView()
        assert "SSL" in stranger.health.error or "certificate" in stranger.health.error
    finally:
        server.stop()


def test_the_reader_refuses_a_gone_budget(api_server):
    reader = KubernetesApi(Endpoint(api_server.url, None, None))
    with pytest.raises(ApiError, match="budget"):
        reader.get("/x", time.monotonic() - 1)


# -- end to end over HTTP --------------------------------------------------------------------------
def workloads(exporter):
    status, body = http_get(exporter.url + "/api/v1/workloads")
    assert status == 200
    return {(w["pod"], w["claim"]): w for w in json.loads(body)["workloads"]}


def basis_info(samples):
    return {(l["pod"], l.get("claim", "")): l["basis"] for l, _ in samples.get("gpu_workload_held_share_basis_info", [])}


def test_a_whole_gpu_by_claim_gets_time_share_sm_activity_counters_and_held_idle(node):
    """gpu-0 resolves to the recording's one GPU through its minor number (0). The trainer's container
    (pids 417, 418: 30 + 10 % of the SM time) holds it through claim train-gpu."""
    server, args = node
    server.service.pods = [claim_pod("team-a", "train-0", {"trainer": [("train-gpu", [("gpu-0", None)])]})]
    server.start()
    with Exporter(*args, "--kubernetes-api", "off", "--held-idle-after", "1s") as exporter:
        found = wait_for(lambda: workloads(exporter).get(("train-0", "train-gpu")), 15, 0.2, "claim holder")
        assert (found["held_share"], found["held_share_basis"], found["namespace"], found["container"]) == \
            (1.0, "whole", "team-a", "trainer")
        # busy time: GPM's GRAPHICS_UTIL (99.90552358 %, GPM serves the GPU), x (30 + 10) / 100 = 0.399622
        assert found["pids"] == [417, 418] and found["time_share"] == pytest.approx(0.399622)
        assert found["sm_active_basis"] == "time_share"  # pid 420 of nobody's runs beside it
        samples = parse_metrics(exporter.metrics())
        labels = samples["gpu_workload_held_share_ratio"][0][0]
        assert (labels["claim"], labels["pod"], labels["user"]) == ("train-gpu", "train-0", "")
        assert {(l["pod"], l["resource"]) for l, _ in samples["gpu_pod_info"]} == {("train-0", "gpu.nvidia.com")}
        assert basis_info(samples) == {("train-0", "train-gpu"): "whole"}
        assert wait_for(lambda: parse_metrics(exporter.metrics()).get("gpu_workload_held_gpu_seconds_total", [(0, 0)])[0][1] > 0,
                        10, 0.2, "held seconds")

        # Claims come and go: an idle claim arrives (no process), the trainer's claim leaves.
        server.service.pods = [claim_pod("team-c", "idle", {"c": [("idle-gpu", [("gpu-0", None)])]})]
        idle = wait_for(lambda: set(workloads(exporter)) == {("idle", "idle-gpu")}
                        and workloads(exporter)[("idle", "idle-gpu")]["held_idle"] and workloads(exporter),
                        15, 0.2, "idle claim held idle")
        assert idle[("idle", "idle-gpu")]["processes"] == 0
        samples = parse_metrics(exporter.metrics())
        assert {l["pod"]: v for l, v in samples["gpu_workload_held_idle"]} == {"idle": 1.0}
        assert {l["pod"] for l, _ in samples["gpu_workload_held_gpu_seconds_total"]} == {"idle"}  # nothing stale
        assert "Traceback" not in exporter.log()


def test_one_gpu_shared_by_three_claims_with_and_without_the_api_server(node):
    server, args = node
    server.service.pods = [claim_pod("team-a", "train-0", {"trainer": [("a-gpu", [("gpu-0", "s1")])]}),
                           claim_pod("team-b", "notebook", {"nb": [("b-gpu", [("gpu-0", "s2")])]}),
                           claim_pod("team-c", "idle", {"c": [("c-gpu", [("gpu-0", "s3")])]})]
    server.start()
    with Exporter(*args, "--kubernetes-api", "off") as exporter:
        found = wait_for(lambda: len(workloads(exporter)) == 3 and workloads(exporter), 15, 0.2, "three claims")
        assert {k: (w["held_share"], w["held_share_basis"]) for k, w in found.items()} == {
            ("train-0", "a-gpu"): (round(1 / 3, 9), "even_split"), ("notebook", "b-gpu"): (round(1 / 3, 9), "even_split"),
            ("idle", "c-gpu"): (round(1 / 3, 9), "even_split")}
        assert found[("notebook", "b-gpu")]["pids"] == [419]
        assert set(basis_info(parse_metrics(exporter.metrics())).values()) == {"even_split"}
    api = FakeApiServer().start()
    try:
        api.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4", memory="80Gi")])]
        api.claims = {("team-a", "a-gpu"): claim("team-a", "a-gpu", [("node-a", "gpu-0", "s1", {"shares": "2"})]),
                      ("team-b", "b-gpu"): claim("team-b", "b-gpu", [("node-a", "gpu-0", "s2", {"shares": "1"})]),
                      ("team-c", "c-gpu"): claim("team-c", "c-gpu", [("node-a", "gpu-0", "s3", {"shares": "1"})])}
        with Exporter(*args, "--kubernetes-api", api.url, env={"NODE_NAME": "node-a"}) as exporter:
            found = wait_for(lambda: len(workloads(exporter)) == 3 and all(
                w["held_share_basis"] == "capacity" for w in workloads(exporter).values()) and workloads(exporter),
                15, 0.2, "capacity shares")
            assert {k: w["held_share"] for k, w in found.items()} == {
                ("train-0", "a-gpu"): 0.5, ("notebook", "b-gpu"): 0.25, ("idle", "c-gpu"): 0.25}
            samples = parse_metrics(exporter.metrics())
            assert {l["collector"]: v for l, v in samples["gpu_exporter_collector_success"]}["kubernetes_api"] == 1.0

            api.delay = 3.0  # the API server turns slow: known allocations stay known, nothing new is asked
            server.service.pods = server.service.pods + [
                claim_pod("team-d", "late", {"c": [("d-gpu", [("gpu-0", "s4")])]})]
            found = wait_for(lambda: len(workloads(exporter)) == 4 and workloads(exporter), 20, 0.2, "a fourth claim")
            assert {w["held_share_basis"] for w in found.values()} == {"even_split"}  # one unknown: all even
            assert parse_metrics(exporter.metrics())["gpu_workload_held_share_ratio"]  # scrapes go on
            wait_for(lambda: exporter.log().count("kubernetes api:") == 1, 15, 0.2, "one line for the slow server")
            assert "Traceback" not in exporter.log()
    finally:
        api.stop()


def test_mig_devices_by_claim_and_a_device_plugin_gpu_beside_a_claim_gpu(tmp_path):
    """Two GPUs: the recording's H100 (minor 0) with MIG on, a 3g.40gb (profile 9, placement 0, 60 SMs)
    and a 1g.10gb (profile 19, placement 6, 16 SMs) whose GPM reads 50 % and 25 %; and a copy of it
    as GPU 1 (minor 1) a device-plugin container holds."""
    server, args = kubernetes_node(tmp_path)
    data = json.loads((tmp_path / "nvml.json").read_text())
    calls = data["calls"]
    calls["mig_devices/0"] = [{"value": {"enabled": True, "sm_count": 132, "devices": [
        {"uuid": "MIG-big", "gpu_instance": 1, "compute_instance": 0, "sm_count": 60, "profile_id": 9,
         "placement_start": 0, "placement_size": 4},
        {"uuid": "MIG-small", "gpu_instance": 2, "compute_instance": 0, "sm_count": 16, "profile_id": 19,
         "placement_start": 6, "placement_size": 1}]}}]
    gpm = calls["gpm_metrics/0"][0]["value"]
    calls["gpm_mig_metrics/0/1"] = [{"value": {**gpm, "sm_active": 50.0}}]
    calls["gpm_mig_metrics/0/2"] = [{"value": {**gpm, "sm_active": 25.0}}]
    for key in [k for k in calls if k.endswith("/0") and not k.startswith(("mig_devices", "gpm_mig"))]:
        calls[key[:-1] + "1"] = json.loads(json.dumps(calls[key]))
    calls["identity/1"][0]["value"].update(uuid="GPU-second", minor=1)
    for answer in calls["compute_processes/1"]:  # GPU 1 runs the trainer's processes only
        answer["value"] = {k: [p for p in v if p["pid"] in (417, 418)] for k, v in answer["value"].items()}
    calls["device_count"] = [{"value": 2}]
    (tmp_path / "nvml.json").write_text(json.dumps(data))
    server.service.allocatable = [(GPU, ["GPU-second"])]
    server.service.pods = [
        claim_pod("team-a", "infer", {"big": [("big-mig", [("gpu-0-mig-3g40gb-9-0", None)])]}),
        claim_pod("team-b", "small", {"small": [("small-mig", [("gpu-0-mig-19-6-1", None)])]}),  # the v25.3 name
        pod("team-c", "dp", {"main": [(GPU, ["GPU-second"])]}),
    ]
    server.start()
    try:
        with Exporter(*args, "--kubernetes-api", "off") as exporter:
            found = wait_for(lambda: len(workloads(exporter)) == 3 and all(
                w["sm_active"] is not None for k, w in workloads(exporter).items() if k[1]) and workloads(exporter),
                20, 0.2, "MIG claims and a device-plugin GPU")
            big, small, dp = found[("infer", "big-mig")], found[("small", "small-mig")], found[("dp", "")]
            assert (big["held_share"], big["held_share_basis"]) == (pytest.approx(60 / 132), "mig")
            assert big["sm_active"] == pytest.approx(0.5 * 60 / 132, abs=1e-6) and big["sm_active_basis"] == "exact"
            assert small["sm_active"] == pytest.approx(0.25 * 16 / 132, abs=1e-6)
            assert (dp["uuid"], dp["held_share"], dp["held_share_basis"]) == ("GPU-second", 1.0, "whole")
            assert "Traceback" not in exporter.log()
    finally:
        server.stop()


def test_claims_naming_devices_this_node_lacks_and_other_drivers_are_one_line_each(node):
    server, args = node
    server.service.pods = [claim_pod("bad", "ghost", {"c": [("ghost", [("gpu-5", None)])]}),
                           claim_pod("bad", "junk", {"c": [("junk", [("gpu-0\nFAKE LOG LINE", None)])]}),
                           claim_pod("net", "nic", {"c": [("nic", [("eth0", None)], "sriov.example.com")]}),
                           claim_pod("team-a", "train-0", {"trainer": [("t", [("gpu-0", None)])]})]
    server.start()
    with Exporter(*args, "--kubernetes-api", "off") as exporter:
        wait_for(lambda: set(workloads(exporter)) == {("train-0", "t")}, 15, 0.2, "the one good claim")
        time.sleep(1.0)  # several ticks: still one line each
        log = exporter.log()
        assert log.count("'gpu-5'") == 1 and log.count("sriov.example.com") == 1
        assert "\nFAKE LOG LINE" not in log  # quoted, never a line of its own
        assert "Traceback" not in log


def test_an_api_server_turning_hostile_is_its_own_error_and_pods_that_leave_still_leave(node):
    """Nested JSON once escaped the claim view as a RecursionError: the kubelet's tick failed on every
    tick, a pod that had left stayed in /metrics, kubernetes_api success stayed 1, and the API server was
    asked on every tick. Now: the reader's error (success 0, one line, backed off), the kubelet's
    attribution goes on (shared devices split evenly) and a pod that leaves is gone."""
    server, args = node
    shared = [claim_pod("team-a", "train-0", {"trainer": [("a-gpu", [("gpu-0", "s1")])]}),
              claim_pod("team-b", "notebook", {"nb": [("b-gpu", [("gpu-0", "s2")])]})]
    leaver = pod("team-c", "leaver", {"c": [(GPU, [f"{UUID}::7"])]})
    server.service.pods = [*shared, leaver]
    server.start()
    api = FakeApiServer().start()
    try:
        api.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4")])]
        api.claims = {(ns, name): claim(ns, name, [("node-a", "gpu-0", share, {"shares": "1"})])
                      for ns, name, share in (("team-a", "a-gpu", "s1"), ("team-b", "b-gpu", "s2"),
                                              ("team-d", "d-gpu", "s3"))}
        with Exporter(*args, "--kubernetes-api", api.url, env={"NODE_NAME": "node-a"}) as exporter:
            success = lambda s: {l["collector"]: v for l, v in s["gpu_exporter_collector_success"]}
            wait_for(lambda: success(scrape(exporter)).get("kubernetes_api") == 1.0 and pods_of(scrape(exporter)),
                     15, 0.2, "a good API server read")
            asked = len(api.requests)
            api.body = nested(100_000)
            server.service.pods = [*shared, claim_pod("team-d", "late", {"c": [("d-gpu", [("gpu-0", "s3")])]})]
            samples = wait_for(lambda: (s := scrape(exporter)) and success(s)["kubernetes_api"] == 0.0 and
                               ("team-c", "leaver", "c", GPU) not in pods_of(s) and s, 15, 0.2, "leaver gone")
            assert success(samples)["kubelet"] == 1.0 and "late" in {p for _, p, _, _ in pods_of(samples)}
            calls = server.service.calls
            wait_for(lambda: server.service.calls >= calls + 10, 15, 0.1, "ten more kubelet ticks")
            assert len(api.requests) == asked + 1  # backed off: 30 s between two tries
            log = exporter.log()
            assert log.count("kubernetes api: GET") == 1 and "JSON nested too deeply" in log
            assert "Traceback" not in log and "tick failed" not in log
    finally:
        api.stop()


# -- exporter/samplers/dra.py --------------------------------------------------------------------------
def test_consumed_capacity_over_the_devices_capacity_is_at_most_the_whole_device():
    """Mutant: the clamp in capacity_ratio dropped: an allocation said to consume twice the MIG device's
    capacity holds 2 x 16/132 of the GPU, more than the device."""
    answer = [claim_pod("nb", n, {"c": [(f"{n}-gpu", [("gpu-1-mig-19-6-1", s)])]}) for n, s in (("x", "s1"), ("y", "s2"))]
    pool_device = ("node-a", "gpu-1-mig-19-6-1")
    api = ApiView(capacity={pool_device: {"shares": 2.0}},
                  consumed={("nb", "x-gpu", *pool_device, "s1"): {"shares": 4.0},
                            ("nb", "y-gpu", *pool_device, "s2"): {"shares": 1.0}})
    held = attribute_claims(answer, node_gpus(api)).held[B]
    assert held[("nb", "x", "c")][:2] == (round(16 / 132, 9), CAPACITY)
    assert held[("nb", "y", "c")][:2] == (round(16 / 132 / 2, 9), CAPACITY)
    assert capacity_ratio({"shares": 2.0}, {"shares": 2.0}) == 1.0


def test_a_container_holding_two_allocations_of_one_gpu_holds_at_most_the_gpu():
    """Mutant: the clamp of a container's summed allocations dropped (3 + 3 of 4 shares: 1.5 GPUs)."""
    answer = [claim_pod("nb", "x", {"c": [("a-gpu", [("gpu-0", "s1")]), ("b-gpu", [("gpu-0", "s2")])]})]
    api = ApiView(capacity={("node-a", "gpu-0"): {"shares": 4.0}},
                  consumed={("nb", "a-gpu", "node-a", "gpu-0", "s1"): {"shares": 3.0},
                            ("nb", "b-gpu", "node-a", "gpu-0", "s2"): {"shares": 3.0}})
    assert attribute_claims(answer, node_gpus(api)).held[A][("nb", "x", "c")] == (1.0, CAPACITY, (), "a-gpu,b-gpu")


def test_shares_decide_before_memory_where_a_device_offers_both():
    """Mutant: memory tried before shares (1 of 4 shares reads as 60 of 80 GiB)."""
    assert capacity_ratio({"shares": 4.0, "memory": 80.0}, {"shares": 1.0, "memory": 60.0}) == 0.25
    assert capacity_ratio({"shares": 4.0, "memory": 80.0}, {"memory": 60.0}) == 0.75  # no shares consumed
    assert capacity_ratio({"memory": 80.0}, {"shares": 1.0}) is None
    assert capacity_ratio({}, {"shares": 1.0}) is None and capacity_ratio({"shares": 4.0}, {}) is None


def test_a_container_holding_one_gpu_both_ways_holds_the_sum_of_both_parts():
    """Mutant: merge keeps the claim's share only (the device-plugin quarter is lost: 0.5, not 0.75), or
    the device plugin's basis and MIG devices only."""
    answer = [claim_pod("ml", "q", {"c": [("q-gpu", [("gpu-0", "s1")])]}),
              claim_pod("ml", "r", {"c": [("r-gpu", [("gpu-0", "s2")])]})]
    device_plugin = {A: {Holder("ml", "q", "c"): Held(0.25, REPLICAS)}}
    merged = merge(device_plugin, attribute_claims(answer, node_gpus()))
    assert merged[A] == {Holder("ml", "q", "c", claim="q-gpu"): Held(0.75, EVEN_SPLIT, resources=(NVIDIA_DRIVER,)),
                         Holder("ml", "r", "c", claim="r-gpu"): Held(0.5, EVEN_SPLIT, resources=(NVIDIA_DRIVER,))}
    # the MIG devices held whole of both parts are kept, and the weaker basis is said
    answer = [claim_pod("ml", "p", {"c": [("big", [("gpu-1-mig-9-0-4", None)])]})]
    device_plugin = {B: {Holder("ml", "p", "c"): Held(16 / 132, MIG, ("MIG-small",))}}
    merged = merge(device_plugin, attribute_claims(answer, node_gpus()))
    assert merged[B] == {Holder("ml", "p", "c", claim="big"): Held(round(76 / 132, 9), MIG, ("MIG-big", "MIG-small"),
                                                                    (NVIDIA_DRIVER,))}
    # an unknown part makes the whole unknown
    whole = [claim_pod("ml", "q", {"c": [("q-gpu", [("gpu-0", None)])]})]
    merged = merge({A: {Holder("ml", "q", "c"): Held(None, WHOLE)}}, attribute_claims(whole, node_gpus()))
    assert merged[A] == {Holder("ml", "q", "c", claim="q-gpu"): Held(None, WHOLE, resources=(NVIDIA_DRIVER,))}


# -- exporter/kubernetes_api.py ------------------------------------------------------------------------
class Clock:
    """A module's `time`, whose monotonic clock the test moves (everything else is the real module's)."""

    def __init__(self, now: float):
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name):
        import time

        return getattr(time, name)


def frozen_api_clock(monkeypatch) -> Clock:
    """One clock at 10,000 s for the reader and for hostio.answers, which measures each request's deadline
    on it: with the real clock there, a machine up longer than 10,000 s found every deadline spent."""
    from hostio import answers

    clock = Clock(10_000.0)
    monkeypatch.setattr(kubernetes_api, "time", clock)
    monkeypatch.setattr(answers, "time", clock)
    return clock


def test_device_uuids_and_capacities_are_forgotten_after_the_api_server_stopped_answering(monkeypatch):
    """Mutants: the FORGET_AFTER_S drop removed (a device the API server no longer confirms keeps its
    uuid and capacity forever); `>` -> `>=` (forgotten at exactly FORGET_AFTER_S)."""
    server = FakeApiServer().start()
    try:
        server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4")])]
        clock = frozen_api_clock(monkeypatch)
        reader = KubernetesApi(Endpoint(server.url, None, None), node_name="node-a")
        devices = {("node-a", "gpu-0")}
        known = reader.view(devices, set())
        assert known.uuids == {("node-a", "gpu-0"): UUID} and known.capacity == {("node-a", "gpu-0"): {"shares": 4.0}}
        server.status = 500  # the API server stops answering
        for at in (SLICES_EVERY_S, FORGET_AFTER_S):
            clock.now = 10_000.0 + at
            assert reader.view(devices, set()) == known, at
        assert not reader.health.success
        clock.now = 10_000.0 + FORGET_AFTER_S + 0.001
        assert reader.view(devices, set()) == ApiView()
    finally:
        server.stop()


@pytest.fixture()
def api_at(monkeypatch):
    """A FakeApiServer on 127.0.0.1 with this node's GPU 0 (4 shares) and a reader of it whose clock the
    test moves."""
    server = FakeApiServer().start()
    server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4")])]
    clock = frozen_api_clock(monkeypatch)
    yield server, KubernetesApi(Endpoint(server.url, None, None), node_name="node-a"), clock
    server.stop()


def test_a_claim_deleted_meanwhile_is_no_failure_and_is_asked_again_after_the_back_off(api_at):
    """Mutants: a 404 for a claim is a failure (the reader backs off, health 0); a claim lacking an
    allocation listed now read again at once, not after BACKOFF_S."""
    from exporter.kubernetes_api import BACKOFF_S

    server, reader, clock = api_at
    gone = {("nb", "x-gpu", "node-a", "gpu-0", "s1")}
    assert reader.view({("node-a", "gpu-0")}, gone).consumed == {} and reader.health.success
    asked = len(server.requests)
    server.claims = {("nb", "x-gpu"): claim("nb", "x-gpu", [("node-a", "gpu-0", "s1", {"shares": "1"})])}
    clock.now += BACKOFF_S - 0.001
    assert reader.view({("node-a", "gpu-0")}, gone).consumed == {} and len(server.requests) == asked
    clock.now += 0.001
    assert reader.view({("node-a", "gpu-0")}, gone).consumed == {("nb", "x-gpu", "node-a", "gpu-0", "s1"): {"shares": 1.0}}


def test_a_device_the_slices_did_not_name_lists_them_again_after_a_sixth_of_the_period(api_at):
    """Mutant: an unknown device waits for the next full SLICES_EVERY_S."""
    server, reader, clock = api_at
    assert reader.view({("node-a", "gpu-0")}, set()).uuids == {("node-a", "gpu-0"): UUID}
    server.slices[0]["spec"]["devices"].append(device("gpu-1", "GPU-one"))
    clock.now += SLICES_EVERY_S / 6 - 0.001
    assert ("node-a", "gpu-1") not in reader.view({("node-a", "gpu-0"), ("node-a", "gpu-1")}, set()).uuids
    clock.now += 0.001
    assert reader.view({("node-a", "gpu-0"), ("node-a", "gpu-1")}, set()).uuids[("node-a", "gpu-1")] == "GPU-one"


def test_other_drivers_answers_and_capacities_that_are_no_number_are_left_out(api_at):
    """Mutants: the driver checks on slices and on claim results dropped (an API server or proxy that
    ignores the field selector); capacities of 0 or that are no quantity kept."""
    server, reader, _ = api_at
    server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="0", memory="lots")])]
    other = resource_slice("node-a", "node-a", [device("gpu-0", "GPU-not-nvidia", shares="2"),
                                                device("gpu-9", "GPU-not-nvidia-either")], driver="x.example.com")
    server.body = json.dumps({"kind": "ResourceSliceList", "metadata": {}, "items": [*server.slices, other]}).encode()
    view = reader.view({("node-a", "gpu-0")}, set())
    assert view.uuids == {("node-a", "gpu-0"): UUID} and view.capacity == {("node-a", "gpu-0"): {}}
    server.body = None
    theirs = claim("nb", "x-gpu", [("node-a", "gpu-0", "s1", {"shares": "1"}), ("node-a", "gpu-0", "s2", {"shares": "3"})])
    theirs["status"]["allocation"]["devices"]["results"][1]["driver"] = "x.example.com"
    server.claims = {("nb", "x-gpu"): theirs}
    wanted = {("nb", "x-gpu", "node-a", "gpu-0", "s1"), ("nb", "x-gpu", "node-a", "gpu-0", "s2")}
    assert reader.view({("node-a", "gpu-0")}, wanted).consumed == {("nb", "x-gpu", "node-a", "gpu-0", "s1"): {"shares": 1.0}}


def test_slices_keep_at_most_max_slice_devices_and_say_so_once(api_at, caplog):
    """Attack 6's tally: ten pages of `{"name":...}` devices were some 600,000 uuids and capacities kept.
    MAX_SLICE_DEVICES are kept (exactly that many: no line), one more is left out and said once, not
    on each list; a device named twice is one. Mutants: the cap dropped, `==` -> `>`, a device named twice
    counted twice, the line never said."""
    import logging

    from exporter.kubernetes_api import MAX_SLICE_DEVICES

    server, reader, clock = api_at
    per_slice = 1024
    server.slices = [resource_slice("node-a", "node-a", [device(f"gpu-{i}", f"GPU-{i}", shares="2")
                                                         for i in range(at, min(at + per_slice, MAX_SLICE_DEVICES))])
                     for at in range(0, MAX_SLICE_DEVICES, per_slice)]
    server.slices.append(resource_slice("node-a", "node-a", [device("gpu-0", "GPU-0")]))  # named twice: one device
    line = f"list more than {MAX_SLICE_DEVICES} devices: only the first {MAX_SLICE_DEVICES} are read"
    with caplog.at_level(logging.INFO, "exporter.kubernetes_api"):
        view = reader.view({("node-a", "gpu-0")}, set())
        assert len(view.uuids) == len(view.capacity) == MAX_SLICE_DEVICES and reader.health.success
        assert not any(line in r.getMessage() for r in caplog.records)
        server.slices.append(resource_slice("node-a", "node-a", [device("gpu-last", "GPU-last", shares="2")]))
        for _ in range(2):  # two lists of the slices, one line
            clock.now += SLICES_EVERY_S
            view = reader.view({("node-a", "gpu-0")}, set())
    assert len(view.uuids) == len(view.capacity) == MAX_SLICE_DEVICES and ("node-a", "gpu-last") not in view.uuids
    assert view.capacity[("node-a", f"gpu-{MAX_SLICE_DEVICES - 1}")] == {"shares": 2.0}
    assert sum(line in r.getMessage() for r in caplog.records) == 1, [r.getMessage() for r in caplog.records]


def test_only_the_capacities_a_share_is_split_by_and_the_allocations_listed_are_kept(api_at):
    """A device's 64 capacities and a claim's 256 results were all kept, for every claim listed: only
    CAPACITY_NAMES and the allocations the kubelet lists are. Mutants: the name filter or the
    allocation filter dropped."""
    server, reader, _ = api_at
    many = {f"c{i}": str(i + 1) for i in range(62)}
    server.slices = [resource_slice("node-a", "node-a", [device("gpu-0", UUID, shares="4", memory="80Gi", **many)])]
    server.claims = {("nb", "x-gpu"): claim("nb", "x-gpu", [("node-a", "gpu-0", f"s{i}", {"shares": "1", **many})
                                                            for i in range(256)])}
    view = reader.view({("node-a", "gpu-0")}, {("nb", "x-gpu", "node-a", "gpu-0", "s7")})
    assert view.capacity == {("node-a", "gpu-0"): {"shares": 4.0, "memory": 80 * 2**30}}
    assert view.consumed == {("nb", "x-gpu", "node-a", "gpu-0", "s7"): {"shares": 1.0}}
