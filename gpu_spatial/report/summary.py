"""From GPU-seconds per (group, quantity, basis) to the table of GPU-hours, shares and wasters.

A quantity a group has no series of at all (busy and SM-active under MPS) is NaN, shown as "unknown",
never 0; held GPU-hours without a series of the quantity are kept as `<quantity>_unknown` and left out
of that quantity's share, so a share reads "of the held GPU-hours where it was measured".
"""
from __future__ import annotations

import math

import pandas as pd

from .account import COVERED, QUANTITIES, WITH_BASIS

BASES = ("exact", "time_share", "rollup")
TOTAL = "(all)"


def columns() -> list[str]:
    out = ["held_gpu_hours"]
    for quantity in QUANTITIES[1:]:
        out.append(f"{quantity}_gpu_hours")
        if quantity in WITH_BASIS:
            out += [f"{quantity}_{basis}_gpu_hours" for basis in BASES]
        if quantity in COVERED:
            out.append(f"{quantity}_unknown_gpu_hours")
        out.append(f"{quantity}_share")
    return out + ["waste_gpu_hours"]


def _figures(hours: dict) -> dict:
    """hours: {(quantity, basis): GPU-hours} of one group -> the row's figures."""
    held = sum(v for (q, _b), v in hours.items() if q == "held")
    row = {"held_gpu_hours": held}
    for quantity in QUANTITIES[1:]:
        measured = {b: v for (q, b), v in hours.items() if q == quantity and b != "unknown"}
        unknown = hours.get((quantity, "unknown"), 0.0)
        value = sum(measured.values()) if measured else math.nan
        row[f"{quantity}_gpu_hours"] = value
        if quantity in WITH_BASIS:
            for basis in BASES:
                row[f"{quantity}_{basis}_gpu_hours"] = measured.get(basis, 0.0)
        if quantity in COVERED:
            row[f"{quantity}_unknown_gpu_hours"] = unknown if measured else held
        base = held - (row.get(f"{quantity}_unknown_gpu_hours") or 0.0)
        row[f"{quantity}_share"] = value / base if measured and base > 1e-12 else math.nan
    row["waste_gpu_hours"] = _zero_nan(row["held_idle_gpu_hours"]) + _zero_nan(row["hidden_idle_gpu_hours"])
    return row


def _zero_nan(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def summarize(rows: pd.DataFrame, labels: tuple[str, ...]) -> pd.DataFrame:
    """One row per group, largest holder first, and a last row for all groups together."""
    labels = list(labels)
    if rows.empty:
        return pd.DataFrame(columns=[*labels, *columns()])
    sums = rows.groupby([*labels, "quantity", "basis"])["gpu_seconds"].sum() / 3600.0
    per_group: dict[tuple, dict] = {}
    everything: dict = {}
    for key, value in sums.items():
        group, quantity_basis = tuple(key[:-2]), tuple(key[-2:])
        per_group.setdefault(group, {})[quantity_basis] = value
        everything[quantity_basis] = everything.get(quantity_basis, 0.0) + value
    table = [dict(zip(labels, group), **_figures(hours)) for group, hours in per_group.items()]
    frame = pd.DataFrame(table, columns=[*labels, *columns()])
    frame = frame.sort_values(["held_gpu_hours", *labels], ascending=[False] + [True] * len(labels))
    total = dict(dict.fromkeys(labels, ""), **{labels[0]: TOTAL}, **_figures(everything))
    return pd.concat([frame, pd.DataFrame([total])], ignore_index=True)


def top_wasters(table: pd.DataFrame, labels, count: int = 5) -> pd.DataFrame:
    groups = table[table[labels[0]] != TOTAL]
    groups = groups[groups["waste_gpu_hours"] > 0]
    return groups.sort_values("waste_gpu_hours", ascending=False).head(count)


def group_name(row, labels) -> str:
    """The group as people read it; control characters from label values (terminal escapes) become '?'."""
    values = ["".join(c if c.isprintable() else "?" for c in str(row[label])) for label in labels]
    return "/".join(values) if any(values) else "(none)"
