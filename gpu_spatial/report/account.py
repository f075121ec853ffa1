"""The GPU account: GPU-seconds per group and quantity, read from the workload counters or their rollups.

Two ways to the same numbers (docs/metrics.md, "Workloads"; docs/account.md):
- counters: `increase(gpu_workload_<q>_gpu_seconds_total[window])` is exact across scrape gaps (to a scrape
  interval at a series' edges: docs/ledger.md, "How exact"), and
  keeps the `basis` of busy, SM-active and hidden-idle and which held GPU-seconds had no busy or SM series
  (MPS, MIG): those are unknown, never 0. It reads every workload series of the range.
- rollups (rules/gpu-utilization.rules.yaml, group gpu-workload-recording): one series per group and
  quantity, `increase(counter[W]) / W` evaluated every D seconds, plus `held_without_<q>` (the unknown) and
  the heartbeat `gpu_workload:rollup_window_seconds` (value W, one sample per evaluation). Where the rules
  are believed is read from the data: the heartbeat's timestamps give the evaluations, their spacing D and
  the gaps (rules added later, outages, another evaluator's interval). Inside a run of evenly spaced
  evaluations each sample is a moving sum over W, so sum(samples) x D is the counters' increase over the
  same span shifted back by (W - D) / 2: the report selects the samples whose span lies in the range and
  weighs the two edge samples by their overlap. Spans the rules do not cover (and W after a run starts or
  before it stops, so that a counter's jump across an outage falls into the counters' window) are read
  from the counters.
Queries go day by day (progress, bounded answers). Per-group sums are folded as each answer arrives, so
memory grows with the groups, not with the days or queries.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field

from exporter.holders import report_groups
from exporter.vocabulary import (BUSY, CTXSW, CUPTI, EXACT, HELD, HIDDEN_IDLE, LEDGER, NVML, QUANTITIES, SM_ACTIVE,
                                 TIME_SHARE, UNOBSERVED)  # QUANTITIES, LEDGER: the report's modules read them from here

from .promapi import PrometheusAPI, ReportError, TooManySamples

# QUANTITIES (held, busy, sm_active, hidden_idle, held_idle) and LEDGER (the holders' ledger cells, exporter/ledger.py:
# keyed by cell, not basis) are the exporter's counters (exporter/vocabulary.py).
WITH_BASIS = (BUSY, SM_ACTIVE, HIDDEN_IDLE)  # the counters with a basis label
KEY_LABEL = {LEDGER: "cell"}  # the label a quantity is split by (basis for the rest of WITH_BASIS)
GPU_LEDGER, OBSERVED = "gpu_ledger_gpu_seconds_total", "gpu_ledger_observed_seconds_total"
LOST_GAUGE = "gpu_lost"  # 1 while the GPU answers GPU_IS_LOST, 0 while it answers (docs/metrics.md)
SIGHTING_STEP, SIGHTING_POINTS = 15.0, 11000  # Prometheus: a GPU's first sighting read to 1..15 s (sightings)
SIGHTED_PER_QUERY = 200  # GPUs whose sightings one query asks for (their uuids in one regular expression)
BOOK = "instance, uuid, gpu, model"  # the labels a GPU's ledger is summed by
EDGE = 600.0  # a GPU (or its node) seen within this of an edge of the range was there (scrape intervals up to 10 min)
GPU_LABELS = ("instance", "model", "gpu", "uuid")  # what a per-GPU ledger series is selected by
COVERED = (BUSY, SM_ACTIVE, HIDDEN_IDLE)  # absent under MPS (and busy/hidden-idle on MIG)
# Bases of each quantity (docs/metrics.md): time share from NVML samples, GPU context switches or an MPS client's
# own kernels (cupti); SM active exact (alone on the GPU), from the holder's own context-switch slices, the GPU's
# split by time share, or an MPS client's kernels' grids scaled to the GPU's SM active (cupti: an estimate).
BASES = {BUSY: (NVML, CTXSW, CUPTI), SM_ACTIVE: (EXACT, CTXSW, TIME_SHARE, CUPTI),
         HIDDEN_IDLE: (EXACT, CTXSW, TIME_SHARE, CUPTI)}
EXACT_BASES = (EXACT, CTXSW)
UNLABELLED_BASIS = {BUSY: NVML}  # exporters before the basis label: NVML was the only time share
# --by choices of the GPUs (gpu: with each GPU's own ledger); the holders' are registered
GPU_GROUPS = {"node": ("instance",), "gpu": ("instance", "uuid"), "model": ("model",)}
GPU_RULED = ("node", "model")  # the GPUs' groupings the recording rules roll up (not gpu: one series per GPU)


def ruled() -> tuple[str, ...]:
    """The --by choices the recording rules roll up (rules/gpu-utilization.rules.yaml, generated from the same
    registry by dashboards/rules.py): the GPUs' node and model, and every holder grouping of one label. A
    grouping of several (a pod, with its namespace) is read from the raw counters."""
    return (*GPU_RULED, *(name for name, labels in report_groups().items() if len(labels) == 1))


def group_labels() -> dict[str, tuple[str, ...]]:
    """--by choice -> the labels of a group: the GPUs' groupings, then every registered holder kind's
    (exporter/holders.py KINDS)."""
    return {**GPU_GROUPS, **report_groups()}


def rule_label(by: str) -> str | None:
    """The label the rollups of a --by choice are kept by (None: no rollup; the counters answer)."""
    return group_labels()[by][-1] if by in ruled() else None
HEARTBEAT = "gpu_workload:rollup_window_seconds"
DAY = 86400.0
MIN_SPLIT = 600.0  # seconds: below this a window that still exceeds the sample limit is the user's to narrow
HEARTBEAT_MARGIN = 3600.0  # heartbeat read this far past the range: runs that straddle its edges
EVEN = 0.25  # a spacing more than 25% off the run's is a break (a gap, or another interval)
MAX_EVALUATORS = 16  # heartbeat series named in the note (more than one: the counters are used)
MAX_EVALUATIONS = 4_000_000  # heartbeat evaluations held (400 days at 10 s is 3.5 M)
MAX_GROUPS = 100_000  # groups a report holds (--by pod over 70,000 pods: 205 MB peak, bench/RESULTS.md)
OTHER = "(other)"  # the waste chart's groups beyond the largest wasters, summed as they arrive
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\\n]|\\.)*")\s*')


def counter(quantity: str) -> str:
    return f"gpu_workload_{quantity}_gpu_seconds_total"


def rollup(label: str, quantity: str) -> str:
    return f"{label}:gpu_workload_{quantity}_gpu_seconds:rate5m"


def parse_matchers(texts: list[str]) -> list[tuple[str, str, str]]:
    """--match 'namespace=~"team-.*"' (repeatable, or comma-separated in one flag) into (label, op, quoted)."""
    out = []
    for text in texts:
        pos = 0
        while pos < len(text):
            m = MATCHER.match(text, pos)
            if not m:
                raise ReportError(f'--match {text!r}: expected label="value" (or =~, !=, !~), e.g. '
                                  f"--match 'namespace=~\"team-.*\"'")
            out.append((m.group(1), m.group(2), m.group(3)))
            pos = m.end()
            if pos < len(text):
                if text[pos] != ",":
                    raise ReportError(f"--match {text!r}: matchers are separated by commas")
                pos += 1
    return out


@dataclass
class Plan:
    by: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)
    source: str = "auto"  # auto | rules | counters

    @property
    def labels(self) -> tuple[str, ...]:
        return group_labels()[self.by]

    @property
    def selector(self) -> str:
        return self.selector_with()

    def selector_with(self, *extra: tuple[str, str, str]) -> str:
        return "{" + ", ".join(f"{label}{op}{value}" for label, op, value in (*self.matchers, *extra)) + "}"

    def rules_unusable(self) -> str | None:
        """Why the rollups cannot answer this report, or None."""
        if rule_label(self.by) is None:
            return f"no recording rule groups by {self.by}"
        other = sorted({label for label, _op, _value in self.matchers} - {rule_label(self.by)})
        if other:
            return f"--match on {', '.join(other)}, which the {self.by} rollups do not keep"
        return None

    def counter_queries(self, window: str) -> list[tuple[str, bool, str]]:
        """(quantity, is the unknown of it, expr) for one window."""
        by = ", ".join(self.labels)

        def increase(quantity):
            return f"increase({counter(quantity)}{self.selector}[{window}])"

        queries = [(q, False, f"sum by ({by}{', basis' * (q in WITH_BASIS)}) ({increase(q)})") for q in QUANTITIES]
        queries.append((LEDGER, False, f"sum by ({by}, cell) ({increase(LEDGER)})"))
        for quantity in COVERED:  # held GPU-seconds of holders that have no series of the quantity
            queries.append((quantity, True,
                            f"sum by ({by}) ({increase('held')} unless ignoring (basis) {increase(quantity)})"))
        return queries

    def rule_queries(self, window: str, factor: float, once: bool = False) -> list[tuple[str, bool, str]]:
        """As counter_queries, from the rollups: sum of the samples in the window x factor (their spacing).
        once: what takes every series' copies of the samples in the window down to one (the average less
        the sum: an evaluation stored twice counts once)."""
        label = rule_label(self.by)

        def summed(record, by):
            series = f"{record}{self.selector}[{window}]"
            inner = f"avg_over_time({series}) - sum_over_time({series})" if once else f"sum_over_time({series})"
            return f"sum by ({by}) ({inner}) * {factor!r}"

        queries = [(q, False, summed(rollup(label, q), f"{label}, basis" if q in WITH_BASIS else label))
                   for q in QUANTITIES]
        queries.append((LEDGER, False, summed(rollup(label, LEDGER), f"{label}, cell")))
        queries += [(q, True, summed(rollup(label, f"held_without_{q}"), label)) for q in COVERED]
        return queries


def promql_window(seconds: float) -> str:
    return f"{max(1, int(round(seconds * 1000)))}ms"


def chunks(start: float, end: float, size: float = DAY) -> list[tuple[float, float]]:
    out, t = [], start
    while t < end:
        out.append((t, min(t + size, end)))
        t += size
    return out


@dataclass
class Span:
    """A piece of the range and where its numbers come from. Rules spans select the heartbeat-timed samples
    in (first, last] (sample times), each worth `step` seconds and accounting for the counters' increase
    over (sample - lag - step, sample - lag]; `weight` < 1 for an edge sample that is partly outside."""
    start: float
    end: float
    source: str                # "rules" | "counters"
    first: float = 0.0
    last: float = 0.0
    step: float = 0.0
    weight: float = 1.0
    window: float = 0.0        # W of the rollups (the heartbeat's value)
    twice: tuple = ()          # sample times in (first, last] the store holds more than once
    held_gpu_seconds: float = 0.0


@dataclass
class GpuBook:
    """One GPU's ledger over the range (from its counters), and when it existed in it."""

    instance: str
    uuid: str
    gpu: str = ""
    model: str = ""
    cells: dict = field(default_factory=dict)  # cell -> GPU-seconds (the exporter's cells, lost included)
    observed: float = 0.0                        # seconds an exporter accounted it for (the exporter's cells' sum)
    first: float = math.inf                      # its first and last sample in the range
    last: float = -math.inf
    listed_lost: bool = False                    # gpu_lost was 1 at its last sample
    before: bool = False                         # seen within EDGE before the range: it existed at its start
    existed: float = 0.0                         # seconds from its first sighting to its end (GpuLedgerTotals.close)

    @property
    def unobserved(self) -> float:
        """Existed, and no exporter accounted for it (exporter down, node restarting): never negative."""
        return max(self.existed - self.observed, 0.0)

    def all_cells(self) -> dict:
        """The exporter's cells and unobserved: they sum to the seconds it existed."""
        return {**self.cells, UNOBSERVED: self.unobserved}


@dataclass
class GpuLedgerTotals:
    """The per-GPU ledger over the range: every GPU-second that existed in one cell. A GPU exists from its
    first sighting in the range to its last, or to the range's end while its node is up or it is listed lost
    (docs/ledger.md); what no exporter accounted for of that time is `unobserved`."""

    books: dict = field(default_factory=dict)        # (instance, uuid) -> GpuBook
    skipped: str = ""                                 # why there is none (matchers on holder labels)
    summed: dict | None = None                        # cell -> GPU-seconds of all, where the server summed them
    read_worst: float | None = None                   # the worst GPU's, where the server computed it

    def book(self, metric: dict) -> GpuBook:
        key = (_label(metric, "instance"), _label(metric, "uuid"))
        if key not in self.books:
            if len(self.books) >= MAX_GROUPS:
                raise ReportError(f"more than {MAX_GROUPS:,} GPUs in the range: narrow --match")
            self.books[key] = GpuBook(*key)
        book = self.books[key]
        book.gpu, book.model = book.gpu or _label(metric, "gpu"), book.model or _label(metric, "model")
        return book

    def close(self, start: float, end: float, node_seen: dict) -> None:
        """Each GPU's existence: from the range's start where it was seen within EDGE before it, else from its
        first sighting; to the range's end where it or its node was seen within EDGE of it (`node_seen`:
        instance -> last sighting) or it was listed lost at its last sample, else to its last sighting; never
        less than its exporters observed, never more than the range."""
        for book in self.books.values():
            first = start if book.before else book.first
            last = book.last
            if end - last <= EDGE or book.listed_lost or end - node_seen.get(book.instance, -math.inf) <= EDGE:
                last = end
            # what its exporters accounted for is evidence too (increase() extrapolates past the first sample)
            book.existed = min(max(last - max(first, start), book.observed), end - start)

    @property
    def gpus(self) -> set:
        return set(self.books)

    def sums(self, books=None) -> dict:
        """cell -> GPU-seconds over `books` (default all), unobserved included."""
        if books is None and self.summed is not None:
            return {**self.summed, UNOBSERVED: sum(b.unobserved for b in self.books.values())}
        out: dict = {}
        for book in self.books.values() if books is None else books:
            for cell, value in book.all_cells().items():
                out[cell] = out.get(cell, 0.0) + value
        return out

    @property
    def cells(self) -> dict:
        return self.sums()

    @property
    def observed(self) -> float:
        return sum(b.observed for b in self.books.values())

    @property
    def existed(self) -> float:
        return sum(b.existed for b in self.books.values())

    @property
    def worst(self) -> float:
        """The largest |exporter's cells - observed| / observed of one GPU: how closely its counters add up."""
        if self.read_worst is not None:
            return self.read_worst
        return max((abs(sum(b.cells.values()) - b.observed) / b.observed for b in self.books.values()
                    if b.observed > 0), default=0.0)

    def by_node(self) -> dict:
        """instance -> its GPUs' books."""
        out: dict = {}
        for book in self.books.values():
            out.setdefault(book.instance, []).append(book)
        return out


@dataclass
class Collected:
    totals: dict               # group tuple -> {(quantity, basis or "unknown"): GPU-seconds}
    spans: list                # Span, in time order
    rule_step: float | None    # spacing of the rollup samples used (seconds), None where none were
    rule_window: float | None  # W of the rollups used
    notes: list[str]
    queries: int
    ledger: GpuLedgerTotals = field(default_factory=GpuLedgerTotals)

    def source_seconds(self) -> dict:
        """source -> (seconds of the range, held GPU-seconds) it answered."""
        out: dict[str, list[float]] = {}
        for span in self.spans:
            entry = out.setdefault(span.source, [0.0, 0.0])
            entry[0] += span.end - span.start
            entry[1] += span.held_gpu_seconds
        return {source: tuple(v) for source, v in out.items()}


def _metric(sample) -> dict:
    """A sample's labels; anything else a hostile server sends reads as no labels."""
    metric = sample.get("metric") if isinstance(sample, dict) else None
    return metric if isinstance(metric, dict) else {}


def _label(metric: dict, label: str, default: str = "") -> str:
    """A label's value: a string in the Prometheus API, anything else is a hostile server's."""
    value = metric.get(label, default)
    if not isinstance(value, str):
        raise ReportError(f"the server answered label {label[:40]!r} as a {type(value).__name__}, not a string: "
                          f"is it a Prometheus API?")
    return value


def _group(metric: dict, labels) -> tuple:
    return tuple(_label(metric, label) for label in labels)


def _pairs(series):
    """A range vector's (time, value) pairs, finite values only; ReportError for what is not a pair of numbers."""
    values = series.get("values") if isinstance(series, dict) else None
    for pair in values if isinstance(values, list) else ():
        try:
            t, value = float(pair[0]), float(pair[1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise ReportError("the server answered a range sample that is not a time and a number: is it a "
                              "Prometheus API?") from None
        if math.isfinite(value):
            yield t, value


def _value(sample: dict) -> float:
    try:
        value = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ReportError("the server answered a sample without a numeric value: is it a Prometheus API?") from None
    return value if math.isfinite(value) else 0.0


# --- where the rules ran: the heartbeat's evaluations -------------------------------------------------------

def heartbeat(api: PrometheusAPI, plan: Plan, start: float, end: float,
              notes: list) -> tuple[list[tuple[float, float]], set]:
    """(time, W) of every evaluation of the rollup group between start and end, read a day at a time, and the
    times the store holds more than once (vmalert's replay writes the edge of each of its range queries
    twice, a remote-write retry can too: each rollup sample there would count twice)."""
    found: dict[tuple, dict[float, float]] = {}  # the first evaluator's evaluations; the others' names only
    evaluators: dict[tuple, None] = {}  # the first MAX_EVALUATORS named, the rest counted
    more, kept = False, 0
    twice: set = set()
    for chunk_start, chunk_end in chunks(start, end):
        expr = f"{HEARTBEAT}[{promql_window(chunk_end - chunk_start)}]"
        for series in api.query_matrix(expr, chunk_end):
            metric, values = _metric(series), series.get("values") if isinstance(series, dict) else None
            key = tuple(sorted((str(k)[:200], str(v)[:200]) for k, v in metric.items()))
            for pair in values if isinstance(values, list) else []:
                try:
                    t, v = float(pair[0]), float(pair[1])
                except (TypeError, ValueError, IndexError, KeyError):
                    continue
                if chunk_start < t <= chunk_end and math.isfinite(v) and v > 0:
                    if key not in evaluators:
                        if len(evaluators) >= MAX_EVALUATORS:
                            more = True
                            break
                        evaluators[key] = None
                    if found and key not in found:  # a second evaluator: the counters are used, its times not needed
                        break
                    seen = found.setdefault(key, {})
                    if t in seen:
                        twice.add(t)
                    elif kept >= MAX_EVALUATIONS:
                        raise ReportError(f"more than {MAX_EVALUATIONS:,} evaluations of {HEARTBEAT} in the range: "
                                          f"use --source counters, or a shorter range")
                    else:
                        kept += 1
                    seen[t] = v
    if len(evaluators) > 1:  # two evaluators (replicas, Prometheus and vmalert): every rollup counts twice
        names = "; ".join(",".join(f"{k}={v}" for k, v in key) or "(no labels)" for key in sorted(evaluators))
        count = f"more than {len(evaluators)}" if more else str(len(evaluators))
        names += "; and more" if more else ""
        notes.append(f"{count} rule evaluators write {HEARTBEAT} ({names}): their rollups would add up, "
                     f"the counters are used (deduplicate replicas; several clusters' rules in one store are not told "
                     f"apart from replicas yet)")
        return [], set()
    if twice:
        notes.append(f"{len(twice)} rule evaluation{'s' * (len(twice) > 1)} stored more than once (vmalert's "
                     f"replay, remote-write retries): each counted once (VictoriaMetrics -dedup.minScrapeInterval "
                     f"removes such copies)")
    return (sorted(next(iter(found.values())).items()) if found else []), twice


def runs(evaluations: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """Evaluations split where the spacing breaks: a gap, a change of interval or of window, or a spacing
    longer than the window (the samples would not cover the time between them)."""
    out: list[list[tuple[float, float]]] = []
    for t, window in evaluations:
        run = out[-1] if out else None
        if run:
            gap, last_w = t - run[-1][0], run[-1][1]
            step = run[1][0] - run[0][0] if len(run) > 1 else gap
            if window == last_w and gap <= window and abs(gap - step) <= EVEN * step:
                run.append((t, window))
                continue
        out.append([(t, window)])
    return out


def why_no_rollups(evaluations) -> str:
    """Why no span of the range can come from the rollups: no evaluation at all, or too few in a run yet (a
    run's first and last window are left to the counters, so it needs more than two windows of evaluations)."""
    if not evaluations:
        return (f"no {HEARTBEAT} in the range: the recording rules (rules/gpu-utilization.rules.yaml, group "
                f"gpu-workload-recording) did not run there")
    run = max(runs(evaluations), key=len)
    times, window = [t for t, _w in run], run[0][1]
    step = statistics.median(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else window
    need = max(3, math.ceil(2 * window / step) + 1)
    edges = f"the first and last {window:g} s of a run come from the counters"
    if len(run) < 2:
        return f"too few evaluations of the recording rules yet: 1, need more than {2 * window:g} s of them ({edges})"
    if len(run) < need:
        return f"too few evaluations of the recording rules yet: {len(run)}, need {need} (every {step:g} s; {edges})"
    return f"the recording rules' {len(run)} evaluations do not reach into the range"


def other_groupings(api: PrometheusAPI, plan: Plan, start: float, end: float) -> str:
    """For a report whose every group is (none): the --by choices whose label the held series do carry."""
    held = counter(HELD) + plan.selector
    found = [f"--by {by} ({len(values)})" for by, labels in group_labels().items() if by != plan.by
             and (values := [v for v in api.label_values(labels[-1], held, start, end) if v])]
    said = f"; {', '.join(found)} {'has' if len(found) == 1 else 'have'} data" if found else ""
    return f"every group is (none): no workload series of the range carries {'/'.join(plan.labels)}{said}"


def plan_spans(evaluations, start: float, end: float, twice=frozenset()) -> list[Span]:
    """The range cut into rules spans (where a run of evaluations covers it) and counters spans (the rest)."""
    covered: list[Span] = []
    for run in runs(evaluations):
        if len(run) < 3:
            continue
        times = [t for t, _w in run]
        step = statistics.median(b - a for a, b in zip(times, times[1:]))
        window = run[0][1]
        lag = (window - step) / 2  # a moving sum over W sampled every step lags W/2 - step/2

        def overlap(t):  # the part of the sample's own span, (t - lag - step, t - lag], inside the range
            return (min(end, t - lag) - max(start, t - lag - step)) / step

        # A run that starts (rules added, evaluator back) or stops inside the range leaves its first and last
        # W to the counters: their window then reaches raw samples on both sides of any scrape gap there.
        low = times[0] + window if times[0] - lag - step > start else -math.inf
        high = times[-1] - window if times[-1] - lag < end else math.inf
        usable = [t for t in times if low <= t <= high and overlap(t) > 1e-9]
        if not usable:
            continue
        edges = []
        if overlap(usable[0]) < 1 - 1e-9:  # straddles the range's start: weighed by the part inside
            t = usable.pop(0)
            covered.append(Span(start, t - lag, "rules", t - step / 2, t, step, overlap(t), window))
        if usable and overlap(usable[-1]) < 1 - 1e-9:
            t = usable.pop()
            edges.append(Span(t - lag - step, end, "rules", t - step / 2, t, step, overlap(t), window))
        if usable:
            covered.append(Span(usable[0] - lag - step, usable[-1] - lag, "rules", usable[0] - step / 2,
                                usable[-1], step, window=window))
        covered += edges
    for span in covered:
        span.twice = tuple(sorted(t for t in twice if span.first < t <= span.last))
    out, t = [], start
    for span in sorted(covered, key=lambda s: s.start):
        if span.start < t - 1.0:  # overlapping runs (one evaluator cannot make them): keep the first
            continue
        if span.start > t + 1.0:
            out.append(Span(t, span.start, "counters"))
        else:  # within a second: evaluation jitter, not a gap
            span.start = t
        out.append(span)
        t = span.end
    if t < end - 1.0:
        out.append(Span(t, end, "counters"))
    return out


# --- reading ----------------------------------------------------------------------------------------------

class Totals:
    """GPU-seconds per group and (quantity, basis), folded answer by answer; at most MAX_GROUPS groups."""

    def __init__(self, labels):
        self.labels = labels
        self.groups: dict[tuple, dict[tuple[str, str], float]] = {}

    def _row(self, group: tuple) -> dict:
        row = self.groups.get(group)
        if row is None:
            if len(self.groups) >= MAX_GROUPS:
                raise ReportError(f"more than {MAX_GROUPS:,} groups by {', '.join(self.labels)}: group by a coarser "
                                  f"label (--by) or narrow --match")
            row = self.groups[group] = {}
        return row

    def merge(self, other: "Totals"):
        while other.groups:
            group, row = other.groups.popitem()
            mine = self._row(group)
            for key, value in row.items():
                mine[key] = mine.get(key, 0.0) + value

    def add(self, plan_quantity: str, unknown: bool, samples: list[dict], signed: bool = False) -> float:
        """Folds one answer in; returns the held GPU-seconds it added (for the span's own total). signed: a
        correction, negative values included."""
        added = 0.0
        seen = set()  # an answer holds each series once (a server repeating one would count it again)
        for sample in samples:
            value = _value(sample)
            metric = _metric(sample)
            if unknown:
                basis = "unknown"
            elif plan_quantity in KEY_LABEL:
                basis = _label(metric, KEY_LABEL[plan_quantity]) or "unknown"
            elif plan_quantity in WITH_BASIS:
                basis = _label(metric, "basis") or UNLABELLED_BASIS.get(plan_quantity, "unknown")
            else:
                basis = "exact"
            group = _group(metric, self.labels)
            series = (group, _label(metric, KEY_LABEL.get(plan_quantity, "basis")))
            if series in seen:
                raise ReportError("the server answered one series twice in one answer: is it a Prometheus API?")
            seen.add(series)
            if unknown and value <= 0 and not signed:
                continue
            key = (plan_quantity, basis)
            row = self._row(group)
            row[key] = row.get(key, 0.0) + value
            if plan_quantity == HELD and not unknown:
                added += value
        return added


def collect(api: PrometheusAPI, plan: Plan, start: float, end: float, progress=None) -> Collected:
    notes: list[str] = []
    use_rules = plan.source != "counters"
    why_not = plan.rules_unusable()
    if why_not and plan.source == "rules":
        raise ReportError(f"--source rules cannot answer this report: {why_not} (use --source counters)")
    if why_not:
        use_rules = False
        notes.append(f"counters used: {why_not}")
    spans = [Span(start, end, "counters")]
    if use_rules:
        evaluations, twice = heartbeat(api, plan, start - HEARTBEAT_MARGIN, end + HEARTBEAT_MARGIN, notes)
        spans = plan_spans(evaluations, start, end, twice)
        if plan.source == "rules" and not any(s.source == "rules" for s in spans):
            raise ReportError(f"{why_no_rollups(evaluations)}; use --source counters (or auto)")
        if plan.source == "rules":
            uncovered = sum(s.end - s.start for s in spans if s.source == "counters")
            if uncovered:
                notes.append(f"--source rules: {uncovered / 3600:.2f} h of the range have no rollups and come "
                             f"from the counters")
    pieces = [(span, a, b) for span in spans for a, b in
              (chunks(span.start, span.end) if span.source == "counters" else [(span.start, span.end)])]
    totals = Totals(plan.labels)
    for number, (span, piece_start, piece_end) in enumerate(pieces, 1):
        if span.source == "rules":
            span.held_gpu_seconds += _rules_span(api, plan, span, totals)
        else:
            span.held_gpu_seconds += _counters_span(api, plan, piece_start, piece_end, notes, totals)
        if progress:
            progress(number, len(pieces), piece_end)
    ruled = [s for s in spans if s.source == "rules"]
    steps = sorted({s.step for s in ruled})
    if len(steps) > 1:
        notes.append(f"the rules ran at {len(steps)} intervals in the range: {', '.join(f'{s:g} s' for s in steps)}")
    windows = sorted({s.window for s in ruled})
    ledger = gpu_ledger(api, plan, start, end)
    return Collected(totals.groups, spans, steps[0] if len(steps) == 1 else None,
                     windows[0] if len(windows) == 1 else None, notes, api.requests, ledger)


def gpu_ledger(api: PrometheusAPI, plan: Plan, start: float, end: float) -> GpuLedgerTotals:
    """Every GPU's cells, observed seconds and sightings over the range, from the counters (a few series per
    GPU: a day at a time for --by gpu and --by node, else summed by the server over the range). GPUs are
    selected by the matchers on GPU labels only: a matcher on a holder label selects holders, not GPUs, so the
    GPU ledger is left out (and says why)."""
    out = GpuLedgerTotals()
    holder_matchers = sorted({label for label, _op, _v in plan.matchers} - set(GPU_LABELS))
    if holder_matchers:
        out.skipped = f"--match on {', '.join(holder_matchers)} selects holders, not GPUs"
        return out
    if plan.by in ("gpu", "node") or not _fleet_cells(api, plan, start, end, out):
        _each_gpus_cells(api, plan, start, end, out)
    if not out.books:
        return out
    _existence(api, plan, start, end, out)
    return out


def _fleet_cells(api: PrometheusAPI, plan: Plan, start: float, end: float, out: GpuLedgerTotals) -> bool:
    """A report without a GPU's or node's own ledger: each GPU's observed seconds and listing over the whole
    range (a GPU each), its cells and the worst GPU's counters summed by the server (one answer each, which
    the server reads once and VictoriaMetrics caches). False where the server's sample limit refuses a whole
    range: the per-GPU reads a day at a time answer then (_each_gpus_cells)."""
    window = promql_window(end - start)
    cells = f"sum by ({BOOK}) (increase({GPU_LEDGER}{plan.selector}[{window}]))"
    observed = f"sum by ({BOOK}) (increase({OBSERVED}{plan.selector}[{window}]))"
    try:
        seen = api.query(observed, end)
        listed = api.query(f"max by ({BOOK}) (max_over_time({LOST_GAUGE}{plan.selector}[{window}]))", end)
        summed = api.query(f"sum by (cell) (increase({GPU_LEDGER}{plan.selector}[{window}]))", end)
        # a GPU observed without cells is 100% off, as in GpuLedgerTotals.worst
        worst = api.query(f"max(abs(({cells} or {observed} * 0) - {observed}) / ({observed} > 0))", end)
    except TooManySamples:
        return False
    for sample in seen:  # a GPU each, over the whole range
        book = out.book(_metric(sample))
        book.observed += _value(sample)
    for sample in listed:
        out.book(_metric(sample))  # a GPU its exporter lists, lost or not (gpu_lost 0 or 1)
    out.summed = {}
    for sample in summed:
        cell = _label(_metric(sample), "cell") or "unknown"
        out.summed[cell] = out.summed.get(cell, 0.0) + _value(sample)
    out.read_worst = max((_value(sample) for sample in worst), default=0.0)
    return True


def _each_gpus_cells(api: PrometheusAPI, plan: Plan, start: float, end: float, out: GpuLedgerTotals) -> None:
    """Every GPU's cells, observed seconds and listing, a day at a time (--by gpu, --by node)."""
    for a, b in chunks(start, end):
        window = promql_window(b - a)
        for sample in api.query(f"sum by ({BOOK}, cell) (increase({GPU_LEDGER}{plan.selector}[{window}]))", b):
            metric = _metric(sample)
            book = out.book(metric)
            cell = _label(metric, "cell") or "unknown"
            book.cells[cell] = book.cells.get(cell, 0.0) + _value(sample)
        for sample in api.query(f"sum by ({BOOK}) (increase({OBSERVED}{plan.selector}[{window}]))", b):
            out.book(_metric(sample)).observed += _value(sample)
        for sample in api.query(f"max by ({BOOK}) (max_over_time({LOST_GAUGE}{plan.selector}[{window}]))", b):
            out.book(_metric(sample))  # a GPU its exporter lists, lost or not (gpu_lost 0 or 1)


def _existence(api: PrometheusAPI, plan: Plan, start: float, end: float, out: GpuLedgerTotals) -> None:
    """When each GPU existed: the range's edges, its listing as lost, its node's up, and the sightings of
    the GPUs the edges do not settle."""
    edge = promql_window(EDGE)
    present = f"count by ({BOOK}) (last_over_time({OBSERVED}{plan.selector}[{edge}]) or " \
              f"last_over_time({LOST_GAUGE}{plan.selector}[{edge}]))"
    for sample in api.query(present, start):
        out.book(_metric(sample)).before = True
    for sample in api.query(present, end):
        out.book(_metric(sample)).last = end
    window = promql_window(min(end - start, DAY))
    for sample in api.query(f"max by ({BOOK}) (last_over_time({LOST_GAUGE}{plan.selector}[{window}]))", end):
        out.book(_metric(sample)).listed_lost = _value(sample) >= 1
    node_seen: dict = {}  # a node whose target answered (up 1) or was still scraped (up 0) in the last EDGE
    for sample in api.query(f"count by (instance) (last_over_time(up{_instance_selector(plan)}[{edge}]))", end):
        node_seen[_label(_metric(sample), "instance")] = end
    for book in out.books.values():
        node_seen[book.instance] = max(node_seen.get(book.instance, -math.inf), book.last)
    # what the edges do not say: when a GPU that appeared in the range was first seen, when one that left it
    # with its node was last seen (few GPUs: a sighting costs Prometheus a subquery)
    wanted = {"min": [b for b in out.books.values() if not b.before],
              "max": [b for b in out.books.values() if end - node_seen[b.instance] > EDGE and not b.listed_lost]}
    for which, books in wanted.items():
        for first in range(0, len(books), SIGHTED_PER_QUERY):
            uuids = "|".join(re.escape(b.uuid) for b in books[first:first + SIGHTED_PER_QUERY])
            selector = plan.selector_with(("uuid", "=~", json.dumps(uuids)))
            for a, b in chunks(start, end):
                for name in (OBSERVED, LOST_GAUGE):  # the ledger's clock, or a GPU listed by an older exporter
                    for sample in sightings(api, which, name, selector, b - a, b):
                        book = out.book(_metric(sample))
                        if which == "min":
                            book.first = min(book.first, _value(sample))
                        else:
                            book.last = max(book.last, _value(sample))
    out.close(start, end, node_seen)


def sightings(api: PrometheusAPI, which: str, name: str, selector: str, window_seconds: float,
              at: float) -> list[dict]:
    """The first (min) or last (max) sample time of each GPU's series in the window. VictoriaMetrics reads
    them from the raw samples (tfirst_over_time, tlast_over_time); Prometheus, which has neither, from the
    sample timestamps at every step of the window (a subquery, at most SIGHTING_POINTS steps of 1 to
    SIGHTING_STEP seconds: a first sighting is late by up to a step)."""
    by = BOOK
    if api.dialect != "promql":
        metricsql = {"min": "tfirst_over_time", "max": "tlast_over_time"}[which]
        try:
            return api.query(f"{which} by ({by}) ({metricsql}({name}{selector}[{promql_window(window_seconds)}]))", at)
        except ReportError as exc:
            if metricsql not in str(exc):
                raise
            api.dialect = "promql"  # the server does not know the function: Prometheus' PromQL
    window, step = promql_window(window_seconds), promql_window(min(max(window_seconds / SIGHTING_POINTS, 1.0),
                                                                    SIGHTING_STEP))
    return api.query(f"{which} by ({by}) ({which}_over_time(timestamp({name}{selector})[{window}:{step}]))", at)


def _instance_selector(plan: Plan) -> str:
    """The report's matchers on instance alone: what selects the nodes' `up` series."""
    matchers = [f"{label}{op}{value}" for label, op, value in plan.matchers if label == "instance"]
    return "{" + ", ".join(matchers) + "}" if matchers else ""


def _counters_span(api, plan, start, end, notes, totals: Totals) -> float:
    """The counters over start..end, in halves (and their halves) where the server's sample limit refuses
    the whole: increases over adjacent windows add up."""
    window = Totals(totals.labels)  # folded answer by answer; merged once the whole window has answered
    try:
        held = sum(window.add(q, unknown, api.query(expr, end))
                   for q, unknown, expr in plan.counter_queries(promql_window(end - start)))
    except TooManySamples:
        if end - start <= MIN_SPLIT:
            raise
        middle = start + (end - start) / 2
        note = "the server's sample limit split days into shorter windows (counters)"
        if note not in notes:
            notes.append(note)
        return _counters_span(api, plan, start, middle, notes, totals) + \
            _counters_span(api, plan, middle, end, notes, totals)
    totals.merge(window)
    return held


def _rules_span(api, plan, span: Span, totals: Totals) -> float:
    # samples in (first, last]: a window of last - first less 1 ms (Prometheus 2 includes its left edge)
    window = promql_window(span.last - span.first - 0.001)
    held = sum(totals.add(q, unknown, api.query(expr, span.last))
               for q, unknown, expr in plan.rule_queries(window, span.step * span.weight))
    for t in span.twice:  # each copy beyond the first taken back
        held += sum(totals.add(q, unknown, api.query(expr, t), signed=True)
                    for q, unknown, expr in plan.rule_queries("1ms", span.step * span.weight, once=True))
    return held


def timeline(api: PrometheusAPI, plan: Plan, collected: Collected, cells, step: float, charted=None):
    """GPU-seconds per step of the holders' ledger `cells` summed, per group: the waste-over-time chart
    (rollups where they answered, the counters elsewhere; a chart, so the rollups' lag is not corrected here).
    `charted`: the groups drawn on their own; the others are summed as they arrive into one group named
    OTHER, so what is held grows with the steps, not with the groups."""
    import pandas as pd

    other = (OTHER,) * len(plan.labels)
    points: dict[tuple, float] = {}
    selector = plan.selector_with(("cell", "=~", '"' + "|".join(cells) + '"'))
    for span in collected.spans:
        if span.end - span.start < step:
            continue
        window = promql_window(step)
        if span.source == "rules":
            label = rule_label(plan.by)
            expr = (f"sum by ({label}) (sum_over_time({rollup(label, LEDGER)}{selector}[{window}])) * "
                    f"{span.step!r}")
        else:
            expr = f"sum by ({', '.join(plan.labels)}) (increase({counter(LEDGER)}{selector}[{window}]))"
        for series in api.query_range(expr, span.start + step, span.end, step):
            group = _group(_metric(series), plan.labels)
            if charted is not None and group not in charted:
                group = other
            for t, value in _pairs(series):
                points[(*group, t)] = points.get((*group, t), 0.0) + value
    frame = pd.DataFrame([(*key, value) for key, value in points.items()],
                         columns=[*plan.labels, "t", "gpu_seconds"])
    return frame.groupby([*plan.labels, "t"], as_index=False)["gpu_seconds"].sum()
