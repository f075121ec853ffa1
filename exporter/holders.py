"""Holders: who holds each GPU (or a share of it), behind one interface for every kind.

A kind of holder (device-plugin containers and DRA claims from the kubelet, Slurm jobs, Unix users)
is one sampler module. It runs in its own thread (`tick` every `interval` seconds) and publishes,
after each tick, `holdings`: per GPU the holders and the share each holds, and per host pid the
holder owning the process. exporter/workloads.py joins the holdings of every kind without knowing
where they came from; the engine takes one list of these samplers.

A new kind is one new module, named in KINDS, with `add_arguments(parser)` (its flags, in an
argument group named after it) and `build(args, nvml, explicit)` (its sampler, or None).
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field

from exporter.sampler import SamplerDefaults
from exporter.snapshot import CollectorHealth
from exporter.vocabulary import CAPACITY, EVEN_SPLIT, HELD_SHARE_BASES, MIG, REPLICAS, WHOLE  # noqa: F401


def weakest_basis(bases) -> str:
    """The least exact of several bases (a holder holding parts of one GPU on different grounds)."""
    return max(bases, key=HELD_SHARE_BASES.index, default=WHOLE)


@dataclass(frozen=True, order=True)
class Holder:
    """A Kubernetes container (with the DRA claim it holds the GPU through, if any), a Slurm job or a
    Unix user; the labels that do not apply are empty."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    hpc_job: str = ""
    claim: str = ""
    user: str = ""

    LABELS = ("namespace", "pod", "container", "hpc_job", "claim", "user")

    def labels(self) -> list[str]:
        return [self.namespace, self.pod, self.container, self.hpc_job, self.claim, self.user]

    def to_json(self) -> dict:
        return dict(zip(self.LABELS, self.labels()))

    def owner(self) -> "Holder":
        """Who runs the holder's processes: a claim is held by its container, whose cgroup the pids name."""
        return dataclasses.replace(self, claim="") if self.claim else self


API_HOLDERS_PER_GPU = 256  # holders of one GPU the JSON API lists per kind; /metrics folds the rest likewise
# The holders beyond --holder-series-limit on one GPU, folded into one (a real pod always has a namespace).
OTHER = Holder(pod="other")


@dataclass(frozen=True)
class Held:
    """What one holder holds of one GPU."""

    share: float | None  # GPU-equivalents; None: the scheduler's share cannot be known (the sampler logs why)
    basis: str = WHOLE  # one of HELD_SHARE_BASES
    mig: tuple[str, ...] = ()  # MIG devices (UUIDs) it holds whole: their instances' SM activity is its own


@dataclass(frozen=True)
class Holdings:
    """One tick of one holder sampler. On failure it is empty with `error` set: never frozen."""

    gpus: dict[str, dict[Holder, Held]] = field(default_factory=dict)  # GPU UUID -> holder -> held
    owners: dict[int, Holder] = field(default_factory=dict)  # host pid -> the holder running it (Holder.owner())
    error: str = ""

    def to_json(self) -> dict:
        """/api/v1/gpus `holders`: what one kind holds, the first API_HOLDERS_PER_GPU holders of each GPU."""
        gpus, omitted = {}, {}
        for uuid, held in self.gpus.items():
            ranked = sorted(held.items())
            gpus[uuid] = [{**holder.to_json(), "held_share": h.share, "held_share_basis": h.basis, "mig": list(h.mig)}
                          for holder, h in ranked[:API_HOLDERS_PER_GPU]]
            if len(ranked) > API_HOLDERS_PER_GPU:
                omitted[uuid] = len(ranked) - API_HOLDERS_PER_GPU
        return {"error": self.error, "gpus": gpus, "omitted": omitted,
                "process_owners": {str(pid): holder.to_json() for pid, holder in sorted(self.owners.items())}}


class HolderSampler(SamplerDefaults):
    """The interface every holder sampler implements (and inherits its defaults from): an
    exporter.sampler.Sampler whose loop starts after NVML's first tick (it maps processes to NVML's
    GPUs), with `holdings`: Holdings of the last tick; `snapshot`: what /api/v1/gpus shows of this kind
    under its name (None: nothing).
    """

    name = ""
    interval = 5.0
    after_nvml = True
    health = CollectorHealth(False, 0.0, "not sampled yet")
    holdings = Holdings()

    def tick(self) -> None:
        raise NotImplementedError


# Kind -> its module: add_arguments(parser), build(args, nvml, explicit) -> its sampler or None (not
# configured), and SCHEDULER (True: a scheduler's allocations; under --holders auto the kinds that are no
# scheduler, Unix users, hold GPUs only where no scheduler is configured). Order: the first kinds'
# process owners win where two kinds claim one pid.
KINDS = {"kubelet": "exporter.samplers.kubelet", "slurm": "exporter.samplers.slurm",
         "users": "exporter.samplers.users"}


def add_arguments(parser) -> None:
    for module in KINDS.values():
        importlib.import_module(module).add_arguments(parser)


def build_holders(args, nvml) -> list:
    """The holder samplers the flags ask for: --holders auto (the schedulers configured on this host,
    Unix users where there is none), a list of kinds, or none."""
    wanted = args.holders
    if wanted == ("none",):
        return []
    auto = wanted == ("auto",)
    samplers = []
    for kind, path in KINDS.items():
        module = importlib.import_module(path)
        if not auto and kind not in wanted:
            continue
        if auto and not module.SCHEDULER and samplers:
            continue
        sampler = module.build(args, nvml, explicit=not auto)
        if sampler is not None:
            samplers.append(sampler)
    return samplers


def join_owners(holdings) -> dict[int, Holder]:
    """pid -> holder over every kind; the first kind listing a pid keeps it."""
    owners: dict[int, Holder] = {}
    for h in holdings:
        if not h.error:
            for pid, holder in h.owners.items():
                owners.setdefault(pid, holder)
    return owners


def join_gpu(uuid: str, holdings) -> dict[Holder, Held]:
    out: dict[Holder, Held] = {}
    for h in holdings:
        if not h.error:
            out.update(h.gpus.get(uuid, {}))
    return out
