"""Running nsys and reading its exports, for every exporter part that does (the nsys spatial source,
the context-switch source, uploads).

nsys steps run in their own process group, bounded in time, and are stopped with what they started;
an export is opened as untrusted input (every problem is one IngestError line). nsys_ingest is imported
where an export is read, not here: its pandas costs memory that an exporter reading no export never pays.
"""
from __future__ import annotations

import os
import selectors
import subprocess
import threading
import time
from pathlib import Path

from exporter.snapshot import GpuIdentity, SpatialReading, as_ratio

READ_BUDGET_S = 60.0  # what validating or publishing one export may cost; a 512 MB export takes ~5 s
STEP_TAIL_BYTES = 64 << 10  # bytes of a step's output read back by default: its last lines, where nsys says why


def spatial_reading(row, start: float, end: float) -> SpatialReading:
    """A bucket of nsys_ingest.analysis.bucket_means (which already sums DRAM read and write)."""
    def value(name):
        return as_ratio(row.get(name))

    return SpatialReading(source="nsys", window_start=start, window_end=end, sm_active=value("sm_active"),
                          sm_occupancy=value("sm_occupancy"), graphics_engine_active=value("gr_active"),
                          tensor_active=value("tensor_active"), dram_active=value("dram_active"),
                          time_utilization=value("gr_active"))


def identity_of(info) -> GpuIdentity:
    return GpuIdentity(info.index, info.label_uuid, info.name)


def read_export(path, work, nsys: str = "nsys", require_metrics: bool = True, budget=None):
    """work(export) on the export at `path`, opened as untrusted input: every problem (the reader's,
    SQLite's, one nobody foresaw) is an IngestError with one line, never a traceback."""
    import sqlite3  # here: an exporter that reads no export never loads SQLite

    from nsys_ingest.reader import Export, IngestError

    try:
        with Export(path, nsys=nsys, require_metrics=require_metrics, budget=budget) as export:
            try:
                return work(export)
            except sqlite3.DatabaseError as exc:
                raise export.explain(exc) from None
    except IngestError:
        raise
    except Exception as exc:  # noqa: BLE001 - a form of export nobody foresaw: bad input, not a crash
        raise IngestError(f"unreadable export ({type(exc).__name__}: {str(exc)[:200]})") from None


def windows_of(export, window_s: float) -> dict[str, tuple[GpuIdentity, SpatialReading]]:
    """Per GPU UUID: the mean of the export's last `window_s` seconds (of that GPU's, where its samples
    end earlier), placed in wall-clock time."""
    _, last = export.time_range()
    out = _windows_ending(export, window_s, last)
    # A GPU whose samples end earlier (its capture stopped first) gets its own last window, not none.
    for gpu, gpu_last in _last_sample_per_gpu(export, {i for i, info in export.gpus.items()
                                                       if info.label_uuid not in out}).items():
        out.update({uuid: found for uuid, found in _windows_ending(export, window_s, gpu_last).items()
                    if uuid == export.gpus[gpu].label_uuid})
    return out


def _windows_ending(export, window_s: float, last: int) -> dict[str, tuple[GpuIdentity, SpatialReading]]:
    from nsys_ingest.analysis import bucket_means

    start_ns = max(0, last - int(window_s * 1e9))
    means = bucket_means(export, window_s + 1.0, start_ns=start_ns, end_ns=last)  # one bucket: the whole window
    out = {}
    for gpu, rows in means.groupby("gpu"):
        info = export.gpus[int(gpu)]
        row = rows.iloc[-1].to_dict()
        begin, end = (float(x) for x in export.wall_seconds([start_ns, last]))
        out[info.label_uuid] = (identity_of(info), spatial_reading(row, begin, end))
    return out


def _last_sample_per_gpu(export, gpus: set[int]) -> dict[int, int]:
    """The newest sample's timestamp of each of `gpus` that has metric samples at all."""
    from nsys_ingest.reader import as_int

    table = "GPU_METRICS" if export.era == "gpu_metrics" else "GENERIC_EVENTS"
    out = {}
    for gpu in sorted(gpus):
        type_ids = sorted({m.type_id for m in export.metrics if m.gpu == gpu})
        if not type_ids:
            continue
        (last,) = export.con.execute(f"select max(timestamp) from {table} where typeId in "
                                     f"({','.join('?' * len(type_ids))})", type_ids).fetchone()
        if last is not None:
            out[gpu] = as_int(last, f"{table}.timestamp")
    return out


def last_window(path: Path, window_s: float, nsys: str = "nsys",
                budget=None) -> dict[str, tuple[GpuIdentity, SpatialReading]]:
    return read_export(path, lambda export: windows_of(export, window_s), nsys, budget=budget)


class CaptureError(RuntimeError):
    """An nsys step that failed as a whole: one line why."""


class NsysRunner:
    """Runs nsys steps (profile, export, the attribution's child) in their own process group, bounded in time;
    `stop()` ends a step in progress with what it started (nsys leaves a launcher and the traced `sleep`).
    Only the last `keep` bytes of what a step prints are kept as it is read: its progress bars, a child's
    warnings cost the exporter no memory beyond that (bench/RESULTS.md, "The exporter's memory after a
    context-switch window")."""

    def __init__(self, stopping: threading.Event):
        self.stopping = stopping  # set: no new step starts, and a failing step is no error
        self._running: subprocess.Popen | None = None

    def run(self, cmd: list[str], timeout: float, what: str, keep: int = STEP_TAIL_BYTES) -> str:
        """The step's output (stdout and stderr together, its last `keep` bytes); "" when stopping."""
        if self.stopping.is_set():
            return ""
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self._running = proc
        try:
            out = _tail_of(proc, timeout, keep).decode(errors="replace")
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise CaptureError(f"{what} did not finish within {timeout:g} s; it was stopped") from None
        finally:
            proc.stdout.close()
            self._running = None
        if proc.returncode != 0 and not self.stopping.is_set():
            raise CaptureError(f"{what} failed (exit {proc.returncode}): {(last_line(out) or 'no output')[:300]}")
        return out

    def stop(self) -> None:
        self.stopping.set()
        proc = self._running
        if proc is not None:
            _kill(proc)


def last_line(out: str) -> str:
    """The last line of a step's output that is not blank, stripped ("" for none): found from the end, without
    a list of every line."""
    return out.rstrip().rpartition("\n")[2].strip()


def _tail_of(proc: subprocess.Popen, timeout: float, keep: int) -> bytes:
    """The last `keep` bytes `proc` writes until it ends; subprocess.TimeoutExpired past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    tail = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            if not selector.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            tail += chunk
            if len(tail) > 2 * keep:  # cut now and then, not at every chunk
                del tail[:-keep]
    proc.wait(max(0.0, deadline - time.monotonic()))
    return bytes(tail[-keep:])


def _kill(proc: subprocess.Popen) -> None:
    """Stops nsys and what it started (its own process group: start_new_session)."""
    try:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
