"""Summaries and time buckets of GPU metrics, streamed chunk by chunk in bounded memory.

Everything here gives the same result whatever the chunk size: samples are regrouped per GPU and
timestamp across chunk edges, statistics come from integer histograms (one bin per 0.001 of ratio,
exact for nsys' integer percentages) and integer sums, never from float sums in chunk order.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from nsys_ingest.reader import DEFAULT_CHUNK_ROWS, Export

SPATIAL = ("sm_active", "sm_occupancy", "tensor_active")
SUMMARY_QUANTITIES = ("gr_active", *SPATIAL)
BUSY_GR, IDLE_SM = 0.8, 0.5  # "busy in time, idle in space": GR active >= 0.8 while SM active <= 0.5
BINS = 1000
# Published per window: the contract's spatial quantities and the time side (GR active).
WINDOW_QUANTITIES = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_read", "dram_write")


def wide_samples(export: Export, quantities, start_ns=None, end_ns=None, chunk_rows=DEFAULT_CHUNK_ROWS,
                 progress=None, ordered=False):
    """Yields DataFrames with one row per (gpu, timestamp) and one column per quantity.

    A sample's rows can straddle two chunks: the newest timestamp of each GPU in a chunk waits for
    the next chunk (or the end) before it is emitted, folded into one row per metric (its sum and
    count), so rows that share a timestamp, however many, hold one row per metric in memory."""
    names = np.array([m.quantity for m in export.metrics], dtype=object)
    carry = None
    for chunk in export.chunks(quantities, start_ns, end_ns, chunk_rows, progress, ordered):
        chunk = chunk.assign(n=chunk["value"].notna().to_numpy(dtype=np.int64))  # NaN: no value, not a zero
        if carry is not None:
            chunk = pd.concat([carry, chunk], ignore_index=True)
        newest = chunk.groupby("gpu")["timestamp"].transform("max")
        held = chunk["timestamp"].to_numpy() == newest.to_numpy()
        carry = chunk[held].groupby(["timestamp", "gpu", "code"], as_index=False, sort=False)[["value", "n"]].sum()
        ready = chunk[~held]
        if len(ready):
            yield _pivot(ready, names)
    if carry is not None and len(carry):
        yield _pivot(carry, names)


def _pivot(rows: pd.DataFrame, names) -> pd.DataFrame:
    """One row per (gpu, timestamp), one column per quantity: the mean of its rows there (`value` holds
    the sum of `n` rows)."""
    frame = rows.assign(quantity=names[rows["code"].to_numpy()])
    sums = frame.pivot_table(index=["gpu", "timestamp"], columns="quantity", values=["value", "n"], aggfunc="sum")
    wide = sums["value"] / sums["n"]
    wide.columns.name = "quantity"
    present = [wide[q].fillna(0) for q in ("dram_read", "dram_write") if q in wide]
    if present:  # an export may have either one alone
        wide["dram_active"] = sum(present).clip(upper=1.0)
    return wide.reset_index()


def nearest_rank_bin(counts: np.ndarray, q: float) -> int | None:
    """The bin holding the nearest-rank q-quantile of histogram `counts`; None when empty."""
    n = int(counts.sum())
    if n == 0:
        return None
    return int(np.searchsorted(np.cumsum(counts), max(1, int(np.ceil(q * n)))))


class Distribution:
    """Mean and nearest-rank percentiles of ratios in 0..1, at 0.001 resolution, in constant memory."""

    def __init__(self):
        self.counts = np.zeros(BINS + 1, dtype=np.int64)
        self.micro_sum = 0  # exact: sum of round(value * 1e6)

    def add(self, values) -> None:
        values = np.asarray(values, dtype=np.float64)
        values = values[~np.isnan(values)].clip(0.0, 1.0)
        if values.size:
            self.counts += np.bincount(np.rint(values * BINS).astype(np.int64), minlength=BINS + 1)
            self.micro_sum += int(np.rint(values * 1e6).astype(np.int64).sum())

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float | None:
        found = nearest_rank_bin(self.counts, q)
        return None if found is None else found / BINS

    def stats(self) -> dict | None:
        if self.n == 0:
            return None
        return {"mean": round(self.micro_sum / self.n / 1e6, 6), "p50": self.quantile(0.5),
                "p95": self.quantile(0.95), "samples": self.n}


def summarise(export: Export, start_ns=None, end_ns=None, chunk_rows=DEFAULT_CHUNK_ROWS, progress=None) -> dict:
    per_gpu: dict[int, dict] = {}
    for wide in wide_samples(export, SUMMARY_QUANTITIES, start_ns, end_ns, chunk_rows, progress):
        for gpu, rows in wide.groupby("gpu"):
            acc = per_gpu.setdefault(int(gpu), {
                "dist": {q: Distribution() for q in (*SUMMARY_QUANTITIES, "hidden_idle")},
                "first": None, "last": None, "busy_idle": 0, "pairs": 0, "samples": 0})
            stamps = rows["timestamp"].to_numpy()
            acc["first"] = int(stamps.min()) if acc["first"] is None else min(acc["first"], int(stamps.min()))
            acc["last"] = int(stamps.max()) if acc["last"] is None else max(acc["last"], int(stamps.max()))
            acc["samples"] += len(rows)
            for q in SUMMARY_QUANTITIES:
                if q in rows:
                    acc["dist"][q].add(rows[q].to_numpy())
            if "gr_active" in rows and "sm_active" in rows:
                gr, sm = rows["gr_active"].to_numpy(), rows["sm_active"].to_numpy()
                both = ~(np.isnan(gr) | np.isnan(sm))
                acc["dist"]["hidden_idle"].add(np.maximum(0.0, gr[both] - sm[both]))
                acc["pairs"] += int(both.sum())
                acc["busy_idle"] += int(((gr[both] >= BUSY_GR) & (sm[both] <= IDLE_SM)).sum())
    gpus = []
    for index, acc in sorted(per_gpu.items()):
        info = export.gpus.get(index)
        gpus.append({
            "gpu": index,
            "name": info.name if info else f"GPU {index}",
            "uuid": info.uuid if info else None,
            "samples": acc["samples"],
            "start_s": round(acc["first"] / 1e9, 6),
            "end_s": round(acc["last"] / 1e9, 6),
            "time": {"gr_active": acc["dist"]["gr_active"].stats()},
            "spatial": {q: acc["dist"][q].stats() for q in SPATIAL},
            "hidden_idle": acc["dist"]["hidden_idle"].stats(),
            "busy_but_idle_share": round(acc["busy_idle"] / acc["pairs"], 6) if acc["pairs"] else None,
        })
    return {
        "file": str(export.source_path),
        "schema": export.era,
        "sampling_hz": export.sampling_hz,
        "capture_start_utc_s": export.start_ns / 1e9 if export.start_ns else None,
        "window_s": [None if start_ns is None else start_ns / 1e9, None if end_ns is None else end_ns / 1e9],
        "busy_but_idle_rule": f"gr_active >= {BUSY_GR} and sm_active <= {IDLE_SM}",
        "gpus": gpus,
    }


def bucket_means(export: Export, step_s: float, quantities=WINDOW_QUANTITIES, start_ns=None, end_ns=None,
                 chunk_rows=DEFAULT_CHUNK_ROWS, progress=None) -> pd.DataFrame:
    """Mean of each quantity per GPU and time bucket of `step_s` seconds.

    Columns: gpu, bucket (start, seconds from capture start), then one per quantity. Memory grows
    with the number of buckets, not of samples."""
    step_ns = max(int(step_s * 1e9), 1)
    sums = None
    for wide in wide_samples(export, quantities, start_ns, end_ns, chunk_rows, progress):
        wide["bucket"] = wide["timestamp"] // step_ns
        value_cols = [c for c in wide.columns if c not in ("gpu", "timestamp", "bucket")]
        grouped = wide.groupby(["gpu", "bucket"])[value_cols]
        part = pd.concat([grouped.sum(min_count=1).add_suffix("|sum"), grouped.count().add_suffix("|n")], axis=1)
        sums = part if sums is None else sums.add(part, fill_value=0)
    if sums is None:
        return pd.DataFrame(columns=["gpu", "bucket"])
    out = pd.DataFrame(index=sums.index)
    for col in sums.columns:
        name, kind = col.rsplit("|", 1)
        if kind == "sum":
            out[name] = sums[col] / sums[f"{name}|n"].replace(0, np.nan)
    out = out.reset_index()
    out["bucket"] = out["bucket"] * step_ns / 1e9
    return out.sort_values(["gpu", "bucket"], ignore_index=True)
