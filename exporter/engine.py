"""Runs the samplers in background threads and publishes one immutable Snapshot after each tick."""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import replace

from exporter import heap
from exporter.chain import build_view
from exporter.holders import HolderSampler, join_owners
from exporter.sampler import SpatialSource
from exporter.sources import default_order
from exporter.snapshot import UNSUPPORTED, CollectorHealth, GpuIdentity, LogOnce, Snapshot, SourceResult

log = logging.getLogger(__name__)
# A tick running longer than this (or a source's own max_tick_seconds, or two intervals) is stuck: its
# values are withdrawn until it returns. A thread cannot be killed in Python, so ticks run in a worker
# thread each and the loop itself never waits past the deadline.
TICK_DEADLINE_S = 10.0
# Samplers that map things to NVML's GPUs (holders: processes) start once NVML's first tick has listed
# them (or failed to), so their first tick does not report "no GPU" on a host that has some.
NVML_FIRST_TICK_WAIT_S = 30.0  # a hung NVML init does not hold them back for longer
# The heap's free pages go back to the system after NVML's first tick and then this often (exporter/heap.py):
# what a start, a burst of scrapes or a slow read freed stays resident otherwise (bench/RESULTS.md, "Resident
# memory at steady state").
HEAP_GIVE_BACK_S = 60.0
# A reader of the JSON API (`gpu-spatial top`, a client polling /api/v1) keeps NVML's loop at --interval this
# long after its last request; unwatched, the loop ticks every `unwatched_interval` (docs/exporter.md, "Freshness").
WATCHED_FOR_S = 30.0


class Engine:
    """Runs one list of samplers (the contract: exporter/sampler.py), each loop in its own thread.
    Scrapes and API calls only read `snapshot`: no device call on their path.

    nvml: the NvmlSampler, whose GPUs and telemetry every view starts from; it closes last.
    samplers: every other sampler, of any kind, in one list. The engine knows them by what they offer:
    spatial sources (results per GPU) go to the chain in `order` (None: exporter/sources.py's default),
    holder samplers' holdings and the MIG instances' readings to the workload join, and every sampler's
    snapshot into the Snapshot under its name. workloads: exporter.workloads.WorkloadAccountant, or None (no holders known).
    """

    def __init__(self, nvml, samplers=(), order=None, disabled_reasons=None,
                 interval: float = 1.0, process_series=("container", 20), workloads=None):
        self.nvml = nvml
        self.samplers = (nvml, *samplers)
        names = [sampler.name for sampler in self.samplers]
        if len(set(names)) != len(names):
            raise ValueError(f"two samplers share a collector name: {sorted(names)}")
        self.spatial = {s.name: s for s in samplers if isinstance(s, SpatialSource)}
        self.holders = tuple(s for s in samplers if isinstance(s, HolderSampler))
        # Loop name -> the samplers it ticks, in order: NVML's loop ticks those that share its window first.
        self._loops = {nvml.name: (*(s for s in samplers if s.in_nvml_loop), nvml)}
        self._loops.update({s.name: (s,) for s in samplers if not s.in_nvml_loop})
        self._loop_of = {s.name: loop for loop, members in self._loops.items() for s in members}
        self.order = default_order() if order is None else tuple(order)
        self.disabled_reasons = dict(disabled_reasons or {})
        self.interval = interval
        self.workloads = workloads
        self.process_series = process_series  # (mode, limit per GPU): read by the GPU collector
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._nvml_ticked = threading.Event()
        self._threads: list[threading.Thread] = []
        self._heap_given_back = float("-inf")
        self._version = 0
        self._log = LogOnce(log)
        self._crashed: dict[str, CollectorHealth] = {}  # loop name -> why its last tick raised or is stuck
        self._withdrawn: set[str] = set()  # loops whose tick is stuck or raised: none of their values are published
        self.tick_deadline = TICK_DEADLINE_S
        # How often NVML's loop ticks while no reader watches (None: always `interval`): its values are read
        # over the whole time since the last tick (NVML's buffered samples, GPM's window), none lost.
        self.unwatched_interval: float | None = None
        self._watched_until = float("-inf")
        self._watched = threading.Event()  # wakes NVML's loop out of an unwatched wait
        self.snapshot = Snapshot(version=0, created=time.time())

    # -- sampling -------------------------------------------------------------------------------
    def tick_loop(self, name: str) -> None:
        """One tick of the loop `name`: each of its samplers in order."""
        members = self._loops[name]
        try:
            for sampler in members:
                sampler.tick()
        finally:
            if self.nvml in members:
                self._nvml_ticked.set()

    def watch(self) -> None:
        """A reader that wants values as fresh as `interval` came (the JSON API): NVML's loop ticks at
        `interval` for the next WATCHED_FOR_S, starting now rather than at the end of an unwatched wait."""
        now = time.monotonic()
        if now >= self._watched_until and self.unwatched_interval is not None:  # no slower wait to end otherwise
            self._watched.set()
        self._watched_until = now + WATCHED_FOR_S

    def device_interval(self) -> float:
        """How often NVML's loop ticks now: `interval` while a reader watches, else the unwatched interval."""
        if self.unwatched_interval is None or time.monotonic() < self._watched_until:
            return self.interval
        return max(self.interval, self.unwatched_interval)

    @property
    def longest_interval(self) -> float:
        """The longest time between two of NVML's ticks: what a snapshot's age is judged by."""
        return max(self.interval, self.unwatched_interval or 0.0)

    def tick_devices(self) -> None:
        """One tick of NVML's loop (GPM, then NVML)."""
        self.tick_loop(self.nvml.name)

    def loops(self):
        """(name, its samplers, interval) of every background loop."""
        for name, members in self._loops.items():
            yield name, members, members[-1].interval

    def start(self) -> None:
        for name, members, interval in self.loops():
            target = self._run_after_nvml if all(s.after_nvml for s in members) else self._run
            thread = threading.Thread(target=target, args=(name, members, interval), name=f"sampler-{name}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run_after_nvml(self, name, members, interval) -> None:
        # Stopping meanwhile also ends the wait; _run then returns at once.
        deadline = time.monotonic() + NVML_FIRST_TICK_WAIT_S
        while not self._nvml_ticked.is_set() and not self._stop.is_set() and time.monotonic() < deadline:
            self._nvml_ticked.wait(0.1)
        self._run(name, members, interval)

    def stop(self) -> None:
        self._stop.set()
        self._watched.set()
        for sampler in reversed(self.samplers[1:]):  # work in flight (a capture) ends now, not after the join
            sampler.close()
        for thread in self._threads:
            thread.join(timeout=5)
        self.nvml.close()  # last: a tick in flight may still call NVML until its thread is joined

    def _run(self, name, members, interval) -> None:
        next_at = time.monotonic()
        deadline = max(self.tick_deadline, 2 * interval, *(s.max_tick_seconds for s in members))
        while not self._stop.is_set():
            done = threading.Event()
            threading.Thread(target=self._tick, args=(name, done), name=f"tick-{name}", daemon=True).start()
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
            devices = name == self.nvml.name
            if devices:
                self._give_back_heap()
            next_at += self.device_interval() if devices else interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (slow device call): skip ticks instead of bursting
                next_at = time.monotonic()
                delay = 0
            if not devices:
                self._stop.wait(delay)
            elif self._watched.wait(delay):  # a reader came: its first values now, not after the unwatched wait
                self._watched.clear()
                next_at = time.monotonic()

    def _give_back_heap(self) -> None:
        now = time.monotonic()
        if now - self._heap_given_back >= HEAP_GIVE_BACK_S:
            self._heap_given_back = now
            heap.give_back()

    def _tick(self, name, done: threading.Event) -> None:
        try:
            self.tick_loop(name)
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

    def _current(self, sampler) -> bool:
        """False while the loop that ticks `sampler` is stuck: none of its values are published."""
        return self._loop_of[sampler.name] not in self._withdrawn

    # -- publishing -----------------------------------------------------------------------------
    def publish(self) -> Snapshot:
        with self._lock:
            self._version += 1
            now = time.time()
            current = [s for s in self.samplers if self._current(s)]
            published = {s.name: s.snapshot for s in current if s.snapshot is not None}
            views = self._views(current, published.get("mps"))
            mig_instances = {key: reading for s in current if s.name in self.spatial
                             for key, reading in s.instances.items()}
            holdings = {s.name: s.holdings for s in current if s in self.holders}
            owners = join_owners(holdings.values())  # every process-to-holder join reads this one map
            self.snapshot = Snapshot(
                version=self._version,
                created=now,
                gpus=views,
                published=published,
                holdings=holdings,
                owners=owners,
                workloads=() if self.workloads is None else
                self.workloads.update(now, views, holdings.values(), mig_instances, owners),
                health=self._health(),
            )
            return self.snapshot

    def _health(self) -> dict[str, CollectorHealth]:
        health = {}
        for sampler in self.samplers:
            health[sampler.name] = sampler.health
            health.update(sampler.more_health())
        for loop, crashed in self._crashed.items():
            for sampler in self._loops[loop]:  # every sampler ticked in the loop
                health[sampler.name] = crashed
        return health

    def _views(self, current, mps):
        """A view per GPU from the samplers whose values are current, NVML's GPUs first."""
        identities: dict[str, GpuIdentity] = {gpu.uuid: gpu for gpu in self.nvml.gpus}
        # GPUs that only a source knows (an nsys replay on a host without GPUs) come after NVML's, under
        # an index of their own: an export's GPU 0 next to NVML's GPU 0 becomes GPU 1 (label gpu="1").
        taken = {gpu.index for gpu in self.nvml.gpus}
        for source in self.spatial.values():  # a stuck source's GPUs stay, without its values
            for uuid, ident in source.identities.items():
                if uuid in identities:
                    continue
                if ident.index in taken:
                    ident = replace(ident, index=next(i for i in itertools.count() if i not in taken))
                taken.add(ident.index)
                identities[uuid] = ident
        telemetry = self.nvml.telemetry if self.nvml in current else {}
        views = []
        for uuid, ident in identities.items():
            results = {s.name: s.results.get(uuid) for s in current if s.name in self.spatial}
            views.append(build_view(ident, telemetry.get(uuid), results, self.order, self._reasons(), self.interval,
                                    mps))
        return tuple(views)

    def _reasons(self) -> dict[str, str]:
        reasons = dict(self.disabled_reasons)
        if self.nvml.backend is None:
            reasons.setdefault("gpm", SourceResult(UNSUPPORTED, self.nvml.health.error or "NVML unavailable"))
        return reasons
