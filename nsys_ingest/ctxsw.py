"""Per-process time and spatial shares of time-sliced GPUs, from the GPU's own context switches.

`nsys profile --gpuctxsw=true --gpu-metrics-devices=all ...`, run as root system-wide, records
GPU_CONTEXT_SWITCH_EVENTS(tag, vmId, seqNo, contextId, timestamp, globalPid, gpuId): a context is
resident on its GPU from its RESTORE_START to its SAVE_END (tags named in ENUM_GPU_CTX_SWITCH), one
context at a time, ~2 ms per slice. A GPU_METRICS sample stamped t describes [t, t'), up to the next
sample t' of its GPU (measured on the H200 at 10 kHz: the sample stamped 50 us after the matmul's
RESTORE_START, following a launch loop at ~1 % SM, reads 99.6 %; the one 50 us before it reads 48 %). So per
process: its resident time (exact), and the SM activity (and occupancy, tensor, DRAM, GR) of its own slices. This
is the one place that attribution is computed: the
`workloads` command and the exporter's live source (exporter/samplers/ctxsw.py) both call attribute().

Estimators (how a sample's value is given to the slices; docs/workloads.md):
- "at": the whole sample goes to the slice at its timestamp (or to the switch gap);
- "overlap": a sample that straddles a switch is split by the time each slice covers of it;
- "fit" (default): each process's density is fitted over all samples, least squares of
  value = sum over processes (and the gap) of overlap fraction x density, each density within 0..1
  (on the H200 at 1 kHz the only one within 0.02 of the 10 kHz truth for every process: docs/workloads.md);
- "within": only the samples that lie wholly inside one slice (or one gap) count: at 10 kHz (0.1 ms
  samples, ~2 ms slices) that is ~95 % of them, and the truth bench/ctxsw_estimators.py measures against.

Bounds (hostile exports, docs/exposure.md and docs/limits.md): both tables are read in timestamp order in chunks of
`chunk_rows`, per GPU; what is held at once is one chunk of samples, the slices overlapping it (at most
MAX_PENDING_SLICES) and per-process sums (at most MAX_PROCESSES processes): memory does not grow with
the length of the capture. Time is the export's Budget.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nsys_ingest.attribution import Attribution, GpuAttribution, ProcessAttribution
from nsys_ingest.reader import (DEFAULT_CHUNK_ROWS, MAX_GPUS, MAX_NAME, NOT_NSYS, Budget, Export, IngestError, _column,
                                 number, numbers_only, text, window_clauses)

EVENTS = "GPU_CONTEXT_SWITCH_EVENTS"
TAGS = "ENUM_GPU_CTX_SWITCH"
RESTORE_START, SAVE_END = "RESTORE_START", "SAVE_END"
# The numbers Nsight Systems 2025.3 gave the two tags on the H200: used only when the export has no enum table.
DEVICE_TAGS = {8: RESTORE_START, 7: SAVE_END}
MAX_TAGS = 256
MAX_OTHER_TAGS = 16  # kinds of other events counted by name (nsys 2025.3 has 4 other tags); the rest together
OTHER_TAGS = f"other tags (beyond the first {MAX_OTHER_TAGS} kinds)"
MAX_PROCESSES = 256  # processes with slices, all GPUs together
MAX_PENDING_SLICES = 1_000_000  # slices overlapping one chunk of samples (a real chunk holds a few thousand)
# The fit's solver: at most this many sweeps, and this many coordinate updates per quantity (the H200
# captures converge within 23 sweeps of their 5 codes; 257 codes (256 processes and the gap) stop after 972).
MAX_SWEEPS = 20_000
MAX_FIT_UPDATES = 250_000
PAIR_BLOCK = 1 << 18  # the fit's (entry, entry) products made at once: ~10 MB of arrays
ESTIMATORS = ("at", "overlap", "fit", "within")
DEFAULT_ESTIMATOR = "fit"
# The spatial quantities attributed, in the order they are shown (nsys_ingest.names; dram_active = read + write).
QUANTITIES = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_active", "sm_issue",
              "dram_read", "dram_write")
READ = ("sm_active", "sm_occupancy", "tensor_active", "gr_active", "sm_issue", "dram_read", "dram_write")
NO_SWITCHES = ("this export has no GPU context switches: profile as root, system-wide, with --gpuctxsw=true "
               "(nsys profile --gpuctxsw=true --trace=none --gpu-metrics-devices=all --sample=none "
               "--cpuctxsw=none -o R sleep 10)")
GAP = -1


class NoSwitches(IngestError):
    """An export without GPU context switches (NO_SWITCHES): nothing to attribute, not a broken export."""


def pid_of(global_pid: int) -> int:
    """The host pid inside nsys' serialized GlobalId."""
    return (int(global_pid) >> 24) & 0xFFFFFF


def has_switches(export: Export) -> bool:
    if EVENTS not in export.tables:
        return False
    return export.con.execute(f"select 1 from {EVENTS} limit 1").fetchone() is not None


def tag_codes(export: Export) -> tuple[int, int, dict[int, str]]:
    """(RESTORE_START, SAVE_END, every tag's name) from the export's own enum table, by name."""
    if TAGS not in export.tables:
        names = dict(DEVICE_TAGS)
    else:
        rows = export.con.execute(f"select {number('id')}, {text('name', MAX_NAME)} from {TAGS} limit ?",
                                  (MAX_TAGS + 1,)).fetchall()
        if len(rows) > MAX_TAGS:
            raise IngestError(f"{TAGS} has more than {MAX_TAGS} tags: {NOT_NSYS}")
        names = {}
        for code, name in rows:
            code = _int(code, f"{TAGS}.id")
            if not isinstance(name, str) or len(name) > MAX_NAME:
                shown = name.decode() if isinstance(name, bytes) else repr(str(name)[:40])  # bytes: text() described it
                raise IngestError(f"{TAGS}.name holds {shown} where a tag name belongs: {NOT_NSYS}")
            names[code] = name
    by_name = {name: code for code, name in names.items()}
    if RESTORE_START not in by_name or SAVE_END not in by_name:
        raise IngestError(f"{TAGS} names no {RESTORE_START} or {SAVE_END} tag: {NOT_NSYS}")
    return by_name[RESTORE_START], by_name[SAVE_END], names


def _int(value, where: str) -> int:
    from nsys_ingest.reader import as_int

    return as_int(value, where)


def _integers(column: tuple, where: str) -> np.ndarray:
    """A column of fetched rows as int64, as a chunk's column reads it (numbers, floats cut, numeric text); an
    IngestError naming the column where it holds NULL or anything else."""
    try:
        return np.array(column, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        if any(value is None for value in column):
            raise IngestError(f"{where} holds NULL where a number belongs: {NOT_NSYS}") from None
        return _column(np.array(column, dtype=object), slice(None), np.int64, where)


def _pids(column: tuple) -> np.ndarray:
    """globalPids as int64; -1 where there is none (NULL, or anything but a number): the slice is kept, its
    process unknown."""
    try:
        return np.array(column, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_pid(value) for value in column], dtype=np.int64)


def _pid(value) -> int:
    try:
        number = float(value) if isinstance(value, str) else value
        if isinstance(number, (int, float)) and -2**63 <= number < 2**63:
            return int(number)
    except (ValueError, OverflowError):
        pass
    return -1


def switch_gpus(export: Export) -> list[int]:
    """GPU indexes with context switches. What gpuId is: nsys' schema documents it as "GPU index",
    TARGET_INFO_GPU.id as the device ID, and GPU_METRICS' typeId & 0xFF as the GPU: on the H100 and
    H200 exports we have, TARGET_INFO_GPU.id and typeId & 0xFF agree (GPU 0), so gpuId is taken as
    the same index. A gpuId no metrics belong to still gets its time shares (no spatial values)."""
    rows = export.con.execute(f"select distinct {number('gpuId')} from {EVENTS} limit ?", (MAX_GPUS + 2,)).fetchall()
    gpus = sorted({_int(g, f"{EVENTS}.gpuId") for g, in rows if g is not None})
    if len(gpus) > MAX_GPUS:
        raise IngestError(f"{EVENTS} names more than {MAX_GPUS} GPUs: {NOT_NSYS}")
    return gpus


def default_window(export: Export, start_ns=None, end_ns=None) -> tuple[int, int]:
    """[start, end] in ns from the capture start: the given bounds, else the span of the context
    switches and of the GPU metrics (the last sample covers one period after its timestamp)."""
    numbers_only(export.con, EVENTS, "timestamp")  # before max(), which would read a blob
    low, high = export.con.execute(f"select min(timestamp), max(timestamp) from {EVENTS}").fetchone()
    lows, highs = [_int(low, f"{EVENTS}.timestamp")], [_int(high, f"{EVENTS}.timestamp")]
    if export.era is not None:
        first, last = export.time_range()
        lows.append(first)
        highs.append(last + _period_ns(export))
    start = min(lows) if start_ns is None else int(start_ns)
    end = max(highs) if end_ns is None else int(end_ns)
    if end <= start:
        raise IngestError(f"the window {start / 1e9:.3f}-{end / 1e9:.3f} s holds no time: give --start before --end")
    return start, end


def _period_ns(export: Export) -> int:
    """The sampling period the export states (META_DATA_CAPTURE); 0 when it does not say."""
    return int(round(1e9 / export.sampling_hz)) if export.sampling_hz else 0


# -- slices ------------------------------------------------------------------------------------------
class _Slices:
    """One GPU's slices in time order, from its switch events read in chunks.

    The GPU runs one context at a time, so in time order a slice is a RESTORE_START directly followed
    by the SAVE_END of the same context. Any other sequence is unmatched and its time counts as gap:
    a RESTORE_START followed by another RESTORE_START, a SAVE_END with no RESTORE_START before it. The
    window's edges are the exceptions: a SAVE_END first on the GPU started at the window start (the
    context was resident when the window opened), a RESTORE_START last ends at the window end."""

    def __init__(self, export: Export, gpu: int, window: tuple[int, int], restore: int, save: int, names,
                 chunk_rows: int):
        self.export, self.window, self.restore, self.save, self.names = export, window, restore, save, names
        clauses, params = window_clauses(*window)
        where = "".join(f" and {c}" for c in clauses)
        self._cursor = export.con.execute(
            f"select {number('timestamp')}, {number('tag')}, {number('contextId')}, {number('globalPid')} "
            f"from {EVENTS} where gpuId = ?{where} "
            "order by timestamp, seqNo", (gpu, *params))
        self.chunk_rows = chunk_rows
        self._carry = None  # the last RESTORE_START of the previous chunk: (ts, ctx, gpid)
        self._first = True
        self.done = False
        self.unmatched = 0
        self.other_events: dict[str, int] = {}  # tag name -> events; at most MAX_OTHER_TAGS + 1 entries
        self._other_codes: dict[int, str] = {}  # the codes tallied by name

    def next(self):
        """The next arrays (start, end, globalPid) of slices clipped to the window, or None at the end."""
        if self.done:
            return None
        self.export.budget.check()
        rows = self._cursor.fetchmany(self.chunk_rows)
        if not rows:
            self.done = True
            if self._carry is None:
                return None
            ts, _, gpid = self._carry
            self._carry = None
            return self._clip(np.array([ts]), np.array([self.window[1]]), np.array([gpid]))
        stamps, tags, contexts, pids = zip(*rows)
        ts = _integers(stamps, f"{EVENTS}.timestamp")
        tag = _integers(tags, f"{EVENTS}.tag")
        ctx = _integers(contexts, f"{EVENTS}.contextId")
        gpid = _pids(pids)
        kind = np.where(tag == self.restore, 1, np.where(tag == self.save, 2, 0))
        self._tally_others(tag[kind == 0])
        keep = kind != 0
        ts, kind, ctx, gpid = ts[keep], kind[keep], ctx[keep], gpid[keep]
        starts, ends, owners = [], [], []
        if self._first and len(ts) and kind[0] == 2:  # resident when the window opened
            starts.append(np.array([self.window[0]]))
            ends.append(ts[:1])
            owners.append(gpid[:1])
            ts, kind, ctx, gpid = ts[1:], kind[1:], ctx[1:], gpid[1:]
        if len(ts):
            self._first = False
        if self._carry is not None:
            c_ts, c_ctx, c_gpid = self._carry
            ts, kind = np.concatenate([[c_ts], ts]), np.concatenate([[1], kind])
            ctx, gpid = np.concatenate([[c_ctx], ctx]), np.concatenate([[c_gpid], gpid])
            self._carry = None
        if len(ts) and kind[-1] == 1:  # may pair with the next chunk's first event
            self._carry = (ts[-1], ctx[-1], gpid[-1])
            ts, kind, ctx, gpid = ts[:-1], kind[:-1], ctx[:-1], gpid[:-1]
        pair = (kind[:-1] == 1) & (kind[1:] == 2) & (ctx[:-1] == ctx[1:])
        opens = np.flatnonzero(pair)
        self.unmatched += len(ts) - 2 * len(opens)
        starts.append(ts[opens])
        ends.append(ts[opens + 1])
        owners.append(np.where(gpid[opens] >= 0, gpid[opens], gpid[opens + 1]))
        return self._clip(np.concatenate(starts), np.concatenate(ends), np.concatenate(owners))

    def _tally_others(self, tags: np.ndarray) -> None:
        """Counts the events of other tags by name: the first MAX_OTHER_TAGS kinds each, the rest together
        (every event with a tag of its own made one entry per event: 10 M of them, 2.2 GB)."""
        codes, counts = np.unique(tags, return_counts=True)
        tallied = np.fromiter((code in self._other_codes for code in codes.tolist()), bool, len(codes))  # not np.isin:
        # it loads numpy.ma (16-25 ms of every child's start-up)
        room = MAX_OTHER_TAGS - len(self._other_codes)
        new_codes, new_counts = codes[~tallied], counts[~tallied]
        for code, count in [*zip(codes[tallied].tolist(), counts[tallied].tolist()),
                            *zip(new_codes[:room].tolist(), new_counts[:room].tolist())]:
            name = self._other_codes.setdefault(code, self.names.get(code, f"unknown tag {code}"))
            self.other_events[name] = self.other_events.get(name, 0) + count
        folded = int(new_counts[room:].sum())
        if folded:
            self.other_events[OTHER_TAGS] = self.other_events.get(OTHER_TAGS, 0) + folded

    def _clip(self, starts, ends, owners):
        starts = np.maximum(starts, self.window[0])
        ends = np.minimum(ends, self.window[1])
        keep = ends > starts
        return starts[keep], ends[keep], owners[keep]


# -- per-GPU sums --------------------------------------------------------------------------------------
class _Gpu:
    """Sums of one GPU: per process code (0..n-1, and the gap last) resident time, sample weights and
    weighted values per quantity; the normal equations for the fit."""

    def __init__(self, index: int, quantities: tuple[str, ...], estimator: str, stream: _Slices, seen: dict):
        self.index, self.quantities, self.estimator = index, quantities, estimator
        self.stream, self.seen = stream, seen  # seen: GPU -> globalPid -> code, shared to cap all processes
        self.gpids: list[int] = []  # code -> globalPid
        self.resident = np.zeros(0)
        self.slices = np.zeros(0, dtype=np.int64)
        self.weight = np.zeros((1, len(quantities)))  # rows: codes, then the gap
        self.weighted = np.zeros((1, len(quantities)))
        self.gram = np.zeros((len(quantities), 1, 1))  # fit: per quantity X'X over codes + gap
        self.moment = np.zeros((len(quantities), 1))  # X'y
        self.samples = 0
        self.between = 0.0  # ns in gaps between consecutive slices: switch overhead, not the idle edges of the window
        self.last_end: int | None = None  # where the last slice read ended
        self.unconverged: list[str] = []  # quantities whose fit stopped at its cap before converging
        self.held: tuple | None = None  # (stamp, values): a sample whose interval ends at the next one
        self.step = 0  # the last distance between two samples (when the export does not say its frequency)
        self.pending = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))  # start, end, code
        self.waiting = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, len(quantities))))  # lo, hi, values

    def feed(self, lo, hi, values) -> None:
        """Samples covering (lo, hi], in time order: attributed once every slice that may overlap
        them is read. Slices come in start order, so a sample ending before the last slice read
        starts has all of its slices; the others wait for the next chunk of slices."""
        w_lo, w_hi, w_values = self.waiting
        lo, hi, values = np.concatenate([w_lo, lo]), np.concatenate([w_hi, hi]), np.concatenate([w_values, values])
        while len(lo):
            starts = self.pending[0]
            ready = len(lo) if self.stream.done else \
                (int(np.searchsorted(hi, starts[-1], side="right")) if len(starts) else 0)
            if ready:
                self.attribute(lo[:ready], hi[:ready], values[:ready])
                self.samples += ready
                self.drop_before(int(hi[ready - 1]))
                lo, hi, values = lo[ready:], hi[ready:], values[ready:]
                continue
            got = self.stream.next()
            if got is not None and len(got[0]):
                self.add_slices(got[0], got[1], self.codes(got[2]))
                self.drop_before(int(lo[0]))
        self.waiting = (lo, hi, values)

    def drain(self) -> None:
        """The slices after the last sample: resident time only."""
        while not self.stream.done:
            got = self.stream.next()
            if got is not None and len(got[0]):
                self.add_slices(got[0], got[1], self.codes(got[2]), keep=False)

    def codes(self, gpids: np.ndarray) -> np.ndarray:
        seen = self.seen
        distinct, first, where = np.unique(gpids, return_index=True, return_inverse=True)
        mine = seen.setdefault(self.index, {})
        new = [g for g in distinct[np.argsort(first)].tolist() if g not in mine]  # in the order they first appear
        for g in new:
            if sum(len(v) for v in seen.values()) >= MAX_PROCESSES:
                raise IngestError(f"context switches of more than {MAX_PROCESSES} processes: {NOT_NSYS}")
            mine[g] = len(self.gpids)
            self.gpids.append(g)
        if new:
            self._grow(len(self.gpids))
        return np.array([mine[g] for g in distinct.tolist()], dtype=np.int64)[where.reshape(-1)]

    def _grow(self, n: int) -> None:
        grow = n - len(self.resident)
        self.resident = np.concatenate([self.resident, np.zeros(grow)])
        self.slices = np.concatenate([self.slices, np.zeros(grow, dtype=np.int64)])
        # the gap row stays last
        self.weight = np.insert(self.weight, [len(self.weight) - 1] * grow, 0.0, axis=0)
        self.weighted = np.insert(self.weighted, [len(self.weighted) - 1] * grow, 0.0, axis=0)
        if self.estimator == "fit":
            q, m = self.gram.shape[0], self.gram.shape[1]
            gram = np.zeros((q, n + 1, n + 1))
            moment = np.zeros((q, n + 1))
            old = list(range(m - 1)) + [n]  # old codes keep their place, the gap moves last
            gram[np.ix_(range(q), old, old)] = self.gram
            moment[:, old] = self.moment
            self.gram, self.moment = gram, moment

    def add_slices(self, starts, ends, codes, keep: bool = True) -> None:
        """Counts the slices; `keep`: hold them for the samples still to come."""
        np.add.at(self.resident, codes, (ends - starts).astype(np.float64))
        np.add.at(self.slices, codes, 1)
        if len(starts):  # slices come in start order: each gap runs from the latest end so far to the next start
            reached = np.empty_like(ends)  # before slice i: the latest end of the slices read before it
            reached[0] = starts[0] if self.last_end is None else self.last_end
            reached[1:] = ends[:-1]
            np.maximum.accumulate(reached, out=reached)
            self.last_end = int(max(reached[-1], ends[-1]))
            np.subtract(starts, reached, out=reached)
            self.between += float(reached[reached > 0].sum())
        if not keep:
            return
        s, e, c = self.pending
        self.pending = (np.concatenate([s, starts]), np.concatenate([e, ends]), np.concatenate([c, codes]))
        if len(self.pending[0]) > MAX_PENDING_SLICES:
            raise IngestError(f"more than {MAX_PENDING_SLICES} context switches within one GPU metrics sample "
                              f"on GPU {self.index}: {NOT_NSYS}")

    def drop_before(self, t: int) -> None:
        s, e, c = self.pending
        keep = e > t
        self.pending = (s[keep], e[keep], c[keep])

    def attribute(self, lo: np.ndarray, hi: np.ndarray, values: np.ndarray) -> None:
        """Samples covering (lo, hi] with `values` (samples x quantities, NaN: not sampled)."""
        gap = len(self.gpids)
        starts, ends, codes = self.pending
        n = len(lo)
        length = (hi - lo).astype(np.float64)
        if self.estimator == "at":
            j = np.searchsorted(starts, lo, side="right") - 1  # the slice with start <= lo (the stamp) < end
            inside = (j >= 0) & (ends[np.maximum(j, 0)] > lo) if len(starts) else np.zeros(n, bool)
            sample = np.arange(n)
            code = np.where(inside, codes[np.maximum(j, 0)] if len(starts) else 0, gap)
            self._add(sample, code, length, values)
            return
        # every (sample, slice) overlap: slices are disjoint and sorted, so at most n + slices pairs
        first = np.searchsorted(ends, lo, side="right")
        last = np.searchsorted(starts, hi, side="left")
        count = np.maximum(last - first, 0)
        sample = np.repeat(np.arange(n), count)
        offset = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
        j = np.repeat(first, count) + offset
        overlap = (np.minimum(hi[sample], ends[j]) - np.maximum(lo[sample], starts[j])).clip(min=0).astype(np.float64)
        in_gap = length - np.bincount(sample, weights=overlap, minlength=n)
        sample = np.concatenate([sample, np.arange(n)])
        code = np.concatenate([codes[j], np.full(n, gap)])
        weight = np.concatenate([overlap, in_gap.clip(min=0)])
        if self.estimator == "overlap":
            self._add(sample, code, weight, values)
        elif self.estimator == "within":
            whole = weight >= length[sample]  # only samples inside one slice (or one gap) count
            self._add(sample[whole], code[whole], weight[whole], values)
        else:
            self._fit(sample, code, weight / np.where(length > 0, length, 1.0)[sample], values)
            self._add(sample, code, weight, values)  # the sample weights (resident time sampled) for the output

    def _add(self, sample, code, weight, values) -> None:
        sampled = ~np.isnan(values)
        for q in range(len(self.quantities)):
            w = weight * sampled[sample, q]
            self.weight[:, q] += np.bincount(code, weights=w, minlength=len(self.weight))
            self.weighted[:, q] += np.bincount(code, weights=w * np.nan_to_num(values[sample, q]),
                                               minlength=len(self.weighted))

    def _fit(self, sample, code, fraction, values) -> None:
        """Adds the samples' X'X and X'y. A sample's row of X holds its overlap fraction per code, so its
        pairs are first summed per (sample, code): a sample then has at most min(its slices + 1, codes)
        entries, and its outer product at most that squared; the products are made in blocks of at most
        PAIR_BLOCK (5,000 1-ns slices in one sample made 25 M rows, 1.9 GB, when joined slice by slice)."""
        size = self.gram.shape[1]
        keep = fraction > 0
        key, where = np.unique(sample[keep] * size + code[keep], return_inverse=True)  # sorted: by sample, then code
        fraction = np.bincount(where, weights=fraction[keep], minlength=len(key))
        sample, code = key // size, key % size
        sampled = ~np.isnan(values)
        y = np.nan_to_num(values)[sample]  # a sample without the quantity adds 0 to X'y (and nothing to X'X below)
        for q in range(len(self.quantities)):
            self.moment[q] += np.bincount(code, weights=fraction * y[:, q], minlength=size)
        first = np.flatnonzero(np.r_[True, sample[1:] != sample[:-1]])  # each sample's first entry
        entries = np.diff(np.r_[first, len(sample)])
        pairs_before = np.cumsum(entries ** 2) - entries ** 2
        group = 0
        while group < len(first):  # whole samples per block, their pairs below PAIR_BLOCK (+ one sample's)
            end = max(int(np.searchsorted(pairs_before, pairs_before[group] + PAIR_BLOCK)), group + 1)
            size_of = np.repeat(entries[group:end], entries[group:end])  # per entry: its sample's entries
            x = np.repeat(np.arange(first[group], first[group] + len(size_of)), size_of)
            partner = np.repeat(np.repeat(first[group:end], entries[group:end]), size_of) + \
                np.arange(len(x)) - np.repeat(np.cumsum(size_of) - size_of, size_of)
            product = fraction[x] * fraction[partner]
            flat = code[x] * size + code[partner]
            for q in range(len(self.quantities)):
                m = sampled[sample[x], q]
                self.gram[q] += np.bincount(flat[m], weights=product[m], minlength=size * size).reshape(size, size)
            group = end

    def densities(self) -> np.ndarray:
        """Per code (and the gap last) and quantity: the mean value while resident (NaN: never sampled)."""
        if self.estimator != "fit":
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(self.weight > 0, self.weighted / np.where(self.weight > 0, self.weight, 1), np.nan)
        out = np.full(self.weight.shape, np.nan)
        for q, quantity in enumerate(self.quantities):
            seen = np.flatnonzero(np.diag(self.gram[q]) > 0)
            if len(seen):
                solved = bounded_least_squares(self.gram[q][np.ix_(seen, seen)], self.moment[q][seen],
                                               budget=self.stream.export.budget)
                out[seen, q] = solved.densities
                if not solved.converged:
                    self.unconverged.append(quantity)
        return out


@dataclass(frozen=True)
class Solved:
    """A bounded least-squares fit: the densities, the sweeps it ran, and whether it converged (False: it
    stopped at its cap of coordinate updates, and the densities are approximate)."""

    densities: np.ndarray
    sweeps: int
    converged: bool


def bounded_least_squares(gram: np.ndarray, moment: np.ndarray, updates: int | None = None,
                          tolerance: float = 1e-12, budget: Budget | None = None) -> Solved:
    """argmin |X d - y|^2 subject to 0 <= d <= 1, from X'X and X'y: projected coordinate descent, which
    converges for any positive semi-definite X'X. A ratio is never negative: the unconstrained fit of the
    H200 capture gave the launch loop -0.14 and the gaps -0.33 (the save phase drains the SMs).
    Nearly equal columns (two processes alternating in the same proportion in every sample) make it creep:
    it stops after `updates` coordinate updates (at most MAX_SWEEPS sweeps), and `budget` is checked after
    every sweep (IngestError once it is spent)."""
    d = np.zeros(len(moment))
    diagonal = np.diag(gram)
    sweeps = min(MAX_SWEEPS, max((updates or MAX_FIT_UPDATES) // max(len(d), 1), 1))
    for sweep in range(1, sweeps + 1):
        moved = 0.0
        for i in range(len(d)):
            if diagonal[i] <= 0:
                continue
            new = min(max(d[i] + (moment[i] - gram[i] @ d) / diagonal[i], 0.0), 1.0)
            moved = max(moved, abs(new - d[i]))
            d[i] = new
        if moved < tolerance:
            return Solved(d, sweep, True)
        if budget is not None:
            budget.check()
    return Solved(d, sweeps, False)


# -- the attribution -----------------------------------------------------------------------------------
def _samples(export: Export, quantities, window, chunk_rows, combine: int):
    """(gpu, timestamp, values) chunks in time order, `combine` consecutive samples of a GPU averaged
    into one (what a capture at 1/combine of the frequency would have seen)."""
    if export.era is None or not quantities:
        return
    before = max(_period_ns(export), 1) * max(combine, 1) * 2  # a sample stamped before reaches into it
    carry: dict[int, tuple] = {}
    for gpu, stamps, values in _wide(export, quantities, window[0] - before, window[1], chunk_rows):
        export.budget.check()
        if combine > 1:
            if gpu in carry:
                stamps, values = np.concatenate([carry[gpu][0], stamps]), np.concatenate([carry.pop(gpu)[1], values])
            whole = len(stamps) // combine * combine
            if whole < len(stamps):
                carry[gpu] = (stamps[whole:], values[whole:])
            if not whole:
                continue
            stamps = stamps[:whole:combine]  # a group describes its first stamp onwards
            values = _nanmean(values[:whole].reshape(whole // combine, combine, -1))
        yield int(gpu), stamps.astype(np.int64), values.astype(np.float64)


def _nanmean(groups: np.ndarray) -> np.ndarray:
    """The mean over axis 1 of what was sampled (NaN where nothing was), as pandas' groupby mean gives it."""
    sampled = ~np.isnan(groups)
    counts = sampled.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, np.where(sampled, groups, 0.0).sum(axis=1) / np.where(counts > 0, counts, 1), np.nan)


def _wide(export: Export, quantities, start_ns, end_ns, chunk_rows):
    """(gpu, timestamps, values: samples x quantities) in time order, a quantity's value the mean of its metrics'
    rows at that timestamp (NaN: none), dram_active their read + write (at most 1). The GPU-metrics era is grouped by
    SQLite (Export.sample_arrays: no pandas); the old era's JSON events go through analysis.wide_samples."""
    if export.era != "gpu_metrics":
        from nsys_ingest.analysis import wide_samples

        for wide in wide_samples(export, READ, start_ns, end_ns, chunk_rows, ordered=True):
            for q in quantities:
                if q not in wide:
                    wide[q] = np.nan
            for gpu, rows in wide.groupby("gpu", sort=False):
                rows = rows.sort_values("timestamp")
                yield gpu, rows["timestamp"].to_numpy(), rows[list(quantities)].to_numpy(dtype=np.float64)
        return
    for gpu, stamps, sums, counts in export.sample_arrays(READ, start_ns, end_ns, chunk_rows):
        with np.errstate(invalid="ignore", divide="ignore"):
            means = sums / counts  # 0 / 0: not sampled
        columns = []
        for q in quantities:
            if q != "dram_active":
                columns.append(means[:, READ.index(q)])
                continue
            dram = [READ.index(d) for d in ("dram_read", "dram_write") if counts[:, READ.index(d)].any()]
            # either one alone counts; a sample without them reads 0 where the chunk has them (as the pivot had it)
            columns.append(np.minimum(sum(np.nan_to_num(means[:, i], nan=0.0) for i in dram), 1.0) if dram
                           else np.full(len(stamps), np.nan))
        yield gpu, stamps, np.column_stack(columns) if columns else np.zeros((len(stamps), 0))


def attribute(export: Export, start_ns=None, end_ns=None, estimator: str = DEFAULT_ESTIMATOR,
              chunk_rows: int = DEFAULT_CHUNK_ROWS, combine: int = 1) -> Attribution:
    """Per GPU and process: resident time share, the spatial quantities while resident (and as shares
    of the whole GPU), switch-gap time, over the window. Raises NoSwitches for an export
    without context switches. `combine`: average every k consecutive samples first (bench only)."""
    if estimator not in ESTIMATORS:
        raise IngestError(f"unknown estimator {estimator!r}: one of {', '.join(ESTIMATORS)}")
    if not has_switches(export):
        raise NoSwitches(NO_SWITCHES)
    restore, save, names = tag_codes(export)
    window = default_window(export, start_ns, end_ns)
    available = {m.quantity for m in export.metrics if m.conversion == "percent"}
    if {"dram_read", "dram_write"} & available:
        available.add("dram_active")
    quantities = tuple(q for q in QUANTITIES if q in available)
    seen: dict = {}
    streams = {g: _Slices(export, g, window, restore, save, names, chunk_rows) for g in switch_gpus(export)}
    gpus = {g: _Gpu(g, quantities, estimator, stream, seen) for g, stream in streams.items()}
    period = _period_ns(export)


    def feed(gpu: _Gpu, lo, hi, values) -> None:
        lo, hi = np.maximum(lo, window[0]), np.minimum(hi, window[1])
        keep = hi > lo
        gpu.feed(lo[keep], hi[keep], values[keep])

    for index, stamps, values in _samples(export, quantities, window, chunk_rows, combine):
        gpu = gpus.get(index)
        if gpu is None:
            continue  # metrics of a GPU without context switches: nothing to attribute to
        if gpu.held is not None:  # the last sample of the previous chunk ends where this chunk starts
            stamps = np.concatenate([[gpu.held[0]], stamps])
            values = np.concatenate([gpu.held[1], values])
        gpu.held = (int(stamps[-1]), values[-1:])
        if len(stamps) > 1:
            gpu.step = int(stamps[-1] - stamps[-2])
        feed(gpu, stamps[:-1], stamps[1:], values[:-1])
    for gpu in gpus.values():
        if gpu.held is not None:  # the very last sample: one period
            stamp, values = gpu.held
            feed(gpu, np.array([stamp]), np.array([stamp + (period * combine or gpu.step)]), values)
        gpu.drain()  # slices after the last sample still count as resident time
    return _result(export, window, estimator, quantities, gpus, streams)


def _commands(export: Export, gpids) -> dict[int, str]:
    if "PROCESSES" not in export.tables or not gpids:
        return {}
    out = {}
    rows = export.con.execute(f"select globalPid, iif(typeof(name) = 'text', substr(name, 1, {MAX_NAME}), null) "
                              f"from PROCESSES where globalPid in ({','.join('?' * len(gpids))}) "
                              "limit ?", (*gpids, len(gpids) * 4 + 1)).fetchall()
    for gpid, name in rows:
        if isinstance(name, str) and isinstance(gpid, int):
            out[gpid] = name[:MAX_NAME]
    return out


def _rounded(values: dict) -> dict:
    return {q: (None if v is None or np.isnan(v) else round(float(v), 6)) for q, v in values.items()}


def _result(export, window, estimator, quantities, gpus, streams) -> Attribution:
    length = window[1] - window[0]
    commands = _commands(export, sorted({g for gpu in gpus.values() for g in gpu.gpids if g >= 0}))
    out = []
    for index, gpu in sorted(gpus.items()):
        info = export.gpus.get(index) or export.described_gpus.get(index)
        density = gpu.densities()
        weight = gpu.weight.sum(axis=0)
        processes = []
        for code, gpid in enumerate(gpu.gpids):
            share = gpu.resident[code] / length
            while_resident = dict(zip(quantities, density[code]))
            processes.append(ProcessAttribution(
                pid=pid_of(gpid) if gpid >= 0 else None, command=commands.get(gpid, ""),
                slices=int(gpu.slices[code]), resident_s=round(gpu.resident[code] / 1e9, 9),
                time_share=round(share, 6), while_resident=_rounded(while_resident),
                of_gpu=_rounded({q: v * share for q, v in while_resident.items()})))
        # a pid with several contexts (or GPU ids) is one process
        merged: dict = {}
        for p in processes:
            merged.setdefault(p.pid, []).append(p)
        processes = [_merge(group, quantities) for group in merged.values()]
        processes.sort(key=lambda p: (-p.time_share, p.pid if p.pid is not None else -1))
        gap_s = max(length - gpu.resident.sum(), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            gpu_means = np.where(weight > 0, gpu.weighted.sum(axis=0) / np.where(weight > 0, weight, 1), np.nan)
        stream = streams[index]
        out.append(GpuAttribution(
            gpu=index, name=info.name if info else f"GPU {index}", uuid=info.uuid if info else None,
            slices=int(gpu.slices.sum()), samples=gpu.samples, switch_gap_s=round(gap_s / 1e9, 9),
            switch_gap_share=round(gap_s / length, 6),
            switch_between_share=round(min(gpu.between, gap_s) / length, 6),
            gap_means=_rounded(dict(zip(quantities, density[-1]))),
            gpu_means=_rounded(dict(zip(quantities, gpu_means))), unmatched_events=stream.unmatched,
            other_events=dict(sorted(stream.other_events.items())), fit_unconverged=tuple(gpu.unconverged),
            processes=tuple(processes)))
    return Attribution(
        file=str(export.source_path), estimator=estimator, sampling_hz=export.sampling_hz,
        window_s=(round(window[0] / 1e9, 9), round(window[1] / 1e9, 9)),
        window_utc_s=None if export.start_ns is None else
        (round((export.start_ns + window[0]) / 1e9, 6), round((export.start_ns + window[1]) / 1e9, 6)),
        quantities=tuple(quantities), gpus=tuple(out))


def _merge(group: list[ProcessAttribution], quantities) -> ProcessAttribution:
    if len(group) == 1:
        return group[0]
    resident = sum(p.resident_s for p in group)
    share = sum(p.time_share for p in group)
    while_resident = {}
    for q in quantities:
        parts = [(p.resident_s, p.while_resident[q]) for p in group if p.while_resident[q] is not None]
        total = sum(r for r, _ in parts)
        while_resident[q] = sum(r * v for r, v in parts) / total if total > 0 else None
    return ProcessAttribution(
        pid=group[0].pid, command=next((p.command for p in group if p.command), ""),
        slices=sum(p.slices for p in group), resident_s=round(resident, 9), time_share=round(share, 6),
        while_resident=_rounded(while_resident),
        of_gpu=_rounded({q: (None if v is None else v * share) for q, v in while_resident.items()}))


def print_workloads(result: Attribution) -> None:
    shown = [q for q in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_active")
             if q in result.quantities]
    heads = {"sm_active": "SM act", "sm_occupancy": "SM occ", "tensor_active": "tensor", "dram_active": "DRAM",
             "gr_active": "GR act"}
    w0, w1 = result.window_s
    print(f"{result.file}: window {w0:.3f}-{w1:.3f} s, estimator {result.estimator}, "
          f"sampled at {result.sampling_hz or '?'} Hz; spatial values are means while the process was resident")
    for gpu in result.gpus:
        print(f"GPU {gpu.gpu} {gpu.name} ({gpu.uuid or 'no uuid'}): {gpu.slices} slices, "
              f"{gpu.samples} samples, switch gaps {gpu.switch_gap_s * 1e3:.1f} ms ({gpu.switch_gap_share:.1%})"
              + (f", {gpu.unmatched_events} unmatched switch events" if gpu.unmatched_events else ""))
        if gpu.fit_unconverged:
            print(f"  the fit stopped at its cap of {MAX_FIT_UPDATES:,} updates before converging "
                  f"({', '.join(gpu.fit_unconverged)}): those densities are approximate")
        print(f"  {'pid':>8} {'command':<20} {'time':>7}" + "".join(f" {heads[q]:>7}" for q in shown))
        rows = [(str(p.pid if p.pid is not None else "?"), p.command[:20], p.time_share, p.while_resident)
                for p in gpu.processes]
        rows.append(("", "(switch gaps)", gpu.switch_gap_share, gpu.gap_means))
        for pid, command, share, values in rows:
            cells = "".join(f" {'n/a':>7}" if values.get(q) is None else f" {values[q]:7.3f}" for q in shown)
            print(f"  {pid:>8} {command:<20} {share:7.3f}{cells}")
