"""Retention of the upload spool: accepted uploads are removed oldest first past a count, a size or an
age, so a spool that takes an export a minute does not fill the disk. Only files the upload handler
named (upload-*.sqlite) are ever removed, never what a user put in a shared watch directory, and
never the export the nsys source publishes now."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from exporter.snapshot import CollectorHealth, LogOnce

log = logging.getLogger(__name__)
UPLOAD_GLOB = "upload-*.sqlite"
PARTIAL_GLOB = ".upload-*.part"
PARTIAL_MAX_AGE_S = 3600.0  # an upload still streaming after an hour was left by a crash


@dataclass(frozen=True)
class SpoolStats:
    files: int
    bytes: int
    removed: int  # since start, by retention


@dataclass(frozen=True)
class Retention:
    max_files: int
    max_bytes: int
    max_age_s: float


class SpoolRetention:
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

    def _uploads(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of the uploads, oldest first; files vanishing meanwhile are skipped."""
        found = []
        for path in self.spool_dir.glob(UPLOAD_GLOB):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            found.append((stat.st_mtime, stat.st_size, path))
        return sorted(found)

    def _doomed(self, uploads, now: float) -> list[Path]:
        rule = self.retention
        published = self.published()
        keep = {published.resolve()} if published else set()
        if uploads:
            keep.add(uploads[-1][2].resolve())  # the newest: the next to be published
        files, total = len(uploads), sum(size for _, size, _ in uploads)
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
            for path in self._abandoned_partials(now):
                path.unlink(missing_ok=True)
            uploads = self._uploads()
            for path in self._doomed(uploads, now):
                path.unlink(missing_ok=True)
                self._removed += 1
                log.info("spool: removed %s (retention: at most %d files, %d bytes, %.0f s old)", path.name,
                         self.retention.max_files, self.retention.max_bytes, self.retention.max_age_s)
            uploads = self._uploads()
            self.stats = SpoolStats(len(uploads), sum(size for _, size, _ in uploads), self._removed)
            self.health = CollectorHealth(True, time.perf_counter() - started)
            self._log.clear("spool")
        except OSError as exc:
            self._log.problem("spool", f"cannot apply retention in {self.spool_dir}: {exc}")
            self.health = CollectorHealth(False, time.perf_counter() - started, str(exc))

    def _abandoned_partials(self, now: float):
        for path in self.spool_dir.glob(PARTIAL_GLOB):
            try:
                if now - path.stat().st_mtime > PARTIAL_MAX_AGE_S:
                    yield path
            except FileNotFoundError:
                continue
