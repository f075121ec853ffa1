"""GPU collector: time utilization next to spatial utilization, from the latest snapshot only."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exporter.chain import time_utilization_source
from exporter.holders import join_gpu, kinds_declaring, owner_labels
from exporter.nvml import CLOCK_EVENT_REASONS
from exporter.snapshot import SPATIAL_FIELDS
from exporter.vocabulary import PUBLISHED_STATES, WORKLOAD_PROCESS_KINDS
from nsys_ingest.verdicts import SHARING_MODES, VERDICTS

GPU_LABELS = ["gpu", "uuid", "model"]

SPATIAL_HELP = {
    "sm_active": "Share of SMs with at least one warp resident, averaged over the window (DCGM SM_ACTIVE, GPM SM_UTIL, nsys SMs Active).",
    "sm_occupancy": "Resident warps over the SM maximum (DCGM SM_OCCUPANCY, GPM SM_OCCUPANCY, nsys Compute Warps in Flight).",
    "graphics_engine_active": "Share of time the graphics/compute engine was busy (DCGM GR_ENGINE_ACTIVE, GPM "
                              "GRAPHICS_UTIL, nsys GR Active).",
    "tensor_active": "Share of cycles the tensor pipes were busy (DCGM PIPE_TENSOR_ACTIVE, GPM ANY_TENSOR_UTIL, nsys Tensor Active).",
    "dram_active": "Share of peak DRAM bandwidth used (DCGM DRAM_ACTIVE, GPM DRAM_BW_UTIL, nsys DRAM read + write).",
}

TELEMETRY = (
    ("memory_used_bytes", "gpu_memory_used_bytes", "Device memory in use (NVML)."),
    ("memory_total_bytes", "gpu_memory_total_bytes", "Device memory in total (NVML)."),
    ("power_watts", "gpu_power_watts", "Power draw (NVML)."),
    ("sm_clock_hertz", "gpu_sm_clock_hertz", "SM clock (NVML)."),
    ("temperature_celsius", "gpu_temperature_celsius", "GPU temperature (NVML)."),
    ("memory_free_bytes", "gpu_memory_free_bytes", "Device memory free (NVML)."),
    ("memory_reserved_bytes", "gpu_memory_reserved_bytes",
     "Device memory the driver reserves, counted in gpu_memory_used_bytes (NVML memory info v2)."),
    ("memory_clock_hertz", "gpu_memory_clock_hertz", "Memory clock (NVML)."),
)
# GpuHealth gauges: (attribute, family, help). Counters and labelled families are in HealthFamilies.
HEALTH_GAUGES = (
    ("sm_clock_max_hertz", "gpu_sm_clock_max_hertz", "Maximum SM clock (NVML max clock info)."),
    ("memory_clock_max_hertz", "gpu_memory_clock_max_hertz", "Maximum memory clock (NVML max clock info)."),
    ("memory_temperature_celsius", "gpu_memory_temperature_celsius", "Memory (HBM) temperature (NVML field 82)."),
    ("encoder_utilization", "gpu_encoder_utilization_ratio", "Share of time the video encoder was busy (NVML)."),
    ("decoder_utilization", "gpu_decoder_utilization_ratio", "Share of time the video decoder was busy (NVML)."),
    ("row_remap_pending", "gpu_row_remap_pending", "1 while remapped rows wait for a GPU reset to take effect (NVML)."),
    ("row_remap_failure", "gpu_row_remap_failure", "1 once a row remapping has failed: the GPU needs service (NVML)."),
)


OTHER = "other"


def process_groups(processes, owners, limit: int, holding=None) -> list[tuple[list[str], float, float]]:
    """Per-process utilization summed per owner (container, Slurm job or user: `owners`, the snapshot's
    one owners map) and command: a label set lives as long as its owner, not the pid. An owner that
    holds no share of this GPU (`holding`: the owners that do; None: every one) is not named. The
    `limit` largest by SM time stay; the rest are summed into command="other" so a node running
    thousands of short processes keeps a bounded series count."""
    groups: dict[tuple, list[float]] = {}
    names = owner_labels()
    no_owner = ("",) * len(names)
    for proc in processes:
        owner = owners.get(proc.pid)
        if holding is not None and owner not in holding:
            owner = None
        key = (*(owner.values_of(names) if owner else no_owner), proc.command)
        sums = groups.setdefault(key, [0.0, 0.0])
        sums[0] += proc.sm
        sums[1] += proc.memory
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    kept, rest = ranked[:limit], ranked[limit:]
    out = [(list(key), round(min(sm, 1.0), 6), round(min(mem, 1.0), 6)) for key, (sm, mem) in kept]
    if rest:
        out.append(([*no_owner, OTHER], round(min(sum(v[0] for _, v in rest), 1.0), 6),
                    round(min(sum(v[1] for _, v in rest), 1.0), 6)))
    return out


POD_LABELS = ("namespace", "pod", "container")  # gpu_pod_info's, with `resource`


def pod_refs(held) -> list[tuple[str, str, str, str]]:
    """gpu_pod_info's series of one GPU from its joined holders (`held`: holder -> Held, every kind's): each
    container (a holder with a pod), once per resource it holds the GPU through; a DRA claim's container is
    the series, not its claim."""
    return sorted({(*holder.values_of(POD_LABELS), resource) for holder, h in held.items()
                   if holder.values_of(("pod",))[0] for resource in h.resources or ("",)})


def bounded_pods(refs, published: set, limit: int | None) -> tuple[list, int]:
    """At most `limit` of a GPU's containers: those published as holders first, then by name; and how
    many more there are (one gpu_pod_info series pod="other" with that count)."""
    if limit is None or len(refs) <= limit:
        return list(refs), 0
    ranked = sorted(refs, key=lambda r: (r[:3] not in published, r))
    return ranked[:limit], len(ranked) - limit


def gpu_labels(view) -> list[str]:
    ident = view.identity
    return [str(ident.index), ident.uuid, ident.model]


def _gauge(name, documentation, extra_labels=()):
    return GaugeMetricFamily(name, documentation, labels=GPU_LABELS + list(extra_labels))


def _one_hot(family, labels, values, current) -> None:
    """A state set: every possible value with 1 for the current one, so a change starts no series;
    nothing at all when the current value is unknown."""
    if current is not None:
        for value in values:
            family.add_metric(labels + [value], 1.0 if value == current else 0.0)


class HealthFamilies:
    """What dcgm-exporter's default set shows beyond utilization (docs/metrics.md, GPU: health)."""

    def __init__(self):
        self.gauges = {attr: _gauge(name, doc) for attr, name, doc in HEALTH_GAUGES}
        self.driver = _gauge("gpu_driver_info", "1, labelled with the NVIDIA driver version (NVML).", ["driver_version"])
        self.reasons = _gauge("gpu_clock_event_reason_active", "1 for each reason NVML gives now for clocks below "
                              "their maximum (nvmlDeviceGetCurrentClocksEventReasons), 0 for the others.", ["reason"])
        self.energy = _counter("gpu_energy_joules", "Energy the GPU used since the driver loaded (NVML, mJ / 1000).")
        self.throttle = _counter("gpu_clock_throttle_seconds", "Time the clocks were held down, by reason "
                                 "(nvmlDeviceGetViolationStatus, ns / 1e9).", ["reason"])
        self.replays = _counter("gpu_pcie_replays", "PCIe replays (retries) since the driver loaded (NVML).")
        self.ecc = _counter("gpu_ecc_errors", "ECC errors: error corrected or uncorrected, scope volatile (since the "
                            "driver loaded) or aggregate (the GPU's life) (NVML).", ["error", "scope"])
        self.rows = _counter("gpu_remapped_rows", "Memory rows remapped, by the error that caused it (NVML).", ["error"])
        self.lost = _gauge("gpu_lost", "1 while the GPU does not answer NVML (GPU_IS_LOST: fell off the bus), 0 while "
                           "it does; a GPU lost before the exporter started is named by its PCI bus id or index "
                           "(uuid unknown-pci-..., model unknown).")
        self.xid = _counter("gpu_xid_errors", "XID events since the exporter started, by XID (NVML event set).", ["xid"])
        self.last_xid = _gauge("gpu_xid_last_code", "The last XID this GPU reported since the exporter started (NVML).")
        self.pcie = _gauge("gpu_pcie_throughput_bytes_per_second", "PCIe throughput: GPM over its window, or "
                           "NVML's 20 ms sample.", ["direction", "source"])
        self.nvlink = _gauge("gpu_nvlink_throughput_bytes_per_second", "NVLink throughput over all links: GPM over "
                             "its window, or NVML's byte counters between two reads.", ["direction", "source"])

    def add(self, labels, view) -> None:
        tel = view.telemetry
        if tel is None:
            return
        self.lost.add_metric(labels, 1.0 if tel.lost else 0.0)
        for xid, count in tel.xid_counts:  # kept for a lost GPU: XID 79 says why it was lost
            self.xid.add_metric(labels + [str(xid)], count)
        if tel.last_xid is not None:
            self.last_xid.add_metric(labels, tel.last_xid)
        health = tel.health
        if tel.lost or health is None:
            return
        for attr, family in self.gauges.items():
            value = getattr(health, attr)
            if value is not None:
                family.add_metric(labels, float(value))
        if health.driver_version:
            self.driver.add_metric(labels + [health.driver_version], 1.0)
        if health.clock_event_reasons is not None:
            for reason, bit in CLOCK_EVENT_REASONS.items():
                self.reasons.add_metric(labels + [reason], 1.0 if health.clock_event_reasons & bit else 0.0)
        if health.energy_joules is not None:
            self.energy.add_metric(labels, health.energy_joules)
        for reason, seconds in health.throttle_seconds:
            self.throttle.add_metric(labels + [reason], seconds)
        if health.pcie_replays is not None:
            self.replays.add_metric(labels, health.pcie_replays)
        for error, scope, count in health.ecc_errors:
            self.ecc.add_metric(labels + [error, scope], count)
        for error, rows in health.remapped_rows:
            self.rows.add_metric(labels + [error], rows)
        links = view.links
        if links is not None:
            for family, prefix in ((self.pcie, "pcie"), (self.nvlink, "nvlink")):
                for direction in ("tx", "rx"):
                    value = getattr(links, f"{prefix}_{direction}")
                    if value is not None:
                        family.add_metric(labels + [direction, links.source], value)

    def families(self):
        yield from self.gauges.values()
        yield from (self.driver, self.reasons, self.energy, self.throttle, self.replays, self.ecc, self.rows,
                    self.lost, self.xid, self.last_xid, self.pcie, self.nvlink)


def _counter(name, documentation, extra_labels=()):
    return CounterMetricFamily(name, documentation, labels=GPU_LABELS + list(extra_labels))


def _flat(families: dict):
    for family in families.values():
        yield from family.families() if isinstance(family, HealthFamilies) else (family,)


class GpuCollector:
    def __init__(self, engine):
        self._engine = engine

    def describe(self):
        """What collect() yields (empty), so the registry refuses a family name registered twice."""
        return list(_flat(self._families()))

    def _families(self) -> dict:
        """Every family collect() yields, empty, in the order it yields them."""
        mode, _ = self._engine.process_series
        process_labels = ["pid", "command"] if mode == "pid" else [*owner_labels(), "command"]
        f = {
            "time_util": _gauge("gpu_time_utilization_ratio", "Share of time at least one kernel ran (NVML "
                                "utilization.gpu, or GPM GRAPHICS_UTIL over the same tick where GPM serves the GPU)."),
            "time_source": _gauge("gpu_time_utilization_source_info", "1 for where gpu_time_utilization_ratio comes "
                                  "from: nvml (utilization samples), gpm (GRAPHICS_UTIL), or a spatial source's own "
                                  "busy time (nsys GR Active: a GPU only an export knows).", ["source"]),
            "memory_util": _gauge("gpu_memory_time_utilization_ratio",
                                  "Share of time device memory was read or written (NVML utilization.memory)."),
        }
        f.update({f"spatial {field}": _gauge(f"gpu_{field}_ratio", SPATIAL_HELP[field], ["source"])
                  for field in SPATIAL_FIELDS})
        f["hidden"] = _gauge("gpu_hidden_idle_sm_ratio", "max(0, time utilization - SM active) over the same window: "
                             "SM capacity that 100% hides.", ["source"])
        f["stamp"] = _gauge("gpu_spatial_sample_timestamp_seconds",
                            "Wall time of the end of the window the spatial values describe.", ["source"])
        f["state"] = _gauge("gpu_spatial_source_state",
                            "1 for the current state of each candidate spatial source (reason: /api/v1/gpus).",
                            ["source", "state"])
        f.update({f"telemetry {attr}": _gauge(name, doc) for attr, name, doc in TELEMETRY})
        f["health"] = HealthFamilies()
        f["proc_sm"] = _gauge("gpu_process_sm_utilization_ratio", "Per-process share of time the process had a "
                              "kernel running (NVML process utilization).", process_labels)
        f["proc_mem"] = _gauge("gpu_process_memory_utilization_ratio",
                               "Per-process share of time the process read or wrote device memory (NVML).",
                               process_labels)
        f["compute"] = _gauge("gpu_compute_processes", "Processes with a compute context on the GPU, by kind: mps "
                              "(MPS clients) or time_sliced (own context); the MPS server is not counted (NVML).",
                              ["kind"])
        f["sharing"] = _gauge("gpu_sharing_mode", "1 for how the GPU is shared now: exclusive, time_sliced (two or "
                              "more contexts take turns), mps, mig or idle (from NVML's process lists and MIG mode).",
                              ["mode"])
        f["diagnosis"] = _gauge("gpu_diagnosis", "1 for the verdict the live rules reach on this GPU (evidence and "
                                "advice: /api/v1/gpus; rules: nsys_ingest/verdicts.py).", ["verdict"])
        f["pod_info"] = _gauge("gpu_pod_info", "1 per container holding the GPU or a share of it (kubelet "
                               "PodResources: device plugins' resources, DRA claims' driver); join on uuid. Beyond "
                               "--holder-series-limit, pod=\"other\" counts the rest.",
                               [*POD_LABELS, "resource"])
        f["pod_count"] = _gauge("gpu_pods", "Pods holding the GPU or a share of it (kubelet PodResources).")
        return f

    def collect(self):
        snapshot = self._engine.snapshot
        gpus = snapshot.gpus
        mode, limit = self._engine.process_series
        holder_limit = getattr(getattr(self._engine, "workloads", None), "series_limit", None)  # None: no holders
        published: dict[str, set] = {}
        for w in snapshot.workloads:
            published.setdefault(w.gpu.uuid, set()).add(w.holder.values_of(POD_LABELS))
        # the GPUs a kind whose holders are pods answered for (held by none included): the others have no gpu_pods
        pod_kinds = kinds_declaring("pod")
        pods_known = {uuid for name, h in snapshot.holdings.items() if name in pod_kinds and not h.error
                      for uuid in h.gpus}
        f = self._families()
        time_util, time_source, memory_util = f["time_util"], f["time_source"], f["memory_util"]
        spatial = {field: f[f"spatial {field}"] for field in SPATIAL_FIELDS}
        telemetry = {attr: f[f"telemetry {attr}"] for attr, _, _ in TELEMETRY}
        hidden, stamp, state, health = f["hidden"], f["stamp"], f["state"], f["health"]
        proc_sm, proc_mem, compute, sharing, diagnosis = (f["proc_sm"], f["proc_mem"], f["compute"], f["sharing"],
                                                          f["diagnosis"])
        pod_info, pod_count = f["pod_info"], f["pod_count"]
        for view in gpus:
            labels = gpu_labels(view)
            held = join_gpu(view.identity.uuid, snapshot.holdings.values())  # every kind's holders of it, once
            if view.time_utilization is not None:
                time_util.add_metric(labels, view.time_utilization)
                time_source.add_metric(labels + [time_utilization_source(view)], 1.0)
            if view.memory_time_utilization is not None:
                memory_util.add_metric(labels, view.memory_time_utilization)
            tel = view.telemetry
            if tel is not None and not tel.lost:
                for attr, family in telemetry.items():
                    value = getattr(tel, attr)
                    if value is not None:
                        family.add_metric(labels, value)
                if mode == "pid":
                    for proc in tel.processes:
                        proc_sm.add_metric(labels + [str(proc.pid), proc.command], proc.sm)
                        proc_mem.add_metric(labels + [str(proc.pid), proc.command], proc.memory)
                elif mode == "container":
                    holding = {h.owner() for h in held}
                    for group, sm, mem in process_groups(tel.processes, snapshot.owners, limit, holding):
                        proc_sm.add_metric(labels + group, sm)
                        proc_mem.add_metric(labels + group, mem)
                if tel.compute_processes is not None:
                    for kind in WORKLOAD_PROCESS_KINDS:  # an MPS server is infrastructure, not a workload
                        compute.add_metric(labels + [kind], sum(p.kind == kind for p in tel.compute_processes))
            if view.identity.uuid in pods_known:
                refs = pod_refs(held)
                shown, rest = bounded_pods(refs, published.get(view.identity.uuid, set()), holder_limit)
                for ref in shown:
                    pod_info.add_metric(labels + list(ref), 1.0)
                if rest:
                    pod_info.add_metric(labels + ["", OTHER, "", ""], float(rest))
                pod_count.add_metric(labels, len({ref[:2] for ref in refs}))
            if view.spatial is not None:
                source = view.spatial.source
                for field, value in view.spatial.values().items():
                    spatial[field].add_metric(labels + [source], value)
                stamp.add_metric(labels + [source], view.spatial.window_end)
                if view.hidden_idle is not None:
                    hidden.add_metric(labels + [source], view.hidden_idle)
            health.add(labels, view)
            _one_hot(sharing, labels, SHARING_MODES, view.sharing_mode)
            _one_hot(diagnosis, labels, VERDICTS, view.diagnosis[0].verdict if view.diagnosis else None)
            for status in view.sources:
                for candidate in PUBLISHED_STATES:
                    state.add_metric(labels + [status.source, candidate], 1.0 if status.state == candidate else 0.0)
        yield from _flat(f)
