"""CUDA kernel statistics from an export's kernel trace (nsys profile --trace=cuda), streamed.

Rows are read in time order `chunk_rows` at a time and reduced with numpy, so memory depends on the
number of GPUs and processes, not of kernels: a one-hour trace of 24 processes has tens of millions
of rows. Per GPU: idle gaps between kernels (exact: the busy interval is carried across chunks),
the kernel time against the busy time (kernels of several processes overlap only under MPS), and
duration and grid-size histograms; per process the same histograms and rates.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nsys_ingest.analysis import nearest_rank_bin
from nsys_ingest.reader import DEFAULT_CHUNK_ROWS, NOT_NSYS, Export, IngestError, window_clauses
from nsys_ingest.verdicts import LONG_GAP_S

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
NO_KERNEL_TRACE = ("this export has no CUDA kernel trace: add --trace=cuda to the nsys command "
                   "(nsys profile --trace=cuda --gpu-metrics-devices=all ...) to see kernels per process")
LONG_GAP_NS = int(LONG_GAP_S * 1e9)  # an idle gap this long waits on the host
BINS_PER_DECADE = 100  # log histograms: 2.3 % resolution; integers up to 43 get a bin of their own
DECADES = 13  # 1 ns .. 10^13 ns (durations); 1 .. 10^13 blocks (grids)


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
class GpuKernels:
    gpu: int
    sm_count: int | None
    first_ns: int | None = None
    window_ns: int = 0  # from the window's start (or this GPU's first kernel) to the window's end
    busy_until: int | None = None  # the latest kernel end seen so far (time order)
    idle_ns: int = 0
    long_idle_ns: int = 0
    gaps: int = 0
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
    return KERNEL_TABLE in export.tables


def kernel_row_estimate(export: Export) -> int:
    """Rows of the kernel table, from its last rowid: no scan."""
    if not has_kernel_trace(export):
        return 0
    return int(export.con.execute(f"select max(rowid) from {KERNEL_TABLE}").fetchone()[0] or 0)


def _cuda_devices(export: Export) -> dict[tuple[int, int], int]:
    """(pid, CUDA device ID in that process) -> GPU: CUDA_VISIBLE_DEVICES renumbers devices per process."""
    if "TARGET_INFO_CUDA_DEVICE" not in export.tables:
        return {}
    rows = export.con.execute("select pid, cudaId, gpuId from TARGET_INFO_CUDA_DEVICE where gpuId is not null")
    return {(int(pid), int(cuda)): int(gpu) for pid, cuda, gpu in rows}


def _process_names(export: Export) -> dict[int, str]:
    if "PROCESSES" not in export.tables:
        return {}
    return {int(g): name or "?" for g, name in export.con.execute("select globalPid, name from PROCESSES")
            if g is not None}


def kernel_stats(export: Export, start_ns=None, end_ns=None, chunk_rows=DEFAULT_CHUNK_ROWS, progress=None):
    """Per GPU statistics of the kernels inside [start_ns, end_ns] (clipped to it), and the window
    they describe: (dict gpu -> GpuKernels, (window start, window end)); the window is the kernels'
    own span where no bound is given. Raises IngestError when the export has no kernel trace."""
    if not has_kernel_trace(export):
        raise IngestError(NO_KERNEL_TRACE)
    devices, names = _cuda_devices(export), _process_names(export)
    clauses, params = window_clauses(start_ns, end_ns, "start", "end")
    where = f" where {' and '.join(clauses)}" if clauses else ""
    sql = (f"select start, end, deviceId, coalesce(globalPid, 0), gridX * gridY * gridZ from {KERNEL_TABLE}{where}")
    try:
        return _reduce(export, export.con.execute(sql, params), start_ns, end_ns, chunk_rows, progress, devices, names)
    except _OutOfOrder:  # nsys writes kernels in start order; an export that is not gets sorted by SQLite
        return _reduce(export, export.con.execute(sql + " order by start", params), start_ns, end_ns, chunk_rows,
                       progress, devices, names)


class _OutOfOrder(Exception):
    pass


ROW = np.dtype([("start", "i8"), ("end", "i8"), ("device", "i8"), ("gpid", "i8"), ("blocks", "i8")])


def _reduce(export, cursor, start_ns, end_ns, chunk_rows, progress, devices, names):
    gpus: dict[int, GpuKernels] = {}
    last_start = None
    span = [None, None]
    while True:
        rows = cursor.fetchmany(chunk_rows)
        if not rows:
            break
        if progress:
            progress(len(rows))
        try:
            chunk = np.fromiter(rows, dtype=ROW, count=len(rows))
        except (TypeError, ValueError, OverflowError):  # untrusted input: text or NULL where integers belong
            raise IngestError(f"{KERNEL_TABLE} holds a start, end, deviceId or grid size that is not an integer: "
                              f"{NOT_NSYS}") from None
        del rows
        starts = chunk["start"]
        if (last_start is not None and starts[0] < last_start) or np.any(starts[1:] < starts[:-1]):
            raise _OutOfOrder
        last_start = int(starts[-1])
        begin = starts if start_ns is None else np.maximum(starts, start_ns)
        end = chunk["end"] if end_ns is None else np.minimum(chunk["end"], end_ns)
        end = np.maximum(end, begin)  # zero-length (or clock-skewed) kernels cover nothing
        span[0] = int(begin[0]) if span[0] is None else span[0]
        span[1] = int(end.max()) if span[1] is None else max(span[1], int(end.max()))
        gpu_of = _gpu_per_row(pid_of(chunk["gpid"]), chunk["device"], devices)
        for gpu in np.unique(gpu_of):
            mine = gpu_of == gpu
            info = export.gpus.get(int(gpu)) or export.described_gpus.get(int(gpu))
            acc = gpus.setdefault(int(gpu), GpuKernels(int(gpu), info.sm_count if info else None))
            _add(acc, begin[mine], end[mine], chunk["blocks"][mine], chunk["gpid"][mine], start_ns, names)
    low = start_ns if start_ns is not None else span[0]
    high = end_ns if end_ns is not None else span[1]
    for acc in gpus.values():  # the idle tail after each GPU's last kernel, up to the window's end
        if high > acc.busy_until:
            _gap(acc, np.array([high - acc.busy_until]))
        acc.window_ns = high - (low if start_ns is not None else acc.first_ns)
    return gpus, (low, high)


def pid_of(global_pid):
    """The process ID inside nsys' serialized GlobalId (bits 24-47); arrays too."""
    return (global_pid >> 24) & 0xFFFFFF


def _gpu_per_row(pids: np.ndarray, device: np.ndarray, devices: dict) -> np.ndarray:
    if not devices:
        return device
    key = pids * 4096 + device  # one integer per (process, CUDA device): a 1-D unique is a hash, not a sort
    uniques, inverse = np.unique(key, return_inverse=True)
    mapped = np.array([devices.get((int(k) // 4096, int(k) % 4096), int(k) % 4096) for k in uniques])
    return mapped[inverse]


def _gap(acc: GpuKernels, gaps: np.ndarray) -> None:
    gaps = gaps[gaps > 0]
    acc.idle_ns += int(gaps.sum())
    acc.long_idle_ns += int(gaps[gaps >= LONG_GAP_NS].sum())
    acc.gaps += int(gaps.size)


def _add(acc: GpuKernels, begin, end, blocks, gpids, start_ns, names) -> None:
    if acc.busy_until is None:  # the window starts at its bound, or at this GPU's first kernel
        acc.first_ns = int(begin[0])
        acc.busy_until = int(start_ns) if start_ns is not None else int(begin[0])
    # The GPU is busy up to the latest end seen before each kernel: a kernel starting later leaves a gap.
    busy_before = np.maximum.accumulate(np.concatenate(([acc.busy_until], end)))[:-1]
    _gap(acc, begin - busy_before)
    acc.busy_until = max(acc.busy_until, int(end.max()))
    duration = end - begin
    # A block runs on one SM: a grid of B blocks can occupy at most min(B, SMs) of them.
    weighted = duration * (np.minimum(blocks / acc.sm_count, 1.0) if acc.sm_count else 1.0)
    for gpid in np.unique(gpids):
        mine = gpids == gpid
        proc = acc.processes.setdefault(int(gpid), ProcessKernels(int(pid_of(gpid)), names.get(int(gpid), "?")))
        proc.kernels += int(mine.sum())
        proc.kernel_ns += int(duration[mine].sum())
        proc.footprint_ns += float(np.sum(weighted[mine]))
        proc.durations.add(duration[mine])
        proc.grids.add(blocks[mine])
