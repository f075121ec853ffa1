"""DRA claims as holders: the GPUs (or shares of them) a container holds through Kubernetes Dynamic
Resource Allocation, from PodResources v1 `ContainerResources.dynamic_resources`.

Each allocated device is listed as (driver_name, pool_name, device_name, share_id). Only NVIDIA's GPU
driver is understood (NVIDIA_DRIVER); the names it gives devices are in NvidiaDeviceNames, the one
place that knows them. A device name resolves to a GPU (and a MIG device) through the `uuid`
attribute of the driver's ResourceSlice where the API server can be read, else through the name.

Held share of one allocation: 1 for a whole GPU, a MIG device's share of the parent's SMs, and for a
device allocated several times (consumable capacity: one share_id per allocation; or one claim
several pods reference) its consumed capacity over the device's capacity where the API server gives
both (basis capacity), else an even split among the device's allocations (basis even_split). An
allocation several containers of a pod list is split evenly among them.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from exporter.holders import CAPACITY, EVEN_SPLIT, MIG, WHOLE, Held, Holder, weakest_basis

NVIDIA_DRIVER = "gpu.nvidia.com"
MAX_DEVICE_NAME = 128  # DRA device names are DNS labels (63): longer is no device name
# What one PodResources List answer may cost, whatever the kubelet lists: every container read is a
# holder each update weighs (10,000 made scrapes wait 418 ms), every device a step of each tick.
MAX_CONTAINERS = 1024  # containers read per List answer; a node runs a few hundred pods
MAX_DEVICES = 4096  # device-plugin IDs and claim devices read per List answer; a node has a few dozen
MAX_PROBLEMS = 10  # named in the log line; the rest are counted
CAPACITY_NAMES = ("shares", "memory")  # the capacities a shared device is split by, in this order


class NvidiaDeviceNames:
    """How kubernetes-sigs/dra-driver-nvidia-gpu (formerly NVIDIA/k8s-dra-driver-gpu) names devices in
    its ResourceSlices, which is what PodResources lists. Checked against its source
    (cmd/gpu-kubelet-plugin/deviceinfo.go, mig.go) at tags v25.3.0, v25.3.2, v25.8.0, v25.8.1, v25.12.0,
    v0.4.0, v0.4.1 and main of 2026-08-07 (95932046):
      whole GPU:  gpu-<minor>                                       every version (minor: /dev/nvidia<minor>)
      MIG device: gpu-<minor>-mig-<giProfileId>-<placementStart>-<placementSize>        v25.3.0 .. v25.8.1
                  gpu-<minor>-mig-<profile name, dots removed>-<giProfileId>-<placementStart>   v25.12.0 on
      (the driver's own parser ignores the profile name: so does this one)
    gpu-vfio-<index> (passthrough to a VM) is not visible to NVML and resolves to nothing."""

    WHOLE = re.compile(r"^gpu-(\d{1,6})$")
    MIG_V25_3 = re.compile(r"^gpu-(\d{1,6})-mig-(\d{1,6})-(\d{1,6})-(\d{1,6})$")
    MIG_V25_12 = re.compile(r"^gpu-(\d{1,6})-mig-([a-z0-9-]+)-(\d{1,6})-(\d{1,6})$")

    @classmethod
    def parse(cls, name: str) -> tuple[int, tuple[int, int, int | None] | None] | None:
        """(parent minor, (GI profile ID, placement start, placement size or None) for a MIG device or
        None for a whole GPU); None: not a name this driver gives a GPU."""
        if len(name) > MAX_DEVICE_NAME:
            return None
        if m := cls.WHOLE.match(name):
            return int(m.group(1)), None
        if m := cls.MIG_V25_3.match(name):  # before the newer form: its digits would match that too
            return int(m.group(1)), (int(m.group(2)), int(m.group(3)), int(m.group(4)))
        if m := cls.MIG_V25_12.match(name):
            return int(m.group(1)), (int(m.group(3)), int(m.group(4)), None)
        return None


@dataclass(frozen=True)
class ApiView:
    """What the API server said (exporter/kubernetes_api.py); empty where it is off or unreadable."""

    uuids: dict[tuple[str, str], str] = field(default_factory=dict)  # (pool, device) -> uuid attribute
    capacity: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # (pool, device) -> capacity
    # (namespace, claim, pool, device, share_id) -> consumed capacity of that allocation
    consumed: dict[tuple[str, str, str, str, str], dict[str, float]] = field(default_factory=dict)


class DraDevices:
    """Resolves NVIDIA DRA device names to (GPU UUID, MIG device UUID or None) on this node."""

    def __init__(self, gpus, telemetry, api: ApiView):
        self.api = api
        self.by_minor = {g.minor: g.uuid for g in gpus if g.minor is not None}
        self.gpu_uuids = {g.uuid for g in gpus}
        self.mig_parent: dict[str, str] = {}
        self.mig_share: dict[str, float | None] = {}
        self.mig_by_placement: dict[tuple[str, int, int], tuple[str, int | None]] = {}
        for g in gpus:
            tel = telemetry.get(g.uuid)
            whole = getattr(tel, "mig_sm_count", None)
            for mig in getattr(tel, "mig_devices", ()) or ():
                self.mig_parent[mig.uuid] = g.uuid
                self.mig_share[mig.uuid] = mig.sm_count / whole if mig.sm_count and whole else None
                if mig.profile_id is not None and mig.placement_start is not None:
                    self.mig_by_placement[(g.uuid, mig.profile_id, mig.placement_start)] = (mig.uuid, mig.placement_size)

    def resolve(self, pool: str, name: str) -> tuple[str, str | None] | str:
        """(GPU UUID, MIG UUID or None), or why the device is none of this node's GPUs."""
        uuid = self.api.uuids.get((pool, name))
        if uuid is not None:  # the driver's own word: its ResourceSlice's uuid attribute
            if uuid in self.gpu_uuids:
                return uuid, None
            if uuid in self.mig_parent:
                return self.mig_parent[uuid], uuid
            return f"its uuid attribute {uuid[:60]!r} is no GPU on this node"
        parsed = NvidiaDeviceNames.parse(name)
        if parsed is None:
            return "not a device name of the NVIDIA DRA driver (gpu-<minor> or gpu-<minor>-mig-...)"
        minor, mig = parsed
        parent = self.by_minor.get(minor)
        if parent is None:
            return f"no GPU with minor number {minor} on this node"
        if mig is None:
            return parent, None
        profile, start, size = mig
        found = self.mig_by_placement.get((parent, profile, start))
        if found is None or (size is not None and found[1] not in (None, size)):
            return f"no MIG device of profile {profile} at placement {start} on GPU {parent}"
        return parent, found[0]

    def device_share(self, gpu: str, mig: str | None) -> float | None:
        return 1.0 if mig is None else self.mig_share.get(mig)


def listed_containers(pod_resources) -> tuple[list, int]:
    """The (pod, container) pairs of a List answer that are read (the first MAX_CONTAINERS), and how
    many containers it lists."""
    listed = sum(len(pod.containers) for pod in pod_resources)
    read = itertools.islice(((pod, c) for pod in pod_resources for c in pod.containers), MAX_CONTAINERS)
    return list(read), listed


def named_at_most(problems: list[str], what: str) -> None:
    """MAX_PROBLEMS named, the rest counted: the log line stays short whatever the kubelet lists."""
    if len(problems) > MAX_PROBLEMS:
        problems[MAX_PROBLEMS:] = [f"and {len(problems) - MAX_PROBLEMS} more {what}"]


def within(items, read: int) -> tuple[list, int]:
    """Of a repeated field, the part that fits in MAX_DEVICES once `read` were read, and the new count."""
    return list(items[:max(0, MAX_DEVICES - read)]), read + len(items)


@dataclass
class _Allocation:
    containers: set = field(default_factory=set)  # (namespace, pod, container)


def capacity_ratio(capacity: dict[str, float] | None, consumed: dict[str, float] | None) -> float | None:
    """Consumed over the device's capacity: `shares` where the device offers them, else `memory`
    where some was consumed; None where neither can be told."""
    if not capacity or not consumed:
        return None
    for name in CAPACITY_NAMES:
        if capacity.get(name) and consumed.get(name):
            return min(consumed[name] / capacity[name], 1.0)
    return None


@dataclass
class ClaimAttribution:
    held: dict[str, dict[tuple[str, str, str], tuple[float | None, str, tuple[str, ...], str]]]
    pods: dict[str, set[tuple[str, str, str]]]  # GPU UUID -> containers holding it through claims
    problems: list[str]
    other_drivers: set[str]
    shared: set[tuple[str, str, str, str, str]]  # (namespace, claim, pool, device, share_id) of shared devices
    devices: set[tuple[str, str]]  # (pool, device) listed


def attribute_claims(pod_resources, devices: DraDevices) -> ClaimAttribution:
    """GPU UUID -> container -> (share, basis, MIG devices held whole, claim names) from the
    dynamic_resources of a PodResources List answer."""
    per_device: dict[tuple[str, str], dict[tuple[str, str, str], _Allocation]] = {}
    where: dict[tuple[str, str], tuple[str, str | None]] = {}
    problems, other, seen = [], set(), 0
    for pod, container in listed_containers(pod_resources)[0]:
        for claim in container.dynamic_resources:
            resources, seen = within(claim.claim_resources, seen)
            for res in resources:
                if res.driver_name != NVIDIA_DRIVER:
                    other.add(res.driver_name[:64])
                    continue
                key = (res.pool_name, res.device_name)
                if key not in where:
                    found = devices.resolve(*key)
                    if isinstance(found, str):
                        problems.append(f"DRA device {res.device_name[:80]!r} (pool {res.pool_name[:60]!r}) of "
                                        f"claim {claim.claim_namespace}/{claim.claim_name} held by "
                                        f"{pod.namespace}/{pod.name}/{container.name}: {found}")
                        where[key] = None
                        continue
                    where[key] = found
                if where[key] is None:
                    continue
                share_id = res.share_id if res.HasField("share_id") else ""
                alloc = per_device.setdefault(key, {}).setdefault(
                    (claim.claim_namespace, claim.claim_name, share_id), _Allocation())
                alloc.containers.add((pod.namespace, pod.name, container.name))
    named_at_most(problems, "DRA devices that are no GPU here")
    if seen > MAX_DEVICES:
        problems.append(f"the kubelet lists {seen} DRA devices: only the first {MAX_DEVICES} are read")
    held: dict[str, dict[tuple, list]] = {}
    shared: set[tuple[str, str, str, str, str]] = set()
    for key, allocations in per_device.items():
        gpu, mig = where[key]
        whole = devices.device_share(gpu, mig)
        single = len(allocations) == 1 and not next(iter(allocations))[2]
        ratios = {}
        if not single:
            shared.update((ns, name, *key, share) for ns, name, share in allocations)
            capacity = devices.api.capacity.get(key)
            ratios = {a: capacity_ratio(capacity, devices.api.consumed.get((a[0], a[1], *key, a[2])))
                      for a in allocations}
        by_capacity = bool(ratios) and all(r is not None for r in ratios.values())
        for alloc_key, alloc in allocations.items():
            if single:
                share, basis = whole, (WHOLE if mig is None else MIG)
            elif by_capacity:
                share, basis = (None if whole is None else whole * ratios[alloc_key]), CAPACITY
            else:
                share, basis = (None if whole is None else whole / len(allocations)), EVEN_SPLIT
            if len(alloc.containers) > 1:  # one pod's containers list one allocation: split evenly
                share, basis = (None if share is None else share / len(alloc.containers)), EVEN_SPLIT
            alone = single and len(alloc.containers) == 1 and mig is not None
            for owner in alloc.containers:
                entry = held.setdefault(gpu, {}).setdefault(owner, [0.0, set(), set(), set()])
                entry[0] = None if entry[0] is None or share is None else entry[0] + share
                entry[1].add(basis)
                if alone:
                    entry[2].add(mig)
                entry[3].add(alloc_key[1])
    out = {gpu: {owner: (None if e[0] is None else round(min(e[0], 1.0), 9), weakest_basis(e[1]),
                         tuple(sorted(e[2])), ",".join(sorted(e[3])))
                 for owner, e in owners.items()} for gpu, owners in held.items()}
    pods = {gpu: set(owners) for gpu, owners in out.items()}
    return ClaimAttribution(out, pods, problems, other, shared, set(per_device) | set(where))


def merge(device_plugin: dict[str, dict[Holder, Held]], claims: ClaimAttribution) -> dict[str, dict[Holder, Held]]:
    """Device-plugin holders and claim holders of every GPU: a container holding one GPU both ways is
    one holder (its processes are one set), labelled with its claims."""
    out = {uuid: dict(holders) for uuid, holders in device_plugin.items()}
    for uuid, owners in claims.held.items():
        gpu = out.setdefault(uuid, {})
        for (namespace, pod, container), (share, basis, mig, names) in owners.items():
            plain = Holder(namespace, pod, container)
            before = gpu.pop(plain, None)
            resources = (NVIDIA_DRIVER,)
            if before is not None:
                share = None if share is None or before.share is None else round(min(share + before.share, 1.0), 9)
                basis, mig = weakest_basis((basis, before.basis)), tuple(sorted({*mig, *before.mig}))
                resources = tuple(sorted({*resources, *before.resources}))
            gpu[Holder(namespace, pod, container, claim=names)] = Held(share, basis, mig, resources)
    return out
