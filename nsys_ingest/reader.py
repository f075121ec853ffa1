"""Open Nsight Systems exports of both schema eras and read their GPU metrics in bounded chunks.

Eras (the schemas Nsight Systems wrote over its versions; README, "nsys_ingest"):
- up to 2023.3: GENERIC_EVENTS(timestamp, typeId, data JSON), metric names without units as keys;
- from 2023.4: TARGET_INFO_GPU_METRICS(typeId, metricId, metricName) + GPU_METRICS(timestamp, typeId,
  metricId, value), joined on (typeId, metricId) since metricId alone repeats across GPUs.
In both, the GPU is typeId & 0xFF and timestamps are nanoseconds from the session start.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from nsys_ingest.names import clock_scale, normalise

DEFAULT_CHUNK_ROWS = 200_000  # ~50 MB of Python rows in flight: bounded memory on any export
NO_METRICS = "this export has no GPU metrics: profile with --gpu-metrics-devices=all"
SQLITE_MAGIC = b"SQLite format 3\x00"


class IngestError(Exception):
    """Bad input: the message names the problem and the fix, and is all the user sees."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str | None
    sm_count: int | None

    @property
    def label_uuid(self) -> str:
        return self.uuid or f"nsys-gpu-{self.index}"


@dataclass(frozen=True)
class MetricInfo:
    code: int  # position in Export.metrics
    gpu: int
    type_id: int
    metric_id: int  # the JSON key's position in the old era
    name: str
    quantity: str
    conversion: str
    scale: float  # stored value * scale = published value


def _gpu_of(type_id: int) -> int:
    return int(type_id) & 0xFF


def window_clauses(start_ns, end_ns, start_column="timestamp", end_column="timestamp") -> tuple[list, list]:
    """SQL conditions (and their parameters) for rows that reach into [start_ns, end_ns]: an event
    from start_column to end_column overlaps the window; an open bound is no condition."""
    clauses, params = [], []
    if start_ns is not None:
        clauses.append(f"{end_column} >= ?")
        params.append(int(start_ns))
    if end_ns is not None:
        clauses.append(f"{start_column} <= ?")
        params.append(int(end_ns))
    return clauses, params


def export_rep(path: Path, nsys: str = "nsys") -> Path:
    """Runs `nsys export --type sqlite` on a .nsys-rep; returns the .sqlite (in a temp dir)."""
    binary = shutil.which(nsys)
    if binary is None:
        raise IngestError(f"{path} is an .nsys-rep report and nsys is not on the PATH: install Nsight Systems, "
                          f"or export it where nsys is: nsys export --type sqlite {path.name}")
    out = Path(tempfile.mkdtemp(prefix="nsys-ingest-")) / (path.stem + ".sqlite")
    done = subprocess.run([binary, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out), str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise IngestError(f"nsys export failed on {path}: {tail[0]}")
    return out


class Export:
    """One export, opened read-only. Raises IngestError for anything that is not a usable export."""

    def __init__(self, path, nsys: str = "nsys", require_metrics: bool = True):
        """`require_metrics=False` also opens an export without GPU metrics (a kernel trace alone):
        then `era` is None and it has no metrics."""
        self.require_metrics = require_metrics
        self.source_path = Path(path)
        if not self.source_path.exists():
            raise IngestError(f"{path}: no such file")
        self.path = export_rep(self.source_path, nsys) if self.source_path.suffix == ".nsys-rep" else self.source_path
        with open(self.path, "rb") as f:
            head = f.read(16)
        if head != SQLITE_MAGIC:
            raise IngestError(f"{path} is not a SQLite file: give an Nsight Systems export "
                              "(nsys export --type sqlite REPORT.nsys-rep)")
        try:
            self.con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            self.tables = {r[0] for r in self.con.execute("select name from sqlite_master where type='table'")}
            self._load()
        except sqlite3.DatabaseError as exc:
            raise IngestError(f"{path} is truncated or corrupt ({exc}): export it again") from None

    # -- catalogue ------------------------------------------------------------------------------
    def _load(self) -> None:
        if "GPU_METRICS" in self.tables and "TARGET_INFO_GPU_METRICS" in self.tables:
            self.era = "gpu_metrics"
            rows = self.con.execute("select typeId, metricId, metricName from TARGET_INFO_GPU_METRICS").fetchall()
        elif "GENERIC_EVENTS" in self.tables:
            self.era = "generic_events"
            rows = self._generic_catalogue()
        elif not {"StringIds", "TARGET_INFO_SESSION_START_TIME"} & self.tables:
            raise IngestError(f"{self.source_path}: unknown schema (tables: {', '.join(sorted(self.tables)[:8]) or 'none'}): "
                              "not an Nsight Systems export")
        else:
            self.era, rows = None, []
        if not rows:
            if self.require_metrics:
                raise IngestError(NO_METRICS)
            self.era = None
        metrics = []
        for code, (type_id, metric_id, name) in enumerate(sorted(rows)):
            quantity, conversion = normalise(name)
            metrics.append(MetricInfo(code, _gpu_of(type_id), int(type_id), int(metric_id), name, quantity,
                                      conversion, 0.01 if conversion == "percent" else 1.0))
        self.metrics = [self._with_clock_scale(m) for m in metrics]
        self.gpus = self._gpus()
        self.start_ns = self._start_ns()
        self.sampling_hz = self._sampling_hz()
        if self.era is not None and self.row_estimate == 0:
            raise IngestError(f"{self.source_path}: the GPU metrics tables are empty (the capture ended before the first "
                              "sample?): profile for longer, or at a higher --gpu-metrics-frequency")

    def _generic_catalogue(self):
        type_ids = [r[0] for r in self.con.execute("select distinct typeId from GENERIC_EVENTS")]
        rows = []
        for type_id in type_ids:
            sample = self.con.execute("select data from GENERIC_EVENTS where typeId=? limit 1", (type_id,)).fetchone()
            try:
                keys = list(json.loads(sample[0]).keys()) if sample and sample[0] else []
            except (TypeError, ValueError):
                continue
            if any(normalise(k)[1] != "raw" for k in keys):  # a GPU metrics event, not some other generic event
                rows.extend((type_id, i, key) for i, key in enumerate(keys))
        return rows

    def _with_clock_scale(self, metric: MetricInfo) -> MetricInfo:
        if metric.conversion != "clock":
            return metric
        values = [v for v, in self._raw_values(metric, 64)]
        return MetricInfo(**{**metric.__dict__, "scale": clock_scale(values)})

    def _raw_values(self, metric: MetricInfo, limit: int):
        if self.era == "gpu_metrics":
            return self.con.execute("select value from GPU_METRICS where typeId=? and metricId=? limit ?",
                                    (metric.type_id, metric.metric_id, limit)).fetchall()
        rows = self.con.execute("select data from GENERIC_EVENTS where typeId=? limit ?", (metric.type_id, limit))
        return [(float(json.loads(d).get(metric.name) or 0),) for d, in rows]

    def _gpus(self) -> dict[int, GpuInfo]:
        found = {}
        if "TARGET_INFO_GPU" in self.tables:
            cols = {r[1] for r in self.con.execute("pragma table_info(TARGET_INFO_GPU)")}
            pick = [c if c in cols else "NULL" for c in ("id", "name", "uuid", "smCount")]
            for index, name, uuid, sms in self.con.execute(f"select {', '.join(pick)} from TARGET_INFO_GPU"):
                if uuid and not str(uuid).startswith("GPU-"):
                    uuid = f"GPU-{uuid}"  # NVML's spelling, so the exporter matches GPUs by UUID
                found[int(index)] = GpuInfo(int(index), name or f"GPU {index}", uuid, sms)
        self.described_gpus = dict(sorted(found.items()))  # with or without metrics (kernels may run there)
        for metric in self.metrics:
            found.setdefault(metric.gpu, GpuInfo(metric.gpu, f"GPU {metric.gpu}", None, None))
        if not self.metrics:  # a kernel trace alone: every GPU the export describes
            return dict(self.described_gpus)
        return {i: found[i] for i in sorted({m.gpu for m in self.metrics})}

    def _start_ns(self) -> int | None:
        if "TARGET_INFO_SESSION_START_TIME" in self.tables:
            row = self.con.execute("select utcEpochNs from TARGET_INFO_SESSION_START_TIME").fetchone()
            if row and row[0]:
                return int(row[0])
        return None

    def _sampling_hz(self) -> float | None:
        if "META_DATA_CAPTURE" not in self.tables:
            return None
        row = self.con.execute("select value from META_DATA_CAPTURE "
                               "where name = 'GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY'").fetchone()
        try:
            return float(row[0]) if row else None
        except ValueError:
            return None

    @property
    def row_estimate(self) -> int:
        """Rows of the metrics table, from its last rowid: no scan."""
        if self.era is None:
            return 0
        table = "GPU_METRICS" if self.era == "gpu_metrics" else "GENERIC_EVENTS"
        row = self.con.execute(f"select max(rowid) from {table}").fetchone()
        return int(row[0] or 0)

    # -- reading --------------------------------------------------------------------------------
    def metric_codes(self, quantities=None) -> list[int]:
        return [m.code for m in self.metrics if quantities is None or m.quantity in quantities]

    def time_range(self) -> tuple[int, int]:
        table = "GPU_METRICS" if self.era == "gpu_metrics" else "GENERIC_EVENTS"
        low, high = self.con.execute(f"select min(timestamp), max(timestamp) from {table}").fetchone()
        return int(low or 0), int(high or 0)

    def to_ns(self, wall_seconds: float) -> int:
        if self.start_ns is None:
            raise IngestError("this export has no session start time: give --start/--end in seconds from capture start")
        return int(wall_seconds * 1e9) - self.start_ns

    def wall_seconds(self, timestamp_ns):
        return (self.start_ns or 0) / 1e9 + np.asarray(timestamp_ns) / 1e9

    def chunks(self, quantities=None, start_ns=None, end_ns=None, chunk_rows=DEFAULT_CHUNK_ROWS, progress=None,
               ordered=False):
        """DataFrames of (timestamp ns, gpu, code, value) with published units, `chunk_rows` rows at most
        read at a time. `progress(n)` is called with the rows read. `ordered` sorts by time (slower)."""
        codes = self.metric_codes(quantities)
        if not codes:
            return
        if self.era == "gpu_metrics":
            yield from self._metric_chunks(codes, start_ns, end_ns, chunk_rows, progress, ordered)
        else:
            yield from self._generic_chunks(codes, start_ns, end_ns, chunk_rows, progress, ordered)

    def _where(self, start_ns, end_ns) -> tuple[str, list]:
        clauses, params = window_clauses(start_ns, end_ns)
        return "".join(f" and {c}" for c in clauses), params

    def _metric_chunks(self, codes, start_ns, end_ns, chunk_rows, progress, ordered):
        chosen = [self.metrics[c] for c in codes]
        type_ids = sorted({m.type_id for m in chosen})
        metric_ids = sorted({m.metric_id for m in chosen})
        # Look-up from (typeId, metricId) to code: sorted keys, searched per chunk in one vector call.
        type_index = {t: i for i, t in enumerate(type_ids)}
        width = max(metric_ids) + 1
        keys = np.array([type_index[m.type_id] * width + m.metric_id for m in chosen], dtype=np.int64)
        order = np.argsort(keys)
        keys, code_of, scale_of = keys[order], np.array(codes)[order], np.array([m.scale for m in chosen])[order]
        where, params = self._where(start_ns, end_ns)
        sql = (f"select timestamp, typeId, metricId, value from GPU_METRICS "
               f"where typeId in ({','.join('?' * len(type_ids))}) and metricId in ({','.join('?' * len(metric_ids))})"
               f"{where}{' order by timestamp' if ordered else ''}")
        cursor = self.con.execute(sql, [*type_ids, *metric_ids, *params])
        type_lookup = pd.Series(np.arange(len(type_ids)), index=type_ids)
        while True:
            rows = cursor.fetchmany(chunk_rows)
            if not rows:
                break
            frame = pd.DataFrame.from_records(rows, columns=["timestamp", "typeId", "metricId", "value"])
            if progress:
                progress(len(frame))
            key = type_lookup.reindex(frame["typeId"].to_numpy()).to_numpy().astype(np.int64) * width \
                + frame["metricId"].to_numpy()
            pos = np.searchsorted(keys, key).clip(0, len(keys) - 1)
            hit = keys[pos] == key  # another GPU's metric with a chosen metricId: not asked for
            pos = pos[hit]
            out = pd.DataFrame({
                "timestamp": frame["timestamp"].to_numpy()[hit].astype(np.int64),
                "gpu": (frame["typeId"].to_numpy()[hit].astype(np.int64) & 0xFF),
                "code": code_of[pos],
                "value": frame["value"].to_numpy()[hit].astype(np.float64) * scale_of[pos],
            })
            yield out

    def _generic_chunks(self, codes, start_ns, end_ns, chunk_rows, progress, ordered):
        chosen = [self.metrics[c] for c in codes]
        by_type: dict[int, list[MetricInfo]] = {}
        for m in chosen:
            by_type.setdefault(m.type_id, []).append(m)
        where, params = self._where(start_ns, end_ns)
        sql = (f"select timestamp, typeId, data from GENERIC_EVENTS where typeId in ({','.join('?' * len(by_type))})"
               f"{where}{' order by timestamp' if ordered else ''}")
        cursor = self.con.execute(sql, [*by_type, *params])
        per_event = max(1, len(chosen) // max(1, len(by_type)))
        while True:
            rows = cursor.fetchmany(max(1, chunk_rows // per_event))
            if not rows:
                break
            if progress:
                progress(len(rows))
            parts = []
            frame = pd.DataFrame.from_records(rows, columns=["timestamp", "typeId", "data"])
            for type_id, group in frame.groupby("typeId", sort=False):
                decoded = pd.DataFrame.from_records([json.loads(d) for d in group["data"]])
                for m in by_type[int(type_id)]:
                    if m.name in decoded:
                        values = pd.to_numeric(decoded[m.name], errors="coerce").to_numpy(dtype=np.float64)
                        parts.append(pd.DataFrame({"timestamp": group["timestamp"].to_numpy(np.int64),
                                                   "gpu": m.gpu, "code": m.code, "value": values * m.scale}))
            if parts:
                out = pd.concat(parts, ignore_index=True)
                yield out[out["value"].notna()]

    def close(self) -> None:
        self.con.close()
        if self.path != self.source_path:
            shutil.rmtree(self.path.parent, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress_bar(total: int, description: str):
    """A tqdm bar on a terminal; nothing when stderr is a file or a pipe. Returns (update, close)."""
    if not sys.stderr.isatty() or os.environ.get("NSYS_INGEST_NO_PROGRESS"):
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=description, unit="rows", unit_scale=True, leave=False)
    return bar.update, bar.close
