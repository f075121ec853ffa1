"""The GPU account: GPU-seconds per group and quantity, read from the workload counters or their rollups.

Two ways to the same numbers (docs/metrics.md, "Workloads"):
- counters: `increase(gpu_workload_<q>_gpu_seconds_total[window])` is exact whatever the scrape gaps, and
  keeps the `basis` of SM-active and hidden-idle and which held GPU-seconds had no busy or SM series
  (MPS, MIG): those are reported as unknown, never as 0. It reads every workload series of the range.
- recording rules: `sum_over_time(<label>:gpu_workload_<q>_gpu_seconds:rate5m[window]) * interval` reads
  one series per group: fast at fleet scale. A rate over 5 minutes evaluated every interval integrates to
  the counter's increase, shifted by at most 5 minutes at the edges of the range. The SM-active and
  hidden-idle rollups keep their basis; no rollup says which held GPU-seconds had no busy series, so a
  group with no busy (or SM) rollup at all is unknown.
Queries are split by day (progress, bounded answers); a day without rollups falls back to the counters.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

import pandas as pd

from .promapi import PrometheusAPI, ReportError, TooManySamples

QUANTITIES = ("held", "busy", "sm_active", "hidden_idle", "held_idle")
WITH_BASIS = ("sm_active", "hidden_idle")     # counters carry basis="exact"|"time_share"
COVERED = ("busy", "sm_active", "hidden_idle")  # absent under MPS (and busy/hidden-idle on MIG)
GROUP_LABELS = {"namespace": ("namespace",), "pod": ("namespace", "pod"), "hpc_job": ("hpc_job",),
                "node": ("instance",), "model": ("model",)}
RULE_LABEL = {"namespace": "namespace", "hpc_job": "hpc_job", "node": "instance", "model": "model"}
DEFAULT_RULE_INTERVAL = 60.0  # rules/gpu-utilization.rules.yaml, group gpu-workload-recording
DAY = 86400.0
MIN_SPLIT = 600.0  # seconds: below this a window that still exceeds the sample limit is the user's to narrow
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
        return GROUP_LABELS[self.by]

    @property
    def selector(self) -> str:
        return "{" + ", ".join(f"{label}{op}{value}" for label, op, value in self.matchers) + "}"

    def rules_unusable(self) -> str | None:
        """Why the rollups cannot answer this report, or None."""
        if self.by not in RULE_LABEL:
            return f"no recording rule groups by {self.by}"
        other = sorted({label for label, _op, _value in self.matchers} - {RULE_LABEL[self.by]})
        if other:
            return f"--match on {', '.join(other)}, which the {self.by} rollups do not keep"
        return None

    def counter_queries(self, window: str) -> list[tuple[str, str, str]]:
        """(quantity, basis or "" to read it from the label, expr) for one window."""
        by = ", ".join(self.labels)

        def increase(quantity):
            return f"increase({counter(quantity)}{self.selector}[{window}])"

        queries = []
        for quantity in QUANTITIES:
            if quantity in WITH_BASIS:
                queries.append((quantity, "", f"sum by ({by}, basis) ({increase(quantity)})"))
            else:
                queries.append((quantity, "exact" if quantity != "busy" else "measured",
                                f"sum by ({by}) ({increase(quantity)})"))
        for quantity in COVERED:  # held GPU-seconds of holders that have no series of the quantity
            queries.append((quantity, "unknown",
                            f"sum by ({by}) ({increase('held')} unless ignoring (basis) {increase(quantity)})"))
        return queries

    def rule_query(self, quantity: str, window: str, interval: float) -> str:
        label = RULE_LABEL[self.by]
        by = f"{label}, basis" if quantity in WITH_BASIS else label  # those rollups keep exact vs time_share
        return f"sum by ({by}) (sum_over_time({rollup(label, quantity)}{self.selector}[{window}])) * {interval:g}"


def promql_window(seconds: float) -> str:
    return f"{int(round(seconds * 1000))}ms"


def chunks(start: float, end: float, size: float = DAY) -> list[tuple[float, float]]:
    out, t = [], start
    while t < end:
        out.append((t, min(t + size, end)))
        t += size
    return out


@dataclass
class Collected:
    rows: pd.DataFrame          # chunk_start, chunk_end, <group labels>, quantity, basis, gpu_seconds
    sources: dict               # source -> number of days it answered
    spans: list                 # (chunk_start, chunk_end, source) of every chunk
    rule_interval: float | None
    notes: list[str]
    queries: int


def collect(api: PrometheusAPI, plan: Plan, start: float, end: float, progress=None) -> Collected:
    notes, interval = [], None
    use_rules = plan.source != "counters"
    why_not = plan.rules_unusable()
    if why_not and plan.source == "rules":
        raise ReportError(f"--source rules cannot answer this report: {why_not} (use --source counters)")
    if why_not:
        use_rules = False
        notes.append(f"counters used: {why_not}")
    if use_rules:
        record = rollup(RULE_LABEL[plan.by], "held")
        interval = api.rule_interval(record)
        if interval is None:
            interval = DEFAULT_RULE_INTERVAL
            notes.append(f"rule interval {interval:g} s assumed (the server lists no rule group recording {record})")
    records, sources, answered, missing_rules = [], {}, [], False
    spans = chunks(start, end)
    for number, (chunk_start, chunk_end) in enumerate(spans, 1):
        window = promql_window(chunk_end - chunk_start)
        found = None
        if use_rules:
            found = _rules_chunk(api, plan, window, chunk_end, interval)
            if found is None and plan.source == "rules":
                found = []
                missing_rules = True
        source = "rules"
        if found is None:
            source = "counters"
            found = _counters_span(api, plan, chunk_start, chunk_end, notes)
        answered.append((chunk_start, chunk_end, source))
        if found:
            sources[source] = sources.get(source, 0) + 1
        records += [(chunk_start, chunk_end, *row) for row in found]
        if progress:
            progress(number, len(spans), chunk_end)
    if missing_rules and not sources:
        raise ReportError(f"no {rollup(RULE_LABEL[plan.by], 'held')} in the range: the recording rules "
                          f"(rules/gpu-utilization.rules.yaml) are not loaded there; use --source counters")
    columns = ["chunk_start", "chunk_end", *plan.labels, "quantity", "basis", "gpu_seconds"]
    return Collected(pd.DataFrame(records, columns=columns), sources, answered,
                     interval if sources.get("rules") else None, notes, api.requests)


def _group(metric: dict, labels) -> tuple:
    return tuple(metric.get(label, "") for label in labels)


def _value(sample: dict) -> float:
    try:
        value = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ReportError("the server answered a sample without a numeric value: is it a Prometheus API?") from None
    return value if math.isfinite(value) else 0.0


def _counters_span(api, plan, start, end, notes) -> list[tuple]:
    """The counters over start..end, in halves (and their halves) where the server's sample limit refuses
    the whole: increases over adjacent windows add up."""
    try:
        return _counters_chunk(api, plan, promql_window(end - start), end)
    except TooManySamples:
        if end - start <= MIN_SPLIT:
            raise
    middle = start + (end - start) / 2
    note = "the server's sample limit split days into shorter windows (counters)"
    if note not in notes:
        notes.append(note)
    return _counters_span(api, plan, start, middle, notes) + _counters_span(api, plan, middle, end, notes)


def _counters_chunk(api, plan, window, at) -> list[tuple]:
    out = []
    for quantity, basis, expr in plan.counter_queries(window):
        for sample in api.query(expr, at):
            value = _value(sample)
            if value > 0 or basis != "unknown":
                out.append((*_group(sample["metric"], plan.labels), quantity,
                            basis or sample["metric"].get("basis", "unknown"), value))
    return out


def _rules_chunk(api, plan, window, at, interval) -> list[tuple] | None:
    """The chunk from the rollups; None when the held rollup has nothing there (fall back to counters)."""
    out = []
    basis_of = {"held": "exact", "held_idle": "exact", "busy": "measured"}
    for quantity in QUANTITIES:
        samples = api.query(plan.rule_query(quantity, window, interval), at)
        if quantity == "held" and not samples:
            return None
        out += [(*_group(s["metric"], plan.labels), quantity,
                 basis_of.get(quantity) or s["metric"].get("basis", "unknown"), _value(s)) for s in samples]
    return out  # a group with no rollup of a quantity at all is unknown there (summary.py)


def timeline(api: PrometheusAPI, plan: Plan, collected: Collected, quantities, step: float) -> pd.DataFrame:
    """GPU-seconds per step of `quantities` summed, per group: the waste-over-time chart."""
    records = []
    for chunk_start, chunk_end, source in collected.spans:
        if chunk_end - chunk_start < step:
            continue
        window = promql_window(step)
        for quantity in quantities:
            if source == "rules":
                expr = plan.rule_query(quantity, window, collected.rule_interval or DEFAULT_RULE_INTERVAL)
            else:
                expr = f"sum by ({', '.join(plan.labels)}) (increase({counter(quantity)}{plan.selector}[{window}]))"
            for series in api.query_range(expr, chunk_start + step, chunk_end, step):
                group = _group(series.get("metric", {}), plan.labels)
                for t, v in series.get("values", []):
                    value = float(v)
                    if math.isfinite(value):
                        records.append((*group, float(t), value))
    frame = pd.DataFrame(records, columns=[*plan.labels, "t", "gpu_seconds"])
    return frame.groupby([*plan.labels, "t"], as_index=False)["gpu_seconds"].sum()


def diagnose_empty(api: PrometheusAPI, plan: Plan, start: float, end: float) -> ReportError:
    """Why a range gave nothing: no exporter at all, an exporter without workload series, or just this range."""
    workload, gpu = counter("held"), "gpu_time_utilization_ratio"
    year = 366 * DAY
    seen = api.metric_names([workload, gpu], end - year, max(end, time.time()) + DAY)
    if workload in seen:
        matched = f" matching {plan.selector}" if plan.matchers else ""
        return ReportError(f"no workload series{matched} between the start and the end: choose a range in which "
                           f"the exporter ran (--start/--end or --last)")
    if gpu in seen:
        return ReportError(f"{api.url} has this exporter's GPU series but no {workload}: holders are known only on "
                           f"Kubernetes (kubelet PodResources) or Slurm (--hpc-job-mapping-dir)")
    return ReportError(f"{api.url} has no series of the gpu-spatial exporter ({workload}): is it the Prometheus "
                       f"(or Thanos/Mimir/VictoriaMetrics) that scrapes or receives it?")
