"""The per-GPU spatial source chain and the GPU views built from the samplers' latest snapshots."""
from __future__ import annotations

from exporter.nvml import CLOCK_EVENT_REASONS
from exporter.samplers.gpm import engine_busy
from exporter.samplers.nvml import window_mean
from nsys_ingest.verdicts import Evidence, judge, sharing_mode
from exporter.vocabulary import MPS, MPS_CLIENT, MPS_SERVER, TIME_SLICED
from exporter.snapshot import (
    ACTIVE,
    DISABLED,
    ERROR,
    OK,
    PENDING,
    STANDBY,
    UNSUPPORTED,
    DeviceTelemetry,
    GpuIdentity,
    GpuView,
    SourceResult,
    SourceStatus,
)


def choose_source(order, results: dict[str, SourceResult | None], disabled_reasons: dict[str, str | SourceResult]):
    """The first source in `order` with a reading is active; the rest say why they are not.

    `disabled_reasons`: why a source runs nowhere: a reason (it was not configured: disabled), or a
    SourceResult (configured, but it could not start: its state and reason).
    Returns (active SourceResult or None, statuses in order)."""
    active = None
    statuses = []
    for name in order:
        result = results.get(name)
        if result is None:
            why = disabled_reasons.get(name)
            if why is None:
                statuses.append(SourceStatus(name, UNSUPPORTED, "this source does not know this GPU"))
            elif isinstance(why, SourceResult):
                statuses.append(SourceStatus(name, why.state, why.reason))
            else:
                statuses.append(SourceStatus(name, DISABLED, why))
            continue
        if result.state == OK and result.reading is not None and active is None:
            active = result
            statuses.append(SourceStatus(name, ACTIVE, result.reason))
        elif result.state in (OK, PENDING):
            why = result.reason if result.state == PENDING else f"{result.reason}; a source earlier in the chain is active"
            statuses.append(SourceStatus(name, STANDBY, why))
        else:
            statuses.append(SourceStatus(name, result.state if result.state in (UNSUPPORTED, ERROR) else ERROR, result.reason))
    return active, tuple(statuses)


def build_view(
    identity: GpuIdentity,
    telemetry: DeviceTelemetry | None,
    results: dict[str, SourceResult | None],
    order,
    disabled_reasons: dict[str, str],
    interval: float,
    mps=None,
) -> GpuView:
    if telemetry is not None and telemetry.lost:
        # Whatever a source still serves for a GPU that fell off the bus (dcgm-exporter repeats its
        # last values) describes nothing: the GPU publishes no value until it answers again.
        lost = SourceResult(ERROR, "the GPU is lost (NVML): no source can measure it")
        results = {name: lost for name in order}
    active, statuses = choose_source(order, results, disabled_reasons)
    spatial = active.reading if active else None
    live = telemetry is not None and not telemetry.lost

    # Time utilization always describes the latest tick when NVML knows the GPU: NVML's samples of
    # the tick, or, where the NVML sampler left them unread, GPM's busy time over its window (the tick).
    time_window = None
    time_util = memory_util = None
    if live:
        start = telemetry.window_start if telemetry.window_start is not None else telemetry.taken_at - interval
        time_window = (start, telemetry.taken_at)
        memory_util = window_mean(telemetry.memory_samples, *time_window)
        gpm = engine_busy(results.get("gpm"))
        if telemetry.gpu_samples or gpm is None:
            time_util = window_mean(telemetry.gpu_samples, *time_window)
        else:
            time_util, time_window = gpm.time_utilization, (gpm.window_start, gpm.window_end)

    # Hidden idle compares time and SM activity over the spatial window, never across two windows.
    hidden = busy = None
    if spatial is not None and spatial.sm_active is not None:
        if live:
            busy = window_mean(telemetry.gpu_samples, spatial.window_start, spatial.window_end)
        if busy is None:
            busy = spatial.time_utilization
        if busy is not None:
            hidden = round(max(0.0, busy - spatial.sm_active), 6)
        if not live and spatial.time_utilization is not None:
            # A GPU only a recorded export knows: its time utilization is the export's GR Active.
            time_util, time_window = spatial.time_utilization, (spatial.window_start, spatial.window_end)
    mode, diagnosis = diagnose(telemetry if live else None, spatial, busy if busy is not None else time_util, mps)
    return GpuView(identity, telemetry, time_util, memory_util, time_window, spatial, hidden, statuses,
                   mode, diagnosis, links(results.get("gpm"), telemetry) if live else None)


def links(gpm: SourceResult | None, telemetry: DeviceTelemetry):
    """PCIe and NVLink throughput: GPM's over its window where it measures them, else NVML's."""
    if gpm is not None and gpm.links is not None:
        return gpm.links
    return telemetry.health.links if telemetry.health is not None else None


def time_utilization_source(view: GpuView) -> str | None:
    """Where a view's time utilization comes from: NVML's samples while NVML knows the GPU, or GPM's
    busy time where it stood in for them; else the spatial source's own busy time (an export's GR
    Active, for a GPU only an export knows)."""
    if view.time_utilization is None:
        return None
    if view.telemetry is not None and not view.telemetry.lost:
        return "nvml" if view.telemetry.gpu_samples else "gpm"
    return view.spatial.source if view.spatial is not None else None


def diagnose(telemetry: DeviceTelemetry | None, spatial, busy: float | None, mps):
    """(sharing mode, (verdict, evidence)) of one GPU from live values; `telemetry` None when NVML
    does not know the GPU (then an export's own values are judged, without sharing or MPS)."""
    mode = processes = None
    if telemetry is not None and telemetry.compute_processes is not None:
        kinds = [p.kind for p in telemetry.compute_processes]
        mode = sharing_mode(kinds.count(TIME_SLICED), kinds.count(MPS_CLIENT), telemetry.mig_enabled)
        processes = len(kinds) - kinds.count(MPS_SERVER)
    health = telemetry.health if telemetry is not None else None
    bits = health.clock_event_reasons if health is not None else None
    evidence = Evidence(
        time_utilization=busy,
        sm_active=spatial.sm_active if spatial else None,
        dram_active=spatial.dram_active if spatial else None,
        sharing_mode=mode,
        processes=processes,
        mps_server_faults_per_s=None if telemetry is None else _mps_server_faults(telemetry, mps, mode),
        sm_clock_hertz=telemetry.sm_clock_hertz if telemetry is not None else None,
        sm_clock_max_hertz=health.sm_clock_max_hertz if health is not None else None,
        clock_event_reasons=None if bits is None else tuple(r for r, bit in CLOCK_EVENT_REASONS.items() if bits & bit),
        throttle_share=health.throttle_share if health is not None else None,
    )
    verdict = judge(evidence)
    return mode, (verdict, evidence) if verdict else None


def _mps_server_faults(telemetry: DeviceTelemetry, mps, mode: str | None) -> float | None:
    """Major faults/s of the MPS server serving this GPU: the one NVML lists on it, or, when NVML
    names it by a pid this process cannot see (another pid namespace), any server on the host."""
    servers = [d for d in getattr(mps, "daemons", ()) if d.role == "server" and d.major_faults_per_s is not None]
    pids = {p.pid for p in telemetry.compute_processes or () if p.kind == MPS_SERVER}
    mine = [d for d in servers if d.pid in pids] or (servers if mode == MPS else [])
    return max((d.major_faults_per_s for d in mine), default=None)
