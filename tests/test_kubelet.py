"""Pod attribution from the kubelet's PodResources API: a real gRPC server on a unix socket, the real
exporter over HTTP replaying NVML answers recorded on the H100 while 4 processes shared it
(tests/fixtures/nvml_h100_time_sliced.json), and a proc tree whose cgroups name the containers."""
import json
import time
from collections import Counter

import pytest

from exporter.kubelet import podresources_pb2 as pb
from exporter.samplers.dra import MAX_CONTAINERS, MAX_DEVICES
from exporter.samplers.kubelet import (ALLOCATABLE_FIELDS_PER_DEVICE, MAX_RESOURCE_NAME_BYTES, DeviceMap, PodRef, attribute,
                                       cgroup_container_id, read_allocatable, read_pods)
from exporter.samplers.kubelet import held_shares, mig_holdings
from exporter.snapshot import DeviceTelemetry, GpuIdentity, MigDevice
from tests.helpers import FIXTURES, Exporter, http_get, parse_metrics, wait_for
from tests.kubelet_server import (GPU, SLICED_UUID as UUID, GarbageServer, claim_pod, ids_of_size, kubernetes_node,
                                  large_node, node_replicas, padded_to, pod)


# -- device IDs -> GPUs ----------------------------------------------------------------------------
def two_gpus_one_mig():
    gpus = (GpuIdentity(0, "GPU-aaaa", "H100"), GpuIdentity(1, "GPU-bbbb", "H100"))
    telemetry = {"GPU-bbbb": DeviceTelemetry(gpus[1], 0.0, mig_enabled=True,
                                             mig_devices=(MigDevice("MIG-1111", 1, 0), MigDevice("MIG-2222", 2, 0)))}
    return DeviceMap(gpus, telemetry)


@pytest.mark.parametrize("device_id, uuid", [
    ("GPU-aaaa", "GPU-aaaa"),                # exclusive
    ("GPU-aaaa::3", "GPU-aaaa"),             # time-slicing or MPS replica
    ("MIG-2222", "GPU-bbbb"),                # MIG device -> its parent
    ("MIG-2222::1", "GPU-bbbb"),             # a replica of a MIG device
    ("MIG-GPU-bbbb/1/0", "GPU-bbbb"),        # older plugins' MIG IDs
    ("1", "GPU-bbbb"), ("0::2", "GPU-aaaa"), ("1:0", "GPU-bbbb"),  # deviceIDStrategy=index
    ("GPU-cccc", None), ("MIG-9999", None), ("7", None), ("", None), ("::1", None),
])
def test_device_ids_resolve_to_the_physical_gpu(device_id, uuid):
    assert two_gpus_one_mig().resolve(device_id) == uuid


def test_attribution_of_exclusive_shared_and_mig_allocations_and_bad_ids():
    answer = [
        pod("ml", "train", {"main": [(GPU, ["GPU-aaaa"])], "sidecar": [("cpu", ["0"])]}),
        pod("ml", "infer-1", {"srv": [("nvidia.com/mig-1g.10gb", ["MIG-1111"])]}),
        pod("ml", "infer-2", {"srv": [("nvidia.com/mig-1g.10gb", ["MIG-2222"])]}),
        pod("nb", "x", {"c": [("nvidia.com/gpu.shared", ["GPU-bbbb::0"])]}),
        pod("nb", "y", {"c": [("nvidia.com/gpu.shared", ["GPU-bbbb::1", "GPU-bbbb::1"])]}),  # one ID twice
        pod("init", "z", {"init": [(GPU, ["GPU-bbbb::4"])], "app": [(GPU, ["GPU-bbbb::4"])]}),  # handed on
        pod("bad", "ghost", {"c": [(GPU, ["GPU-not-here"])]}),
        pod("bad", "dup-1", {"c": [(GPU, ["GPU-bbbb::9"])]}),
        pod("bad", "dup-2", {"c": [(GPU, ["GPU-bbbb::9"])]}),
    ]
    pods, problems = attribute(answer, two_gpus_one_mig())
    assert pods["GPU-aaaa"] == (PodRef("ml", "train", "main", GPU),)
    assert {(r.namespace, r.pod, r.container) for r in pods["GPU-bbbb"]} == {
        ("ml", "infer-1", "srv"), ("ml", "infer-2", "srv"), ("nb", "x", "c"), ("nb", "y", "c"),
        ("init", "z", "init"), ("init", "z", "app")}
    assert len(problems) == 2
    assert "'GPU-not-here'" in problems[0] and "bad/ghost/c" in problems[0] and "no GPU on this node" in problems[0]
    assert "'GPU-bbbb::9'" in problems[1] and "bad/dup-1, bad/dup-2" in problems[1]


def test_an_empty_answer_attributes_nothing():
    pods, problems = attribute([], two_gpus_one_mig())
    assert pods == {"GPU-aaaa": (), "GPU-bbbb": ()} and problems == []


def test_a_list_answer_is_read_up_to_its_bounds_and_the_rest_counted_in_one_problem():
    """10,000 device-plugin pods once made scrapes wait 418 ms: every container read is a holder each
    update weighs. The first MAX_CONTAINERS containers and MAX_DEVICES device IDs are read; ten
    problems are named and the rest counted, so the log line stays short."""
    many = [pod("ns", f"p{i}", {"c": [(GPU, [f"GPU-aaaa::{i}"])]}) for i in range(MAX_CONTAINERS + 1)]
    assert attribute(many[:-1], two_gpus_one_mig())[1] == []  # exactly the bound: all read, no problem
    pods, problems = attribute(many, two_gpus_one_mig())
    assert len(pods["GPU-aaaa"]) == MAX_CONTAINERS and PodRef("ns", f"p{MAX_CONTAINERS}", "c", GPU) not in pods["GPU-aaaa"]
    assert problems == [f"the kubelet lists {MAX_CONTAINERS + 1} containers: only the first {MAX_CONTAINERS} are read"]
    one = [pod("ns", "p", {"c": [(GPU, [f"GPU-aaaa::{i}" for i in range(MAX_DEVICES)])]})]
    assert attribute(one, two_gpus_one_mig())[1] == []
    one = [pod("ns", "p", {"c": [(GPU, [f"GPU-aaaa::{i}" for i in range(MAX_DEVICES + 1)])]})]
    claimed = []
    _, problems = attribute(one, two_gpus_one_mig(), claimed)
    assert len(claimed) == MAX_DEVICES
    assert problems == [f"the kubelet lists {MAX_DEVICES + 1} device IDs: only the first {MAX_DEVICES} are read"]
    ghosts = [pod("ns", f"g{i}", {"c": [(GPU, [f"GPU-ghost-{i}"])]}) for i in range(25)]
    assert len(attribute(ghosts[:10], two_gpus_one_mig())[1]) == 10  # ten: each named
    dups = [pod("ns", f"d{i}", {"c": [(GPU, [f"GPU-aaaa::{i // 2}"])]}) for i in range(30)]
    _, problems = attribute(ghosts + dups, two_gpus_one_mig())
    assert len(problems) == 22 and problems[10] == "and 15 more device IDs that are no GPU here"
    assert problems[-1] == "and 5 more device IDs listed for several pods"


def test_a_list_answer_is_parsed_a_pod_at_a_time_up_to_the_bound():
    answer = pb.ListPodResourcesResponse(pod_resources=[pod("ns", f"p{i}", {"c": [(GPU, [f"GPU-aaaa::{i}"])]})
                                                        for i in range(5)]).SerializeToString()
    pods, more = read_pods(answer, limit=4)
    assert [p.name for p in pods] == ["p0", "p1", "p2", "p3"] and more
    pods, more = read_pods(b"\x10\x96\x01" + answer, limit=5)  # an unknown varint field (2 = 150) is skipped
    assert len(pods) == 5 and not more
    assert read_pods(b"", limit=3) == ([], False)
    # fields that are no pod: `limit` of them are skipped, one more is no List answer (16 MiB of them
    # would be millions of steps of the walk)
    assert read_pods(b"\x10\x01" * 3 + b"\x12\x00" * 2 + answer, limit=5)[0][4].name == "p4"
    with pytest.raises(ValueError, match="more than 5 fields that are no pod"):
        read_pods(b"\x10\x01" * 3 + b"\x12\x00" * 3 + answer, limit=5)
    with pytest.raises(ValueError, match="runs past the end"):  # a pod past the bound that runs past the end
        read_pods(answer + b"\x0a\x05ab", limit=5)
    for garbage in (answer[:-1], b"\x0d\x00\x00\x00\x00", b"\x0a" + b"\xff" * 11, b"\x0a\x05\xff\xff\xff\xff\xff"):
        with pytest.raises(Exception) as caught:  # each is a KubeletError ("garbled") in list_pods
            read_pods(garbage, limit=5)
        assert caught.type.__name__ in ("ValueError", "IndexError", "DecodeError"), caught


def test_a_varint_that_starts_inside_a_sub_message_and_ends_past_it_is_no_answer():
    """A container whose last byte starts a varint field (field 4, `\\x20`), its value the pod's next
    byte (`\\x0a`, which also starts the pod's name): read either way, the bytes make sense, and
    protobuf refuses them. So does the walk, at any depth; the same container with its varint inside is
    read."""
    from google.protobuf.message import DecodeError

    name = wire(1, b"x")
    for inside in (False, True):
        container = wire(1, b"c") + (b"\x20\x0a" if inside else b"\x20")
        answer = wire(1, wire(2, b"ns") + wire(3, container) + name)
        if inside:
            assert [(p.namespace, p.name, p.containers[0].name) for p in read_pods(answer)[0]] == [("ns", "x", "c")]
            assert pb.ListPodResourcesResponse.FromString(answer).pod_resources[0].name == "x"
            continue
        with pytest.raises(DecodeError):
            pb.ListPodResourcesResponse.FromString(answer)
        with pytest.raises(ValueError, match="runs past the end"):
            read_pods(answer)
        with pytest.raises(ValueError, match="runs past the end"):  # the same one level up, and at the top
            read_pods(wire(1, wire(2, b"ns") + b"\x20") + b"\x0a\x00")


def test_a_list_answer_walked_on_the_wire_reads_as_protobuf_parses_it():
    """read_pods builds only what the samplers read, from the bytes: attribution, claims and problems
    are those of the answer parsed by protobuf, with fields nothing reads (cpu_ids, memory, topology,
    CDI devices, unknown fields), a resource name after its IDs, another resource's IDs (never counted)
    and the bounds at their boundaries (MAX_DEVICES IDs over two pods, N read, N + 1 counted)."""
    from exporter.samplers.dra import attribute_claims
    from tests.test_dra import node_gpus

    late = pb.ContainerDevices(resource_name="rdma/hca", device_ids=["GPU-aaaa::7"])  # the last name counts
    late_name = late.SerializeToString() + pb.ContainerDevices(resource_name=GPU).SerializeToString()
    # as sent: protobuf would merge the names; pod and container named twice: protobuf keeps the last
    late_container = wire(1, b"first") + b"\x0a\x01c\x12" + bytes([len(late_name)]) + late_name
    late_pod = wire(1, b"first") + pb.PodResources(namespace="ns", name="late").SerializeToString() + b"\x1a" \
        + bytes([len(late_container)]) + late_container
    extra = pb.ContainerResources(name="extra", cpu_ids=[1, 2], memory=[pb.ContainerMemory(memory_type="memory", size=4)],
                                  devices=[pb.ContainerDevices(resource_name=GPU, device_ids=["GPU-aaaa::8"],
                                                               topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=1)]))])
    mixed = [
        pod("ml", "train", {"main": [(GPU, ["GPU-aaaa"])], "sidecar": [("cpu", ["0"] * 9000)]}),
        pod("nb", "y", {"c": [("nvidia.com/gpu.shared", ["GPU-bbbb::1", "GPU-bbbb::1", "MIG-1111"])]}),
        pod("bad", "dup-1", {"c": [(GPU, ["GPU-bbbb::9", "GPU-ghost"])]}), pod("bad", "dup-2", {"c": [(GPU, ["GPU-bbbb::9"])]}),
        pb.PodResources(namespace="ns", name="extra", containers=[extra]),
        claim_pod("ns", "claims", {"c": [("one", [("gpu-0", None), ("gpu-1-mig-3g40gb-9-0", None)]),
                                         ("shared", [("gpu-0", "s1"), ("gpu-9", None)]),
                                         ("other", [("gpu-0", None)], "example.com")]}),
    ]
    bounds = [pod("ns", "a", {"c": [(GPU, [f"GPU-aaaa::{i}" for i in range(MAX_DEVICES // 2)])]}),
              pod("ns", "b", {"c": [(GPU, [f"GPU-bbbb::{i}" for i in range(MAX_DEVICES // 2)])]})]
    many_claims = [claim_pod("ns", "p", {"c": [("big", [("gpu-0", f"s{i}") for i in range(MAX_DEVICES)])]})]
    cases = [mixed, bounds, bounds + [pod("ns", "c", {"c": [(GPU, ["GPU-aaaa::x"])]})],
             [pod("ns", f"p{i}", {"c": [(GPU, [f"GPU-aaaa::{i}"])]}) for i in range(MAX_CONTAINERS + 1)],
             many_claims, many_claims + [claim_pod("ns", "q", {"c": [("big", [("gpu-0", "x")])]})]]
    for parsed in cases:
        answer = pb.ListPodResourcesResponse(pod_resources=parsed).SerializeToString()
        if parsed is mixed:
            answer += b"\x0a" + bytes([len(late_pod)]) + late_pod
            parsed = list(pb.ListPodResourcesResponse.FromString(answer).pod_resources)
        walked, more = read_pods(b"\x20\x01" + answer, limit=MAX_CONTAINERS + 1)
        assert more == 0 and [(p.namespace, p.name) for p in walked] == [(p.namespace, p.name) for p in parsed]
        found = [(attribute(read, two_gpus_one_mig(), claimed := []), claimed, attribute_claims(read, node_gpus()))
                 for read in (walked, parsed)]
        assert found[0] == found[1], parsed[0].name
    answer = pb.ListPodResourcesResponse(pod_resources=cases[2]).SerializeToString()
    assert attribute(read_pods(answer)[0], two_gpus_one_mig())[1] == [
        f"the kubelet lists {MAX_DEVICES + 1} device IDs: only the first {MAX_DEVICES} are read"]
    answer = pb.ListPodResourcesResponse(pod_resources=cases[-1]).SerializeToString()
    assert attribute_claims(read_pods(answer)[0], node_gpus()).problems == [
        f"the kubelet lists {MAX_DEVICES + 1} DRA devices: only the first {MAX_DEVICES} are read"]
    sidecar = read_pods(pb.ListPodResourcesResponse(pod_resources=mixed).SerializeToString())[0][0].containers[1]
    assert sidecar.devices == []  # another resource's 9,000 IDs: walked, never kept
    answer = pb.ListPodResourcesResponse(pod_resources=cases[3]).SerializeToString()
    last = read_pods(answer, limit=MAX_CONTAINERS + 1)[0][-1]
    assert len(last.containers) == 1 and list(last.containers) == []  # the container past the bound: counted, not kept


def test_the_list_walk_stops_at_its_fields_budget_keeping_the_pods_it_read_whole():
    """Every field walked counts, at any depth: an answer of exactly `fields` fields is read whole, one
    more and the walk stops there, with the pods it read whole: the one it stopped in is unknown (its
    name may come after the cut, or come again there: protobuf keeps the last)."""
    from exporter.samplers.kubelet import Unread

    one = pb.ListPodResourcesResponse(pod_resources=[pod("ns", "p", {"c": [(GPU, ["GPU-aaaa::0", "GPU-aaaa::1"])]})])
    answer = one.SerializeToString()  # pod, name, namespace, container, its name, entry, resource name, 2 IDs
    pods, more = read_pods(answer, fields=9)
    assert more == Unread.NOTHING and list(pods[0].containers[0].devices[0].device_ids) == ["GPU-aaaa::0", "GPU-aaaa::1"]
    assert read_pods(answer, fields=8) == ([], Unread.FIELDS)
    pods, more = read_pods(answer * 2, fields=17)  # the second pod's last ID is past the budget
    assert more == Unread.FIELDS and [p.name for p in pods] == ["p"]
    pods, more = read_pods(answer * 2, fields=18)
    assert more == Unread.NOTHING and [p.name for p in pods] == ["p", "p"]
    pods, more = read_pods(b"\x20\x01" + answer + answer, fields=10)  # the unknown field counts too
    assert more == Unread.FIELDS and [p.name for p in pods] == ["p"]
    assert read_pods(answer, fields=0) == ([], Unread.FIELDS)


def kubelet_sampler(tmp_path, pods, allocatable=None, **options):
    """A started kubelet (real gRPC) listing `pods` (and `allocatable`: tests/kubelet_server.py), and a
    kubelet sampler of the replayed H100 asking it (KubeletSampler's `options`)."""
    from exporter.nvml_replay import ReplayNvml
    from exporter.samplers.kubelet import KubeletSampler
    from exporter.samplers.nvml import NvmlSampler

    server, _ = kubernetes_node(tmp_path)
    server.service.pods, server.service.allocatable = pods, allocatable
    server.start()
    nvml = NvmlSampler(ReplayNvml(tmp_path / "nvml.json"))
    nvml.tick()
    return server, KubeletSampler(server.path, nvml, proc_root=str(tmp_path / "proc"), container_logs=None, **options)


def test_a_kubelet_listing_more_pods_than_are_read_or_garbled_ones_is_the_ticks_problem(tmp_path):
    server, sampler = kubelet_sampler(tmp_path, [pod("ns", f"p{i}", {"c": [(GPU, [f"{UUID}::{i}"])]})
                                                 for i in range(MAX_CONTAINERS + 1)])
    try:
        sampler.tick()
        assert len(sampler.snapshot.pods[UUID]) == MAX_CONTAINERS and not sampler.health.success
        assert sampler.health.error == f"the kubelet lists more than {MAX_CONTAINERS} pods: only those are read"
        server.service.pods = server.service.pods[:MAX_CONTAINERS]
        sampler.tick()
        assert len(sampler.snapshot.pods[UUID]) == MAX_CONTAINERS and sampler.health.success
        server.service.raw = b"\x1d\x00\x00\x00\x00"  # field 3 as a fixed32: no List answer has one
        sampler.tick()
        assert "not a List answer" in sampler.health.error and not sampler.snapshot.pods  # withdrawn
    finally:
        sampler.close()
        server.stop()


def allocatable(*devices, cpu_ids=()) -> bytes:
    """An AllocatableResourcesResponse's bytes: devices are (resource name, device IDs)."""
    return pb.AllocatableResourcesResponse(cpu_ids=cpu_ids, devices=[
        pb.ContainerDevices(resource_name=r, device_ids=ids, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)]))
        for r, ids in devices]).SerializeToString()


def test_an_allocatable_answer_is_walked_up_to_its_bounds():
    """Distinct NVIDIA IDs in the order listed, the first `limit`; other resources, cpu_ids and unknown
    varint fields are walked, never read; no more than ALLOCATABLE_FIELDS_PER_DEVICE * limit fields."""
    answer = allocatable(("nvidia.com/gpu", ["GPU-a::0", "GPU-a::1"]), ("rdma/hca", ["mlx5_0"]),
                         ("nvidia.com/gpu", ["GPU-a::1", "GPU-b"]), cpu_ids=[1, 2, 3])  # GPU-a::1 on two NUMA nodes
    assert read_allocatable(answer, limit=3) == (["GPU-a::0", "GPU-a::1", "GPU-b"], False)  # exactly the bound
    assert read_allocatable(answer, limit=2) == (["GPU-a::0", "GPU-a::1"], True)
    assert read_allocatable(b"\x20\x01" + answer, limit=3) == (["GPU-a::0", "GPU-a::1", "GPU-b"], False)
    # resource name after the IDs (any order is protobuf), the last of two names counts
    late = b"\x0a\x17" + b"\x12\x01x" + b"\x0a\x04rdma" + b"\x0a\x0cnvidia.com/g"
    assert read_allocatable(late, limit=3) == (["x"], False)
    assert read_allocatable(b"\x20\x01" * (ALLOCATABLE_FIELDS_PER_DEVICE * 2), limit=2) == ([], False)
    assert read_allocatable(b"\x20\x01" * (ALLOCATABLE_FIELDS_PER_DEVICE * 2 + 1), limit=2) == ([], True)
    one = allocatable(("nvidia.com/gpu", ["a", "b"]))  # 1 entry + name + 2 IDs + topology: 5 fields
    assert read_allocatable(b"\x20\x01" * (2 * ALLOCATABLE_FIELDS_PER_DEVICE - 5) + one, limit=2) == (["a", "b"], False)
    assert read_allocatable(b"\x20\x01" * (2 * ALLOCATABLE_FIELDS_PER_DEVICE - 4) + one, limit=2) == ([], True)
    twice = allocatable(("nvidia.com/gpu", ["a", "b"]), ("nvidia.com/gpu", ["b"]))  # the limit, then one listed again
    assert read_allocatable(twice, limit=2) == (["a", "b"], False)
    # an entry keeps `limit` spans until its name is known: one more ID (a duplicate too) lists more than is read
    assert read_allocatable(allocatable(("nvidia.com/gpu", ["a", "a"])), limit=2) == (["a"], False)
    assert read_allocatable(allocatable(("nvidia.com/gpu", ["a", "a", "b"])), limit=2) == (["a"], True)
    # a resource name of Kubernetes' longest is read, one byte longer is no resource's
    longest = "nvidia.com/" + "g" * (MAX_RESOURCE_NAME_BYTES - len("nvidia.com/"))
    assert read_allocatable(allocatable((longest, ["a"])), limit=2) == (["a"], False)
    assert read_allocatable(allocatable((longest + "g", ["a"])), limit=2) == ([], False)
    for garbage in (answer[:-1], b"\x0d\x00\x00\x00\x00", b"\x0a" + b"\xff" * 11, b"\x0a\x03\x12\x05ab",
                    b"\x0a\x04\x0a\x02\xff\xfe"):  # cut, fixed32, a long varint, an ID past its entry, no UTF-8
        with pytest.raises((ValueError, IndexError)):
            read_allocatable(garbage, limit=5)


def traced_peak(reader, answer):
    """What `reader` makes of `answer`, and the peak of Python memory traced meanwhile: the reader's
    alone (the test's server in this process serialises in threads, before and after)."""
    import tracemalloc

    tracemalloc.start()
    try:
        return reader(answer), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_hostile_allocatable_answer_is_read_bounded_and_said_once(tmp_path, caplog):
    """GetAllocatableResources over the real gRPC server: MAX_DEVICES IDs are read and give the
    replica's share; one more and the share is unknown (a GPU's replicas may be partly read), in one
    problem line; a garbled answer is a problem too; 16 MiB of IDs costs its bytes, not a Python string
    per ID (traced Python memory: the old reader's 1.5 million strings and their tally were 174 MB)."""
    import logging

    from exporter.holders import Holder
    from exporter.samplers.kubelet import MAX_MESSAGE_BYTES

    server, sampler = kubelet_sampler(tmp_path, [pod("ns", "p", {"c": [(GPU, [f"{UUID}::1"])]})],
                                      [(GPU, [f"{UUID}::{i}" for i in range(MAX_DEVICES)])])
    share = lambda: sampler.holdings.gpus[UUID][Holder("ns", "p", "c")].share
    cut = f"GetAllocatableResources lists more than {MAX_DEVICES} device IDs: it is read no further"
    try:
        sampler.tick()
        assert share() == round(1 / MAX_DEVICES, 9) and sampler.health.success
        server.service.allocatable = [(GPU, [f"{UUID}::{i}" for i in range(MAX_DEVICES + 1)])]
        with caplog.at_level(logging.WARNING, "exporter.samplers.kubelet"):
            sampler.tick()
            sampler.tick()
        assert share() is None and not sampler.health.success and sampler.health.error.startswith(cut)
        assert sum(cut in r.getMessage() for r in caplog.records) == 1  # once, not per tick
        server.service.allocatable = b"\x1d\x00\x00\x00\x00"  # field 3 as a fixed32: no answer has one
        sampler.tick()
        assert share() is None and "not an Allocatable answer (ValueError: wire type 5" in sampler.health.error
        assert sampler.snapshot.pods[UUID]  # the pod is still attributed: only its share is unknown
        hostile = pb.AllocatableResourcesResponse(devices=[
            pb.ContainerDevices(resource_name=GPU, device_ids=ids_of_size(MAX_MESSAGE_BYTES - 64))])
        server.service.allocatable = hostile
        sampler.tick()
        assert sampler.health.error.startswith(cut) and share() is None
        server.service.allocatable = pb.AllocatableResourcesResponse(devices=[  # one more MiB: gRPC refuses it
            pb.ContainerDevices(resource_name=GPU, device_ids=ids_of_size(MAX_MESSAGE_BYTES + 2**20))])
        with caplog.at_level(logging.WARNING, "exporter.samplers.kubelet"):
            sampler.tick()
        assert share() is None and sampler.health.success  # as from a kubelet without the call
        assert f"(RESOURCE_EXHAUSTED): the share of a time-slicing or MPS replica is unknown (an answer over " \
               f"{MAX_MESSAGE_BYTES} bytes" in caplog.records[-1].getMessage()
        answer = hostile.SerializeToString()
        (ids, more), peak = traced_peak(read_allocatable, answer)
        # what a bounded walk keeps: MAX_DEVICES strings or spans (0.5 MB); a span per field walked was 4 MB
        assert more and len(ids) <= MAX_DEVICES and peak < 1024 * 1024, peak
    finally:
        sampler.close()
        server.stop()


def wire(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, as a kubelet may send it: in any order, any number of times."""
    from google.protobuf.internal.encoder import _VarintBytes

    return _VarintBytes(number << 3 | 2) + _VarintBytes(len(payload)) + payload


def test_a_hostile_list_answer_is_walked_bounded_and_said_once(tmp_path, caplog):
    """List over the real gRPC server: one pod of 16 MiB of device IDs (1.5 million) was parsed whole by
    protobuf (+72 MB). Now its first LIST_FIELDS fields are walked: the pods read whole before the cut
    are attributed, the IDs walked counted exactly, the cut said first, in one line over two ticks; an
    answer of exactly LIST_FIELDS fields is read whole. The pod the walk stopped in is unknown: its name
    may come after the cut (it was attributed as "//trainer"), or come again there (protobuf keeps the
    last). The reader keeps MAX_DEVICES strings and spans, never one per ID listed (traced Python memory,
    the reader alone)."""
    import logging

    from exporter.samplers.kubelet import LIST_FIELDS, MAX_MESSAGE_BYTES

    ok = pod("ns", "ok", {"c": [(GPU, [f"{UUID}::0"])]})  # 8 fields: pod, name, namespace, container, its
    # name, device entry, resource name, ID; the big pod's IDs come after 7 fields of its own
    walked = LIST_FIELDS - 15
    counted = f"the kubelet lists {walked + 1} device IDs: only the first {MAX_DEVICES} are read"
    cut = f"the kubelet's List answer is walked no further than its first {LIST_FIELDS} fields (1 pods read whole): " \
          "the pod it stopped in and what it lists after it are neither read nor counted"
    # index-style IDs (GPU 0's replicas): the budget's worth of them fits in the receive cap
    big = lambda count: pod("ns", "p", {"c": [(GPU, [f"0::{i}" for i in range(1, count + 1)])]})
    server, sampler = kubelet_sampler(tmp_path, [ok, big(walked)])
    only_ok = (PodRef("ns", "ok", "c", GPU),)
    try:
        sampler.tick()  # exactly the budget: no cut
        assert sampler.health.error == counted and sampler.snapshot.pods[UUID] == (*only_ok, PodRef("ns", "p", "c", GPU))
        server.service.pods = [ok, big(walked), pod("ns", "tail", {"c": [(GPU, [f"{UUID}::99999999"])]})]
        sampler.tick()  # cut in the third pod: the cut said first, then the counts of what was read
        assert sampler.health.error == f"{cut.replace('(1 pods', '(2 pods')}; {counted}"
        assert sampler.snapshot.pods[UUID] == (*only_ok, PodRef("ns", "p", "c", GPU))
        server.service.pods = [ok, big(walked + 1)]
        sampler.tick()
        assert sampler.health.error == cut and sampler.snapshot.pods[UUID] == only_ok
        trainer = pb.ContainerResources(name="trainer", devices=[pb.ContainerDevices(
            resource_name=GPU, device_ids=[f"0::{i}" for i in range(1, walked + 2)])]).SerializeToString()
        ok_bytes = pb.ListPodResourcesResponse(pod_resources=[ok]).SerializeToString()
        for late in (wire(3, trainer) + wire(1, b"late") + wire(2, b"team"),  # named after its containers
                     wire(1, b"first") + wire(2, b"team") + wire(3, trainer) + wire(1, b"last")):  # named again
            server.service.raw = ok_bytes + wire(1, late)
            sampler.tick()
            assert sampler.health.error == cut and sampler.snapshot.pods[UUID] == only_ok
        hostile = pb.ListPodResourcesResponse(pod_resources=[pod("ns", "p", {"c": [
            (GPU, [f"{UUID}::{i}" for i in range(8)] + ids_of_size(MAX_MESSAGE_BYTES - 5000))]})])
        server.service.raw = answer = hostile.SerializeToString()
        caplog.clear()
        with caplog.at_level(logging.WARNING, "exporter.samplers.kubelet"):
            sampler.tick()
            sampler.tick()
        assert sampler.health.error == cut.replace("(1 pods", "(0 pods") and not sampler.health.success
        assert sampler.snapshot.pods[UUID] == ()
        assert sum("walked no further" in r.getMessage() for r in caplog.records) == 1  # once, not per tick
        (pods, more), peak = traced_peak(read_pods, answer)
        assert more and pods == []
        # MAX_DEVICES strings and spans (0.8 MB); a span or a string per ID walked would be 5 MB or more
        assert peak < 2 * 1024 * 1024, peak
    finally:
        sampler.close()
        server.stop()


def test_the_parsed_pods_are_let_go_before_allocatable_is_asked(tmp_path):
    """A List and an Allocatable answer at the 16 MiB cap held at once took the exporter to 222-240 MB,
    196-199 MB with the parsed pods let go first. Counted by reference: when Allocatable is asked, only
    this test holds the list of pods. Mutant: `del pod_resources` dropped."""
    import sys

    server, sampler = kubelet_sampler(tmp_path, [pod("ns", "p", {"c": [(GPU, [f"{UUID}::1"])]})])
    seen, list_pods = {}, sampler.list_pods

    def listed(refused):
        seen["pods"], more = list_pods(refused)
        return seen["pods"], more

    def allocatable(problems):
        seen["references"] = sys.getrefcount(seen["pods"])  # seen's own and the call's argument
        return None

    sampler.list_pods, sampler.allocatable_devices = listed, allocatable
    try:
        sampler.tick()
        assert seen["references"] == 2 and sampler.snapshot.pods[UUID]
    finally:
        sampler.close()
        server.stop()


@pytest.mark.parametrize("text, found", [
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-"
     + "c" * 64 + ".scope\n", "c" * 64),
    ("12:memory:/kubepods/besteffort/pod1b2c/" + "d" * 64 + "\n11:cpu:/kubepods/besteffort/pod1b2c/" + "d" * 64,
     "d" * 64),
    ("0::/system.slice/sshd.service\n", None),
    ("", None),
])
def test_container_id_from_cgroup(text, found):
    assert cgroup_container_id(text) == found


def test_only_the_log_links_of_gpu_processes_containers_are_kept(tmp_path):
    """The kubelet's log folder may hold a link per container the node ever ran: only the containers GPU
    processes run in are kept. Mutant: the filter dropped (every link a dict entry each tick)."""
    from exporter.samplers.kubelet import container_links

    for name in (f"train-0_team-a_trainer-{'a' * 64}.log", f"nb_team-b_nb-{'b' * 64}.log", "garbage.log",
                 f"x_team-c_x-{'c' * 64}.log.1"):
        (tmp_path / name).symlink_to("/nonexistent")
    assert container_links(tmp_path, {"a" * 64, "c" * 64, "d" * 64}) == {"a" * 64: PodRef("team-a", "train-0", "trainer")}
    assert container_links(tmp_path, set()) == {}


# -- end to end over HTTP --------------------------------------------------------------------------
@pytest.fixture()
def node(tmp_path):
    server, args = kubernetes_node(tmp_path)
    yield server, args
    server.stop()


def pods_of(samples):
    return {(l["namespace"], l["pod"], l["container"], l["resource"]) for l, _ in samples.get("gpu_pod_info", [])}


def kubelet_success(samples):
    return {l["collector"]: v for l, v in samples["gpu_exporter_collector_success"]}.get("kubelet")


def scrape(exporter):
    started = time.monotonic()
    samples = parse_metrics(exporter.metrics())
    # never waits on the kubelet, which holds its answer up to 60 s in the slow spell below; the bound is
    # generous because a busy CI machine can take seconds to answer what an idle one answers in milliseconds
    assert time.monotonic() - started < 10.0
    return samples


def settle(exporter, predicate, what):
    return wait_for(lambda: predicate(scrape(exporter)) and scrape(exporter), 15, 0.2, what)


def test_pods_per_gpu_and_processes_per_container_over_http(node):
    server, args = node
    server.service.pods = [
        pod("team-a", "train-0", {"trainer": [(GPU, [f"{UUID}::0", f"{UUID}::1"])]}),
        pod("team-b", "notebook", {"nb": [(GPU, [f"{UUID}::2"])]}),
        pod("team-c", "ghost", {"x": [(GPU, ["GPU-00000000-not-on-this-node"])]}),
        pod("kube-system", "dns", {"dns": [("cpu", ["1"])]}),
    ]
    server.start()
    with Exporter(*args) as exporter:
        samples = settle(exporter, lambda s: pods_of(s) and s.get("gpu_compute_processes")
                         and any(l.get("pod") == "train-0" for l, _ in s["gpu_process_sm_utilization_ratio"]),
                         "pods and process owners")
        assert pods_of(samples) == {("team-a", "train-0", "trainer", GPU), ("team-b", "notebook", "nb", GPU)}
        assert samples["gpu_pods"] == [({"gpu": "0", "uuid": UUID, "model": "NVIDIA H100 80GB HBM3"}, 2.0)]
        assert kubelet_success(samples) == 0.0  # the ghost's ID is a problem worth a look
        per_owner = {(l["namespace"], l["pod"], l["container"], l["command"]): v
                     for l, v in samples["gpu_process_sm_utilization_ratio"]}
        assert per_owner == pytest.approx({("team-a", "train-0", "trainer", "python3"): 0.4,
                                           ("team-b", "notebook", "nb", "python3"): 0.4,
                                           ("", "", "", "python3"): 0.2})
        assert {l["kind"]: v for l, v in samples["gpu_compute_processes"]} == {"time_sliced": 4.0, "mps": 0.0}
        gpu = exporter.gpus()["gpus"][0]
        assert {p["pod"] for p in gpu["pods"]} == {"train-0", "notebook"}
        assert exporter.gpus()["kubelet"]["process_owners"]["419"]["pod"] == "notebook"

        # Pods come and go; two pods claiming one replica are credited to neither.
        server.service.pods = [
            pod("team-b", "notebook", {"nb": [(GPU, [f"{UUID}::2"])]}),
            pod("team-d", "dup-1", {"c": [(GPU, [f"{UUID}::5"])]}),
            pod("team-d", "dup-2", {"c": [(GPU, [f"{UUID}::5"])]}),
        ]
        samples = settle(exporter, lambda s: pods_of(s) == {("team-b", "notebook", "nb", GPU)}, "train-0 gone")
        per_owner = {(l["pod"], l["command"]): v for l, v in samples["gpu_process_sm_utilization_ratio"]}
        assert per_owner == pytest.approx({("notebook", "python3"): 0.4, ("", "python3"): 0.6})

        server.service.pods = []  # an empty List answer: no pods, and that is no failure
        samples = settle(exporter, lambda s: not pods_of(s) and kubelet_success(s) == 1.0, "empty answer")
        assert samples["gpu_pods"][0][1] == 0.0

        log = exporter.log()
        assert log.count("GPU-00000000-not-on-this-node") == 1  # one line per problem, not per tick
        assert log.count(f"'{UUID}::5' is listed for several pods (team-d/dup-1, team-d/dup-2)") == 1
        assert log.count("lists no container holding an NVIDIA device") == 1
        assert "Traceback" not in log


def test_slow_missing_garbage_and_restarting_kubelet_never_fail_a_scrape(node):
    server, args = node
    server.service.pods = [pod("team-b", "notebook", {"nb": [(GPU, [UUID])]})]
    server.start()
    with Exporter(*args) as exporter:
        settle(exporter, lambda s: pods_of(s) and kubelet_success(s) == 1.0, "pods")

        server.service.answering.clear()  # the kubelet holds every List: slower than the exporter's timeout
        samples = settle(exporter, lambda s: kubelet_success(s) == 0.0, "slow kubelet noticed")
        assert "gpu_pods" not in samples and not pods_of(samples)  # gone, never frozen
        assert samples["gpu_time_utilization_ratio"]  # the rest is served
        assert not server.service.answering.is_set()  # ... while the kubelet still holds its answers
        server.service.answering.set()
        settle(exporter, lambda s: pods_of(s) and kubelet_success(s) == 1.0, "back after the slow spell")

        server.stop()  # the kubelet goes away with its socket
        settle(exporter, lambda s: kubelet_success(s) == 0.0 and not pods_of(s), "missing socket noticed")
        garbage = GarbageServer(server.path)
        time.sleep(1.0)
        assert kubelet_success(scrape(exporter)) == 0.0 and not pods_of(scrape(exporter))
        garbage.stop()
        missing = f"no kubelet pod-resources socket at {server.path}"
        wait_for(lambda: exporter.log().count(missing) == 2, 10, 0.2, "missing again")

        server.start()  # a restarted kubelet: a new socket at the same path
        settle(exporter, lambda s: pods_of(s) and kubelet_success(s) == 1.0, "restarted kubelet found")
        status, body = http_get(exporter.url + "/healthz")
        assert status == 200, body

        log = exporter.log()
        assert log.count("DEADLINE_EXCEEDED") == 1
        # missing, then garbage, then missing again (the garbage server took its socket along)
        assert log.count(missing) == 2, log
        # The garbage spell, between the two "missing" lines: one line, whichever way gRPC words it
        # ("Failed parsing HTTP/2", or a broken pipe when the garbage server closes first).
        garbage_spell = log.split(missing)[1]
        assert garbage_spell.count("failed: UNAVAILABLE") == 1, log
        assert "Traceback" not in log and "chttp2" not in log  # gRPC's own chatter stays quiet
        errors = json.loads(http_get(exporter.url + "/api/v1/gpus")[1])["collectors"]["kubelet"]
        assert errors["success"] is True


def test_no_kubelet_socket_on_a_plain_host_means_no_pod_series():
    with Exporter("--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), "--no-mps", "--interval", "0.2",
                  "--kubelet-socket", "none") as exporter:
        samples = parse_metrics(exporter.metrics())
        assert "gpu_pods" not in samples and "gpu_pod_info" not in samples
        assert "kubelet" not in {l["collector"] for l, _ in samples["gpu_exporter_collector_success"]}


def test_pid_series_are_opt_in_and_the_limit_folds_the_rest(node):
    server, args = node
    with Exporter(*args, "--kubelet-socket", "none", "--process-series", "pid") as exporter:
        samples = wait_for(lambda: parse_metrics(exporter.metrics()).get("gpu_process_sm_utilization_ratio"), 10)
        assert {l["pid"] for l, _ in samples} == {"417", "418", "419", "420"}
    server.service.pods = [pod("team-a", "train-0", {"trainer": [(GPU, [f"{UUID}::0"])]}),
                           pod("team-b", "notebook", {"nb": [(GPU, [f"{UUID}::2"])]})]
    server.start()
    with Exporter(*args, "--process-series-limit", "1") as exporter:
        def two_groups():
            found = parse_metrics(exporter.metrics()).get("gpu_process_sm_utilization_ratio", [])
            return len(found) == 2 and found
        samples = wait_for(two_groups, 15, 0.2, "one kept, the rest folded")
        groups = {(l["pod"], l["command"]): v for l, v in samples}
        # team-a and team-b tie at 0.4: the first by name stays, notebook and the host process fold.
        assert groups == pytest.approx({("train-0", "python3"): 0.4, ("", "other"): 0.6})


@pytest.mark.parametrize("what, bound, build", [
    ("pod name", 253, lambda n: pod("ns", n, {"c": [(GPU, ["GPU-aaaa"])]})),
    ("namespace", 63, lambda n: pod(n, "p", {"c": [(GPU, ["GPU-aaaa"])]})),
    ("container name", 63, lambda n: pod("ns", "p", {n: [(GPU, ["GPU-aaaa"])]})),
    ("resource name", 317, lambda n: pod("ns", "p", {"c": [(("nvidia.com/" + n)[:len(n)], ["GPU-aaaa"])]})),
    ("claim name", 253, lambda n: claim_pod("ns", "p", {"c": [(n, [("gpu-0", None)])]})),
    ("claim namespace", 63, lambda n: pb.PodResources(namespace="ns", name="p", containers=[pb.ContainerResources(
        name="c", dynamic_resources=[pb.DynamicResource(claim_name="x", claim_namespace=n)])])),
    # a claim device's strings, decoded whole before: a DRA driver, pool or device name, a share's UID
    ("driver name", 253, lambda n: claim_pod("ns", "p", {"c": [("x", [("gpu-0", None)], n, "pool")]})),
    ("pool name", 253, lambda n: claim_pod("ns", "p", {"c": [("x", [("gpu-0", None)], "gpu.nvidia.com", n)]})),
    ("device name", 253, lambda n: claim_pod("ns", "p", {"c": [("x", [(n, None)])]})),
    ("share id", 253, lambda n: claim_pod("ns", "p", {"c": [("x", [("gpu-0", n)])]})),
])
def test_a_name_longer_than_kubernetes_allows_refuses_its_pod(what, bound, build):
    """Kubernetes bounds a pod or claim name at 253 bytes, a namespace or container name at 63, a
    resource name at 253 + 1 + 63: at the bound the pod is read, one byte more and it is refused (counted
    with why), never a label; the pods around it are read."""
    around = [pod("ns", "before", {"c": [(GPU, ["GPU-bbbb"])]}), None, pod("ns", "after", {"c": [(GPU, ["0"])]})]
    for size in (bound, bound + 1):
        around[1] = build("n" * size)
        refused: list[str] = []
        pods, _ = read_pods(pb.ListPodResourcesResponse(pod_resources=around).SerializeToString(), refused=refused)
        if size == bound:
            assert [p.name for p in pods] == ["before", "p" if what != "pod name" else "n" * size, "after"] and not refused
        else:
            assert [p.name for p in pods] == ["before", "after"] and refused == [f"a {what} of {size} bytes"]


def test_huge_names_and_device_ids_from_the_kubelet_are_refused_or_shown_short(tmp_path):
    """Over the real gRPC kubelet: one pod named with 16 MiB (every /metrics was 268 MB), then three of 4 MiB,
    are refused in one counted problem, the other pod still attributed; eleven unknown device IDs of 1.4 MB
    (a 14 MB health text served to every /api/v1/gpus) are each shown by their first bytes and size, and the
    whole text stays within MAX_HEALTH_CHARS. (Each as large as the receive cap lets it be.)"""
    from exporter.samplers.kubelet import MAX_HEALTH_CHARS, MAX_MESSAGE_BYTES

    ok = pod("ns", "ok", {"c": [(GPU, [UUID])]})
    server, sampler = kubelet_sampler(tmp_path, [ok, pod("ns", "n" * (MAX_MESSAGE_BYTES - 4096), {"c": [(GPU, [f"{UUID}::1"])]})])
    attributed = (PodRef("ns", "ok", "c", GPU),)
    try:
        sampler.tick()
        assert sampler.snapshot.pods[UUID] == attributed and not sampler.health.success
        assert sampler.health.error == f"the kubelet lists 1 pods with a name longer than Kubernetes allows (first: a " \
                                       f"pod name of {MAX_MESSAGE_BYTES - 4096} bytes): refused, what they hold is unattributed"
        # a namespace, and a container name one byte too long: the first says why
        third = MAX_MESSAGE_BYTES // 3 - 4096
        server.service.pods = [ok, *(pod("n" * third, f"p{i}", {"c" * 64: [(GPU, [f"{UUID}::1"])]}) for i in range(3))]
        sampler.tick()
        assert sampler.snapshot.pods[UUID] == attributed and sampler.health.error.startswith(
            f"the kubelet lists 3 pods with a name longer than Kubernetes allows (first: a namespace of {third} bytes)")
        huge = MAX_MESSAGE_BYTES // 11 - 4096
        server.service.pods = [ok, *(pod("ns", f"g{i}", {"c": [(GPU, [f"GPU-{i}" + "x" * (huge - 5)])]}) for i in range(11))]
        sampler.tick()
        assert sampler.snapshot.pods[UUID] == attributed and len(sampler.health.error) <= MAX_HEALTH_CHARS
        assert sampler.health.error.count(f"...({huge} bytes)' of {GPU} held by ns/g") == 10
        assert sampler.health.error.endswith("and 1 more device IDs that are no GPU here")
    finally:
        sampler.close()
        server.stop()


def test_answers_past_the_receive_cap_are_refused_before_they_are_read(tmp_path, caplog):
    """Both calls over the real gRPC kubelet at the default cap, byte for byte: a List answer of exactly
    MAX_MESSAGE_BYTES is read, one byte more is refused by gRPC from its length prefix (an answer at the
    old 16 MiB cap cost the exporter ~80 MB): the tick fails, the pods read before are withdrawn, and
    the one log line names the flag that raises the cap. An Allocatable answer past it leaves a
    replica's share unknown, as from a kubelet without the call, in one line naming the flag too."""
    import logging

    from exporter.holders import Holder
    from exporter.samplers.kubelet import ANSWER_FLAG

    MAX_MESSAGE_BYTES = 1024 * 1024  # the documented default (docs/exporter.md, 1M), not the module's figure
    listed = pb.ListPodResourcesResponse(pod_resources=[pod("ns", "p", {"c": [(GPU, [f"{UUID}::1"])]})]).SerializeToString()
    offered = pb.AllocatableResourcesResponse(devices=[pb.ContainerDevices(
        resource_name=GPU, device_ids=[f"{UUID}::{i}" for i in range(4)])]).SerializeToString()
    server, sampler = kubelet_sampler(tmp_path, [], padded_to(offered, MAX_MESSAGE_BYTES))
    share = lambda: sampler.holdings.gpus[UUID][Holder("ns", "p", "c")].share
    try:
        server.service.raw = padded_to(listed, MAX_MESSAGE_BYTES)
        sampler.tick()
        assert sampler.health.success and share() == 0.25
        server.service.allocatable = padded_to(offered, MAX_MESSAGE_BYTES + 1)
        with caplog.at_level(logging.WARNING, "exporter.samplers.kubelet"):
            sampler.tick()
            sampler.tick()
        assert sampler.health.success and share() is None and sampler.snapshot.pods[UUID]
        said = [r.getMessage() for r in caplog.records if "GetAllocatableResources failed" in r.getMessage()]
        assert len(said) == 1 and f"an answer over {MAX_MESSAGE_BYTES} bytes: raise {ANSWER_FLAG}" in said[0]
        server.service.raw = padded_to(listed, MAX_MESSAGE_BYTES + 1)
        caplog.clear()
        with caplog.at_level(logging.WARNING, "exporter.samplers.kubelet"):
            sampler.tick()
            sampler.tick()
        assert not sampler.health.success and sampler.snapshot.pods == {} and sampler.holdings.gpus == {}
        assert sampler.health.error.endswith(f"failed: RESOURCE_EXHAUSTED: an answer over {MAX_MESSAGE_BYTES} bytes: "
                                             f"raise {ANSWER_FLAG} where a device plugin lists a device per MiB of "
                                             "GPU memory (it costs ~3 times the cap at its peak)")
        assert sum(ANSWER_FLAG in r.getMessage() for r in caplog.records) == 1  # once, not per tick
        server.service.raw = padded_to(listed, MAX_MESSAGE_BYTES)
        sampler.tick()
        assert sampler.health.success and sampler.snapshot.pods[UUID]
    finally:
        sampler.close()
        server.stop()


def test_the_receive_cap_is_the_flags_from_outside(node):
    """The real exporter with --kubelet-max-answer-bytes 64K: a List answer of exactly 64 KiB is read, one
    byte more refused (pods gone from /metrics, kubelet success 0, one log line naming the flag over
    several ticks), the cap's own size read again after it."""
    server, args = node
    cap = 64 * 1024
    listed = pb.ListPodResourcesResponse(pod_resources=[pod("team-b", "notebook", {"nb": [(GPU, [UUID])]})]).SerializeToString()
    server.service.raw = padded_to(listed, cap)
    server.start()
    with Exporter(*args, "--kubelet-max-answer-bytes", "64K") as exporter:
        settle(exporter, lambda s: pods_of(s) and kubelet_success(s) == 1.0, "an answer of exactly the cap")
        server.service.raw = padded_to(listed, cap + 1)
        samples = settle(exporter, lambda s: kubelet_success(s) == 0.0, "one byte past the cap refused")
        assert not pods_of(samples) and "gpu_pods" not in samples
        calls = server.service.calls
        wait_for(lambda: server.service.calls >= calls + 3, 15, 0.1, "three more refused answers")
        assert exporter.log().count("--kubelet-max-answer-bytes") == 1
        assert f"RESOURCE_EXHAUSTED: an answer over {cap} bytes" in exporter.log()
        server.service.raw = padded_to(listed, cap)
        settle(exporter, lambda s: pods_of(s) and kubelet_success(s) == 1.0, "the cap's size read again")


def test_the_receive_caps_flag_is_refused_past_its_bounds():
    """At least 4 KiB (a smaller cap refuses every real answer), at most gRPC's int32 message length."""
    from exporter.config import parse_args

    for accepted, value in (("4096", 4096), ("4K", 4096), ("16M", 16 << 20), (str(2**31 - 1), 2**31 - 1)):
        assert parse_args(["--kubelet-max-answer-bytes", accepted]).kubelet_max_answer_bytes == value
    for refused in ("4095", str(2**31), "2G", "lots"):
        with pytest.raises(SystemExit):
            parse_args(["--kubelet-max-answer-bytes", refused])


def test_the_default_cap_holds_a_large_node_tenfold_and_costs_under_10_mb():
    """A pessimistic large node (250 pods of three containers, exclusive CPUs, 8 GPUs of 48 replicas) answers
    71 KB: the default cap holds ten times that. A List and an Allocatable answer at the cap in one tick
    cost the exporter ~5 times the cap at the peak (`python3 bench/kube_attacks.py --only both_at_cap`:
    1 MiB +5.6 MB, 2 MiB +10.6 MB): under the 10 MB a hostile kubelet may cost."""
    from exporter.samplers.kubelet import MAX_MESSAGE_BYTES

    answer = pb.ListPodResourcesResponse(pod_resources=large_node(250, node_replicas(8, 48))).SerializeToString()
    assert 10 * len(answer) <= MAX_MESSAGE_BYTES and 5 * MAX_MESSAGE_BYTES <= 10 * 1000 * 1000


def test_an_allocatable_device_id_past_its_bound_is_no_gpus_replica(tmp_path):
    """read_allocatable takes a device ID as List shows it: one of MAX_DEVICE_ID_BYTES is a replica of its
    GPU (two offered: a pod holding one holds half), one byte longer is no GPU's (kept short, never
    decoded whole): the GPU offers one replica, held whole. An entry whose resource name is longer than
    Kubernetes allows is no NVIDIA resource's: its replica is not counted."""
    from exporter.holders import Holder
    from exporter.samplers.kubelet import MAX_DEVICE_ID_BYTES, SHOWN_BYTES

    def offered(length: int) -> list:
        digits = length - len(UUID) - 2
        return [(GPU, [f"{UUID}::0", f"{UUID}::{1:0{digits}d}"])]

    server, sampler = kubelet_sampler(tmp_path, [pod("ns", "p", {"c": [(GPU, [f"{UUID}::0"])]})], offered(MAX_DEVICE_ID_BYTES))
    share = lambda: sampler.holdings.gpus[UUID][Holder("ns", "p", "c")].share
    try:
        sampler.tick()
        assert share() == 0.5
        server.service.allocatable = offered(MAX_DEVICE_ID_BYTES + 1)
        sampler.tick()
        assert share() == 1.0
        for name_bytes, replicas in ((MAX_RESOURCE_NAME_BYTES, 3), (MAX_RESOURCE_NAME_BYTES + 1, 2)):  # its entry skipped
            longest = "nvidia.com/" + "g" * (name_bytes - len("nvidia.com/"))
            server.service.allocatable = [*offered(MAX_DEVICE_ID_BYTES), (longest, [f"{UUID}::2"])]
            sampler.tick()
            assert share() == round(1 / replicas, 9)
        long = pb.AllocatableResourcesResponse(devices=[pb.ContainerDevices(resource_name=GPU, device_ids=["x" * 10**6])])
        assert read_allocatable(long.SerializeToString()) == (["x" * SHOWN_BYTES + f"...({10**6} bytes)"], False)
    finally:
        sampler.close()
        server.stop()


def test_device_ids_are_shown_whole_up_to_their_bound_and_the_health_text_is_cut_at_its_own():
    from exporter.samplers.kubelet import MAX_DEVICE_ID_BYTES, MAX_HEALTH_CHARS, SHOWN_BYTES, health_text

    ids = ["G" * MAX_DEVICE_ID_BYTES, "H" * (MAX_DEVICE_ID_BYTES + 1)]
    pods, _ = read_pods(pb.ListPodResourcesResponse(pod_resources=[pod("ns", "p", {"c": [(GPU, ids)]})]).SerializeToString())
    assert list(pods[0].containers[0].devices[0].device_ids) == [
        ids[0], "H" * SHOWN_BYTES + f"...({MAX_DEVICE_ID_BYTES + 1} bytes)"]
    exact = ["x" * (MAX_HEALTH_CHARS - 12), "y" * 10]  # joined by "; ": exactly the bound
    assert health_text(exact) == "; ".join(exact)
    longer = health_text(["x" * (MAX_HEALTH_CHARS - 12), "y" * 11])
    assert len(longer) == MAX_HEALTH_CHARS and longer.endswith(f"x... ({MAX_HEALTH_CHARS + 1} characters in all)")


# -- exporter/samplers/kubelet.py ------------------------------------------------------------------------
def test_a_mig_device_offered_as_replicas_is_not_held_whole():
    """A 3g MIG device (60 of 132 SMs) that the device plugin offers twice (`MIG-big::0`, `::1`): a pod holding
    one replica holds half of its share, and its instance's SM activity is not the pod's alone.
    Mutations: replicas ignored for MIG devices (held whole), mig_holdings without the one-replica test."""
    gpu = GpuIdentity(0, "GPU-aaaa", "H100")
    tel = DeviceTelemetry(gpu, 0.0, mig_enabled=True, mig_devices=(MigDevice("MIG-big", 1, 0, 60),), mig_sm_count=132)
    devices = DeviceMap((gpu,), {gpu.uuid: tel})
    ref = PodRef("team-a", "train-0", "trainer")
    claims = [("MIG-big::0", gpu.uuid, ref)]
    offered = Counter({"MIG-big": 2})
    assert held_shares(claims, devices, offered) == {gpu.uuid: {("team-a", "train-0", "trainer"): round(60 / 132 / 2, 9)}}
    assert mig_holdings(claims, devices, offered) == {}
    whole = [("MIG-big", gpu.uuid, ref)]  # offered once: held whole, its instance's SMs are the pod's
    assert held_shares(whole, devices, Counter({"MIG-big": 1})) == {
        gpu.uuid: {("team-a", "train-0", "trainer"): round(60 / 132, 9)}}
    assert mig_holdings(whole, devices, Counter({"MIG-big": 1})) == {gpu.uuid: {("team-a", "train-0", "trainer"): ("MIG-big",)}}
