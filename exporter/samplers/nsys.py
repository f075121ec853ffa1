"""Nsight Systems spatial source: replayed, watched, uploaded or live GPU-metrics exports.

- replay (--replay FILE): a recorded export published as a live stream, in a loop, one bucket of
  the export per tick, so a host without GPUs can show the whole stack and fire its alerts;
- watch (--nsys-watch-dir): the newest export in a directory; its last window per GPU is published
  with its capture time (old data is visible as old through gpu_spatial_sample_timestamp_seconds);
- upload (POST /api/v1/nsys, with a token): validated exports land in the watched spool directory;
- live (--nsys-live): `nsys profile` of the GPUs that no other source serves, in short windows.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
import uuid as uuidlib
from pathlib import Path

from exporter.sampler import SamplerDefaults
from exporter.snapshot import (ERROR, OK, UNSUPPORTED, CollectorHealth, GpuIdentity, LogOnce, SourceResult,
                               SpatialReading, as_ratio, loggable)

log = logging.getLogger(__name__)
SETTLE_S = 2.0  # a watched file must be this old before it is read: nsys may still be writing it
MAX_WATCHED_ENTRIES = 100_000  # directory entries looked at per tick: a directory of millions costs no more
READ_BUDGET_S = 60.0  # what validating or publishing one export may cost; a 512 MB export takes ~5 s


def _reading(row, start: float, end: float) -> SpatialReading:
    """A bucket of nsys_ingest.analysis.bucket_means (which already sums DRAM read and write)."""
    value = lambda name: as_ratio(row.get(name))  # noqa: E731
    return SpatialReading(source="nsys", window_start=start, window_end=end, sm_active=value("sm_active"),
                          sm_occupancy=value("sm_occupancy"), graphics_engine_active=value("gr_active"),
                          tensor_active=value("tensor_active"), dram_active=value("dram_active"),
                          time_utilization=value("gr_active"))


def _identity(info) -> GpuIdentity:
    return GpuIdentity(info.index, info.label_uuid, info.name)


def serves(sources: dict, name: str, uuid: str) -> bool:
    """Whether the source `name` among `sources` (name -> source) publishes this GPU now: live nsys
    captures leave a GPU that DCGM profiles alone (both cannot sample its counters at once)."""
    source = sources.get(name)
    result = source.results.get(uuid) if source is not None else None
    return result is not None and result.state == OK


def read_export(path, work, nsys: str = "nsys", require_metrics: bool = True, budget=None):
    """work(export) on the export at `path`, opened as untrusted input: every problem (the reader's,
    SQLite's, one nobody foresaw) is an IngestError with one line, never a traceback."""
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
        out[info.label_uuid] = (_identity(info), _reading(row, begin, end))
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
    """Runs nsys steps (profile, export) in their own process group, bounded in time; `stop()` ends a
    step in progress with what it started (nsys leaves a launcher and the traced `sleep`)."""

    def __init__(self, stopping: threading.Event):
        self.stopping = stopping  # set: no new step starts, and a failing step is no error
        self._running: subprocess.Popen | None = None

    def run(self, cmd: list[str], timeout: float, what: str) -> None:
        if self.stopping.is_set():
            return
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        self._running = proc
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise CaptureError(f"{what} did not finish within {timeout:g} s; it was stopped") from None
        finally:
            self._running = None
        if proc.returncode != 0 and not self.stopping.is_set():
            tail = [line.strip() for line in (out or "").splitlines() if line.strip()][-1:] or ["no output"]
            raise CaptureError(f"{what} failed (exit {proc.returncode}): {tail[0][:300]}")

    def stop(self) -> None:
        self.stopping.set()
        proc = self._running
        if proc is not None:
            _kill(proc)


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


class NsysSource(SamplerDefaults):
    name = "nsys"

    def __init__(self, interval: float = 1.0, replay=None, watch_dir=None, live=False, window_s: float = 5.0,
                 frequency: int = 100, binary: str = "nsys", nvml=None, other_sources=None):
        self.interval = interval
        self.window_s = window_s
        self.watch_dir = Path(watch_dir) if watch_dir else None
        self.live = live
        self.frequency = frequency
        self.binary = binary
        self._nvml = nvml  # NvmlSampler: which GPUs exist, for live mode
        self._others = other_sources or {}  # name -> source: live mode leaves GPUs they serve alone
        self.results: dict[str, SourceResult] = {}
        self.identities: dict[str, GpuIdentity] = {}
        self.health = CollectorHealth(True, 0.0, "")
        self._log = LogOnce(log)
        self._seen: tuple | None = None  # (path, mtime, size) of the newest export looked at
        self._published: Path | None = None  # the export whose windows are published now
        self._replay = None
        self._replay_step = 0
        self._live_uuids: set[str] = set()
        self._watched_uuids: set[str] = set()  # GPUs the published export brought
        self._stopping = threading.Event()  # stops a read in progress when the exporter stops
        self._runner = NsysRunner(self._stopping)  # live captures
        if replay:
            self._load_replay(Path(replay))

    @property
    def max_tick_seconds(self) -> float:
        """How long a tick may take before the engine calls it stuck: reading an export has its own
        budget, a live capture its window and nsys' export on top."""
        return READ_BUDGET_S + 30 + (self.window_s + 120 if self.live else 0)

    # -- replay ---------------------------------------------------------------------------------
    def _load_replay(self, path: Path) -> None:
        from nsys_ingest.analysis import bucket_means
        from nsys_ingest.reader import IngestError

        def load(export):
            return bucket_means(export, self.interval), {int(i): _identity(info) for i, info in export.gpus.items()}

        try:
            means, gpus = read_export(path, load)
        except IngestError as exc:
            raise SystemExit(f"error: --replay {path}: {exc}") from None
        if means.empty:
            raise SystemExit(f"error: --replay {path}: no samples of GR, SM, tensor or DRAM activity to replay: "
                             "profile with --gpu-metrics-devices=all")
        self._replay = {gpus[int(g)]: [row for _, row in rows.iterrows()] for g, rows in means.groupby("gpu")}
        self.identities = {ident.uuid: ident for ident in gpus.values()}
        steps = max(len(r) for r in self._replay.values())
        log.info("replaying %s: %d GPU(s), %d steps of %.2f s, looped", path, len(gpus), steps, self.interval)

    def _tick_replay(self) -> dict[str, SourceResult]:
        now = time.time()
        results = {}
        for ident, rows in self._replay.items():
            row = rows[self._replay_step % len(rows)].to_dict()
            results[ident.uuid] = SourceResult(OK, f"replay step {self._replay_step % len(rows) + 1}/{len(rows)}",
                                               _reading(row, now - self.interval, now))
        self._replay_step += 1
        return results

    # -- watch ----------------------------------------------------------------------------------
    def published_path(self) -> Path | None:
        return self._published

    def _newest_export(self) -> Path | None:
        """The newest settled regular file named *.sqlite or *.nsys-rep. Anything else with such a name
        (a symbolic link loop, a FIFO, a directory) is skipped on its own, with one log line."""
        try:
            with os.scandir(self.watch_dir) as listing:
                entries = [Path(e.path) for e, _ in zip(listing, range(MAX_WATCHED_ENTRIES))
                           if e.name.endswith((".sqlite", ".nsys-rep"))]
        except OSError as exc:
            raise RuntimeError(f"cannot read --nsys-watch-dir {self.watch_dir}: {exc}") from None
        ready, skipped = [], []
        for path in entries:
            try:
                info = path.stat()
            except FileNotFoundError:  # removed between listing and looking: not an error
                continue
            except OSError as exc:  # e.g. [Errno 40] a symbolic link loop: that file only
                skipped.append(f"{path.name} ({exc.strerror or exc})")
                continue
            if not stat.S_ISREG(info.st_mode):
                skipped.append(f"{path.name} (not a regular file)")
            elif time.time() - info.st_mtime >= SETTLE_S:
                ready.append((info.st_mtime, path))
        if skipped:
            self._log.problem("nsys watch", f"skipped in {self.watch_dir}: {', '.join(sorted(skipped))}")
        else:
            self._log.clear("nsys watch")
        return max(ready, default=(None, None))[1]

    def _tick_watch(self) -> dict[str, SourceResult] | None:
        """New results when a newer export appeared or the published one is gone, else None (keep
        what is published)."""
        from nsys_ingest.reader import Budget, IngestError

        forgotten = None
        if self._published is not None and not self._published.exists():
            forgotten = self._forget_watched()
        newest = self._newest_export()
        if newest is None:
            return forgotten
        try:
            info = newest.stat()
        except OSError:  # removed (or replaced by a link loop) since it was listed: the next tick looks again
            return forgotten
        key = (str(newest), info.st_mtime, info.st_size)
        if key == self._seen:
            return forgotten
        previous, self._seen = self._seen, key
        try:
            windows = last_window(newest, self.window_s, self.binary, Budget(READ_BUDGET_S, self._stopping))
        except IngestError as exc:
            if not newest.exists():  # removed before it could be opened: the next tick looks again
                self._seen = previous
                return forgotten
            if forgotten is not None:
                self.results = forgotten
            raise RuntimeError(f"{newest.name}: {exc}") from None
        log.info("nsys: published the last %.1f s of %s", self.window_s, loggable(newest.name))
        # GPUs NVML does not know here (exports from another host, no NVML) are published too, as
        # long as this export is the one published: the next export (or none) replaces them.
        self._published = newest
        self._watched_uuids = set(windows)
        self.identities = {uuid: ident for uuid, (ident, _) in windows.items()}
        return {uuid: SourceResult(OK, f"{newest.name}, captured {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(r.window_end))}", r)
                for uuid, (_, r) in windows.items()}

    def _forget_watched(self) -> dict[str, SourceResult]:
        """No export publishes the GPUs the last one brought: they go, like a lost GPU."""
        log.info("nsys: %s is gone; its GPUs are no longer published", loggable(self._published.name))
        self._published = None
        self.identities = {}
        results = {uuid: r for uuid, r in self.results.items() if uuid not in self._watched_uuids}
        self._watched_uuids = set()
        return results

    def close(self) -> None:
        self._runner.stop()  # a live capture in progress ends with the exporter, not up to 2 minutes later

    # -- live -----------------------------------------------------------------------------------
    def _live_targets(self) -> tuple[list, dict[str, SourceResult]]:
        targets, refused = [], {}
        for gpu in getattr(self._nvml, "gpus", ()):
            if serves(self._others, "dcgm", gpu.uuid):
                refused[gpu.uuid] = SourceResult(UNSUPPORTED, "live capture refused: DCGM profiles this GPU and both "
                                                 "cannot sample it at once (pause DCGM: dcgmi profile --pause)")
                continue
            if serves(self._others, "gpm", gpu.uuid):
                refused[gpu.uuid] = SourceResult(UNSUPPORTED, "live capture not needed: GPM serves this GPU")
                continue
            targets.append(gpu)
        return targets, refused

    def _tick_live(self) -> dict[str, SourceResult]:
        from nsys_ingest.reader import IngestError

        binary = shutil.which(self.binary)
        if binary is None:
            raise RuntimeError(f"--nsys-live: {self.binary} not found on the PATH (install Nsight Systems)")
        targets, results = self._live_targets()
        if not targets:
            return results
        work = Path(tempfile.mkdtemp(prefix="nsys-live-"))
        try:
            devices = ",".join(str(g.index) for g in targets)
            cmd = [binary, "profile", f"--gpu-metrics-devices={devices}", f"--gpu-metrics-frequency={self.frequency}",
                   "--sample=none", "--cpuctxsw=none", "--trace=none", "-o", str(work / "live"), "-f", "true",
                   "sleep", str(self.window_s)]
            self._runner.run(cmd, self.window_s + 120, "nsys profile")
            rep = work / "live.nsys-rep"
            if self._stopping.is_set():
                return results
            if not rep.exists():
                raise CaptureError("nsys profile wrote no report (live.nsys-rep)")
            try:
                windows = last_window(rep, self.window_s, binary)
            except IngestError as exc:
                raise RuntimeError(f"live capture unreadable: {exc}") from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self._live_uuids = {gpu.uuid for gpu in targets}
        for gpu in targets:
            match = windows.get(gpu.uuid)
            results[gpu.uuid] = (SourceResult(OK, f"live capture of {self.window_s:.0f} s", match[1]) if match else
                                 SourceResult(ERROR, "live capture held no metrics for this GPU"))
        return results

    # -- one tick -------------------------------------------------------------------------------
    def tick(self) -> None:
        started = time.perf_counter()
        try:
            if self._replay is not None:
                self.results = self._tick_replay()
            else:
                if self.watch_dir is not None:
                    fresh = self._tick_watch()
                    if fresh is not None:
                        self.results = fresh
                if self.live:
                    self.results = {**self.results, **self._tick_live()}
            self.health = CollectorHealth(True, time.perf_counter() - started)
            self._log.clear("nsys")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            self._log.problem("nsys", str(exc))
            self.health = CollectorHealth(False, time.perf_counter() - started, str(exc))
            if self.live:  # a live window that failed has no value; a watched export keeps its capture time
                self.results = {uuid: SourceResult(ERROR, str(exc)) if uuid in self._live_uuids else result
                                for uuid, result in self.results.items()}


UPLOAD_IDLE_S = 10.0  # an upload that sends nothing for this long is abandoned
UPLOAD_DEADLINE_S = 600.0  # and one that takes longer than this in all (a 512 MB export at 1 MB/s)
MAX_IN_FLIGHT = 4  # uploads and diagnoses received or read at once; more wait for a 503's Retry-After


class _Refused(Exception):
    """An upload that ends with this status and one line why (None: the client left, no answer)."""

    def __init__(self, status: int | None, why: str = ""):
        super().__init__(why)
        self.status = status


class UploadSpool:
    """POST /api/v1/nsys: a bearer-token upload of an export into the spool directory the nsys source
    watches. The body streams to a partial file (never past the size limit, never idle for long), is
    read the way the nsys source will publish it (in a worker thread, under a time budget, stopped
    when the client leaves), and only then renamed to a name the server chooses. POST
    /api/v1/diagnose (`diagnose`): the same, answered with nsys_ingest's diagnosis, nothing kept."""

    def __init__(self, token: str, spool_dir: Path, max_bytes: int, retention=None, window_s: float = 5.0,
                 budget_s: float = READ_BUDGET_S, idle_s: float = UPLOAD_IDLE_S, max_in_flight: int = MAX_IN_FLIGHT,
                 refuse_uploads: str | None = None):
        self.token = token
        self.refuse_uploads = refuse_uploads  # why a stored upload would never be published (409), or None
        self.spool_dir = Path(spool_dir)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.retention = retention  # exporter.spool.SpoolRetention, applied after each upload too
        self.window_s = window_s
        self.budget_s = budget_s
        self.idle_s = idle_s
        self.max_in_flight = max_in_flight
        self._in_flight = 0

    # -- the two endpoints (Starlette requests in, Starlette responses out) -------------------------
    async def handle(self, request):
        """POST /api/v1/nsys: 201 with what was stored, or 400/401/408/409/413/422/503 with one line why."""
        from starlette.responses import JSONResponse

        async def store(part, size):
            if self.refuse_uploads:  # after the body: every client reads the answer, none a broken pipe
                log.info("nsys upload: refused (%d bytes): --replay publishes no other export", size)
                raise _Refused(409, self.refuse_uploads)
            summary = await self._read(request, self._check, part)
            name = f"upload-{time.strftime('%Y%m%dT%H%M%S')}-{uuidlib.uuid4().hex[:8]}.sqlite"
            os.replace(part, self.spool_dir / name)
            if self.retention is not None:
                await asyncio.to_thread(self.retention.tick)
            log.info("nsys upload: stored %s (%d bytes, GPUs %s)", name, size, loggable(", ".join(summary["gpus"])))
            return JSONResponse({"stored": name, "bytes": size, **summary}, status_code=201)

        return await self._with_body(request, store)

    async def diagnose(self, request):
        """POST /api/v1/diagnose: the JSON of `python3 -m nsys_ingest diagnose --json FILE` for the
        uploaded export ("file" reads "upload"), under the upload's rules; the file is deleted
        whatever happens."""
        from starlette.responses import JSONResponse

        async def answer(part, _size):
            return JSONResponse(await self._read(request, self._diagnose, part))

        return await self._with_body(request, answer)

    # -- receiving --------------------------------------------------------------------------------
    async def _with_body(self, request, then):
        """Checks the token and the declared size, receives the body into a partial file and runs
        then(partial, size); the partial file is gone afterwards, whatever happened."""
        from starlette.responses import JSONResponse

        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            return JSONResponse({"error": f"export larger than {self.max_bytes} bytes"}, status_code=413)
        if self._in_flight >= self.max_in_flight:
            return JSONResponse({"error": f"{self._in_flight} uploads in progress already: retry later"},
                                status_code=503, headers={"Retry-After": "10"})
        self._in_flight += 1
        fd, part = tempfile.mkstemp(prefix=".upload-", suffix=".part", dir=self.spool_dir)
        try:
            size = await self._receive(request, fd)
            return await then(part, size)
        except _Refused as refused:
            if refused.status is None:
                return JSONResponse({"error": "client left"}, status_code=499)  # nobody reads it
            return JSONResponse({"error": str(refused)}, status_code=refused.status)
        finally:
            self._in_flight -= 1
            Path(part).unlink(missing_ok=True)

    async def _receive(self, request, fd) -> int:
        from starlette.requests import ClientDisconnect

        size = 0
        deadline = time.monotonic() + UPLOAD_DEADLINE_S
        blocks = request.stream().__aiter__()
        with os.fdopen(fd, "wb") as out:
            while True:
                wait = min(self.idle_s, deadline - time.monotonic())
                try:
                    block = await asyncio.wait_for(blocks.__anext__(), timeout=max(wait, 0.001))
                except StopAsyncIteration:
                    return size
                except ClientDisconnect:
                    log.info("nsys upload: the client left after %d bytes; nothing kept", size)
                    raise _Refused(None) from None
                except asyncio.TimeoutError:
                    why = (f"no data for {self.idle_s:g} s" if time.monotonic() < deadline
                           else f"not complete after {UPLOAD_DEADLINE_S:g} s")
                    log.info("nsys upload: abandoned after %d bytes (%s); nothing kept", size, why)
                    raise _Refused(408, f"upload abandoned: {why}") from None
                size += len(block)
                if size > self.max_bytes:
                    raise _Refused(413, f"export larger than {self.max_bytes} bytes")
                out.write(block)

    # -- reading, in a worker thread, stopped when the client leaves --------------------------------
    async def _read(self, request, work, part):
        """work(part, budget) in a worker thread; the event loop (and /metrics) never waits for it."""
        from nsys_ingest.reader import Budget, IngestError

        budget = Budget(self.budget_s)
        worker = asyncio.ensure_future(asyncio.to_thread(work, part, budget))
        watcher = asyncio.ensure_future(_client_left(request))
        try:
            await asyncio.wait({worker, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not worker.done():
                budget.cancel.set()  # SQLite stops within a few thousand instructions
                log.info("nsys upload: the client left while its export was read; reading stopped, nothing kept")
                await asyncio.wait({worker})
                worker.exception()  # retrieved: it is the "cancelled" the budget raised, nobody's news
                raise _Refused(None)
            return worker.result()
        except IngestError as exc:
            status = 422 if budget.stopped else 400
            raise _Refused(status, str(exc).replace(str(part), "the upload")) from None
        except asyncio.CancelledError:  # the server is stopping: so does the read
            budget.cancel.set()
            raise
        finally:
            watcher.cancel()

    def _check(self, part, budget) -> dict:
        """What the nsys source will publish, read now: an export that would publish nothing is refused."""
        from nsys_ingest.reader import IngestError

        windows, era = read_export(Path(part), lambda e: (windows_of(e, self.window_s), e.era), budget=budget)
        if not windows:
            raise IngestError("the export has GPU metrics but no samples of GR, SM, tensor or DRAM activity: "
                              "profile with --gpu-metrics-devices=all")
        return {"gpus": sorted(windows), "schema": era}

    @staticmethod
    def _diagnose(part, budget) -> dict:
        from nsys_ingest.diagnose import diagnose

        result = read_export(Path(part), diagnose, require_metrics=False, budget=budget)
        return {**result, "file": "upload"}


async def _client_left(request) -> None:
    """Returns when the client of a request whose body was read hangs up."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
