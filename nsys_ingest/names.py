"""Metric names across nsys versions and GPU architectures, mapped onto the contract's quantities.

nsys names the same counter differently by version and chip: "SM Active" / "SMs Active", with or
without a " [Throughput %]" suffix (2023.4 on), "Compute Warps In Flight" / "Compute Warps in
Flight", "DRAM Read Throughput" / "DRAM Read Bandwidth". Matching is on the name without its unit
suffix, case-insensitively; the suffix decides the unit.
"""
from __future__ import annotations

import re

# canonical quantity -> name stems (lower case, unit suffix removed)
CANONICAL = {
    "gr_active": ("gr active", "graphics active"),
    "sm_active": ("sms active", "sm active"),
    "sm_issue": ("sm issue", "sms issue"),
    "tensor_active": ("tensor active", "tensor active / fp16 active", "tensor pipe active", "tensor active/fp16 active"),
    "sm_occupancy": ("compute warps in flight",),
    "unallocated_warps": ("unallocated warps in active sms", "unallocated warps in active sm"),
    "dram_read": ("dram read bandwidth", "dram read throughput"),
    "dram_write": ("dram write bandwidth", "dram write throughput"),
    "pcie_rx": ("pcie rx throughput", "pcie read throughput", "pcie read requests to bar1"),
    "pcie_tx": ("pcie tx throughput", "pcie write throughput", "pcie write requests to bar1"),
    "gpc_clock_hertz": ("gpc clock frequency",),
    "sys_clock_hertz": ("sys clock frequency",),
}
_STEM_TO_CANONICAL = {stem: name for name, stems in CANONICAL.items() for stem in stems}
CLOCKS = ("gpc_clock_hertz", "sys_clock_hertz")
SUFFIX = re.compile(r"\s*\[([^\]]*)\]\s*$")
# Old exports (up to 2023.3) have no unit suffix: their throughput metrics were percentages.
PERCENT_BY_DEFAULT = {"gr_active", "sm_active", "sm_issue", "tensor_active", "sm_occupancy", "unallocated_warps",
                      "dram_read", "dram_write", "pcie_rx", "pcie_tx"}


def split_unit(name: str) -> tuple[str, str | None]:
    match = SUFFIX.search(name)
    if not match:
        return name.strip(), None
    return name[: match.start()].strip(), match.group(1).strip()


def sanitise(name: str) -> str:
    """A Prometheus-safe name for a metric we do not know: 'Pixel Warps in Flight [Avg]' ->
    'pixel_warps_in_flight_avg'."""
    text = name.lower().replace("%", "pct")
    text = re.sub(r"[^a-z0-9]+", "_", text).strip("_")
    return text if text and not text[0].isdigit() else f"m_{text}"


def normalise(name: str) -> tuple[str, str]:
    """(quantity, conversion) for an nsys metric name.

    conversion is 'percent' (divide by 100 to a ratio), 'clock' (hertz or megahertz, decided per
    export by the values), or 'raw' (kept as it is, under a sanitised name)."""
    stem, unit = split_unit(name)
    canonical = _STEM_TO_CANONICAL.get(stem.lower())
    if canonical is None:
        return sanitise(name), "raw"
    if canonical in CLOCKS:
        return canonical, "clock"
    if unit is None:
        return canonical, "percent" if canonical in PERCENT_BY_DEFAULT else "raw"
    if "%" in unit:
        return canonical, "percent"
    # e.g. "Compute Warps in Flight [Avg]": a count, not the contract's occupancy ratio.
    return sanitise(name), "raw"


def clock_scale(sample_values) -> float:
    """Multiplier from stored clock values to hertz. Exports label the clocks [MHz], yet some hold
    hertz (840000125 for 840 MHz): no GPU clock reaches 100 kHz in MHz, so larger values are hertz."""
    values = [v for v in sample_values if v]
    if not values:
        return 1e6
    values.sort()
    return 1.0 if values[len(values) // 2] > 100_000 else 1e6
