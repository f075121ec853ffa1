"""Workload collector: per (holder, GPU) shares and GPU-second counters, from the latest snapshot only."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exporter.collectors.gpu import GPU_LABELS
from exporter.holders import labels as holder_labels
from exporter.vocabulary import (ACTIVE, BUSY_BY_BASIS, CUPTI, HELD, HELD_IDLE, HIDDEN_IDLE, LEDGER, SM_ACTIVE,
                                 WORKLOAD_SOURCE_STATES)


class WorkloadCollector:
    def __init__(self, engine):
        self._engine = engine

    def describe(self):
        """What collect() yields (empty), so the registry refuses a family name registered twice."""
        if self._engine.workloads is None:
            return []
        sources = self._engine.workloads.sources
        return [*_families().values(), *_gpu_ledger_families(),
                *(f for name, source in sources.items() for f in _state_families(name, source)),
                *(_cupti_families() if CUPTI in sources else ())]

    def collect(self):
        if self._engine.workloads is None:  # no holder kind configured (--holders none): no families
            return
        f = _families()
        held, held_basis, processes, time_share, sm_active, folded = (f["held"], f["held_basis"], f["processes"],
                                                                      f["time_share"], f["sm_active"], f["folded"])
        idle_seconds, held_idle, c_held, c_busy, c_sm, c_hidden, c_idle = (
            f["idle_seconds"], f["held_idle"], f["c_held"], f["c_busy"], f["c_sm"], f["c_hidden"], f["c_idle"])
        c_ledger = f["c_ledger"]
        for w in self._engine.snapshot.workloads:
            labels = [str(w.gpu.index), w.gpu.uuid, w.gpu.model] + w.holder.labels()
            if w.folded:
                folded.add_metric(labels[:len(GPU_LABELS)], w.folded)
            if w.held_share is not None:
                held.add_metric(labels, w.held_share)
                held_basis.add_metric(labels + [w.held_share_basis], 1.0)
                c_held.add_metric(labels, w.counters[HELD], created=w.created)
                c_idle.add_metric(labels, w.counters[HELD_IDLE], created=w.created)
            if w.processes is not None:
                processes.add_metric(labels, w.processes)
            if w.time_share is not None:
                time_share.add_metric(labels + [w.time_share_basis], w.time_share)
            busy = dict(w.counters[BUSY_BY_BASIS])
            if w.time_share is not None:
                busy.setdefault(w.time_share_basis, 0.0)
            for basis, value in sorted(busy.items()):
                c_busy.add_metric(labels + [basis], value, created=w.created)
            if w.sm_active is not None:
                sm_active.add_metric(labels + [w.sm_active_basis], w.sm_active)
            if w.sm_estimate is not None:
                f["sm_estimate"].add_metric(labels, w.sm_estimate)
            for basis, value in sorted(w.counters[SM_ACTIVE].items()):
                c_sm.add_metric(labels + [basis], value, created=w.created)
            for basis, value in sorted(w.counters[HIDDEN_IDLE].items()):
                c_hidden.add_metric(labels + [basis], value, created=w.created)
            for cell, value in sorted(w.counters[LEDGER].items()):
                c_ledger.add_metric(labels + [cell], value, created=w.created)
            if w.idle_seconds is not None:
                idle_seconds.add_metric(labels, w.idle_seconds)
                held_idle.add_metric(labels, 1.0 if w.held_idle else 0.0)
        yield from f.values()
        yield from self._gpu_ledgers()
        yield from self._source_states()
        if CUPTI in self._engine.workloads.sources:
            yield from self._cupti_gpus()

    def _cupti_gpus(self):
        """Per MPS GPU with a fresh cupti window: the SM activity no traced client accounts for, and how
        many clients do not trace."""
        unattributed, untraced = _cupti_families()
        for gpu, scaling in self._engine.workloads.cupti_gpus:
            labels = [str(gpu.index), gpu.uuid, gpu.model]
            if scaling.unattributed is not None:
                unattributed.add_metric(labels, scaling.unattributed)
            untraced.add_metric(labels, scaling.untraced)
        yield from (unattributed, untraced)

    def _gpu_ledgers(self):
        """Per GPU, every cell of its ledger and the wall-clock seconds they sum to."""
        cells, observed = _gpu_ledger_families()
        for book in self._engine.workloads.gpu_ledgers:
            labels = [str(book.gpu.index), book.gpu.uuid, book.gpu.model]
            for cell, value in sorted(book.counters.items()):
                cells.add_metric(labels + [cell], round(value, 6), created=book.created)
            observed.add_metric(labels, round(book.observed, 6), created=book.created)
        yield cells
        yield observed

    def _source_states(self):
        """Per workload source and GPU: its state and its window's time."""
        workloads = self._engine.workloads
        for name, states in workloads.source_states.items():
            state, stamp = _state_families(name, workloads.sources[name])
            for gpu, current in states:
                labels = [str(gpu.index), gpu.uuid, gpu.model]
                for value in WORKLOAD_SOURCE_STATES:
                    state.add_metric(labels + [value], 1.0 if current.state == value else 0.0)
                if current.state == ACTIVE and current.window_end is not None:
                    stamp.add_metric(labels, current.window_end)
            yield state
            yield stamp


def _gauge(name, doc, extra=()):
    return GaugeMetricFamily(name, doc, labels=[*GPU_LABELS, *holder_labels(), *extra])


def _counter(name, doc, extra=()):
    return CounterMetricFamily(name, doc, labels=[*GPU_LABELS, *holder_labels(), *extra])


def _families() -> dict:
    """Every per-workload family WorkloadCollector.collect() yields, empty, in the order it yields them."""
    return {
        "held": _gauge("gpu_workload_held_share_ratio", "Share of the GPU the holder was allocated (kubelet "
                       "PodResources, DRA claims, Slurm job mapping, Unix users): 1 whole, k/N replicas, a MIG "
                       "device's share of the SMs, a claim's consumed capacity, or an even split (basis: "
                       "gpu_workload_held_share_basis_info)."),
        "held_basis": _gauge("gpu_workload_held_share_basis_info", "1 for why the held share is what it is: whole, "
                             "mig, replicas, capacity (consumed over device capacity) or even_split (an estimate).",
                             ["basis"]),
        "processes": _gauge("gpu_workload_processes", "The holder's CUDA processes on the GPU (NVML process lists, "
                            "pid to holder through its cgroup); works under MPS too."),
        "time_share": _gauge("gpu_workload_time_share_ratio", "Share of the GPU's time the holder's contexts were "
                             "resident (basis ctxsw: GPU context switches) or its kernels ran (basis nvml: NVML "
                             "per-process utilization scaled to the GPU total); absent under MPS and MIG.", ["basis"]),
        "sm_active": _gauge("gpu_workload_sm_active_ratio", "SM activity attributed to the holder, as a share of the "
                            "whole GPU's SMs; basis exact (alone on the GPU), ctxsw (the SM activity of its own time "
                            "slices) or time_share (the GPU's split by time shares).", ["basis"]),
        "sm_estimate": _gauge("gpu_workload_cupti_sm_estimate_ratio", "Basis cupti: the holder's MPS clients' own SM "
                              "estimate (each kernel's grid against the SMs it can occupy, over their window), before "
                              "the scaling that keeps all clients' sum within the GPU's measured SM active."),
        "folded": GaugeMetricFamily("gpu_workload_folded_holders", "Holders of the GPU beyond --holder-series-limit, "
                                    "published summed as the holder pod=\"other\".", labels=GPU_LABELS),
        "idle_seconds": _gauge("gpu_workload_idle_seconds", "Seconds the holder has held the GPU with no CUDA process "
                               "or a time share under 1%; 0 while it uses it."),
        "held_idle": _gauge("gpu_workload_held_idle", "1 once the holder has been idle for --held-idle-after."),
        "c_held": _counter("gpu_workload_held_gpu_seconds", "GPU-seconds held (held share x seconds)."),
        "c_busy": _counter("gpu_workload_busy_gpu_seconds", "GPU-seconds busy in time (time share x seconds), by the "
                           "basis of the time share integrated (ctxsw where available, else nvml).", ["basis"]),
        "c_sm": _counter("gpu_workload_sm_active_gpu_seconds", "SM-active GPU-seconds (SM active x seconds).",
                         ["basis"]),
        "c_hidden": _counter("gpu_workload_hidden_idle_gpu_seconds", "GPU-seconds busy in time while the SMs idled "
                             "(max(0, time share - SM active) x seconds).", ["basis"]),
        "c_idle": _counter("gpu_workload_held_idle_gpu_seconds", "GPU-seconds held while idle (held share x idle "
                           "seconds)."),
        "c_ledger": _counter("gpu_workload_ledger_gpu_seconds", "The holder's cells of its GPU's ledger "
                             "(docs/ledger.md), GPU-seconds: sm_active_work, hidden_idle, busy_unsplit, time_idle. "
                             "Physical: never add held GPU-seconds (the allocation view) to these.", ["cell"]),
    }


def _gpu_ledger_families() -> tuple[CounterMetricFamily, CounterMetricFamily]:
    """Per GPU: every cell of its ledger, and the wall-clock seconds they sum to."""
    return (CounterMetricFamily("gpu_ledger_gpu_seconds", "Every GPU-second of the GPU in exactly one cell "
                                "(docs/ledger.md): the holders' cells summed, the unattributed ones, switch_overhead, "
                                "unheld, unmeasured. Sums over cell to gpu_ledger_observed_seconds_total.",
                                labels=GPU_LABELS + ["cell"]),
            CounterMetricFamily("gpu_ledger_observed_seconds", "Wall-clock seconds the exporter accounted the GPU for: "
                                "the GPU-hours that existed.", labels=GPU_LABELS))


def _cupti_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    """The cupti source's per-GPU families (--workload-cupti)."""
    return (GaugeMetricFamily("gpu_workload_cupti_unattributed_sm_ratio", "On an MPS GPU: the GPU's SM active over "
                              "the clients' last window less what the traced clients were given (the SM activity of "
                              "clients that do not trace, and the estimates' shortfall).", labels=GPU_LABELS),
            GaugeMetricFamily("gpu_workload_cupti_untraced_clients", "MPS clients on the GPU whose last window was "
                              "not traced (no tracer, or no CUPTI in them).", labels=GPU_LABELS))


def _state_families(name: str, source) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    """A workload source's state series and window time (exporter.sampler.WorkloadSource)."""
    state = GaugeMetricFamily(f"gpu_workload_{name}_state", f"1 for the current state of the {source.description}: "
                              "active, standby, unsupported, error, disabled; /api/v1/workloads and the log say why.",
                              labels=GPU_LABELS + ["state"])
    stamp = GaugeMetricFamily(f"gpu_workload_{name}_sample_timestamp_seconds", "Wall time of the end of the "
                              f"window the basis=\"{source.basis}\" values describe ({source.description}).",
                              labels=GPU_LABELS)
    return state, stamp
