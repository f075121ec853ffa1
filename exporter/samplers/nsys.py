"""Nsight Systems spatial source: replayed, watched, uploaded or live GPU-metrics exports.

- replay (--replay FILE): a recorded export published as a live stream, in a loop, one bucket of
  the export per tick, so a host without GPUs can show the whole stack and fire its alerts;
- watch (--nsys-watch-dir): the newest export in a directory; its last window per GPU is published
  with its capture time (old data is visible as old through gpu_spatial_sample_timestamp_seconds);
- upload (POST /api/v1/nsys, with a token: exporter/uploads.py): validated exports land in the
  watched spool directory;
- live (--nsys-live): `nsys profile` of the GPUs that no other source serves, in short windows.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from exporter.nsys_exports import (READ_BUDGET_S, CaptureError, NsysRunner, identity_of, last_window, read_export,
                                   spatial_reading)
from exporter.sampler import SamplerDefaults, serves
from exporter.snapshot import ERROR, OK, UNSUPPORTED, CollectorHealth, GpuIdentity, LogOnce, SourceResult, loggable

log = logging.getLogger(__name__)
SETTLE_S = 2.0  # a watched file must be this old before it is read: nsys may still be writing it
MAX_WATCHED_ENTRIES = 100_000  # directory entries looked at per tick: a directory of millions costs no more


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
            return bucket_means(export, self.interval), {int(i): identity_of(info) for i, info in export.gpus.items()}

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
                                               spatial_reading(row, now - self.interval, now))
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
