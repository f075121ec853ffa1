"""The per-GPU spatial source chain and the GPU views built from the samplers' latest snapshots."""
from __future__ import annotations

from exporter.samplers.nvml import window_mean
from exporter.snapshot import (
    ACTIVE,
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

DEFAULT_ORDER = ("dcgm", "gpm", "nsys")


def choose_source(order, results: dict[str, SourceResult | None], disabled_reasons: dict[str, str]):
    """The first source in `order` with a reading is active; the rest say why they are not.

    Returns (active SourceResult or None, statuses in order)."""
    active = None
    statuses = []
    for name in order:
        result = results.get(name)
        if result is None:
            reason = disabled_reasons.get(name, "this source does not know this GPU")
            statuses.append(SourceStatus(name, UNSUPPORTED, reason))
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
) -> GpuView:
    if telemetry is not None and telemetry.lost:
        # Whatever a source still serves for a GPU that fell off the bus (dcgm-exporter repeats its
        # last values) describes nothing: the GPU publishes no value until it answers again.
        lost = SourceResult(ERROR, "the GPU is lost (NVML): no source can measure it")
        results = {name: lost for name in order}
    active, statuses = choose_source(order, results, disabled_reasons)
    spatial = active.reading if active else None
    live = telemetry is not None and not telemetry.lost

    # Time utilization always describes the latest tick when NVML knows the GPU.
    time_window = None
    time_util = memory_util = None
    if live:
        time_window = (telemetry.taken_at - interval, telemetry.taken_at)
        time_util = window_mean(telemetry.gpu_samples, *time_window)
        memory_util = window_mean(telemetry.memory_samples, *time_window)

    # Hidden idle compares time and SM activity over the spatial window, never across two windows.
    hidden = None
    if spatial is not None and spatial.sm_active is not None:
        busy = None
        if live:
            busy = window_mean(telemetry.gpu_samples, spatial.window_start, spatial.window_end)
        if busy is None:
            busy = spatial.time_utilization
        if busy is not None:
            hidden = round(max(0.0, busy - spatial.sm_active), 6)
        if not live and spatial.time_utilization is not None:
            # A GPU only a recorded export knows: its time utilization is the export's GR Active.
            time_util, time_window = spatial.time_utilization, (spatial.window_start, spatial.window_end)
    return GpuView(identity, telemetry, time_util, memory_util, time_window, spatial, hidden, statuses)
