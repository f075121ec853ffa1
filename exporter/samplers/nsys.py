"""Nsight Systems spatial source: replayed, watched, uploaded or live GPU-metrics exports.

- replay (--replay FILE): a recorded export published as a live stream, in a loop, one bucket of
  the export per tick, so a host without GPUs can show the whole stack and fire its alerts;
- watch (--nsys-watch-dir): the newest export in a directory; its last window per GPU is published
  with its capture time (old data is visible as old through gpu_spatial_sample_timestamp_seconds);
- upload (POST /api/v1/nsys, with a token): validated exports land in the watched spool directory;
- live (--nsys-live): `nsys profile` of the GPUs that no other source serves, in short windows.
"""
from __future__ import annotations

import hmac
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

from exporter.snapshot import ERROR, OK, UNSUPPORTED, CollectorHealth, GpuIdentity, LogOnce, SourceResult, SpatialReading, as_ratio

log = logging.getLogger(__name__)
SETTLE_S = 2.0  # a watched file must be this old before it is read: nsys may still be writing it


def _reading(row, start: float, end: float) -> SpatialReading:
    """A bucket of nsys_ingest.analysis.bucket_means (which already sums DRAM read and write)."""
    value = lambda name: as_ratio(row.get(name))  # noqa: E731
    return SpatialReading(source="nsys", window_start=start, window_end=end, sm_active=value("sm_active"),
                          sm_occupancy=value("sm_occupancy"), graphics_engine_active=value("gr_active"),
                          tensor_active=value("tensor_active"), dram_active=value("dram_active"),
                          time_utilization=value("gr_active"))


def _identity(info) -> GpuIdentity:
    return GpuIdentity(info.index, info.label_uuid, info.name)


def last_window(path: Path, window_s: float, nsys: str = "nsys") -> dict[str, tuple[GpuIdentity, SpatialReading]]:
    """Per GPU UUID: the mean of the export's last `window_s` seconds, placed in wall-clock time."""
    from nsys_ingest.analysis import bucket_means
    from nsys_ingest.reader import Export

    with Export(path, nsys=nsys) as export:
        _, last = export.time_range()
        start_ns = max(0, last - int(window_s * 1e9))
        means = bucket_means(export, window_s + 1.0, start_ns=start_ns)  # one bucket holds the whole window
        out = {}
        for gpu, rows in means.groupby("gpu"):
            info = export.gpus[int(gpu)]
            row = rows.iloc[-1].to_dict()
            begin, end = (float(x) for x in export.wall_seconds([start_ns, last]))
            out[info.label_uuid] = (_identity(info), _reading(row, begin, end))
        return out


class NsysSource:
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
        self._seen: tuple | None = None  # (path, mtime, size) of the export published now
        self._replay = None
        self._replay_step = 0
        self._live_uuids: set[str] = set()
        if replay:
            self._load_replay(Path(replay))

    # -- replay ---------------------------------------------------------------------------------
    def _load_replay(self, path: Path) -> None:
        from nsys_ingest.analysis import bucket_means
        from nsys_ingest.reader import Export, IngestError

        try:
            with Export(path) as export:
                means = bucket_means(export, self.interval)
                gpus = {int(i): _identity(info) for i, info in export.gpus.items()}
        except IngestError as exc:
            raise SystemExit(f"error: --replay {path}: {exc}") from None
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
        return Path(self._seen[0]) if self._seen else None

    def _newest_export(self) -> Path | None:
        try:
            entries = [p for p in self.watch_dir.iterdir() if p.suffix in (".sqlite", ".nsys-rep")]
        except OSError as exc:
            raise RuntimeError(f"cannot read --nsys-watch-dir {self.watch_dir}: {exc}") from None
        ready = []
        for path in entries:
            try:
                mtime = path.stat().st_mtime
            except FileNotFoundError:  # removed between listing and looking: not an error
                continue
            if time.time() - mtime >= SETTLE_S and path.is_file():
                ready.append((mtime, path))
        return max(ready, default=(None, None))[1]

    def _tick_watch(self) -> dict[str, SourceResult] | None:
        """New results when a newer export appeared, else None (keep what is published)."""
        from nsys_ingest.reader import IngestError

        newest = self._newest_export()
        if newest is None:
            return None
        try:
            stat = newest.stat()
        except FileNotFoundError:
            return None
        key = (str(newest), stat.st_mtime, stat.st_size)
        if key == self._seen:
            return None
        previous, self._seen = self._seen, key
        try:
            windows = last_window(newest, self.window_s, self.binary)
        except IngestError as exc:
            if not newest.exists():  # removed before it could be opened: the next tick looks again
                self._seen = previous
                return None
            raise RuntimeError(f"{newest.name}: {exc}") from None
        log.info("nsys: published the last %.1f s of %s", self.window_s, newest.name)
        # GPUs NVML does not know here (exports from another host, no NVML) are published too.
        self.identities = {**self.identities, **{uuid: ident for uuid, (ident, _) in windows.items()}}
        return {uuid: SourceResult(OK, f"{newest.name}, captured {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(r.window_end))}", r)
                for uuid, (_, r) in windows.items()}

    # -- live -----------------------------------------------------------------------------------
    def _live_targets(self) -> tuple[list, dict[str, SourceResult]]:
        targets, refused = [], {}
        for gpu in getattr(self._nvml, "gpus", ()):
            dcgm = self._others.get("dcgm")
            dcgm_result = dcgm.results.get(gpu.uuid) if dcgm else None
            if dcgm_result is not None and dcgm_result.state == OK:
                refused[gpu.uuid] = SourceResult(UNSUPPORTED, "live capture refused: DCGM profiles this GPU and both "
                                                 "cannot sample it at once (pause DCGM: dcgmi profile --pause)")
                continue
            gpm = self._others.get("gpm")
            gpm_result = gpm.results.get(gpu.uuid) if gpm else None
            if gpm_result is not None and gpm_result.state == OK:
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
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=self.window_s + 120, check=False)
            rep = work / "live.nsys-rep"
            if done.returncode != 0 or not rep.exists():
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                raise RuntimeError(f"nsys profile failed: {tail[0]}")
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


class UploadSpool:
    """POST /api/v1/nsys: a bearer-token upload of an export into the spool directory the nsys source
    watches. The body streams to a temporary file (never past the size limit), is validated as an
    export with GPU metrics, and only then renamed to a name the server chooses."""

    def __init__(self, token: str, spool_dir: Path, max_bytes: int, retention=None):
        self.token = token
        self.spool_dir = Path(spool_dir)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.retention = retention  # exporter.spool.SpoolRetention, applied after each upload too

    async def handle(self, request):
        """The route's endpoint (a Starlette Request)."""
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            return JSONResponse({"error": f"export larger than {self.max_bytes} bytes"}, status_code=413)
        fd, part = tempfile.mkstemp(prefix=".upload-", suffix=".part", dir=self.spool_dir)
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                async for block in request.stream():
                    size += len(block)
                    if size > self.max_bytes:
                        return JSONResponse({"error": f"export larger than {self.max_bytes} bytes"}, status_code=413)
                    out.write(block)
            problem, summary = await run_in_threadpool(self._validate, part)
            if problem:
                return JSONResponse({"error": problem}, status_code=400)
            name = f"upload-{time.strftime('%Y%m%dT%H%M%S')}-{uuidlib.uuid4().hex[:8]}.sqlite"
            os.replace(part, self.spool_dir / name)
            part = None
            if self.retention is not None:
                await run_in_threadpool(self.retention.tick)
            return JSONResponse({"stored": name, "bytes": size, **summary}, status_code=201)
        finally:
            if part and os.path.exists(part):
                os.unlink(part)

    @staticmethod
    def _validate(path) -> tuple[str | None, dict]:
        from nsys_ingest.reader import Export, IngestError

        try:
            with Export(path) as export:
                return None, {"gpus": [g.label_uuid for g in export.gpus.values()], "schema": export.era}
        except IngestError as exc:
            return str(exc).replace(str(path), "the upload"), {}
        except Exception as exc:  # noqa: BLE001 - anything unreadable is a bad upload, never a crash
            return f"the upload is not a readable export: {exc}", {}
