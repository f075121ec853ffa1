"""Kubelet sampler: which pods hold each GPU (PodResources v1 `List` over the kubelet's unix socket),
and which container each GPU process runs in (its cgroup's container ID).

Device IDs the NVIDIA device plugin hands out, all mapped to the physical GPU's UUID:
  GPU-<uuid>                 a whole GPU
  GPU-<uuid>::<n>            replica n of a time-sliced or MPS-shared GPU
  MIG-<uuid>                 a MIG device (its parent from NVML's MIG device list)
  MIG-GPU-<uuid>/<gi>/<ci>   a MIG device, older plugins
  <index>, <index>::<n>, <index>:<mig>   the same with deviceIDStrategy=index
A device ID that is none of these GPUs is logged once and attributed to nobody.
Devices allocated through DRA claims (`dynamic_resources`) are resolved in exporter/samplers/dra.py,
with the API server's ResourceSlices and ResourceClaims where it can be read (exporter/kubernetes_api.py).
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from exporter.config import api_server, at_least, duration, size
from exporter.holders import MIG, REPLICAS, WHOLE, Held, Holder, HolderSampler, Holdings, weakest_basis
from exporter.samplers.cgroups import ProcFileOwners, gpu_pids
from exporter.samplers.dra import (MAX_CONTAINERS, MAX_DEVICES, MAX_PROBLEMS, NVIDIA_DRIVER, ApiView, DraDevices, attribute_claims,
                                   listed_containers, merge, named_at_most, within)
from exporter.snapshot import CollectorHealth, LogOnce

log = logging.getLogger(__name__)
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_CONTAINER_LOGS = "/var/log/containers"
RESOURCE_PREFIX = "nvidia.com/"
# The JSON API lists at most this many holders per GPU (and says how many it left out): a kubelet may
# answer 16 MB of pods, and every GET would serialise them all. /metrics folds them (--holder-series-limit).
API_PODS_PER_GPU = 256
# What gRPC receives of one answer, by default (--kubelet-max-answer-bytes). gRPC refuses a longer one
# from its length prefix, before buffering it (40 MiB over a 2 MiB cap: +1.4 MB RSS); one it takes costs
# ~3 times its size at the peak, its slices and then Python bytes (1 MiB +3.8 MB, 2 MiB +5.9 MB, 16 MiB
# +48 MB: `python3 bench/kubelet_list_memory.py --cap ...`), a List and an Allocatable answer at the cap
# in one tick ~5 times (the first one's freed memory stays resident: 2 MiB +10.6 MB, 1 MiB +5.6 MB in the
# exporter, bench/kube_attacks.py), so the default keeps a hostile kubelet under 10 MB. A large real node
# answers far less: 110 pods of three containers with exclusive CPUs and 8 GPUs of 16 time-slicing
# replicas, 29 KB; 250 such pods and 48 replicas a GPU, 71 KB (`python3 bench/kube_attacks.py --sizes`).
# A device plugin offering a device per MiB of GPU memory (volcano's vgpu-memory: 8 H20s made a 23 MB
# ListAndWatch) needs the flag raised, and pays what it costs.
MAX_MESSAGE_BYTES = 1024 * 1024
ANSWER_FLAG = "--kubelet-max-answer-bytes"
GRPC_MAX_BYTES = 2**31 - 1  # gRPC's own limit: a message length is an int32
# read_allocatable's walk: an entry per device (and NUMA node) of resource name, ID and topology, twice
# over for a device on two NUMA nodes.
ALLOCATABLE_FIELDS_PER_DEVICE = 8
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
# The kubelet's log links: <pod>_<namespace>_<container>-<container id>.log (names hold no '_').
LOG_LINK = re.compile(r"^(?P<pod>[^_]+)_(?P<namespace>[^_]+)_(?P<container>[^_]+)-(?P<id>[0-9a-f]{64})\.log$")
REPLICA = re.compile(r"^(?P<base>.+?)::\d+$")
OLD_MIG = re.compile(r"^MIG-(?P<parent>GPU-[0-9a-fA-F-]+)/\d+/\d+$")
INDEX = re.compile(r"^(?P<index>\d+)(?::\d+)?$")


@dataclass(frozen=True, order=True)
class PodRef:
    """A container holding a GPU or a share of it."""

    namespace: str
    pod: str
    container: str
    resource: str = ""


@dataclass(frozen=True)
class KubeletSnapshot:
    pods: dict[str, tuple[PodRef, ...]] = field(default_factory=dict)  # GPU UUID -> holders
    owners: dict[int, PodRef] = field(default_factory=dict)  # host pid -> container (resource "")
    error: str = ""

    def to_json(self) -> dict:
        listed = {uuid: listed_pods(refs) for uuid, refs in self.pods.items()}
        return {"error": self.error,
                "pods": {uuid: pods for uuid, (pods, _) in listed.items()},
                "pods_omitted": {uuid: omitted for uuid, (_, omitted) in listed.items() if omitted},
                "process_owners": {str(pid): ref.__dict__ for pid, ref in self.owners.items()}}


def listed_pods(refs) -> tuple[list[dict], int]:
    """The holders of one GPU as the JSON API lists them (the first API_PODS_PER_GPU), and how many it
    leaves out."""
    return [ref.__dict__ for ref in refs[:API_PODS_PER_GPU]], max(0, len(refs) - API_PODS_PER_GPU)


class DeviceMap:
    """Resolves device-plugin IDs to GPU UUIDs from what NVML knows of this node."""

    def __init__(self, gpus, telemetry):
        self.by_uuid = {g.uuid: g.uuid for g in gpus}
        self.by_index = {str(g.index): g.uuid for g in gpus}
        self.mig_share: dict[str, float | None] = {}  # MIG device UUID -> its share of the parent's SMs
        for g in gpus:
            tel = telemetry.get(g.uuid)
            for mig in getattr(tel, "mig_devices", ()) or ():
                self.by_uuid[mig.uuid] = g.uuid
                whole = getattr(tel, "mig_sm_count", None)
                self.mig_share[mig.uuid] = mig.sm_count / whole if mig.sm_count and whole else None

    def base_share(self, base_id: str) -> float | None:
        """The share of its GPU a device ID without replica suffix stands for: 1 for a whole GPU, a MIG
        device's share of the SMs, None where NVML cannot tell (MIG IDs of older plugins, index:mig)."""
        if base_id in self.mig_share:
            return self.mig_share[base_id]
        if base_id in self.by_uuid or (INDEX.match(base_id) and ":" not in base_id):
            return 1.0
        return None

    def resolve(self, device_id: str) -> str | None:
        base = replica_base(device_id)
        if base in self.by_uuid:
            return self.by_uuid[base]
        old = OLD_MIG.match(base)
        if old:
            return self.by_uuid.get(old.group("parent"))
        index = INDEX.match(base)
        if index:
            return self.by_index.get(index.group("index"))
        return None


def replica_base(device_id: str) -> str:
    replica = REPLICA.match(device_id)
    return replica.group("base") if replica else device_id


def offered_replicas(device_ids) -> Counter | None:
    """Device ID without replica suffix -> how many distinct IDs the device plugin offers for it (N of
    a time-slicing or MPS GPU with N replicas; 1 for an exclusive GPU or MIG device). None: unknown."""
    if device_ids is None:
        return None
    return Counter(replica_base(i) for i in set(device_ids))


def replicas_of(device_id: str, offered: Counter | None) -> int | None:
    """How many IDs the device plugin offers for this ID's device: 1 for an ID without replica suffix
    when the kubelet does not say; None for a replica then (N unknown)."""
    base = replica_base(device_id)
    if offered is not None:
        return offered.get(base)
    return 1 if base == device_id else None


def held_shares(claims, devices: DeviceMap, offered: Counter | None) -> dict[str, dict[tuple, float | None]]:
    """GPU UUID -> (namespace, pod, container) -> the share of the GPU its device IDs stand for: each ID
    is its device's share (1, or a MIG device's) over the replicas offered of that device."""
    held: dict[str, dict[tuple, set[str]]] = {}
    for device_id, uuid, ref in claims:
        held.setdefault(uuid, {}).setdefault((ref.namespace, ref.pod, ref.container), set()).add(device_id)
    out: dict[str, dict[tuple, float | None]] = {}
    for uuid, holders in held.items():
        for holder, ids in holders.items():
            total = 0.0
            for device_id in ids:
                share = devices.base_share(replica_base(device_id))
                replicas = replicas_of(device_id, offered)
                if share is None or not replicas:
                    total = None
                    break
                total += share / replicas
            out.setdefault(uuid, {})[holder] = None if total is None else round(min(total, 1.0), 9)
    return out


def id_basis(device_id: str, devices: DeviceMap, offered: Counter | None) -> str:
    """Why one device ID stands for its share: a whole GPU, a MIG device, or k of N replicas."""
    if replicas_of(device_id, offered) != 1:
        return REPLICAS
    return MIG if replica_base(device_id) in devices.mig_share else WHOLE


def device_plugin_holdings(claims, devices: DeviceMap, offered: Counter | None) -> dict[str, dict[Holder, Held]]:
    """GPU UUID -> container -> what its device-plugin IDs hold of the GPU."""
    shares = held_shares(claims, devices, offered)
    mig = mig_holdings(claims, devices, offered)
    bases: dict[tuple[str, tuple], set[str]] = {}
    resources: dict[tuple[str, tuple], set[str]] = {}
    for device_id, uuid, ref in claims:
        key = (uuid, (ref.namespace, ref.pod, ref.container))
        bases.setdefault(key, set()).add(id_basis(device_id, devices, offered))
        resources.setdefault(key, set()).add(ref.resource)
    return {uuid: {Holder(*key): Held(share, weakest_basis(bases[(uuid, key)]), mig.get(uuid, {}).get(key, ()),
                                      tuple(sorted(resources[(uuid, key)])))
                   for key, share in holders.items()} for uuid, holders in shares.items()}


def mig_holdings(claims, devices: DeviceMap, offered: Counter | None) -> dict[str, dict[tuple, tuple[str, ...]]]:
    """GPU UUID -> holder -> the MIG devices it holds whole (one replica offered, or an ID without
    replica suffix): those whose instance's SM activity is the holder's alone."""
    out: dict[str, dict[tuple, set[str]]] = {}
    for device_id, uuid, ref in claims:
        base = replica_base(device_id)
        if base in devices.mig_share and replicas_of(device_id, offered) == 1:
            out.setdefault(uuid, {}).setdefault((ref.namespace, ref.pod, ref.container), set()).add(base)
    return {uuid: {h: tuple(sorted(ids)) for h, ids in holders.items()} for uuid, holders in out.items()}


def attribute(pod_resources, devices: DeviceMap, claimed: list | None = None
              ) -> tuple[dict[str, tuple[PodRef, ...]], list[str]]:
    """GPU UUID -> containers holding it, and the problems found (unknown or doubly-held IDs).
    `claimed`, when given, receives the (device ID, GPU UUID, container) of every credited ID."""
    holders: dict[str, set[tuple[str, str]]] = {}  # device ID -> pods listing it
    claims: list[tuple[str, str, PodRef]] = []
    problems = []
    containers, listed = listed_containers(pod_resources)
    if listed > MAX_CONTAINERS:
        problems.append(f"the kubelet lists {listed} containers: only the first {MAX_CONTAINERS} are read")
    seen = 0
    for pod, container in containers:
        for dev in container.devices:
            if not dev.resource_name.startswith(RESOURCE_PREFIX):
                continue
            ref = PodRef(pod.namespace, pod.name, container.name, dev.resource_name)
            device_ids, seen = within(dev.device_ids, seen)
            for device_id in device_ids:
                uuid = devices.resolve(device_id)
                if uuid is None:
                    problems.append(f"device ID {device_id!r} of {dev.resource_name} held by "
                                    f"{pod.namespace}/{pod.name}/{container.name} is no GPU on this node")
                    continue
                holders.setdefault(device_id, set()).add((pod.namespace, pod.name))
                claims.append((device_id, uuid, ref))
    named_at_most(problems, "device IDs that are no GPU here")
    if seen > MAX_DEVICES:
        problems.append(f"the kubelet lists {seen} device IDs: only the first {MAX_DEVICES} are read")
    # An ID is one device: several containers of one pod may share it (the kubelet hands an init
    # container's devices on), two pods never. Then neither is credited.
    doubled = {d for d, pods in holders.items() if len(pods) > 1}
    doubts = []
    for device_id in sorted(doubled):
        names = ", ".join(f"{ns}/{name}" for ns, name in sorted(holders[device_id])[:MAX_PROBLEMS])
        doubts.append(f"device ID {device_id!r} is listed for several pods ({names}): not attributed")
    named_at_most(doubts, "device IDs listed for several pods")
    problems.extend(doubts)
    pods: dict[str, set[PodRef]] = {uuid: set() for uuid in set(devices.by_index.values())}
    for device_id, uuid, ref in claims:
        if device_id not in doubled:
            pods[uuid].add(ref)
            if claimed is not None:
                claimed.append((device_id, uuid, ref))
    return {uuid: tuple(sorted(refs)) for uuid, refs in pods.items()}, problems


# read_pods's walk: fields of any kind (pods, containers, device entries, IDs, claims and their parts,
# cpu_ids and memory entries) per container and device it reads. A real node's answer needs a few per
# item; past this budget the rest of the answer is neither read nor counted, so 16 MiB of tiny fields
# costs what the bounds cost (73,728 fields: 27 ms of CPU for one pod of 16 MiB of IDs).
LIST_FIELDS = 8 * (MAX_CONTAINERS + 2 * MAX_DEVICES)
# Kubernetes' bounds on the names a List answer gives (a pod or claim name is a DNS subdomain, a
# namespace or container name a DNS label, an extended resource name prefix/name): a longer one is no
# Kubernetes object's, and its pod is refused, never a label (one pod named with 16 MiB made every
# /metrics 268 MB).
MAX_NAME_BYTES = 253
MAX_LABEL_BYTES = 63
MAX_RESOURCE_NAME_BYTES = MAX_NAME_BYTES + 1 + MAX_LABEL_BYTES
# A device ID longer than this is no GPU's (a UUID with a replica suffix is ~50 bytes): it is kept
# shortened, as it is shown in a problem, never whole (eleven IDs of 1.4 MB made a 14 MB health text).
MAX_DEVICE_ID_BYTES = 128
SHOWN_BYTES = 64  # of a too-long device ID, what is shown
MAX_HEALTH_CHARS = 8192  # the tick's problems as one text: 22 named problems of short names fit


class Unread(IntEnum):
    """What read_pods left of a List answer (false: nothing)."""

    NOTHING = 0
    PODS = 1  # pods past its limit
    FIELDS = 2  # fields past its walk's budget: the counts are of what was walked


class Listed:
    """A repeated field as read: its first items (iterated and sliced) and how many were listed (len)."""

    __slots__ = ("items", "listed")

    def __init__(self):
        self.items, self.listed = [], 0

    def __len__(self) -> int:
        return self.listed

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, index):
        return self.items[index]


@dataclass(slots=True)
class Pod:  # PodResources, as the samplers read it
    name: str = ""
    namespace: str = ""
    containers: Listed = field(default_factory=Listed)


@dataclass(slots=True)
class Container:  # ContainerResources
    name: str = ""
    devices: list = field(default_factory=list)
    dynamic_resources: list = field(default_factory=list)


@dataclass(slots=True)
class Devices:  # ContainerDevices
    resource_name: str = ""
    device_ids: Listed = field(default_factory=Listed)


@dataclass(slots=True)
class Claim:  # DynamicResource
    claim_name: str = ""
    claim_namespace: str = ""
    claim_resources: Listed = field(default_factory=Listed)


@dataclass(slots=True)
class ClaimDevice:  # ClaimResource
    driver_name: str = ""
    pool_name: str = ""
    device_name: str = ""
    share_id: str | None = None

    def HasField(self, name: str) -> bool:
        return getattr(self, name) is not None


class _WalkSpent(Exception):
    pass


class WireWalk:
    """A kubelet answer's bytes walked on the wire, at most `fields` fields of any kind at every depth
    together: past them, _WalkSpent."""

    def __init__(self, answer: bytes, fields: int):
        self.answer, self.fields = answer, fields

    def walk(self, span):
        for number, inner in wire_fields(self.answer, *span):
            self.fields -= 1
            if self.fields < 0:
                raise _WalkSpent
            yield number, inner

    def text(self, span) -> str:
        return self.answer[span[0]:span[1]].decode()

    def shown(self, span) -> str:
        """The text of a field of any length, shortened past MAX_DEVICE_ID_BYTES to what a problem shows of it."""
        if span[1] - span[0] <= MAX_DEVICE_ID_BYTES:
            return self.text(span)
        head = self.answer[span[0]:span[0] + SHOWN_BYTES].decode("utf-8", "replace")
        return f"{head}...({span[1] - span[0]} bytes)"


class ListReader(WireWalk):
    """Builds what the samplers read of a ListPodResourcesResponse from its bytes, walked on the wire
    (never parsed whole: one pod of 16 MiB of device IDs was 72 MB of protobuf): the first MAX_CONTAINERS
    containers, of their NVIDIA device entries the first MAX_DEVICES IDs, of their claims the first
    MAX_DEVICES devices, each listed field counted; at most `fields` fields walked. A name longer
    than Kubernetes allows refuses its pod (`too_long` says which, once the pod is walked)."""

    def __init__(self, answer: bytes, fields: int):
        super().__init__(answer, fields)
        self.containers = self.device_ids = self.claim_devices = 0  # listed so far, as attribute counts them
        self.too_long = ""  # of the pod being walked: which name is too long

    def name(self, span, bound: int, what: str) -> str:
        if span[1] - span[0] > bound:
            self.too_long = self.too_long or f"a {what} of {span[1] - span[0]} bytes"
            return ""
        return self.text(span)

    # Each item joins its parent before its fields are walked; a pod is read whole or not at all (a cut
    # pod's name may be unread, or named again after the cut: protobuf keeps the last).
    def pod(self, span, pod: Pod) -> None:
        self.too_long = ""
        for number, inner in self.walk(span):
            if inner is NO_SPAN:
                continue
            if number == 1:
                pod.name = self.name(inner, MAX_NAME_BYTES, "pod name")
            elif number == 2:
                pod.namespace = self.name(inner, MAX_LABEL_BYTES, "namespace")
            elif number == 3:
                pod.containers.listed += 1
                self.containers += 1
                if self.containers <= MAX_CONTAINERS:  # the rest are counted, never walked
                    pod.containers.items.append(Container())
                    self.container(inner, pod.containers.items[-1])

    def container(self, span, container: Container) -> None:
        for number, inner in self.walk(span):
            if inner is NO_SPAN:
                continue
            if number == 1:
                container.name = self.name(inner, MAX_LABEL_BYTES, "container name")
            elif number == 2:
                self.devices(inner, container)
            elif number == 5:
                container.dynamic_resources.append(Claim())
                self.claim(inner, container.dynamic_resources[-1])

    def devices(self, span, container: Container) -> None:
        """An entry of NVIDIA devices (another resource's is left out), its IDs read while the answer's
        first MAX_DEVICES last. The resource name may come after the IDs: spans are kept until it is known."""
        devices, kept = Devices(), []
        room = max(0, MAX_DEVICES - self.device_ids)
        for number, inner in self.walk(span):
            if inner is NO_SPAN:
                continue
            if number == 1:  # the last one counts, as in protobuf
                devices.resource_name = self.name(inner, MAX_RESOURCE_NAME_BYTES, "resource name")
            elif number == 2:
                devices.device_ids.listed += 1
                if len(kept) < room:
                    kept.append(inner)
        if devices.resource_name.startswith(RESOURCE_PREFIX):
            self.device_ids += devices.device_ids.listed
            devices.device_ids.items = [self.shown(ids) for ids in kept]
            container.devices.append(devices)

    def claim(self, span, claim: Claim) -> None:
        for number, inner in self.walk(span):
            if inner is NO_SPAN:
                continue
            if number == 2:
                claim.claim_name = self.name(inner, MAX_NAME_BYTES, "claim name")
            elif number == 3:
                claim.claim_namespace = self.name(inner, MAX_LABEL_BYTES, "claim namespace")
            elif number == 4:
                claim.claim_resources.listed += 1
                self.claim_devices += 1
                if self.claim_devices <= MAX_DEVICES:
                    claim.claim_resources.items.append(ClaimDevice())
                    self.claim_device(inner, claim.claim_resources[-1])

    def claim_device(self, span, device: ClaimDevice) -> None:
        for number, inner in self.walk(span):
            if inner is not NO_SPAN and number in CLAIM_DEVICE_FIELDS:
                what = CLAIM_DEVICE_FIELDS[number]  # a driver, pool or device name, a share's UID: none is longer
                setattr(device, what, self.name(inner, MAX_NAME_BYTES, what.replace("_", " ")))


CLAIM_DEVICE_FIELDS = {2: "driver_name", 3: "pool_name", 4: "device_name", 5: "share_id"}  # 1: CDI devices, unread


def read_pods(answer: bytes, limit: int = MAX_CONTAINERS, fields: int = LIST_FIELDS,
              refused: list[str] | None = None) -> tuple[list[Pod], Unread]:
    """The first `limit` pods of a ListPodResourcesResponse's bytes, walked on the wire (ListReader),
    and what it left unread (a pod holds a container at least: no more pods are read past `limit`).
    More than `limit` fields that are no pod (the answer has no other field) is no List answer; past
    `fields` fields of any kind walked, the walk stops with the pods it read whole (the one it was in
    is unknown). A pod with a name longer than Kubernetes allows is left out; `refused`, when given,
    receives why, one entry per pod."""
    reader = ListReader(answer, fields)
    pods, others = [], 0
    try:
        for number, span in reader.walk((0, len(answer))):
            if number != 1 or span is NO_SPAN:
                others += 1
                if others > limit:
                    raise ValueError(f"more than {limit} fields that are no pod")
                continue
            if len(pods) == limit:
                return pods, Unread.PODS
            pod = Pod()
            reader.pod(span, pod)
            if not reader.too_long:
                pods.append(pod)
            elif refused is not None:
                refused.append(reader.too_long)
    except _WalkSpent:
        return pods, Unread.FIELDS
    return pods, Unread.NOTHING


def read_allocatable(answer: bytes, limit: int = MAX_DEVICES) -> tuple[list[str], bool]:
    """The distinct device IDs of NVIDIA resources in an AllocatableResourcesResponse's bytes, the first
    `limit`, and whether it lists more. Walked on the wire, never parsed whole: 16 MiB of IDs would be
    millions of Python strings. The walk also stops after ALLOCATABLE_FIELDS_PER_DEVICE * `limit` fields
    of any kind (the kubelet sends an entry of 3 fields per device and NUMA node), so an answer costs
    what `limit` devices cost, whatever its size; an entry listing more than `limit` IDs (duplicates
    too) lists more. An ID longer than MAX_DEVICE_ID_BYTES is no GPU's: it is kept as List shows it
    (WireWalk.shown), never decoded whole nor counted as a GPU's replica; an entry whose resource name is
    longer than Kubernetes allows is no NVIDIA resource's."""
    ids: dict[str, None] = {}  # an ordered set: a device on two NUMA nodes is listed twice
    reader = WireWalk(answer, ALLOCATABLE_FIELDS_PER_DEVICE * limit)
    try:
        for number, span in reader.walk((0, len(answer))):
            if number != 1 or span is NO_SPAN:  # cpu_ids, memory: not read
                continue
            resource, listed, cut = "", [], False
            for inner, field in reader.walk(span):
                if inner == 1 and field is not NO_SPAN:  # resource_name: the last one counts, as in protobuf
                    too_long = field[1] - field[0] > MAX_RESOURCE_NAME_BYTES  # no resource's: its IDs are skipped
                    resource = "" if too_long else reader.text(field)
                elif inner == 2 and field is not NO_SPAN:  # device_ids, kept until the name is known
                    cut = cut or len(listed) == limit  # at most `limit` spans, not one per ID walked (4 MB)
                    if not cut:
                        listed.append(field)
            if not resource.startswith(RESOURCE_PREFIX):
                continue
            for field in listed:
                device_id = reader.shown(field)  # as List shows it: one too long is no GPU's, never decoded
                if device_id not in ids and len(ids) == limit:
                    return list(ids), True
                ids[device_id] = None
            if cut:  # an entry listing more than `limit` IDs lists more than are read
                return list(ids), True
    except _WalkSpent:
        return list(ids), True
    return list(ids), False


NO_SPAN = (None, None)


def wire_fields(data: bytes, at: int, end: int):
    """(field number, (start, end) of its bytes) of each field of the protobuf message in data[at:end]:
    NO_SPAN for a varint field (an unknown one, or an unpacked integer). Any other wire type, a field
    running past the end (a varint too: one that starts inside a sub-message and ends in its parent's
    bytes is no field of either) or an over-long varint is a ValueError (IndexError at the data's end),
    raised before the field is handed on."""
    while at < end:
        tag, at = _varint(data, at)
        if tag & 7 == 0:
            _, at = _varint(data, at)
            span = NO_SPAN
        elif tag & 7 == 2:
            size, at = _varint(data, at)
            span, at = (at, at + size), at + size
        else:
            raise ValueError(f"wire type {tag & 7} at byte {at}")
        if at > end:
            raise ValueError("a field runs past the end")
        yield tag >> 3, span


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7
    raise ValueError("a varint of more than 10 bytes")


def container_links(folder: Path, ids: set[str]) -> dict[str, PodRef]:
    """Container ID -> (namespace, pod, container) of the containers `ids` (those GPU processes run in),
    from the names of the kubelet's log links: a folder of 10^5 links is walked, never kept. Only
    names are read: no log is ever opened."""
    out = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            match = LOG_LINK.match(entry.name) if entry.name[-68:-4] in ids else None
            if match:
                out[match.group("id")] = PodRef(match.group("namespace"), match.group("pod"), match.group("container"))
    return out


def cgroup_container_id(text: str) -> str | None:
    """The container ID a /proc/PID/cgroup names (cri-containerd-<id>.scope, crio-<id>, docker-<id>,
    or cgroupfs's .../<id>); None for a process outside any container."""
    found = CONTAINER_ID.findall(text)
    return found[-1] if found else None


def health_text(problems: list[str]) -> str:
    """The tick's problems in one text of at most MAX_HEALTH_CHARS, served to every reader of /api/v1/gpus:
    each item is named short already, but their number times their names is not."""
    text = "; ".join(problems)
    if len(text) <= MAX_HEALTH_CHARS:
        return text
    said = f"... ({len(text)} characters in all)"
    return text[:MAX_HEALTH_CHARS - len(said)] + said


class KubeletSampler(HolderSampler):
    name = "kubelet"

    def __init__(self, socket_path: str, nvml, proc_root="/proc", container_logs: str | None = DEFAULT_CONTAINER_LOGS,
                 interval: float = 5.0, timeout: float = 2.0, api=None, max_answer_bytes: int = MAX_MESSAGE_BYTES):
        self.socket_path = socket_path
        self.max_answer_bytes = max_answer_bytes
        self.api = api  # exporter.kubernetes_api.KubernetesApi, or None (--kubernetes-api off, or no cluster)
        self._api_view = ApiView()
        self.nvml = nvml
        self.container_logs = Path(container_logs) if container_logs else None
        self.interval = interval
        self.timeout = timeout
        self.snapshot = KubeletSnapshot()
        self.holdings = Holdings()
        self.health = CollectorHealth(False, 0.0, "not sampled yet")
        self._channel = None
        self._list = None
        self._containers = ProcFileOwners(proc_root, cgroup_container_id)
        self._log = LogOnce(log)

    # -- the PodResources API -------------------------------------------------------------------
    def _connect(self):
        if self._list is None:
            grpc = import_grpc()
            from exporter.kubelet import podresources_pb2

            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}", options=[
                ("grpc.max_receive_message_length", self.max_answer_bytes)])
            self._list = self._channel.unary_unary(  # the answer's bytes: read_pods walks them
                "/v1.PodResourcesLister/List",
                request_serializer=podresources_pb2.ListPodResourcesRequest.SerializeToString)
            self._request = podresources_pb2.ListPodResourcesRequest()
            self._allocatable = self._channel.unary_unary(  # the answer's bytes: read_allocatable walks them
                "/v1.PodResourcesLister/GetAllocatableResources",
                request_serializer=podresources_pb2.AllocatableResourcesRequest.SerializeToString)
            self._allocatable_request = podresources_pb2.AllocatableResourcesRequest()
        return self._list

    def _disconnect(self) -> None:
        # A kubelet restart makes a new socket: a fresh channel finds it at once, where the old one
        # would back off for up to minutes.
        if self._channel is not None:
            self._channel.close()
        self._channel = self._list = None

    def close(self) -> None:
        self._disconnect()

    def more_health(self) -> dict:
        return {} if self.api is None else {self.api.name: self.api.health}

    def _claims(self, pod_resources, problems: list[str]):
        """The DRA claim holders of this List answer, with what the API server knows of their devices."""
        gpus, telemetry = self.nvml.gpus, self.nvml.telemetry
        found = attribute_claims(pod_resources, DraDevices(gpus, telemetry, self._api_view))
        if self.api is not None and (found.devices or found.shared):
            view = self.api.view(found.devices, found.shared)
            if view != self._api_view:  # news from the API server: resolve again with it
                self._api_view = view
                found = attribute_claims(pod_resources, DraDevices(gpus, telemetry, view))
        if found.other_drivers:
            self._log.problem("kubelet dra drivers", f"DRA devices of {', '.join(sorted(found.other_drivers))} are "
                              f"no GPUs of {NVIDIA_DRIVER}: ignored", logging.INFO)
        else:
            self._log.clear("kubelet dra drivers", f"only {NVIDIA_DRIVER} devices listed again")
        problems.extend(found.problems)
        return found

    def over_cap(self) -> str:
        return (f"an answer over {self.max_answer_bytes} bytes: raise {ANSWER_FLAG} where a device plugin lists "
                "a device per MiB of GPU memory (it costs ~3 times the cap at its peak)")

    def list_pods(self, refused: list[str] | None = None) -> tuple[list[Pod], Unread]:
        """The pods of a List answer that are read, and whether it lists more (read_pods, `refused` too)."""
        grpc = import_grpc()
        try:
            answer = self._connect()(self._request, timeout=self.timeout)
        except grpc.RpcError as exc:
            self._disconnect()
            code = exc.code().name if hasattr(exc, "code") and exc.code() else "error"
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            if not os.path.exists(self.socket_path):
                raise KubeletError(f"no kubelet pod-resources socket at {self.socket_path}: mount "
                                   "/var/lib/kubelet/pod-resources, or pass --kubelet-socket none", "missing") from None
            if code == "RESOURCE_EXHAUSTED":  # gRPC's words name its option, not our flag
                detail = self.over_cap()
            raise KubeletError(f"PodResources List on {self.socket_path} failed: {code}: {detail}", code) from None
        try:
            return read_pods(answer, refused=refused)
        except (ValueError, IndexError) as exc:  # UnicodeDecodeError is a ValueError
            raise KubeletError(f"PodResources List on {self.socket_path}: not a List answer ({exc})", "garbled") from None

    def allocatable_devices(self, problems: list[str]) -> list[str] | None:
        """The NVIDIA device IDs the kubelet can hand out (GetAllocatableResources, GA since Kubernetes
        1.28), or None when it does not answer, answers garbage or lists more than MAX_DEVICES: then
        replica shares are unknown, whole GPUs still exact. A garbled or cut answer is one of the tick's
        `problems`."""
        grpc = import_grpc()
        try:
            answer = self._allocatable(self._allocatable_request, timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") and exc.code() else "error"
            why = (self.over_cap() if code == "RESOURCE_EXHAUSTED" else
                   "KubeletPodResourcesGetAllocatable gate off, or a kubelet older than 1.23")
            self._log.problem("kubelet allocatable", f"GetAllocatableResources failed ({code}): the share of a "
                              f"time-slicing or MPS replica is unknown ({why})", kind=code)
            return None
        self._log.clear("kubelet allocatable", "GetAllocatableResources answers again")
        try:
            ids, more = read_allocatable(answer)
        except Exception as exc:  # noqa: BLE001 - whatever a garbled answer makes go wrong is the tick's problem
            problems.append(f"GetAllocatableResources on {self.socket_path}: not an Allocatable answer "
                            f"({type(exc).__name__}: {str(exc)[:200]}): the share of a replica is unknown")
            return None
        if more:  # a GPU's replicas may be partly read (in any order): counting them would overstate shares
            problems.append(f"GetAllocatableResources lists more than {MAX_DEVICES} device IDs: it is read no "
                            "further, and how many replicas a GPU offers is unknown (so is a replica's share)")
            return None
        return ids

    # -- processes ------------------------------------------------------------------------------
    def _owners(self, listed: set[tuple[str, str, str]], problems: list[str]) -> dict[int, PodRef]:
        pids = gpu_pids(self.nvml.telemetry)
        if not pids or self.container_logs is None:
            self._containers.lookup(set())
            return {}
        containers = self._containers.lookup(pids)
        try:
            links = container_links(self.container_logs, {c for c in containers.values() if c})
        except OSError as exc:
            problems.append(f"cannot list {self.container_logs} (processes keep their command label): {exc}")
            return {}
        owners = {}
        for pid, container_id in containers.items():
            ref = links.get(container_id or "")
            if ref is not None and (ref.namespace, ref.pod, ref.container) in listed:
                owners[pid] = ref
        return owners

    # -- one tick -------------------------------------------------------------------------------
    def tick(self) -> None:
        started = time.perf_counter()
        refused: list[str] = []
        try:
            pod_resources, more = self.list_pods(refused)
        except KubeletError as exc:
            self._log.problem("kubelet", str(exc), kind=exc.kind)  # details vary from call to call
            # Gone, not frozen: pods that may have left are never shown as still there.
            self.snapshot = KubeletSnapshot(error=str(exc))
            self.holdings = Holdings(error=str(exc))
            self.health = CollectorHealth(False, time.perf_counter() - started, str(exc))
            return
        self._log.clear("kubelet")
        gpus = self.nvml.gpus
        if not gpus:
            why = "NVML knows no GPU on this node: nothing to attribute pods to"
            self._log.problem("kubelet", why)
            self.snapshot = KubeletSnapshot(error=why)
            self.holdings = Holdings(error=why)
            self.health = CollectorHealth(False, time.perf_counter() - started, why)
            return
        devices = DeviceMap(gpus, self.nvml.telemetry)
        claims: list = []
        pods, problems = attribute(pod_resources, devices, claims)
        if more == Unread.PODS:
            problems.append(f"the kubelet lists more than {len(pod_resources)} pods: only those are read")
        elif more == Unread.FIELDS:  # first: the counts of the lines after it are of what was walked
            problems.insert(0, f"the kubelet's List answer is walked no further than its first {LIST_FIELDS} "
                               f"fields ({len(pod_resources)} pods read whole): the pod it stopped in and what it lists "
                               "after it are neither read nor counted")
        if refused:
            problems.append(f"the kubelet lists {len(refused)} pods with a name longer than Kubernetes allows (first: "
                            f"{refused[0]}): refused, what they hold is unattributed")
        found = self._claims(pod_resources, problems)
        read = len(pod_resources)
        # The pods read (a few MB at most: ListReader) go before the Allocatable answer comes: both
        # answers at the cap are not held at once.
        del pod_resources
        offered = offered_replicas(self.allocatable_devices(problems))
        # every GPU of the node, those no container holds too: known to be held by none
        held = {uuid: {} for uuid in pods} | merge(device_plugin_holdings(claims, devices, offered), found)
        for uuid, owners in found.pods.items():
            pods[uuid] = tuple(sorted({*pods.get(uuid, ()), *(PodRef(*o, NVIDIA_DRIVER) for o in owners)}))
        if not any(pods.values()):
            self._log.problem("kubelet pods", f"the kubelet lists no container holding an NVIDIA device or claim "
                                              f"({read} pods listed)", logging.INFO)
        else:
            self._log.clear("kubelet pods", "containers holding NVIDIA devices or claims listed again")
        listed = {(r.namespace, r.pod, r.container) for refs in pods.values() for r in refs}
        owners = self._owners(listed, problems)
        said = health_text(problems)
        if problems:  # one line whenever the set of problems changes, not one per tick
            self._log.problem("kubelet attribution", said)
        else:
            self._log.clear("kubelet attribution")
        self.snapshot = KubeletSnapshot(pods=pods, owners=owners)
        self.holdings = Holdings(gpus=held, owners={pid: Holder(r.namespace, r.pod, r.container)
                                                    for pid, r in owners.items()})
        self.health = CollectorHealth(not problems, time.perf_counter() - started, said)


SCHEDULER = True  # exporter/holders.py KINDS
LABELS = {"namespace": "the Kubernetes namespace of a container holder", "pod": "its pod",  # label -> meaning
          "container": "the container", "claim": "the DRA ResourceClaim the container holds the GPU through"}
HELD_THROUGH = ("claim",)  # a DRA claim: held by its container, whose cgroup names the processes
GROUPS = {"namespace": ("namespace",), "pod": ("namespace", "pod"), "claim": ("claim",)}  # report --by (not container)
# the workloads dashboard's tables of GPU-hours: grouping -> (its groups called, where they come from, why none)
PANELS = {"namespace": ("Namespaces", "", "no pod held a GPU in the range: outside Kubernetes (no kubelet PodResources "
                                          "socket) no pod is known."),
          "pod": ("Pods", "Each pod's own numbers, from its own processes: never its GPU's total.",
                  "no pod held a GPU in the range (outside Kubernetes no pod is known).")}


def add_arguments(parser) -> None:
    g = parser.add_argument_group("kubelet")
    g.add_argument("--kubelet-socket", default=None,
                   help="the kubelet's PodResources socket, for the pods holding each GPU; 'none' to switch off "
                        "(default: /var/lib/kubelet/pod-resources/kubelet.sock when it exists at start)")
    g.add_argument("--kubelet-interval", type=duration, default=5.0, help="time between two PodResources List calls")
    g.add_argument("--kubelet-container-logs", default="/var/log/containers",
                   help="the kubelet's container log links, whose names map a process's container ID to its pod "
                        "(only names are read); 'none' to label processes by command only")
    g.add_argument(ANSWER_FLAG, type=at_least(size, 4096, "a size", GRPC_MAX_BYTES), default=MAX_MESSAGE_BYTES,
                   help="the largest List or GetAllocatableResources answer read from the kubelet; a larger one is "
                        "refused before it is received (List: no pods attributed, one log line). Raise it for a "
                        "device plugin that lists a device per MiB of GPU memory: an answer costs ~3 times its size")
    g.add_argument("--kubernetes-api", type=api_server, default="auto",
                   help="the API server, for DRA claims on shared GPUs (consumed capacity) and device UUIDs: auto "
                        "(in a pod, through its service account), off, or a URL (e.g. kubectl proxy's "
                        "http://127.0.0.1:8001); needs get and list on resourceclaims and resourceslices")


def build(args, nvml, explicit: bool = False):
    """The kubelet sampler, or None. Without --kubelet-socket it runs where the default socket exists
    (a Kubernetes node) or where --holders names kubelet; a socket named explicitly is watched even
    while it is missing."""
    socket = args.kubelet_socket
    if socket is None:
        if not explicit and not os.path.exists(DEFAULT_SOCKET):
            return None
        socket = DEFAULT_SOCKET
    if socket.lower() == "none":
        return None
    logs = None if args.kubelet_container_logs.lower() == "none" else args.kubelet_container_logs
    log.info("pod attribution from the kubelet at %s", socket)
    from exporter import kubernetes_api

    return KubeletSampler(socket, nvml, proc_root=args.proc_root, container_logs=logs,
                          interval=args.kubelet_interval, timeout=min(2.0, args.kubelet_interval),
                          api=kubernetes_api.build(args), max_answer_bytes=args.kubelet_max_answer_bytes)


class KubeletError(Exception):
    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def import_grpc():
    """grpc, imported only when pod attribution is on: every other host would pay its memory."""
    # gRPC's C core logs each GOAWAY of a restarting kubelet to stderr: we log once ourselves.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    import grpc

    return grpc
