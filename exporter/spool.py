"""Retention of the upload spool: accepted uploads are removed oldest first past a count, a size or an
age, so a spool that takes an export a minute does not fill the disk. Uploads still streaming (partial
files) count against the same limits. Only files the upload handler named (upload-*.sqlite, their
SQLite sidecars, .upload-*.part) are ever removed, never what a user put in a shared watch directory,
and never the export the nsys source publishes now."""
from __future__ import annotations

import logging
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from exporter.sampler import SamplerDefaults
from exporter.snapshot import CollectorHealth, LogOnce

log = logging.getLogger(__name__)
UPLOAD_GLOB = "upload-*.sqlite"
PARTIAL_GLOB = ".upload-*.part"
SIDECARS = ("-wal", "-shm", "-journal")  # what SQLite may leave beside a database it opened
SIDECAR_GLOB = "upload-*.sqlite-*"
PARTIAL_MAX_AGE_S = 900.0  # past the upload handler's own deadline: left by a crash


@dataclass(frozen=True)
class SpoolStats:
    files: int
    bytes: int
    removed: int  # since start, by retention
    partial_files: int = 0  # uploads still streaming or being validated
    partial_bytes: int = 0


@dataclass(frozen=True)
class Retention:
    max_files: int
    max_bytes: int
    max_age_s: float


class SpoolRetention(SamplerDefaults):
    """Ticked in its own loop (every `interval` s) and after each accepted upload."""

    name = "spool"

    def __init__(self, spool_dir, retention: Retention, published=lambda: None, interval: float = 10.0):
        self.spool_dir = Path(spool_dir)
        self.retention = retention
        self.published = published  # () -> Path | None: the export the nsys source serves now
        self.interval = interval
        self.stats = SpoolStats(0, 0, 0)
        self.health = CollectorHealth(True, 0.0)
        self._removed = 0
        self._log = LogOnce(log)

    @property
    def snapshot(self) -> SpoolStats:
        return self.stats

    def _uploads(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of the uploads, oldest first; files vanishing meanwhile are skipped."""
        return self._files(UPLOAD_GLOB)

    def _partials(self) -> list[tuple[float, int, Path]]:
        return self._files(PARTIAL_GLOB)

    def _files(self, pattern: str) -> list[tuple[float, int, Path]]:
        found = []
        for path in self.spool_dir.glob(pattern):
            try:
                info = path.lstat()  # the server writes regular files: a link (a loop) is none of its own
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((info.st_mtime, info.st_size, path))
        return sorted(found)

    def _doomed(self, uploads, now: float, partials=()) -> list[Path]:
        rule = self.retention
        published = self.published()
        keep = {published.resolve()} if published else set()
        if uploads:
            keep.add(uploads[-1][2].resolve())  # the newest: the next to be published
        files = len(uploads) + len(partials)
        total = sum(size for _, size, _ in uploads) + sum(size for _, size, _ in partials)
        doomed = []
        for mtime, size, path in uploads:  # oldest first
            over = files > rule.max_files or total > rule.max_bytes or now - mtime > rule.max_age_s
            if not over:
                break
            if path.resolve() in keep:
                continue
            doomed.append(path)
            files -= 1
            total -= size
        return doomed

    def tick(self) -> None:
        started = time.perf_counter()
        now = time.time()
        try:
            for _, _, path in self._partials():
                if self._abandoned(path, now):
                    path.unlink(missing_ok=True)
            uploads, partials = self._uploads(), self._partials()
            for path in self._doomed(uploads, now, partials):
                remove_with_sidecars(path)
                self._removed += 1
                log.info("spool: removed %s (retention: at most %d files, %d bytes, %.0f s old)", path.name,
                         self.retention.max_files, self.retention.max_bytes, self.retention.max_age_s)
            self._remove_orphan_sidecars()
            uploads, partials = self._uploads(), self._partials()
            self.stats = SpoolStats(len(uploads), sum(size for _, size, _ in uploads), self._removed,
                                    len(partials), sum(size for _, size, _ in partials))
            self.health = CollectorHealth(True, time.perf_counter() - started)
            self._log.clear("spool")
        except OSError as exc:
            self._log.problem("spool", f"cannot apply retention in {self.spool_dir}: {exc}")
            self.health = CollectorHealth(False, time.perf_counter() - started, str(exc))

    @staticmethod
    def _abandoned(path: Path, now: float) -> bool:
        try:
            return now - path.stat().st_mtime > PARTIAL_MAX_AGE_S
        except FileNotFoundError:
            return False

    def _remove_orphan_sidecars(self) -> None:
        """Sidecars whose database is gone (removed by an older exporter, or by hand)."""
        for path in self.spool_dir.glob(SIDECAR_GLOB):
            owner = next((path.name[: -len(s)] for s in SIDECARS if path.name.endswith(s)), None)
            if owner and not (self.spool_dir / owner).exists():
                path.unlink(missing_ok=True)


def remove_with_sidecars(path: Path) -> None:
    path.unlink(missing_ok=True)
    for suffix in SIDECARS:
        Path(f"{path}{suffix}").unlink(missing_ok=True)
