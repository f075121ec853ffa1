"""XID events from NVML's event set, waited on in their own thread: never on a tick or the scrape path.

NVML hands an XID to every event set registered when the driver reports it; nothing tells of XIDs
from before the exporter started (the kernel log does). Counts are per (GPU index, XID) since start.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from exporter.nvml import NvmlError
from exporter.snapshot import LogOnce

log = logging.getLogger(__name__)
WAIT_MS = 1000  # one wait's timeout: how long a stop may take; an idle wait costs no CPU
RETRY_S = 10.0  # after a failed wait (the driver going away), ask again this often


class XidWatcher:
    def __init__(self, backend):
        self._backend = backend
        self._lock = threading.Lock()
        self._counts: Counter = Counter()  # (index, xid) -> events
        self._last: dict[int, int] = {}  # index -> last XID
        self.watched: dict[int, str | None] = {}  # index -> None (watched) or why not
        self._again: set[int] = set()  # GPUs back after a reset, to register in the XID thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log = LogOnce(log)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sampler-xid", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        closer = getattr(self._backend, "xid_close", None)
        if closer:
            closer()
        if self._thread is not None:
            self._thread.join(timeout=2 * WAIT_MS / 1000)

    def events(self, index: int) -> tuple[tuple[tuple[int, int], ...], int | None]:
        """((xid, count), ...) of one GPU in XID order, and its last XID (None before any)."""
        with self._lock:
            counts = tuple(sorted((xid, n) for (i, xid), n in self._counts.items() if i == index))
            return counts, self._last.get(index)

    def reregister(self, index: int) -> None:
        """A GPU answers again after it was lost (reset, driver reloaded): its new handle is registered
        by the XID thread before its next wait (a wait holds NVML's event set for up to WAIT_MS)."""
        with self._lock:
            self._again.add(index)

    def _register_again(self) -> None:
        with self._lock:
            again, self._again = self._again, set()
        for index in sorted(again):
            why = self._backend.xid_register(index)
            self.watched[index] = why
            if why is None:
                self._log.clear(f"xid GPU {index} again")
                log.info("xid GPU %d: registered for XID events again after it came back", index)
            else:
                self._log.problem(f"xid GPU {index} again", f"XID events unavailable on GPU {index} after it came "
                                  f"back: {why}")

    def _open(self) -> bool:
        try:
            watched = self._backend.xid_open()
        except NvmlError as exc:
            level = logging.INFO if exc.unsupported else logging.WARNING
            self._log.problem("xid", f"XID events unavailable ({exc.reason}): no gpu_xid_errors_total", level)
            return False
        self.watched = {gpu.index: gpu.refused for gpu in watched}
        for index, why in sorted(self.watched.items()):
            if why is not None:
                self._log.problem(f"xid GPU {index}", f"XID events unavailable on this GPU: {why}", logging.INFO)
        return True

    def _run(self) -> None:
        if not self._open():
            return
        while not self._stop.is_set():
            self._register_again()
            started = time.monotonic()
            try:
                event = self._backend.xid_wait(WAIT_MS)
            except NvmlError as exc:
                self._log.problem("xid wait", f"waiting for XID events failed: {exc.reason}; retrying every "
                                  f"{RETRY_S:.0f} s")
                self._stop.wait(RETRY_S)
                continue
            self._log.clear("xid wait")
            if event is None:
                # A wait that returns at once (a closed set) must not spin.
                self._stop.wait(max(0.0, WAIT_MS / 1000 / 2 - (time.monotonic() - started)))
                continue
            index, xid = event.index, event.xid
            with self._lock:
                self._counts[(index, xid)] += 1
                self._last[index] = xid
            # One line when a GPU's XID changes, not one per event of a storm (the counter has them all).
            self._log.problem(f"xid GPU {index}", f"XID {xid} (NVIDIA's XID catalogue says what it means; "
                              "gpu_xid_errors_total counts them)", logging.ERROR, kind=str(xid))
