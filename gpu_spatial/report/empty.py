"""Why a report found no held GPU-seconds, said as the one thing to do: choose another range, wait for the
next scrape (a Prometheus that has just started has scraped the exporter never or once, and an increase
needs two samples), or point --prometheus at the server that scrapes the exporter."""
from __future__ import annotations

import re
from datetime import datetime

from exporter.vocabulary import HELD

from .account import DAY, Plan, _value, counter
from .promapi import PrometheusAPI, ReportError

RECENT = 600.0  # seconds before the range's end in which a first scrape is looked for
JUST_STARTED = 120.0  # seconds: a Prometheus this young may not list its targets yet (it does within ~5 s)
NAMED_TARGETS = 3
NEVER_SCRAPED = "unknown"  # a target's health before its first scrape (the /api/v1/targets API)


def diagnose_empty(api: PrometheusAPI, plan: Plan, start: float, end: float, now: float) -> ReportError:
    """No exporter at all, one not scraped yet, one scraped once, one without holders, or just this range."""
    workload, gpu = counter(HELD), "gpu_time_utilization_ratio"
    seen = api.metric_names([workload, gpu], end - 366 * DAY, max(end, now) + DAY)
    if workload in seen:
        if scraped_once(api, plan, start, end):
            return ReportError(f"{api.url} has one scrape of the workload counters in the range (a Prometheus that has "
                               f"just started?): an account needs two; run the report again after the next scrape, "
                               f"or end the range later")
        matched = f" matching {plan.selector}" if plan.matchers else ""
        return ReportError(f"no workload series{matched} between the start and the end: choose a range in which "
                           f"the exporter ran (--start/--end or --last)")
    if gpu in seen:
        return ReportError(f"{api.url} has this exporter's GPU series but no {workload}: holders are known only on "
                           f"Kubernetes (kubelet PodResources) or Slurm (--hpc-job-mapping-dir)")
    targets = active_targets(api)
    waiting = never_scraped(targets)
    if waiting:
        return ReportError(f"{api.url} has not scraped {', '.join(waiting)} yet (it has just started?): run the "
                           f"report again after its first scrapes, within a scrape interval")
    age = started_ago(api, now)
    # Prometheus lists the targets of its scrape configurations a few seconds after it starts
    if not targets and age is not None and age < JUST_STARTED and scrapes_something(api):
        return ReportError(f"{api.url} started {age:.0f} s ago and lists no scrape target yet: run the report again "
                           f"after its first scrapes, in a minute")
    return ReportError(f"{api.url} has no series of the gpu-spatial exporter ({workload}): is it the Prometheus "
                       f"(or Thanos/Mimir/VictoriaMetrics) that scrapes or receives it?")


def scraped_once(api: PrometheusAPI, plan: Plan, start: float, end: float) -> bool:
    """Whether the range's last minutes hold exactly one sample of a held counter, and none holds more."""
    window = max(1, int(min(end - start, RECENT)))
    found = api.query(f"max(count_over_time({counter('held')}{plan.selector}[{window}s]))", end)
    return bool(found) and isinstance(found[0], dict) and _value(found[0]) == 1


def active_targets(api: PrometheusAPI) -> list:
    """The server's active scrape targets; none where it has no targets API (Thanos, Mimir)."""
    try:
        return api.targets()
    except ReportError:
        return []


def started_ago(api: PrometheusAPI, now: float) -> float | None:
    """Seconds since the server started, where it says (Prometheus' runtime information); None elsewhere."""
    try:
        info = api.runtime_info()
        # RFC3339 with nanoseconds: datetime reads up to microseconds (and "Z" only from Python 3.11)
        started = datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", str(info["startTime"])).replace("Z", "+00:00"))
    except (ReportError, KeyError, TypeError, ValueError):
        return None
    return now - started.timestamp() if started.tzinfo else None


def scrapes_something(api: PrometheusAPI) -> bool:
    """Whether the server's configuration (Prometheus' own rendering of it) has scrape configurations."""
    try:
        rendered = api.configuration()
    except ReportError:
        return False
    return "\nscrape_configs:" in "\n" + str(rendered.get("yaml", ""))


def never_scraped(targets: list) -> list[str]:
    """The scrape URLs of the active targets not scraped yet: at most a few named, then a count."""
    urls = [printable(t.get("scrapeUrl")) for t in targets if isinstance(t, dict) and t.get("health") == NEVER_SCRAPED]
    more = len(urls) - NAMED_TARGETS
    return urls[:NAMED_TARGETS] + ([f"{more} more targets"] if more > 0 else [])


def printable(value, limit: int = 200) -> str:
    """A server's string as one short line of a terminal: no control characters, no escape sequences."""
    return "".join(c if c.isprintable() else "?" for c in str(value)[:limit])
