"""From GPU-seconds per (group, quantity, basis) to the table of GPU-hours, shares and wasters.

Two views of a group, never added (docs/ledger.md). The allocation view: held GPU-hours and what it used
of them (busy, which exceeds what was held when the others leave the GPU to it). A quantity a group has
no series of at all (busy and SM-active under MPS) is NaN, shown as "unknown", never 0; held GPU-hours
without a series of the quantity are kept as `<quantity>_unknown` and left out of that quantity's share,
so a share reads "of the held GPU-hours where it was measured". The physical view: the group's cells of
the GPU ledger (`ledger_<cell>_gpu_hours`), which add up across groups to at most the GPU-hours that
existed. Waste is physical: the group's hidden idle + time idle; a lower bound where some of its busy
time has no SM split (busy_unsplit), its own busy time is unknown (MPS, MIG) or it held GPUs with no
ledger series (exporters before the ledger). A group none of whose held time has an SM-active (hidden-idle)
series has its work (hidden idle) unknown: NaN, "unknown", null in JSON.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from exporter.vocabulary import BUSY_UNSPLIT, HELD, HIDDEN_IDLE, HOLDER_CELLS, SM_ACTIVE_WORK, TIME_IDLE

from .account import BASES, COVERED, EXACT_BASES, LEDGER, QUANTITIES, WITH_BASIS

TOTAL = "(all)"
UNKNOWN_WITHOUT = {SM_ACTIVE_WORK: "sm_active", HIDDEN_IDLE: "hidden_idle"}  # a holder cell, the series it needs


def columns() -> list[str]:
    out = ["held_gpu_hours"]
    for quantity in QUANTITIES[1:]:
        out.append(f"{quantity}_gpu_hours")
        if quantity in WITH_BASIS:
            out += [f"{quantity}_{basis}_gpu_hours" for basis in BASES[quantity]]
            out += [f"{quantity}_exactly_measured_gpu_hours", f"{quantity}_estimated_gpu_hours"]
        if quantity in COVERED:
            out.append(f"{quantity}_unknown_gpu_hours")
        out.append(f"{quantity}_share")
    out += [f"ledger_{cell}_gpu_hours" for cell in HOLDER_CELLS] + ["ledger_gpu_hours"]
    return out + ["waste_gpu_hours", "waste_is_lower_bound"]


def figures(hours: dict) -> dict:
    """hours: {(quantity, basis): GPU-hours} of one group -> the row's figures."""
    held = sum(v for (q, _b), v in hours.items() if q == HELD)
    row = {"held_gpu_hours": held}
    for quantity in QUANTITIES[1:]:
        measured = {b: v for (q, b), v in hours.items() if q == quantity and b != "unknown"}
        value = sum(measured.values()) if measured else math.nan
        row[f"{quantity}_gpu_hours"] = value
        if quantity in WITH_BASIS:
            for basis in BASES[quantity]:
                row[f"{quantity}_{basis}_gpu_hours"] = measured.get(basis, 0.0)
            exact = sum(v for b, v in measured.items() if b in EXACT_BASES)
            row[f"{quantity}_exactly_measured_gpu_hours"] = exact
            row[f"{quantity}_estimated_gpu_hours"] = sum(measured.values()) - exact
        if quantity in COVERED:
            row[f"{quantity}_unknown_gpu_hours"] = hours.get((quantity, "unknown"), 0.0) if measured else held
        base = held - (row.get(f"{quantity}_unknown_gpu_hours") or 0.0)
        row[f"{quantity}_share"] = value / base if measured and base > 1e-12 else math.nan
    cells = {b: v for (q, b), v in hours.items() if q == LEDGER}
    for cell in HOLDER_CELLS:
        row[f"ledger_{cell}_gpu_hours"] = cells.get(cell, 0.0)
    # a group none of whose held time has an SM (hidden-idle) series cannot have its work (hidden idle) known:
    # unknown, never 0 (its GPUs' figures are in the unattributed cells)
    for cell, quantity in UNKNOWN_WITHOUT.items():
        if math.isnan(row[f"{quantity}_gpu_hours"]) and not cells.get(cell) and held > 0:
            row[f"ledger_{cell}_gpu_hours"] = math.nan
    row["ledger_gpu_hours"] = sum(v for cell in HOLDER_CELLS if not math.isnan(v := row[f"ledger_{cell}_gpu_hours"]))
    row["waste_gpu_hours"] = row[f"ledger_{TIME_IDLE}_gpu_hours"] + \
        (0.0 if math.isnan(row[f"ledger_{HIDDEN_IDLE}_gpu_hours"]) else row[f"ledger_{HIDDEN_IDLE}_gpu_hours"])
    # a lower bound where some busy time has no SM split, where the group's own busy time is unknown (MPS
    # clients, MIG: the GPU's hidden idle stays unattributed) or where it has no ledger series at all
    row["waste_is_lower_bound"] = bool(row[f"ledger_{BUSY_UNSPLIT}_gpu_hours"] > 1e-9 or (held > 1e-9 and not cells)
                                       or row["hidden_idle_unknown_gpu_hours"] > 1e-9)
    return row


def summarize(totals: dict, labels: tuple[str, ...]) -> pd.DataFrame:
    """totals: {group: {(quantity, basis): GPU-seconds}} -> one row per group, largest holder first, and a
    last row for all groups together."""
    labels = list(labels)
    if not totals:
        return pd.DataFrame(columns=[*labels, *columns()])
    everything: dict = {}
    names = columns()
    size = len(totals)
    keys = [[""] * size for _ in labels]
    values = {name: np.empty(size, dtype=bool if name == "waste_is_lower_bound" else float) for name in names}
    for i in range(size):  # one row at a time into arrays, each group's sums dropped once read (70,000 pods)
        group, seconds = totals.popitem()
        hours = {key: value / 3600.0 for key, value in seconds.items()}
        for key, value in hours.items():
            everything[key] = everything.get(key, 0.0) + value
        for position, value in enumerate(group):
            keys[position][i] = value
        for name, value in figures(hours).items():
            values[name][i] = value
    frame = pd.DataFrame({**dict(zip(labels, keys)), **values}, columns=[*labels, *names])
    frame = frame.sort_values(["held_gpu_hours", *labels], ascending=[False] + [True] * len(labels))
    total = dict(dict.fromkeys(labels, ""), **{labels[0]: TOTAL}, **figures(everything))
    return pd.concat([frame, pd.DataFrame([total])], ignore_index=True)


def top_wasters(table: pd.DataFrame, labels, count: int = 5) -> pd.DataFrame:
    groups = table[table[labels[0]] != TOTAL]
    groups = groups[groups["waste_gpu_hours"] > 0]
    return groups.sort_values("waste_gpu_hours", ascending=False).head(count)


def group_name(row, labels) -> str:
    """The group as people read it; control characters from label values (terminal escapes) become '?'."""
    values = ["".join(c if c.isprintable() else "?" for c in str(row[label])) for label in labels]
    return "/".join(values) if any(values) else "(none)"
