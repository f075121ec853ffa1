"""Open Nsight Systems exports of both schema eras and read their GPU metrics in bounded chunks.

Eras (the schemas Nsight Systems wrote over its versions; docs/nsys.md):
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np

from hostio.files import read_capped
from nsys_ingest.names import clock_scale, normalise

DEFAULT_CHUNK_ROWS = 200_000  # ~50 MB of Python rows in flight: bounded memory on any export
NO_METRICS = "this export has no GPU metrics: profile with --gpu-metrics-devices=all"
SQLITE_MAGIC = b"SQLite format 3\x00"


NOT_NSYS = "not an export nsys wrote: export it again (nsys export --type sqlite REPORT.nsys-rep)"

# Every export is untrusted (an upload, a watched file, a file a user was sent): what one may cost is
# bounded. Real exports are far inside these: one GPU per typeId, a few dozen metrics per GPU, names
# of tens of characters, no value past a few KB.
MAX_GPUS = 64
MAX_METRICS = 4096  # catalogue entries: (typeId, metricId) pairs, or the old era's distinct typeIds
MAX_NAME = 256  # characters of a GPU or metric name
MAX_UUID = 64
MAX_GPU_INDEX = 255  # the GPU is typeId & 0xFF
CATALOGUE_EVENTS = 32  # old era: events of each type read for its metric names
SQLITE_LIMITS = {  # per connection; the schema's own expressions are parsed under them too
    sqlite3.SQLITE_LIMIT_LENGTH: 16 << 20,  # any one value: a generated or stored 200 MB string fails
    sqlite3.SQLITE_LIMIT_SQL_LENGTH: 1 << 20,
    sqlite3.SQLITE_LIMIT_COLUMN: 1000,
    sqlite3.SQLITE_LIMIT_EXPR_DEPTH: 100,
    sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: 8,
    sqlite3.SQLITE_LIMIT_VDBE_OP: 250_000,  # our widest query: IN lists of MAX_METRICS ids
    sqlite3.SQLITE_LIMIT_FUNCTION_ARG: 8,
    sqlite3.SQLITE_LIMIT_ATTACHED: 0,
    sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: 1000,
    sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER: 2 * MAX_METRICS + 16,
    sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH: 1,
}
MAX_EVENT_CHARS = 8192  # an old-era event's JSON: a few dozen metrics are under 1 KB
EVENT_FETCH_ROWS = 4096  # old-era events fetched at once: at most 32 MB of JSON in flight
MAX_SCHEMA_OBJECTS = 10_000  # tables and views of one export: nsys writes a few hundred
HEAP_LIMIT_BYTES = 256 << 20  # SQLite's own memory, process-wide (sorts spill to temporary files)
PROGRESS_EVERY = 20_000  # SQLite instructions between two looks at the clock and the cancel flag
# The tables (and their columns) this package reads: each must be a plain table with these columns.
COLUMNS = {
    "GPU_METRICS": ("timestamp", "typeId", "metricId", "value"),
    "TARGET_INFO_GPU_METRICS": ("typeId", "metricId", "metricName"),
    "GENERIC_EVENTS": ("timestamp", "typeId", "data"),
    "TARGET_INFO_GPU": ("id",),  # name, uuid and smCount are optional
    "TARGET_INFO_SESSION_START_TIME": ("utcEpochNs",),
    "META_DATA_CAPTURE": ("name", "value"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "deviceId", "globalPid", "gridX", "gridY", "gridZ"),
    "TARGET_INFO_CUDA_DEVICE": ("pid", "cudaId", "gpuId"),
    "PROCESSES": ("globalPid", "name"),
    "GPU_CONTEXT_SWITCH_EVENTS": ("tag", "seqNo", "contextId", "timestamp", "globalPid", "gpuId"),
    "ENUM_GPU_CTX_SWITCH": ("id", "name"),
}


INTERRUPTED = "interrupted"


class IngestError(Exception):
    """Bad input: the message names the problem and the fix, and is all the user sees."""


class Budget:
    """What reading one export may cost in time, and a flag that stops it (the client left, the
    process is shutting down). SQLite looks at both every PROGRESS_EVERY instructions; Python loops
    call check() between statements."""

    def __init__(self, seconds: float | None = None, cancel: threading.Event | None = None):
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.cancel = cancel or threading.Event()
        self.stopped: str | None = None  # why reading was stopped, once it was

    def spent(self) -> bool:
        try:
            return self._spent()
        except KeyboardInterrupt:  # Ctrl-C inside SQLite's callback: sqlite3 would swallow it
            self.stopped = INTERRUPTED
            return True

    def _spent(self) -> bool:
        if self.cancel.is_set():
            self.stopped = "reading was cancelled (the client left or the exporter is stopping)"
        elif self.deadline is not None and time.monotonic() > self.deadline:
            self.stopped = (f"reading this export took longer than its budget of {self.seconds:g} s: "
                            "give a smaller export (a shorter capture, or fewer metrics)")
        return self.stopped is not None

    def check(self) -> None:
        if self.spent():
            raise IngestError(self.stopped)


class UntrustedConnection(sqlite3.Connection):
    """What connect_untrusted returns: `guard` is the TableGuard every read passes (None for scrub's copy)."""

    guard = None


def connect_untrusted(path, budget: Budget | None = None, readonly: bool = True) -> UntrustedConnection:
    """A connection to an export that nothing in the file can abuse: read-only and immutable (no
    lock, no -wal/-shm sidecars, no journal replayed), the schema's functions untrusted, lengths and
    expression depths bounded, every statement stopped when `budget` is spent, and every table read,
    by whichever module, passing TableGuard. `readonly=False` is for scrub's private copy (it checks
    every table itself: it rewrites them all)."""
    if readonly:
        uri = f"file:{quote(Path(path).resolve().as_posix())}?mode=ro&immutable=1"  # '?', '#', '%' in names
        con = sqlite3.connect(uri, uri=True, check_same_thread=False, factory=UntrustedConnection)
    else:
        con = sqlite3.connect(path, check_same_thread=False, factory=UntrustedConnection)
    try:
        _harden(con, budget, readonly)
    except BaseException:
        con.close()
        raise
    return con


def _harden(con: UntrustedConnection, budget: Budget | None, readonly: bool) -> None:
    for limit, value in SQLITE_LIMITS.items():
        con.setlimit(limit, value)
    if not readonly:
        con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 1)  # VACUUM attaches its temporary copy
    con.execute("pragma trusted_schema = off")
    con.execute("pragma cell_size_check = on")
    (heap,) = con.execute("pragma hard_heap_limit").fetchone()
    if heap == 0 or heap > HEAP_LIMIT_BYTES:
        con.execute(f"pragma hard_heap_limit = {HEAP_LIMIT_BYTES}")
    if readonly:
        con.execute("pragma query_only = on")
    if budget is not None:
        con.set_progress_handler(budget.spent, PROGRESS_EVERY)
    if readonly:
        con.guard = TableGuard(con, schema_objects(con))
        con.set_authorizer(con.guard)


def check_tables(con, tables: dict[str, str], wanted=COLUMNS) -> None:
    """Each table of `wanted` that the export has must be a plain table (no view, no virtual table)
    with the columns we read, none of its columns generated: a view or a generated column runs the
    file's own SQL on every read."""
    for table, columns in wanted.items():
        kind = tables.get(table)
        if kind is None:
            continue
        if kind != "table":
            raise IngestError(f"{table} is a {kind}, not a table: {NOT_NSYS}")
        info = con.execute(f"pragma table_xinfo([{table}])").fetchall()
        generated = [r[1] for r in info if r[6] != 0]
        if generated:
            raise IngestError(f"{table}.{generated[0]} is a generated column: {NOT_NSYS}")
        have = {r[1] for r in info}
        missing = [c for c in columns if c not in have]
        if missing:
            raise IngestError(f"{table} has no column {missing[0]}: {NOT_NSYS}")


def schema_objects(con) -> dict[str, str]:
    """name -> 'table', 'view' or 'virtual table' for every table-like object of the schema (names
    longer than MAX_NAME are left out: no table read here has one)."""
    rows = con.execute("select name, type, ltrim(substr(sql, 1, 40)) like 'CREATE VIRTUAL%' from sqlite_master "
                       f"where type in ('table', 'view') and length(name) <= {MAX_NAME} limit ?",
                       (MAX_SCHEMA_OBJECTS + 1,)).fetchall()
    if len(rows) > MAX_SCHEMA_OBJECTS:
        raise IngestError(f"the export holds more than {MAX_SCHEMA_OBJECTS} tables and views: {NOT_NSYS}")
    return {name: "virtual table" if virtual else kind for name, kind, virtual in rows}


class TableGuard:
    """SQLite's authorizer on a reading connection: every column any statement reads (in this module,
    kernels.py, or a reader added later) must come from a plain table without generated columns. A view,
    virtual table or generated column would run the file's own SQL on every read. A refused statement
    fails when it is prepared, and `refused` says why (Export.explain makes it the one line)."""

    INTERNAL = ("sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_sequence")

    def __init__(self, con, objects: dict[str, str]):
        self.objects = objects
        self.generated: dict[str, str] = {}  # table -> its first generated column
        for table, column in con.execute(
                "select m.name, p.name from sqlite_master m, pragma_table_xinfo(m.name) p "
                "where m.type = 'table' and ltrim(substr(m.sql, 1, 40)) not like 'CREATE VIRTUAL%' "
                "and p.hidden in (2, 3) limit ?", (MAX_SCHEMA_OBJECTS,)):
            self.generated.setdefault(table, column)
        self.refused: str | None = None

    def __call__(self, action, table, column, database, source):
        if action != sqlite3.SQLITE_READ or table in self.INTERNAL:
            return sqlite3.SQLITE_OK
        why = None
        if source is not None:  # read on behalf of a view or trigger
            why = f"{source} is a view, not a table"
        elif self.objects.get(table, "table") != "table":
            why = f"{table} is a {self.objects[table]}, not a table"
        elif table in self.generated:
            why = f"{table}.{self.generated[table]} is a generated column"
        if why is None:
            return sqlite3.SQLITE_OK
        self.refused = self.refused or f"{why}: {NOT_NSYS}"
        return sqlite3.SQLITE_DENY


# A value's declared size is checked before it is read: typeof() and length() of a blob read only the
# record header, never the value (nor an overflow chain that claims a megabyte per row). Values come back
# as Python numbers and short strings only; anything else as a description of what is stored.
_DESCRIBED = "typeof({c}) || ' of ' || length({c}) || iif(typeof({c}) = 'text', ' characters', ' bytes')"


def number(column: str, null: str = "null") -> str:
    """SQL for a column that holds numbers: the number, `null` for NULL, a text of up to 40 characters
    as stored (to name it in the error), else its description ('blob of 999264 bytes')."""
    return (f"(case when typeof({column}) in ('integer', 'real') then {column} "
            f"when typeof({column}) = 'null' then {null} "
            f"when typeof({column}) = 'text' and length({column}) <= 40 then {column} "
            f"else {_DESCRIBED.format(c=column)} end)")


def numbers_only(con, table: str, column: str) -> None:
    """Raises an IngestError naming the first value of `column` that is no number (its type is looked
    at, never the value: a blob is not read); for aggregates such as max(), which would read it."""
    row = con.execute(f"select {number(column)} from {table} where typeof({column}) not in ('integer', 'real', 'null') "
                      "limit 1").fetchone()
    if row is not None:
        as_int(row[0], f"{table}.{column}")


def text(column: str, longest: int) -> str:
    """SQL for a column that holds names: the text when it has at most `longest` characters, NULL, else
    its description as a blob (bytes in Python: never mistaken for a name; see _text)."""
    return (f"(case when typeof({column}) = 'text' and length({column}) <= {longest} then {column} "
            f"when typeof({column}) = 'null' then null else cast({_DESCRIBED.format(c=column)} as blob) end)")


def as_int(value, where: str) -> int:
    """An integer the export stores, or an IngestError naming the column when it holds something else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 2**63 - 1:
        raise IngestError(f"{where} holds {_shown(value)} where an integer belongs: {NOT_NSYS}")
    return int(value)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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

    def __init__(self, path, nsys: str = "nsys", require_metrics: bool = True, budget: Budget | None = None):
        """`require_metrics=False` also opens an export without GPU metrics (a kernel trace alone):
        then `era` is None and it has no metrics. `budget`: what reading it may cost (time, cancel);
        none by default (a CLI user waits as long as they like, and can press Ctrl-C)."""
        self.require_metrics = require_metrics
        self.budget = budget or Budget()
        self.source_path = Path(path)
        self.path, self.con, self.guard = self.source_path, None, None
        if not self.source_path.exists():
            raise IngestError(f"{path}: no such file")
        if self.source_path.is_dir():
            raise IngestError(f"{path} is a directory: give an export file (.sqlite)")
        self.path = export_rep(self.source_path, nsys) if self.source_path.suffix == ".nsys-rep" else self.source_path
        try:  # a FIFO or device named x.sqlite must not block or stream forever
            head = read_capped(self.path, len(SQLITE_MAGIC), follow=True, truncate=True)
        except OSError as exc:
            self.close()
            raise IngestError(f"{path}: {exc.strerror or exc}: give an export file (.sqlite)") from None
        if head != SQLITE_MAGIC:
            self.close()
            raise IngestError(f"{path} is not a SQLite file: give an Nsight Systems export "
                              "(nsys export --type sqlite REPORT.nsys-rep)")
        try:
            self.con = connect_untrusted(self.path, self.budget)
            self.guard = self.con.guard  # kept past close(): explain() names what it refused
            objects = self.guard.objects
            check_tables(self.con, {name: kind for name, kind in objects.items() if kind == "table"})
            # Views and virtual tables too: a read of one is refused by the guard, naming it.
            self.tables = set(objects)
            self._load()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise self.explain(exc) from None
        except IngestError:
            self.close()
            raise

    def explain(self, exc: sqlite3.DatabaseError) -> IngestError:
        """The one line for an error SQLite raised while reading this export."""
        if self.budget.stopped == INTERRUPTED:
            raise KeyboardInterrupt
        if self.budget.stopped:
            return IngestError(self.budget.stopped)
        if self.guard is not None and self.guard.refused:
            return IngestError(self.guard.refused)
        text = str(exc)
        if "too big" in text:
            return IngestError(f"{self.source_path} holds a value longer than {SQLITE_LIMITS[sqlite3.SQLITE_LIMIT_LENGTH]} "
                               f"bytes: {NOT_NSYS}")
        if "no such column" in text or "no such table" in text or "malformed database schema" in text or "unsafe use" in text:
            return IngestError(f"{self.source_path}: {text}: {NOT_NSYS}")
        return IngestError(f"{self.source_path} is truncated or corrupt ({text}): export it again")

    # -- catalogue ------------------------------------------------------------------------------
    def _load(self) -> None:
        if "GPU_METRICS" in self.tables and "TARGET_INFO_GPU_METRICS" in self.tables:
            self.era = "gpu_metrics"
            rows = self.con.execute(f"select {number('typeId')}, {number('metricId')}, {text('metricName', MAX_NAME)} "
                                    "from TARGET_INFO_GPU_METRICS limit ?", (MAX_METRICS + 1,)).fetchall()
            if len(rows) > MAX_METRICS:
                raise IngestError(f"TARGET_INFO_GPU_METRICS describes more than {MAX_METRICS} metrics: {NOT_NSYS}")
            rows = [(as_int(t, "TARGET_INFO_GPU_METRICS.typeId"), as_int(m, "TARGET_INFO_GPU_METRICS.metricId"),
                     _metric_name(n, "TARGET_INFO_GPU_METRICS.metricName")) for t, m, n in rows]
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
        if len({_gpu_of(t) for t, _, _ in rows}) > MAX_GPUS:
            raise IngestError(f"GPU metrics of more than {MAX_GPUS} GPUs in one export: {NOT_NSYS}")
        metrics = []
        for code, (type_id, metric_id, name) in enumerate(sorted(set(rows))):
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
        type_ids = [r[0] for r in self.con.execute(f"select distinct {number('typeId')} from GENERIC_EVENTS limit ?",
                                                   (MAX_METRICS + 1,))]
        if len(type_ids) > MAX_METRICS:
            raise IngestError(f"GENERIC_EVENTS has more than {MAX_METRICS} event types: {NOT_NSYS}")
        rows = []
        for type_id in type_ids:
            self.budget.check()
            if not isinstance(type_id, int):
                continue  # not an event nsys wrote: no GPU metrics there
            # A type's first event can hold a part of its metrics (a clock alone): its keys are the union
            # over its first CATALOGUE_EVENTS events, in the order they first appear.
            keys = {}
            for (data,) in self.con.execute(f"select {text('data', MAX_EVENT_CHARS)} from GENERIC_EVENTS "
                                            "where typeId=? limit ?", (type_id, CATALOGUE_EVENTS)):
                keys.update(dict.fromkeys(_event(data) if data else {}))
                if len(keys) > MAX_METRICS:
                    break
            keys = list(keys)
            if len(keys) > MAX_METRICS or any(len(k) > MAX_NAME for k in keys):
                raise IngestError(f"GENERIC_EVENTS type {type_id} has {len(keys)} keys or a key longer than "
                                  f"{MAX_NAME} characters: {NOT_NSYS}")
            if any(normalise(k)[1] != "raw" for k in keys):  # a GPU metrics event, not some other generic event
                rows.extend((type_id, i, key) for i, key in enumerate(keys))
        return rows

    def _with_clock_scale(self, metric: MetricInfo) -> MetricInfo:
        if metric.conversion != "clock":
            return metric
        values = [v for v, in self._raw_values(metric, 64) if isinstance(v, (int, float)) and v == v]
        return MetricInfo(**{**metric.__dict__, "scale": clock_scale(values)})

    def _raw_values(self, metric: MetricInfo, limit: int):
        if self.era == "gpu_metrics":
            return self.con.execute(f"select {number('value')} from GPU_METRICS where typeId=? and metricId=? limit ?",
                                    (metric.type_id, metric.metric_id, limit)).fetchall()
        rows = self.con.execute(f"select {text('data', MAX_EVENT_CHARS)} from GENERIC_EVENTS where typeId=? limit ?",
                                (metric.type_id, limit))
        return [(_event(d).get(metric.name),) for d, in rows]

    def _gpus(self) -> dict[int, GpuInfo]:
        found = {}
        if "TARGET_INFO_GPU" in self.tables:
            cols = {r[1] for r in self.con.execute("pragma table_info(TARGET_INFO_GPU)")}
            pick = [guarded if c in cols else "NULL" for c, guarded in (
                ("id", number("id")), ("name", text("name", MAX_NAME)), ("uuid", text("uuid", MAX_UUID)),
                ("smCount", number("smCount")))]
            described = self.con.execute(f"select {', '.join(pick)} from TARGET_INFO_GPU limit ?", (MAX_GPUS + 1,))
            for index, name, uuid, sms in described:
                index = as_int(index, "TARGET_INFO_GPU.id")
                if not 0 <= index <= MAX_GPU_INDEX:
                    raise IngestError(f"TARGET_INFO_GPU.id holds {index}, not a GPU index (0-{MAX_GPU_INDEX}): {NOT_NSYS}")
                name = _text(name, "TARGET_INFO_GPU.name", MAX_NAME)
                uuid = _text(uuid, "TARGET_INFO_GPU.uuid", MAX_UUID)
                sms = None if sms is None else as_int(sms, "TARGET_INFO_GPU.smCount")
                if uuid and not uuid.startswith("GPU-"):
                    uuid = f"GPU-{uuid}"  # NVML's spelling, so the exporter matches GPUs by UUID
                found[index] = GpuInfo(index, name or f"GPU {index}", uuid, sms if sms and sms > 0 else None)
            if len(found) > MAX_GPUS:
                raise IngestError(f"TARGET_INFO_GPU describes more than {MAX_GPUS} GPUs: {NOT_NSYS}")
        self.described_gpus = dict(sorted(found.items()))  # with or without metrics (kernels may run there)
        for metric in self.metrics:
            found.setdefault(metric.gpu, GpuInfo(metric.gpu, f"GPU {metric.gpu}", None, None))
        if not self.metrics:  # a kernel trace alone: every GPU the export describes
            return dict(self.described_gpus)
        return {i: found[i] for i in sorted({m.gpu for m in self.metrics})}

    def _start_ns(self) -> int | None:
        if "TARGET_INFO_SESSION_START_TIME" in self.tables:
            row = self.con.execute(f"select {number('utcEpochNs')} from TARGET_INFO_SESSION_START_TIME").fetchone()
            if row and row[0]:
                return as_int(row[0], "TARGET_INFO_SESSION_START_TIME.utcEpochNs")
        return None

    def _sampling_hz(self) -> float | None:
        if "META_DATA_CAPTURE" not in self.tables:
            return None
        row = self.con.execute(f"select {text('value', 64)} from META_DATA_CAPTURE "
                               "where name = 'GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY'").fetchone()
        try:
            hz = float(row[0]) if row else None
        except (TypeError, ValueError):
            return None
        return hz if hz is not None and 0 < hz < 1e9 else None

    @property
    def row_estimate(self) -> int:
        """Rows of the metrics table, from its last rowid: no scan."""
        if self.era is None:
            return 0
        table = "GPU_METRICS" if self.era == "gpu_metrics" else "GENERIC_EVENTS"
        row = self.con.execute(f"select max(rowid) from {table}").fetchone()
        return int(row[0] or 0)  # a rowid is always an integer

    # -- reading --------------------------------------------------------------------------------
    def metric_codes(self, quantities=None) -> list[int]:
        return [m.code for m in self.metrics if quantities is None or m.quantity in quantities]

    def time_range(self) -> tuple[int, int]:
        table = "GPU_METRICS" if self.era == "gpu_metrics" else "GENERIC_EVENTS"
        # Numbers only (comparing blobs would read them): a row of another type is refused when read.
        low, high = self.con.execute(f"select min(timestamp), max(timestamp) from {table} "
                                     "where typeof(timestamp) in ('integer', 'real')").fetchone()
        return as_int(low or 0, f"{table}.timestamp"), as_int(high or 0, f"{table}.timestamp")

    def span(self) -> tuple[int, int] | None:
        """(first, last) timestamp in ns of what the export holds: its GPU metrics, else its kernels."""
        if self.era is not None:
            return self.time_range()
        if "CUPTI_ACTIVITY_KIND_KERNEL" in self.tables:
            low, high = self.con.execute("select min(start), max(end) from CUPTI_ACTIVITY_KIND_KERNEL "
                                         "where typeof(start) = 'integer' and typeof(end) = 'integer'").fetchone()
            if low is not None and high is not None:
                return as_int(low, "CUPTI_ACTIVITY_KIND_KERNEL.start"), as_int(high, "CUPTI_ACTIVITY_KIND_KERNEL.end")
        return None

    def empty_window(self, start_ns, end_ns, what: str = "GPU metric samples") -> IngestError:
        """The error for a window that holds nothing: it says where the capture's data lies."""
        def shown(ns) -> str:
            return "..." if ns is None else f"{ns / 1e9:.3f} s"

        asked = f"{shown(start_ns)} to {shown(end_ns)}" if (start_ns, end_ns) != (None, None) else "the whole capture"
        span = self.span()
        if span is None:
            return IngestError(f"no {what} in this window ({asked}): the export holds none at all")
        low, high = span
        where = f"{low / 1e9:.3f}-{high / 1e9:.3f} s from the capture start"
        if self.start_ns is not None:
            def stamp(ns) -> str:
                return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((self.start_ns + ns) / 1e9))

            where += f" ({stamp(low)} to {stamp(high)})"
        return IngestError(f"no {what} in this window ({asked}): the capture's data spans {where}; "
                           "give --start/--end inside it")

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
        sql = (f"select {number('timestamp')}, typeId, metricId, {number('value')} from GPU_METRICS "
               f"where typeId in ({','.join('?' * len(type_ids))}) and metricId in ({','.join('?' * len(metric_ids))})"
               f"{where}{' order by timestamp' if ordered else ''}")
        cursor = self.con.execute(sql, [*type_ids, *metric_ids, *params])
        import pandas as pd  # here: a reader of grouped samples (sample_arrays) never loads it

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
                "timestamp": _column(frame["timestamp"], hit, np.int64, "GPU_METRICS.timestamp"),
                "gpu": (frame["typeId"].to_numpy()[hit].astype(np.int64) & 0xFF),
                "code": code_of[pos],
                "value": _column(frame["value"], hit, np.float64, "GPU_METRICS.value") * scale_of[pos],
            })
            yield out

    def _generic_chunks(self, codes, start_ns, end_ns, chunk_rows, progress, ordered):
        chosen = [self.metrics[c] for c in codes]
        by_type: dict[int, list[MetricInfo]] = {}
        for m in chosen:
            by_type.setdefault(m.type_id, []).append(m)
        where, params = self._where(start_ns, end_ns)
        sql = (f"select {number('timestamp')}, typeId, {text('data', MAX_EVENT_CHARS)} from GENERIC_EVENTS "
               f"where typeId in ({','.join('?' * len(by_type))})"
               f"{where}{' order by timestamp' if ordered else ''}")
        cursor = self.con.execute(sql, [*by_type, *params])
        per_event = max(1, len(chosen) // max(1, len(by_type)))
        import pandas as pd

        while True:
            rows = cursor.fetchmany(max(1, min(chunk_rows // per_event, EVENT_FETCH_ROWS)))
            if not rows:
                break
            if progress:
                progress(len(rows))
            parts = []
            frame = pd.DataFrame.from_records(rows, columns=["timestamp", "typeId", "data"])
            for type_id, group in frame.groupby("typeId", sort=False):
                wanted = by_type[int(type_id)]
                events = [_event(d) for d in group["data"]]
                # Only the metrics asked for: an event's other keys (any number, up to its size) are never tabled.
                decoded = pd.DataFrame([[event.get(m.name) for m in wanted] for event in events],
                                       columns=range(len(wanted)), dtype=object)
                for i, m in enumerate(wanted):
                    if decoded[i].notna().any():
                        values = pd.to_numeric(decoded[i], errors="coerce").to_numpy(dtype=np.float64)
                        stamps = _column(group["timestamp"], slice(None), np.int64, "GENERIC_EVENTS.timestamp")
                        parts.append(pd.DataFrame({"timestamp": stamps,
                                                   "gpu": m.gpu, "code": m.code, "value": values * m.scale}))
            if parts:
                out = pd.concat(parts, ignore_index=True)
                yield out[out["value"].notna()]

    def sample_arrays(self, quantities, start_ns, end_ns, chunk_rows=DEFAULT_CHUNK_ROWS):
        """(gpu, timestamps, sums, counts) per GPU and chunk, in time order, of the GPU-metrics era: one row per
        sample, grouped by SQLite (no Python object per metric row, no pandas): sums[i, j] is the sum of the
        published values of quantities[j] at timestamps[i] (0 where none), counts[i, j] how many there were.
        The old era is not read here (its JSON payloads: `chunks`)."""
        chosen = [m for m in self.metrics if m.quantity in quantities]
        if self.era != "gpu_metrics" or not chosen:
            return
        where, params = self._where(start_ns, end_ns)
        # value x scale per (typeId, metricId): the same multiplication as the chunks' (integer to double first). The
        # ids are integers the catalogue checked, written into the statement; each distinct scale is one parameter
        # (?1, ?2, ...): a catalogue of MAX_METRICS metrics stays within SQLite's variable limit.
        scales = {scale: n for n, scale in enumerate(sorted({m.scale for m in chosen}), 1)}
        columns = []
        for quantity in quantities:
            case = " ".join(f"when typeId = {int(m.type_id)} and metricId = {int(m.metric_id)} then value * ?{scales[m.scale]}"
                            for m in chosen if m.quantity == quantity) or "when 0 then null"
            columns.append(f"total(case {case} end), count(case {case} end)")
        type_ids = sorted({m.type_id for m in chosen})
        metric_ids = sorted({m.metric_id for m in chosen})
        self._refuse_non_numbers(type_ids, metric_ids, where, params)
        cursor = self.con.execute(
            f"select timestamp, typeId & 255 as gpu, {', '.join(columns)} from GPU_METRICS "
            f"where typeId in ({','.join('?' * len(type_ids))}) and metricId in ({','.join('?' * len(metric_ids))})"
            f"{where} group by timestamp, gpu order by timestamp, gpu", [*scales, *type_ids, *metric_ids, *params])
        width = len(quantities)
        per_fetch = max(1, chunk_rows * 4 // (2 + 2 * width))  # as many cells in flight as chunk_rows of the 4 columns
        while True:
            self.budget.check()
            rows = cursor.fetchmany(per_fetch)
            if not rows:
                return
            stamps = _column(np.array([r[0] for r in rows], dtype=object), slice(None), np.int64, "GPU_METRICS.timestamp")
            gpus = np.fromiter((r[1] for r in rows), np.int64, len(rows))
            cells = np.array([r[2:] for r in rows], dtype=np.float64).reshape(len(rows), width, 2)
            for gpu in sorted(set(gpus.tolist())):  # (np.unique would load numpy.ma: 16-25 ms of every child's start)
                mine = gpus == gpu
                yield gpu, stamps[mine], cells[mine, :, 0], cells[mine, :, 1]

    def _refuse_non_numbers(self, type_ids, metric_ids, where: str, params) -> None:
        """The IngestError for the first value of the chosen metrics that is no number (text, a blob), as a chunk
        names it: the grouped read would sum it as 0 instead."""
        row = self.con.execute(
            f"select {number('value')} from GPU_METRICS where typeId in ({','.join('?' * len(type_ids))}) "
            f"and metricId in ({','.join('?' * len(metric_ids))}){where} "
            "and typeof(value) not in ('integer', 'real', 'null') limit 1", [*type_ids, *metric_ids, *params]).fetchone()
        if row is not None:
            raise IngestError(f"GPU_METRICS.value holds {_shown(row[0])} where a number belongs: {NOT_NSYS}")

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None
        if self.path != self.source_path:
            shutil.rmtree(self.path.parent, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _column(series, rows, dtype, where: str) -> np.ndarray:
    """A column of a chunk (a pandas Series, or an array) as numbers; an IngestError naming the column where
    the export stores text, or NULL timestamps."""
    values = np.asarray(series)[rows]
    if dtype == np.int64 and values.dtype.kind == "f" and np.isnan(values).any():
        raise IngestError(f"{where} holds NULL where a number belongs: {NOT_NSYS}")
    try:
        return values.astype(dtype)
    except (TypeError, ValueError, OverflowError):
        bad = next((v for v in values if not isinstance(v, (int, float))), values[0])
        raise IngestError(f"{where} holds {_shown(bad)} where a number belongs: {NOT_NSYS}") from None


def _event(data) -> dict:
    """An old-era event's JSON payload; anything else reads as an event with no metrics, except one
    too long to read (text() described it as bytes)."""
    if isinstance(data, bytes):
        raise IngestError(f"GENERIC_EVENTS.data holds {data.decode()} where an event of at most {MAX_EVENT_CHARS} "
                          f"characters belongs: {NOT_NSYS}")
    try:
        event = json.loads(data)
    except (TypeError, ValueError, RecursionError):
        return {}
    return event if isinstance(event, dict) else {}


def _text(value, where: str, longest: int) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):  # text() described what is stored instead of reading it
        raise IngestError(f"{where} holds {value.decode()} where a name of at most {longest} characters belongs: "
                          f"{NOT_NSYS}")
    if not isinstance(value, str) or len(value) > longest:
        raise IngestError(f"{where} holds {_shown(value)}{f' ({len(value)} characters)' if isinstance(value, str) else ''}"
                          f" where a name of at most {longest} characters belongs: {NOT_NSYS}")
    return value


def _metric_name(value, where: str) -> str:
    if value is None:
        raise IngestError(f"{where} is NULL where a metric name belongs: {NOT_NSYS}")
    return _text(value, where, MAX_NAME)


def progress_bar(total: int, description: str):
    """A tqdm bar on a terminal; nothing when stderr is a file or a pipe. Returns (update, close)."""
    if not sys.stderr.isatty() or os.environ.get("NSYS_INGEST_NO_PROGRESS"):
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=description, unit="rows", unit_scale=True, leave=False)
    return bar.update, bar.close
