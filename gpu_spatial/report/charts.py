"""The HTML report's two charts as PNG bytes (matplotlib, Agg: no display needed)."""
from __future__ import annotations

import io
import math

import pandas as pd

from .account import OTHER
from .summary import TOTAL, group_name

MAX_GROUPS = 8


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.subplots(figsize=(10, 4.2), dpi=100)


def _png(plt, fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def waste_over_time(waste: pd.DataFrame, labels, step: float) -> bytes:
    """Stacked GPUs wasted (the ledger's hidden idle + time idle GPU-seconds per step / step) of the largest
    wasters: physical GPU-seconds, so the stack never exceeds the GPUs that existed."""
    from datetime import datetime, timezone

    plt, (fig, ax) = _figure()
    if waste.empty:
        ax.text(0.5, 0.5, "no waste series in the range", ha="center", transform=ax.transAxes)
    else:
        named = waste.assign(name=["other" if row[labels[0]] == OTHER else group_name(row, labels)
                                   for _, row in waste.iterrows()])
        largest = named.groupby("name")["gpu_seconds"].sum().drop("other", errors="ignore").sort_values(ascending=False)
        keep = set(largest.index[:MAX_GROUPS])
        named["name"] = named["name"].where(named["name"].isin(keep), "other")
        wide = named.pivot_table(index="t", columns="name", values="gpu_seconds", aggfunc="sum").fillna(0.0) / step
        order = [n for n in largest.index if n in wide.columns] + (["other"] if "other" in wide.columns else [])
        times = [datetime.fromtimestamp(t, timezone.utc) for t in wide.index]
        ax.stackplot(times, *[wide[n].to_numpy() for n in order], labels=order, step="pre")
        ax.legend(loc="upper left", fontsize=8, ncol=2)
        fig.autofmt_xdate()
    ax.set_ylabel("GPUs wasted (average per step)")
    ax.set_title(f"Waste by group over time: the ledger's hidden idle + time idle, {step / 60:g}-minute steps (UTC)")
    return _png(plt, fig)


def time_vs_spatial(table: pd.DataFrame, labels) -> bytes:
    """Per group: busy share (time) next to SM-active share (space); unknown (MPS) drawn as a hatched stub."""
    plt, (fig, ax) = _figure()
    groups = table[table[labels[0]] != TOTAL].head(15)
    names = [group_name(row, labels) for _, row in groups.iterrows()]
    x = range(len(names))
    for offset, column, label, color in ((-0.2, "busy_share", "busy (time)", "#4c72b0"),
                                         (0.2, "sm_active_share", "SM active (spatial)", "#dd8452")):
        values = groups[column].tolist()
        known = [v * 100 if not math.isnan(v) else 0.0 for v in values]
        ax.bar([i + offset for i in x], known, width=0.4, label=label, color=color)
        for i, v in zip(x, values):
            if math.isnan(v):
                ax.bar(i + offset, 3, width=0.4, color="white", edgecolor=color, hatch="//")
                ax.text(i + offset, 4, "unknown", rotation=90, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("% of held GPU-hours (where measured)")
    ax.set_ylim(0, 110)
    ax.set_title("Time vs spatial per group")
    ax.legend(fontsize=8)
    return _png(plt, fig)
