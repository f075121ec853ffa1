"""Runs the samplers in background threads and publishes one immutable Snapshot after each tick."""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import replace

from exporter.chain import build_view
from exporter.snapshot import UNSUPPORTED, CollectorHealth, GpuIdentity, LogOnce, Snapshot, SourceResult

log = logging.getLogger(__name__)
# A tick running longer than this (or a source's own max_tick_seconds, or two intervals) is stuck: its
# values are withdrawn until it returns. A thread cannot be killed in Python, so ticks run in a worker
# thread each and the loop itself never waits past the deadline.
TICK_DEADLINE_S = 10.0
# Holder samplers map processes to holders on NVML's GPUs: their loops start once NVML's first tick has
# listed them (or failed to), so their first tick does not report "no GPU" on a host that has some.
NVML_FIRST_TICK_WAIT_S = 30.0  # a hung NVML init does not hold them back for longer


class Engine:
    """Owns the samplers. Scrapes and API calls only read `snapshot`: no device call on their path.

    nvml: NvmlSampler; gpm: GpmSource (ticked in the NVML thread, same window as time utilization);
    spatial: other spatial sources by name (own threads, e.g. dcgm, nsys); mps: MPS sampler or None;
    holders: holder samplers of every kind (exporter/holders.py), each in its own thread.
    """

    def __init__(self, nvml, gpm=None, spatial=None, mps=None, order=("dcgm", "gpm", "nsys"),
                 disabled_reasons=None, interval: float = 1.0, holders=(), process_series=("container", 20),
                 spool=None, workloads=None):
        self.nvml = nvml
        self.gpm = gpm
        self.spatial = dict(spatial or {})
        self.mps = mps
        self.order = tuple(order)
        self.disabled_reasons = dict(disabled_reasons or {})
        self.interval = interval
        self.holders = tuple(holders)
        # exporter.workloads.WorkloadAccountant: per-holder views and counters, or None (no holders known)
        self.workloads = workloads
        self.spool = spool  # exporter.spool.SpoolRetention of the upload spool, or None
        self.process_series = process_series  # (mode, limit per GPU): read by the GPU collector
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._nvml_ticked = threading.Event()
        self._threads: list[threading.Thread] = []
        self._version = 0
        self._log = LogOnce(log)
        self._crashed: dict[str, CollectorHealth] = {}  # loop name -> why its last tick raised or is stuck
        self._withdrawn: set[str] = set()  # loops whose tick is stuck or raised: none of their values are published
        self.tick_deadline = TICK_DEADLINE_S
        self.snapshot = Snapshot(version=0, created=time.time())

    # -- sampling -------------------------------------------------------------------------------
    def tick_devices(self) -> None:
        if self.gpm is not None:
            self.gpm.tick(self.nvml.backend, self.nvml.gpus, self.nvml.telemetry)
        try:
            self.nvml.tick()
        finally:
            self._nvml_ticked.set()

    def loops(self):
        """(name, function, interval) of every background loop."""
        yield "nvml", self.tick_devices, self.interval
        for source in self.spatial.values():
            yield source.name, source.tick, getattr(source, "interval", self.interval)
        if self.mps is not None:
            yield "mps", self.mps.tick, getattr(self.mps, "interval", self.interval)
        for holder in self.holders:
            yield holder.name, holder.tick, holder.interval
        if self.spool is not None:
            yield "spool", self.spool.tick, self.spool.interval
        for sampler in getattr(self.workloads, "samplers", ()):  # the workload view's own (ctxsw)
            yield sampler.name, sampler.tick, sampler.interval

    def start(self) -> None:
        holders = {holder.name for holder in self.holders}
        for name, fn, interval in self.loops():
            target = self._run_after_nvml if name in holders else self._run
            thread = threading.Thread(target=target, args=(name, fn, interval), name=f"sampler-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run_after_nvml(self, name, fn, interval) -> None:
        # Stopping meanwhile also ends the wait; _run then returns at once.
        deadline = time.monotonic() + NVML_FIRST_TICK_WAIT_S
        while not self._nvml_ticked.is_set() and not self._stop.is_set() and time.monotonic() < deadline:
            self._nvml_ticked.wait(0.1)
        self._run(name, fn, interval)

    def stop(self) -> None:
        self._stop.set()
        for sampler in getattr(self.workloads, "samplers", ()):  # a capture in flight ends now, not after the join
            sampler.close()
        for thread in self._threads:
            thread.join(timeout=5)
        if hasattr(self.nvml, "close"):
            self.nvml.close()  # its XID watcher, before NVML shuts down
        closer = getattr(self.nvml.backend, "shutdown", None)
        if closer:
            closer()
        for source in (*self.spatial.values(), *self.holders):
            if hasattr(source, "close"):
                source.close()

    def _run(self, name, fn, interval) -> None:
        next_at = time.monotonic()
        deadline = max(self.tick_deadline, 2 * interval, getattr(getattr(fn, "__self__", None), "max_tick_seconds", 0))
        while not self._stop.is_set():
            done = threading.Event()
            threading.Thread(target=self._tick, args=(name, fn, done), name=f"tick-{name}", daemon=True).start()
            started = time.monotonic()
            while not done.wait(0.2):  # a stuck tick returns when it returns; then a fresh one starts
                if self._stop.is_set():
                    done.wait(5)  # a tick in flight ends before stop() shuts NVML down (a stuck one is left)
                    return
                if name not in self._withdrawn and time.monotonic() - started > deadline:
                    self._stuck(name, deadline)
            if name not in self._crashed:  # a tick that raised leaves the values withdrawn
                self._withdrawn.discard(name)
            self.publish()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (slow device call): skip ticks instead of bursting
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def _tick(self, name, fn, done: threading.Event) -> None:
        try:
            fn()
            self._crashed.pop(name, None)
            self._log.clear(f"sampler {name}")
        except Exception as exc:  # noqa: BLE001 - one broken sampler must never stop the others
            # Its own health still says how its last good tick went: a raising tick overrides it, and
            # what that tick would have replaced is withdrawn (never frozen) until a tick succeeds.
            self._crashed[name] = CollectorHealth(False, 0.0, f"tick failed: {exc!r}")
            self._withdrawn.add(name)
            self._log.problem(f"sampler {name}", f"tick failed: {exc!r}", logging.ERROR)
        finally:
            done.set()

    def _stuck(self, name: str, deadline: float) -> None:
        """A tick past its deadline: what the source published goes (never frozen), its success is 0."""
        why = f"tick stuck for more than {deadline:g} s: its values are withdrawn until it returns"
        self._crashed[name] = CollectorHealth(False, deadline, why)
        self._withdrawn.add(name)
        self._log.problem(f"sampler {name}", why, logging.ERROR)
        self.publish()

    def _fresh(self, name: str, value):
        """`value`, or None while the loop `name` is stuck (GPM ticks in the NVML loop)."""
        return None if (name if name != "gpm" else "nvml") in self._withdrawn else value

    # -- publishing -----------------------------------------------------------------------------
    def publish(self) -> Snapshot:
        with self._lock:
            self._version += 1
            now = time.time()
            views = self._views()
            holders = [h for h in self.holders if h.name not in self._withdrawn]
            self.snapshot = Snapshot(
                version=self._version,
                created=now,
                gpus=views,
                mps=self._fresh("mps", getattr(self.mps, "snapshot", None)),
                holders={h.name: h.snapshot for h in holders if h.snapshot is not None},
                spool=self._fresh("spool", getattr(self.spool, "stats", None)),
                workloads=() if self.workloads is None else
                self.workloads.update(now, views, [h.holdings for h in holders],
                                      self._fresh("gpm", getattr(self.gpm, "instances", None))),
                health=self._health(),
            )
            return self.snapshot

    def _health(self) -> dict[str, CollectorHealth]:
        health = {"nvml": self.nvml.health}
        if self.gpm is not None:
            health["gpm"] = self.gpm.health
        for name, source in self.spatial.items():
            health[name] = source.health
        if self.mps is not None:
            health["mps"] = self.mps.health
        for holder in self.holders:
            health[holder.name] = holder.health
            health.update(holder.more_health())
        if self.spool is not None:
            health["spool"] = self.spool.health
        for sampler in getattr(self.workloads, "samplers", ()):
            health[sampler.name] = sampler.health
        for name, crashed in self._crashed.items():
            for collector in (name, "gpm") if name == "nvml" else (name,):  # GPM ticks in the NVML loop
                if collector in health:
                    health[collector] = crashed
        return health

    def _views(self):
        sources = dict(self.spatial)
        if self.gpm is not None:
            sources["gpm"] = self.gpm
        identities: dict[str, GpuIdentity] = {gpu.uuid: gpu for gpu in self.nvml.gpus}
        # GPUs that only a source knows (an nsys replay on a host without GPUs) come after NVML's, under
        # an index of their own: an export's GPU 0 next to NVML's GPU 0 becomes GPU 1 (label gpu="1").
        taken = {gpu.index for gpu in self.nvml.gpus}
        for source in sources.values():
            for uuid, ident in getattr(source, "identities", {}).items():
                if uuid in identities:
                    continue
                if ident.index in taken:
                    ident = replace(ident, index=next(i for i in itertools.count() if i not in taken))
                taken.add(ident.index)
                identities[uuid] = ident
        views = []
        for uuid, ident in identities.items():
            results = {name: self._fresh(name, src.results.get(uuid)) for name, src in sources.items()}
            views.append(
                build_view(ident, self._fresh("nvml", self.nvml.telemetry.get(uuid)), results, self.order,
                           self._reasons(), self.interval, self._fresh("mps", getattr(self.mps, "snapshot", None)))
            )
        return tuple(views)

    def _reasons(self) -> dict[str, str]:
        reasons = dict(self.disabled_reasons)
        if self.nvml.backend is None:
            reasons.setdefault("gpm", SourceResult(UNSUPPORTED, self.nvml.health.error or "NVML unavailable"))
        return reasons
