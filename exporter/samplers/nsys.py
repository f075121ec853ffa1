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

import argparse
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from exporter.config import duration, env_name, size
from exporter.nsys_exports import (READ_BUDGET_S, CaptureError, NsysRunner, identity_of, last_window, read_export,
                                   spatial_reading)
from exporter.sampler import SamplerDefaults, serves
from exporter.sources import profiled_by
from exporter.snapshot import ERROR, OK, UNSUPPORTED, CollectorHealth, GpuIdentity, LogOnce, SourceResult, loggable

log = logging.getLogger(__name__)
SETTLE_S = 2.0  # a watched file must be this old before it is read: nsys may still be writing it
MAX_WATCHED_ENTRIES = 100_000  # directory entries looked at per tick: a directory of millions costs no more


class NsysSource(SamplerDefaults):
    name = "nsys"
    upload = None  # its upload spool (exporter.uploads.UploadSpool) where uploads are on (build)

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
            profiler = profiled_by(self._others, gpu.uuid)
            if profiler is not None:
                name, pause = profiler[0].upper(), profiler[1]
                refused[gpu.uuid] = SourceResult(UNSUPPORTED, f"live capture refused: {name} profiles this GPU and "
                                                 f"both cannot sample it at once (pause {name}: {pause})")
                continue
            serving = next((name for name in self._others if serves(self._others, name, gpu.uuid)), None)
            if serving is not None:
                refused[gpu.uuid] = SourceResult(UNSUPPORTED, f"live capture not needed: {serving.upper()} serves "
                                                 "this GPU")
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


# -- registration (exporter/sources.py SOURCES) -------------------------------------------------------
TOKEN_FILE_MAX_BYTES = 4096


def read_token(path: str) -> str:
    """The upload token from a file (a Kubernetes or compose secret), surrounding whitespace removed."""
    from hostio.files import FileTooLarge, NotRegularFile, read_capped

    try:  # non-blocking and regular files only: a FIFO there must not hang the exporter's start
        raw = read_capped(path, TOKEN_FILE_MAX_BYTES, follow=True)  # a mounted secret is a link
    except FileTooLarge:
        raise argparse.ArgumentTypeError(f"--nsys-upload-token-file {path}: over {TOKEN_FILE_MAX_BYTES} bytes, "
                                         f"not a token") from None
    except NotRegularFile as exc:
        raise argparse.ArgumentTypeError(f"--nsys-upload-token-file {path}: {exc}; give the file holding the "
                                         f"token") from None
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"--nsys-upload-token-file {path}: {exc.strerror}") from None
    try:
        token = raw.decode().strip()
    except UnicodeDecodeError:
        token = ""
    if not token:
        raise argparse.ArgumentTypeError(f"--nsys-upload-token-file {path}: empty or not text; "
                                         f"write the token into it")
    return token


def add_arguments(parser) -> None:
    g = parser.add_argument_group("nsys")
    g.add_argument("--replay", metavar="FILE", default=None,
                   help="publish a recorded Nsight Systems export (.sqlite) as a live stream, in a loop")
    g.add_argument("--nsys-watch-dir", default=None,
                   help="directory where Nsight Systems exports (.sqlite) appear; the newest window per GPU is published")
    g.add_argument("--nsys-window", type=duration, default=5.0,
                   help="time of an export published as one window (watch and replay), and of one live capture")
    g.add_argument("--nsys-live", action="store_true",
                   help="profile GPUs that neither DCGM nor GPM serves with `nsys profile` in short windows")
    g.add_argument("--nsys-frequency", type=int, default=100, help="GPU metrics sampling frequency of live captures, Hz")
    g.add_argument("--nsys-binary", default="nsys", help="the nsys executable for live captures and .nsys-rep exports")
    g.add_argument("--nsys-upload-token", default=None,
                   help="enable POST /api/v1/nsys for clients that send this bearer token (disabled without it); "
                        "prefer the file or the environment variable: a flag shows in `ps` to every user")
    g.add_argument("--nsys-upload-token-file", metavar="FILE", default=None,
                   help="read the upload token from this file (a mounted secret), whitespace stripped")
    g.add_argument("--nsys-spool-dir", default=None,
                   help="where uploaded exports are kept (default: the watch directory, else a temporary directory)")
    g.add_argument("--nsys-upload-max-bytes", type=size, default=512 * 1024 * 1024, help="largest upload accepted")
    g.add_argument("--nsys-spool-max-files", type=int, default=100,
                   help="uploads kept in the spool; the oldest go first (never the one published now)")
    g.add_argument("--nsys-spool-max-bytes", type=size, default=10 * 1024**3,
                   help="bytes of uploads kept in the spool")
    g.add_argument("--nsys-spool-max-age", type=duration, default=7 * 86400,
                   help="how long an upload is kept")


def check_arguments(args) -> str | None:
    """Why the upload flags cannot work (one line), or None; reads the token file into the token."""
    if args.no_api and (args.nsys_upload_token or args.nsys_upload_token_file):
        return ("--no-api switches uploads off too (POST /api/v1/nsys and /api/v1/diagnose): "
                "drop the upload token or --no-api")
    if args.nsys_upload_token_file:
        if args.nsys_upload_token:
            return ("give the upload token once: --nsys-upload-token-file or --nsys-upload-token "
                    f"({env_name('--nsys-upload-token')}), not both")
        try:
            args.nsys_upload_token = read_token(args.nsys_upload_token_file)
        except argparse.ArgumentTypeError as exc:
            return str(exc)
    return None


def _replaying(args) -> str | None:
    """Why uploads, a watched directory and live captures publish nothing with --replay (None without)."""
    if not args.replay:
        return None
    return (f"this exporter replays {args.replay} (--replay) and publishes no other export: uploads are refused "
            "(409), --nsys-watch-dir and --nsys-live are not read; POST /api/v1/diagnose still answers. "
            "Send exports to an exporter without --replay")


def build(args, nvml, built=None):
    """The nsys source (a replay, a watched directory or spool, live captures), or (None, why). Its upload
    spool, where uploads are on, is its `upload`. Each import where its flag asks for it: an exporter
    without uploads pays none of them."""
    watch_dir, upload = args.nsys_watch_dir, None
    if args.nsys_upload_token:
        from exporter.spool import Retention, SpoolRetention
        from exporter.uploads import UploadSpool

        spool = args.nsys_spool_dir or watch_dir or tempfile.mkdtemp(prefix="nsys-spool-")
        retention = SpoolRetention(spool, Retention(args.nsys_spool_max_files, args.nsys_spool_max_bytes,
                                                    args.nsys_spool_max_age))
        upload = UploadSpool(args.nsys_upload_token, spool, args.nsys_upload_max_bytes, retention,
                             window_s=args.nsys_window, refuse_uploads=_replaying(args))
        watch_dir = watch_dir or spool
    if args.replay and (args.nsys_watch_dir or args.nsys_upload_token or args.nsys_live):
        log.warning("%s", _replaying(args))
    if not (args.replay or watch_dir or args.nsys_live):
        return None, "not configured: pass --replay, --nsys-watch-dir, --nsys-live or --nsys-upload-token-file"
    nsys = NsysSource(interval=args.interval if args.replay else max(args.interval, 1.0), replay=args.replay,
                      watch_dir=watch_dir, live=args.nsys_live, window_s=args.nsys_window,
                      frequency=args.nsys_frequency, binary=args.nsys_binary, nvml=nvml, other_sources=built)
    if upload is not None:
        upload.retention.published = nsys.published_path
    nsys.upload = upload
    return nsys, None
