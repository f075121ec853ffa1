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

import importlib
from dataclasses import dataclass, field

from exporter.sampler import SamplerDefaults
from exporter.snapshot import CollectorHealth
from exporter.vocabulary import CAPACITY, EVEN_SPLIT, HELD_SHARE_BASES, MIG, REPLICAS, WHOLE, check  # noqa: F401 - re-exported


def weakest_basis(bases) -> str:
    """The least exact of several bases (a holder holding parts of one GPU on different grounds)."""
    return max(bases, key=HELD_SHARE_BASES.index, default=WHOLE)


class Holder:
    """Who holds a GPU or a share of it: a Kubernetes container (with the DRA claim it holds the GPU
    through, if any), a Slurm job, a Unix user, or any kind registered in KINDS. Its labels are the ones
    the registered kinds declare (labels()); those that do not apply are empty. `Holder("ns", "pod",
    "c")` fills the labels in their registered order. A label no kind declares is refused here, where the
    holder is built, not published as a new series."""

    __slots__ = ("_values", "_map", "_order", "_key", "_owner")

    def __init__(self, *values: str, **named: str):
        order = labels()
        if values:
            if len(values) > len(order):
                raise TypeError(f"Holder takes at most {len(order)} labels by position ({', '.join(order)})")
            named = {**dict(zip(order, values)), **named}
        unknown = named.keys() - _declarations()[4]
        if unknown:
            raise ValueError(f"no holder kind declares the label(s) {', '.join(sorted(unknown))}; declared: "
                             f"{', '.join(order)} (a kind's LABELS, exporter/holders.py KINDS)")
        self._set({label: str(value) for label, value in named.items() if value})

    def _set(self, values: dict) -> None:
        object.__setattr__(self, "_values", tuple(sorted(values.items())))
        object.__setattr__(self, "_map", dict(self._values))
        object.__setattr__(self, "_order", None)  # the registry's labels its sort key and owner were made for
        object.__setattr__(self, "_key", ())
        object.__setattr__(self, "_owner", None)

    @classmethod
    def _unchecked(cls, **values: str) -> "Holder":
        """A holder of labels known without the registry (OTHER, built while the kinds are imported)."""
        holder = cls.__new__(cls)
        holder._set(values)
        return holder

    def __getattr__(self, name: str) -> str:
        if name.startswith("_") or name not in labels():
            raise AttributeError(name)
        return self._map.get(name, "")

    def __setattr__(self, name, value):
        raise AttributeError("a Holder is immutable")

    def __eq__(self, other) -> bool:
        return isinstance(other, Holder) and self._values == other._values

    def __hash__(self) -> int:
        return hash(self._values)

    def _sort_key(self) -> tuple:
        """Its values in the registered label order (the order holders are listed in)."""
        self._made_for_registry()
        return self._key

    def _made_for_registry(self) -> None:
        """Its sort key and owner for the registry now (made once: the join compares owners per process)."""
        order = labels()
        if self._order is not order:
            through = held_through_labels()
            object.__setattr__(self, "_key", tuple(self._map.get(label, "") for label in order))
            object.__setattr__(self, "_owner", self if not through & self._map.keys() else Holder._unchecked(
                **{label: value for label, value in self._values if label not in through}))
            object.__setattr__(self, "_order", order)

    def __lt__(self, other: "Holder") -> bool:
        return self._sort_key() < other._sort_key()

    def __le__(self, other: "Holder") -> bool:
        return self._sort_key() <= other._sort_key()

    def __gt__(self, other: "Holder") -> bool:
        return self._sort_key() > other._sort_key()

    def __ge__(self, other: "Holder") -> bool:
        return self._sort_key() >= other._sort_key()

    def __repr__(self) -> str:
        return f"Holder({', '.join(f'{k}={v!r}' for k, v in self._values)})"

    def __reduce__(self):
        return (_rebuild, (self._values,))

    def labels(self) -> list[str]:
        """Its value of every registered label, in their order (empty where it does not apply)."""
        return list(self._sort_key())

    def values_of(self, names) -> tuple[str, ...]:
        """Its values of `names` (empty where it has none)."""
        return tuple(self._map.get(name, "") for name in names)

    def to_json(self) -> dict:
        return dict(zip(labels(), self.labels()))

    def owner(self) -> "Holder":
        """Who runs the holder's processes: a claim is held by its container, whose cgroup the pids name
        (the labels a kind declares HELD_THROUGH name what the GPU is held through, not who runs)."""
        self._made_for_registry()
        return self._owner


def _rebuild(values) -> Holder:
    return Holder._unchecked(**dict(values))


API_HOLDERS_PER_GPU = 256  # holders of one GPU the JSON API lists per kind; /metrics folds the rest likewise
# The holders beyond --holder-series-limit on one GPU, folded into one (a real pod always has a namespace).
OTHER = Holder._unchecked(pod="other")


@dataclass(frozen=True)
class Held:
    """What one holder holds of one GPU."""

    share: float | None  # GPU-equivalents; None: the scheduler's share cannot be known (the sampler logs why)
    basis: str = WHOLE  # one of HELD_SHARE_BASES
    mig: tuple[str, ...] = ()  # MIG devices (UUIDs) it holds whole: their instances' SM activity is its own
    # what the scheduler handed the share out as (the kubelet's device-plugin resource names, a DRA driver),
    # sorted; gpu_pod_info's `resource`
    resources: tuple[str, ...] = ()

    def __post_init__(self):
        check(self.basis, HELD_SHARE_BASES, "held-share basis")


@dataclass(frozen=True)
class Holdings:
    """One tick of one holder sampler. On failure it is empty with `error` set: never frozen."""

    # GPU UUID -> holder -> held; a GPU the kind looked at and found no holder of may map to {} (it is known
    # to hold none: gpu_pods 0)
    gpus: dict[str, dict[Holder, Held]] = field(default_factory=dict)
    owners: dict[int, Holder] = field(default_factory=dict)  # host pid -> the holder running it (Holder.owner())
    error: str = ""

    def to_json(self) -> dict:
        """/api/v1/gpus `holders`: what one kind holds, the first API_HOLDERS_PER_GPU holders of each GPU."""
        gpus, omitted = {}, {}
        for uuid, held in self.gpus.items():
            if not held:
                continue
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


# Kind -> its module, which declares
# - LABELS: the labels its holders set, label -> what it names (kinds may share one: an LSF job is an
#   hpc_job too; the first kind's meaning is published), and HELD_THROUGH (optional): those of them that
#   name what the GPU is held through rather than who runs the processes (a DRA claim): the process
#   series' owners go without them (Holder.owner());
#   and GROUPS (optional): what `gpu-spatial report --by` groups by, name -> labels (a pod needs its
#   namespace), where not every label is a grouping alone (the default);
# - SCHEDULER: True for a scheduler's allocations; under --holders auto the kinds that are no scheduler
#   (Unix users) hold GPUs only where no scheduler is configured;
# - add_arguments(parser) and build(args, nvml, explicit) -> its sampler or None (not configured).
# Every view (the metric families, the JSON API and its schema, the process series' owners, the report,
# top, the rules' checks) takes the labels from here. Order: the first kinds' process owners win where
# two kinds claim one pid, and their labels come first.
KINDS = {"kubelet": "exporter.samplers.kubelet", "slurm": "exporter.samplers.slurm",
         "users": "exporter.samplers.users"}
_declared: list = [None, None]  # [a copy of KINDS, (labels, label -> meaning, held-through, groups, label set)]


def _declarations() -> tuple:
    if _declared[0] != KINDS:  # first use, or a kind registered since (cheap: read per holder compared)
        meaning, through, groups = {}, set(), {}
        for module in map(importlib.import_module, KINDS.values()):
            for label, what in module.LABELS.items():
                meaning.setdefault(label, what)
            through.update(getattr(module, "HELD_THROUGH", ()))
            for name, grouped in getattr(module, "GROUPS", {label: (label,) for label in module.LABELS}).items():
                groups.setdefault(name, tuple(grouped))
        # one registry at a time: the label tuple's identity marks what holders made for it (sort key, owner)
        _declared[:] = [dict(KINDS), (tuple(meaning), meaning, frozenset(through), groups, frozenset(meaning))]
    return _declared[1]


@dataclass(frozen=True)
class KindViews:
    """How the views name one kind's holders, from its declarations (the generated rules and dashboards, top)."""

    kind: str
    own: tuple[str, ...]  # its labels that name who runs the processes
    through: tuple[str, ...]  # its labels that name what the GPU is held through (HELD_THROUGH: a DRA claim)
    named: tuple[str, ...]  # of its own labels, those a grouping ends in, general first (a pod's namespace, its pod)
    noun: str  # one holder in a sentence (the GPUHeldIdle alert): HOLDER_NOUN, else its one own label
    panels: dict  # the workloads dashboard's tables: grouping -> (what its groups are called, where they come from,
    # why there may be none) (PANELS; none by default)


def kind_views() -> list[KindViews]:
    """Every registered kind's KindViews, in KINDS' order."""
    through = held_through_labels()
    out = []
    for kind, module in zip(KINDS, map(importlib.import_module, KINDS.values())):
        own = tuple(label for label in module.LABELS if label not in through)
        groups = getattr(module, "GROUPS", {label: (label,) for label in own})
        out.append(KindViews(kind, own, tuple(label for label in module.LABELS if label in through),
                             tuple(grouped[-1] for grouped in groups.values() if grouped[-1] in own),
                             getattr(module, "HOLDER_NOUN", own[0] if len(own) == 1 else kind),
                             dict(getattr(module, "PANELS", {}))))
    return out


def holder_name(values) -> str:
    """A holder's short name for a terminal (gpu-spatial top), from its labels (`values`: label -> value,
    as the API serves them; another exporter's): the first kind with a label set names it, by the value
    of its most specific grouping (a pod, not its namespace; the label too where the kind has only one:
    "user alice"), then what it holds the GPU through ("(claim gpu-0)"). "" where no label is set."""
    for kind in kind_views():
        found = [label for label in reversed(kind.named) if _text(values.get(label))]
        held = [f"({label} {_text(values.get(label))})" for label in kind.through if _text(values.get(label))]
        if found or held:
            name = "" if not found else _text(values[found[0]]) if len(kind.own) > 1 else f"{found[0]} {values[found[0]]}"
            return " ".join([name, *held]).strip()
    return ""


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def report_groups() -> dict[str, tuple[str, ...]]:
    """What holders are grouped by in `gpu-spatial report --by`: name -> the labels of a group."""
    return dict(_declarations()[3])


def labels() -> tuple[str, ...]:
    """Every holder label the registered kinds declare, in KINDS' order."""
    return _declarations()[0]


def label_meanings() -> dict[str, str]:
    """Label -> what it names (the API schema's descriptions)."""
    return dict(_declarations()[1])


def held_through_labels() -> frozenset:
    return _declarations()[2]


def owner_labels() -> tuple[str, ...]:
    """The labels of a process's owner (Holder.owner()): the holder labels less those held through."""
    through = held_through_labels()
    return tuple(label for label in labels() if label not in through)


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


def kinds_declaring(label: str) -> set[str]:
    """The registered kinds whose holders may set `label` (a holder sampler's name is its kind's key)."""
    return {kind for kind, module in KINDS.items() if label in importlib.import_module(module).LABELS}


def join_gpu(uuid: str, holdings) -> dict[Holder, Held]:
    out: dict[Holder, Held] = {}
    for h in holdings:
        if not h.error:
            out.update(h.gpus.get(uuid, {}))
    return out
