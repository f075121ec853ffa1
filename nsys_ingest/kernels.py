"""CUDA kernel and copy statistics from an export's CUDA trace (nsys profile --trace=cuda), streamed.

Rows of the kernel, memcpy and memset tables are read in time order `chunk_rows` at a time per table,
merged, and reduced with numpy, so memory depends on the number of GPUs and processes, not of rows: a
one-hour trace of 24 processes has tens of millions. Per GPU: idle gaps with neither a kernel nor a
copy running (exact: the busy interval is carried across chunks), the kernel time against the busy
time (overlap), the same for short kernels only (only MPS overlaps those), copies and memsets by
kind, and duration and grid-size histograms; per process the same histograms and rates.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nsys_ingest.analysis import nearest_rank_bin
from nsys_ingest.reader import (DEFAULT_CHUNK_ROWS, MAX_GPU_INDEX, MAX_GPUS, MAX_NAME, NOT_NSYS, Export, IngestError,
                                 as_int, number, text, window_clauses)
from nsys_ingest.verdicts import LONG_GAP_S, SHORT_KERNEL_S

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
COPY_TABLES = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
NO_KERNEL_TRACE = ("this export has no CUDA kernel trace: add --trace=cuda to the nsys command "
                   "(nsys profile --trace=cuda --gpu-metrics-devices=all ...) to see kernels per process")
LONG_GAP_NS = int(LONG_GAP_S * 1e9)  # an idle gap this long waits on the host
SHORT_KERNEL_NS = int(SHORT_KERNEL_S * 1e9)  # kernels this short never span another context's time slice
BINS_PER_DECADE = 100  # log histograms: 2.3 % resolution; integers up to 43 get a bin of their own
DECADES = 13  # 1 ns .. 10^13 ns (durations); 1 .. 10^13 blocks (grids)
# What one export's trace may hold (each process costs two histograms, ~21 KB, and a row of the answer):
MAX_PROCESSES = 1024  # (process, GPU) pairs with kernels
MAX_COPY_KINDS = 256  # rows of ENUM_CUDA_MEMCPY_OPER: nsys writes about ten
MAX_LISTED = 65536  # rows of PROCESSES and TARGET_INFO_CUDA_DEVICE read


class LogHistogram:
    """Counts of positive values in logarithmic bins: quantiles to 2.3 %, in constant memory."""

    def __init__(self):
        self.counts = np.zeros(BINS_PER_DECADE * DECADES + 1, dtype=np.int64)

    def add(self, values: np.ndarray) -> None:
        if values.size:
            bins = np.floor(np.log10(np.maximum(values, 1)) * BINS_PER_DECADE + 1e-9).astype(np.int64)
            self.counts += np.bincount(bins.clip(0, len(self.counts) - 1), minlength=len(self.counts))

    def quantile(self, q: float) -> float | None:
        found = nearest_rank_bin(self.counts, q)
        return None if found is None else float(10 ** (found / BINS_PER_DECADE))

    @classmethod
    def merged(cls, histograms) -> "LogHistogram":
        out = cls()
        for histogram in histograms:
            out.counts += histogram.counts
        return out


@dataclass
class ProcessKernels:
    pid: int
    name: str
    kernels: int = 0
    kernel_ns: int = 0
    footprint_ns: float = 0.0  # sum of duration x share of the SMs its grid can occupy
    durations: LogHistogram = field(default_factory=LogHistogram)
    grids: LogHistogram = field(default_factory=LogHistogram)


@dataclass
class Busy:
    """The union of intervals fed in start order, chunk by chunk: busy time and the idle gaps
    between intervals, exact across chunks (the latest end seen so far is carried over)."""

    origin_ns: int | None = None  # where the union starts: the window's start, or the first interval
    busy_until: int | None = None  # the latest end seen so far
    idle_ns: int = 0
    long_idle_ns: int = 0  # idle time in gaps of LONG_GAP_NS or more
    gaps: int = 0
    work_ns: int = 0  # the intervals' own durations, summed: above the busy time where they overlap
    count: int = 0

    def add(self, begin: np.ndarray, end: np.ndarray) -> None:
        if not begin.size:
            return
        if self.busy_until is None:
            self.origin_ns = int(begin[0]) if self.origin_ns is None else self.origin_ns
            self.busy_until = self.origin_ns
        # Busy up to the latest end seen before each interval: one starting later leaves a gap.
        busy_before = np.maximum.accumulate(np.concatenate(([self.busy_until], end)))[:-1]
        self._gap(begin - busy_before)
        self.busy_until = max(self.busy_until, int(end.max()))
        self.work_ns += int((end - begin).sum())
        self.count += int(begin.size)

    def close(self, until: int) -> None:
        """The idle tail after the last interval, up to the window's end."""
        if self.busy_until is not None and until > self.busy_until:
            self._gap(np.array([until - self.busy_until]))
            self.busy_until = until

    @property
    def busy_ns(self) -> int:
        return 0 if self.busy_until is None else self.busy_until - self.origin_ns - self.idle_ns

    def _gap(self, gaps: np.ndarray) -> None:
        gaps = gaps[gaps > 0]
        self.idle_ns += int(gaps.sum())
        self.long_idle_ns += int(gaps[gaps >= LONG_GAP_NS].sum())
        self.gaps += int(gaps.size)


@dataclass
class Copies:
    """Memory copies and memsets on one GPU: their own busy union, counts and bytes per kind."""

    busy: Busy = field(default_factory=Busy)
    kinds: dict[str, list[int]] = field(default_factory=dict)  # kind -> [count, bytes, ns]
    gpids: set[int] = field(default_factory=set)  # the processes that copied

    @property
    def count(self) -> int:
        return sum(c for c, _b, _ns in self.kinds.values())

    @property
    def bytes(self) -> int:
        return sum(b for _c, b, _ns in self.kinds.values())


@dataclass
class GpuKernels:
    gpu: int
    sm_count: int | None
    window_ns: int = 0  # from the window's start (or this GPU's first work) to the window's end
    work: Busy = field(default_factory=Busy)  # kernels and copies: the GPU's idle gaps
    kernel_busy: Busy = field(default_factory=Busy)  # kernels only: their overlap
    short_busy: Busy = field(default_factory=Busy)  # kernels under SHORT_KERNEL_NS only (MPS test)
    copies: Copies | None = None  # None: the export has no copy or memset tables
    processes: dict[int, ProcessKernels] = field(default_factory=dict)

    # The GPU's kernel totals are its processes' totals: derived, never counted twice.
    @property
    def kernels(self) -> int:
        return sum(p.kernels for p in self.processes.values())

    @property
    def kernel_ns(self) -> int:
        return sum(p.kernel_ns for p in self.processes.values())

    @property
    def footprint_ns(self) -> float:
        return sum(p.footprint_ns for p in self.processes.values())

    @property
    def durations(self) -> LogHistogram:
        return LogHistogram.merged(p.durations for p in self.processes.values())

    @property
    def grids(self) -> LogHistogram:
        return LogHistogram.merged(p.grids for p in self.processes.values())


def has_kernel_trace(export: Export) -> bool:
    """A CUDA trace: kernels, or at least copies (a loop of copies launches no kernel)."""
    return bool({KERNEL_TABLE, *COPY_TABLES} & export.tables)


def kernel_row_estimate(export: Export) -> int:
    """Rows of the kernel and copy tables, from their last rowids: no scan."""
    return sum(int(export.con.execute(f"select max(rowid) from {table}").fetchone()[0] or 0)
               for table in (KERNEL_TABLE, *COPY_TABLES) if table in export.tables)


def _listed(export: Export, table: str, sql: str, most: int, what: str) -> list:
    """At most `most` rows of `sql`; more is refused with one line."""
    rows = export.con.execute(f"{sql} limit ?", (most + 1,)).fetchall()
    if len(rows) > most:
        raise IngestError(f"{table} lists more than {most} {what}: {NOT_NSYS}")
    return rows


def _copy_kind_names(export: Export) -> dict[int, str]:
    names = {MEMSET_KIND: "memset"}
    if "ENUM_CUDA_MEMCPY_OPER" in export.tables:
        rows = _listed(export, "ENUM_CUDA_MEMCPY_OPER", f"select {number('id')}, {text('label', MAX_NAME)} "
                       "from ENUM_CUDA_MEMCPY_OPER where id is not null", MAX_COPY_KINDS, "copy kinds")
        names.update({as_int(i, "ENUM_CUDA_MEMCPY_OPER.id"): _name(label, "ENUM_CUDA_MEMCPY_OPER.label")
                      for i, label in rows})
    return names


def _name(value, where: str) -> str:
    if isinstance(value, bytes):  # text() described what is stored instead of reading it
        raise IngestError(f"{where} holds {value.decode()} where a name of at most {MAX_NAME} characters belongs: "
                          f"{NOT_NSYS}")
    return "?" if value is None else str(value)


def _cuda_devices(export: Export) -> dict[tuple[int, int], int]:
    """(pid, CUDA device ID in that process) -> GPU: CUDA_VISIBLE_DEVICES renumbers devices per process."""
    if "TARGET_INFO_CUDA_DEVICE" not in export.tables:
        return {}
    rows = _listed(export, "TARGET_INFO_CUDA_DEVICE", f"select {number('pid')}, {number('cudaId')}, {number('gpuId')} "
                   "from TARGET_INFO_CUDA_DEVICE where gpuId is not null", MAX_LISTED, "devices")
    return {(as_int(pid, "TARGET_INFO_CUDA_DEVICE.pid"), as_int(cuda, "TARGET_INFO_CUDA_DEVICE.cudaId")):
            _gpu_index(as_int(gpu, "TARGET_INFO_CUDA_DEVICE.gpuId"), "TARGET_INFO_CUDA_DEVICE.gpuId")
            for pid, cuda, gpu in rows}


def _gpu_index(value: int, where: str) -> int:
    if not 0 <= value <= MAX_GPU_INDEX:
        raise IngestError(f"{where} holds {value}, not a GPU index (0-{MAX_GPU_INDEX}): {NOT_NSYS}")
    return value


def _process_names(export: Export) -> dict[int, str]:
    if "PROCESSES" not in export.tables:
        return {}
    # A name is cut at MAX_NAME characters (substr reads at most the value's declared length, itself capped).
    rows = _listed(export, "PROCESSES", f"select {number('globalPid')}, iif(typeof(name) = 'text', substr(name, 1, "
                   f"{MAX_NAME}), null) from PROCESSES where globalPid is not null", MAX_LISTED, "processes")
    return {as_int(g, "PROCESSES.globalPid"): name or "?" for g, name in rows}


def kernel_stats(export: Export, start_ns=None, end_ns=None, chunk_rows=DEFAULT_CHUNK_ROWS, progress=None):
    """Per GPU statistics of the kernels and copies inside [start_ns, end_ns] (clipped to it), and
    the window they describe: (dict gpu -> GpuKernels, (window start, window end)); the window is
    their own span where no bound is given. Raises IngestError when the export has no CUDA trace."""
    if not has_kernel_trace(export):
        raise IngestError(NO_KERNEL_TRACE)
    devices, names = _cuda_devices(export), _process_names(export)
    clauses, params = window_clauses(start_ns, end_ns, "start", "end")
    where = f" where {' and '.join(clauses)}" if clauses else ""
    streams = [(f"select {columns} from {table}{where}", kind) for table, columns, kind in _STREAMS
               if table in export.tables]
    has_copies = bool(set(COPY_TABLES) & export.tables)

    def reduce(order):
        cursors = [(export.con.execute(sql + order, params), kind) for sql, kind in streams]
        rows = _merged(cursors, chunk_rows, progress)
        return _reduce(export, rows, start_ns, end_ns, devices, names, has_copies)

    try:
        return reduce("")
    except _OutOfOrder:  # nsys writes activities in start order; an export that is not gets sorted by SQLite
        return reduce(" order by start")


class _OutOfOrder(Exception):
    pass


ROW = np.dtype([("start", "i8"), ("end", "i8"), ("device", "i8"), ("gpid", "i8"), ("blocks", "i8"),
                ("bytes", "i8"), ("kind", "i8")])
KERNEL_KIND, MEMSET_KIND = -1, -2  # `kind` of a row: a kernel, a memset, or a copy's copyKind (0 and up)
# Per table: the columns read (the fewer, the faster SQLite hands rows over) and the `kind` of its rows,
# None where the row brings its own (a copy's copyKind).
# Every column through reader.number(): a value of another type arrives as text, never as its content.
_COMMON = f"{number('start')}, {number('end')}, {number('deviceId')}, {number('globalPid', '0')}"
_STREAMS = (
    (KERNEL_TABLE, f"{_COMMON}, {number('gridX')} * {number('gridY')} * {number('gridZ')}", KERNEL_KIND),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", f"{_COMMON}, {number('bytes', '0')}, {number('copyKind', '0')}", None),
    ("CUPTI_ACTIVITY_KIND_MEMSET", f"{_COMMON}, {number('bytes', '0')}", MEMSET_KIND),
)
_READ = {KERNEL_KIND: ("start", "end", "device", "gpid", "blocks"), MEMSET_KIND: ("start", "end", "device", "gpid", "bytes"),
         None: ("start", "end", "device", "gpid", "bytes", "kind")}


def _rows(rows: list, kind: int | None) -> np.ndarray:
    """One table's rows as ROW: fields it has no column for are 0, `kind` is the table's own."""
    names = _READ[kind]
    try:
        read = np.fromiter(rows, dtype=np.dtype([(name, "i8") for name in names]), count=len(rows))
    except (TypeError, ValueError, OverflowError):  # untrusted input: text or NULL where integers belong
        table = KERNEL_TABLE if kind == KERNEL_KIND else "a memory copy or memset table"
        raise IngestError(f"{table} holds a start, end, deviceId or size that is not an integer: {NOT_NSYS}") from None
    out = np.zeros(len(rows), dtype=ROW)
    for name in names:
        out[name] = read[name]
    if kind is not None:
        out["kind"] = kind
    return out


def _merged(cursors, chunk_rows, progress):
    """Chunks of rows from several (cursor, kind) streams, each in start order, merged into one start
    order with at most chunk_rows rows per cursor in memory. Raises _OutOfOrder when one is not in order."""
    pending = [np.empty(0, dtype=ROW) for _ in cursors]
    is_open = [True] * len(cursors)
    last_start = [None] * len(cursors)
    while True:
        for i, (cursor, kind) in enumerate(cursors):
            if is_open[i] and not pending[i].size:
                rows = cursor.fetchmany(chunk_rows)
                if not rows:
                    is_open[i] = False
                    continue
                if progress:
                    progress(len(rows))
                chunk = _rows(rows, kind)
                del rows
                starts = chunk["start"]
                if (last_start[i] is not None and starts[0] < last_start[i]) or np.any(starts[1:] < starts[:-1]):
                    raise _OutOfOrder
                last_start[i] = int(starts[-1])
                pending[i] = chunk
        if not any(p.size for p in pending):
            return
        # Rows up to the earliest last start among the cursors still open can come no later than any row to come.
        bound = min((int(p["start"][-1]) for p, o in zip(pending, is_open) if o), default=None)
        parts = []
        for i, p in enumerate(pending):
            cut = p.size if bound is None else int(np.searchsorted(p["start"], bound, side="right"))
            parts.append(p[:cut])
            pending[i] = p[cut:]
        parts = [part for part in parts if part.size]
        if len(parts) == 1:  # one table in this stretch (a kernel trace without copies): already in order
            yield parts[0]
            continue
        merged = np.concatenate(parts)
        yield merged[np.argsort(merged["start"], kind="stable")]


def _reduce(export, chunks, start_ns, end_ns, devices, names, has_copies):
    gpus: dict[int, GpuKernels] = {}
    span = [None, None]
    kind_names = _copy_kind_names(export) if has_copies else {}
    for chunk in chunks:
        begin = chunk["start"] if start_ns is None else np.maximum(chunk["start"], start_ns)
        end = chunk["end"] if end_ns is None else np.minimum(chunk["end"], end_ns)
        end = np.maximum(end, begin)  # zero-length (or clock-skewed) activities cover nothing
        span[0] = int(begin[0]) if span[0] is None else span[0]
        span[1] = int(end.max()) if span[1] is None else max(span[1], int(end.max()))
        gpu_of = _gpu_per_row(pid_of(chunk["gpid"]), chunk["device"], devices)
        for gpu in np.unique(gpu_of):
            if len(gpus) >= MAX_GPUS and int(gpu) not in gpus:
                raise IngestError(f"kernels or copies on more than {MAX_GPUS} GPUs in one export: {NOT_NSYS}")
            mine = gpu_of == gpu
            acc = gpus.get(int(gpu))
            if acc is None:
                info = export.gpus.get(int(gpu)) or export.described_gpus.get(int(gpu))
                acc = gpus[int(gpu)] = GpuKernels(int(gpu), info.sm_count if info else None,
                                                  copies=Copies() if has_copies else None)
                acc.work.origin_ns = start_ns  # the window starts at its bound, or at this GPU's first work
            others = sum(len(g.processes) for g in gpus.values()) - len(acc.processes)
            _add(acc, chunk[mine], begin[mine], end[mine], names, kind_names, MAX_PROCESSES - others)
    low = start_ns if start_ns is not None else span[0]
    high = end_ns if end_ns is not None else span[1]
    for acc in gpus.values():
        acc.work.close(high)
        acc.window_ns = high - acc.work.origin_ns
    return gpus, (low, high)


def pid_of(global_pid):
    """The process ID inside nsys' serialized GlobalId (bits 24-47); arrays too."""
    return (global_pid >> 24) & 0xFFFFFF


def _gpu_per_row(pids: np.ndarray, device: np.ndarray, devices: dict) -> np.ndarray:
    bad = (device < 0) | (device > MAX_GPU_INDEX)
    if bad.any():
        raise IngestError(f"a kernel or copy's deviceId holds {int(device[bad][0])}, not a GPU index "
                          f"(0-{MAX_GPU_INDEX}): {NOT_NSYS}")
    if not devices:
        return device
    key = pids * 4096 + device  # one integer per (process, CUDA device): a 1-D unique is a hash, not a sort
    uniques, inverse = np.unique(key, return_inverse=True)
    mapped = np.array([devices.get((int(k) // 4096, int(k) % 4096), int(k) % 4096) for k in uniques])
    return mapped[inverse]


def _add(acc: GpuKernels, rows, begin, end, names, kind_names, room: int) -> None:
    """Adds one chunk's rows of this GPU; `room`: how many processes this GPU may hold in all."""
    acc.work.add(begin, end)
    kernel = rows["kind"] == KERNEL_KIND
    if acc.copies is not None and not kernel.all():
        _add_copies(acc.copies, rows[~kernel], begin[~kernel], end[~kernel], kind_names)
    if not kernel.any():
        return
    begin, end, blocks, gpids = begin[kernel], end[kernel], rows["blocks"][kernel], rows["gpid"][kernel]
    duration = end - begin
    acc.kernel_busy.add(begin, end)
    short = duration < SHORT_KERNEL_NS
    acc.short_busy.add(begin[short], end[short])
    # A block runs on one SM: a grid of B blocks can occupy at most min(B, SMs) of them.
    weighted = duration * (np.minimum(blocks / acc.sm_count, 1.0) if acc.sm_count else 1.0)
    new = np.setdiff1d(np.unique(gpids), np.fromiter(acc.processes, np.int64, len(acc.processes)))
    if len(acc.processes) + new.size > room:  # checked before any is added: memory stays bounded
        raise IngestError(f"kernels of more than {MAX_PROCESSES} processes in one export (a process counted once per "
                          "GPU): profile fewer processes at once (one nsys profile per job)")
    for gpid in np.unique(gpids):
        mine = gpids == gpid
        proc = acc.processes.setdefault(int(gpid), ProcessKernels(int(pid_of(gpid)), names.get(int(gpid), "?")))
        proc.kernels += int(mine.sum())
        proc.kernel_ns += int(duration[mine].sum())
        proc.footprint_ns += float(np.sum(weighted[mine]))
        proc.durations.add(duration[mine])
        proc.grids.add(blocks[mine])


def _add_copies(copies: Copies, rows, begin, end, kind_names) -> None:
    copies.busy.add(begin, end)
    copies.gpids.update(int(g) for g in np.unique(rows["gpid"]))
    kinds, sizes = rows["kind"], rows["bytes"]
    for kind in np.unique(kinds):
        mine = kinds == kind
        totals = copies.kinds.setdefault(kind_names.get(int(kind), f"kind {int(kind)}"), [0, 0, 0])
        totals[0] += int(mine.sum())
        totals[1] += int(sizes[mine].sum())
        totals[2] += int((end[mine] - begin[mine]).sum())
