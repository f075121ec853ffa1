"""The README's replay example fires HiddenIdleSMs (issue 27 item 11).

tests/fixtures/h100_quarter_sms_50hz.sqlite starts and ends near idle (GR active 0.01 and 0.53 in its
first and last steps), so a replay of it in a loop breaks the alert's condition every 10 s and it never
holds for the rule's `for` (10 minutes). The showcase, h100_quarter_sms_steady_50hz.sqlite, is the same
H100 recording trimmed to its steady phase (1.6-8.9 s: tools/trim_export.py, then scrub): every step of
its replay meets the condition, at any --interval, so the condition holds for as long as it runs.
Checked twice: each replay step against the thresholds read from the rule (exact, no timing), and by
Debian's Prometheus scraping the replay with `for` at 20 s (more than two loops of the replay).
"""
from __future__ import annotations

import re

import pytest

from exporter.samplers.nsys import NsysSource
from tests.helpers import FIXTURES, ROOT, RULES, Exporter, Prometheus, needs, wait_for

STEADY = FIXTURES / "h100_quarter_sms_steady_50hz.sqlite"
LOOPING = FIXTURES / "h100_quarter_sms_50hz.sqlite"


def thresholds() -> tuple[float, float]:
    """(time at or over, SM active at or under) of HiddenIdleSMs, as the rule writes them."""
    expr = RULES.read_text().split("- alert: HiddenIdleSMs", 1)[1].split("- alert:", 1)[0]
    time = re.search(r"\(gpu_time_utilization_ratio >= ([0-9.]+)\)", expr).group(1)
    sm = re.search(r"\(gpu_sm_active_ratio\) <= ([0-9.]+)\)", expr).group(1)
    return float(time), float(sm)


def steps(path, interval: float) -> list:
    source = NsysSource(interval=interval, replay=str(path))
    (rows,) = source._replay.values()
    out = []
    for _ in rows:
        source.tick()
        (result,) = source.results.values()
        out.append(result.reading)
    return out


def holds(reading) -> bool:
    time, sm = thresholds()
    return reading.time_utilization >= time and 0 < reading.sm_active <= sm


@pytest.mark.parametrize("interval", [0.5, 1.0, 5.0])
def test_every_step_of_the_showcase_meets_the_alerts_condition(interval):
    readings = steps(STEADY, interval)
    assert len(readings) >= 2 and all(holds(r) for r in readings), [(r.time_utilization, r.sm_active) for r in readings]


def test_the_whole_capture_breaks_the_condition_every_loop():
    """Why the showcase exists: the full capture's first and last steps are near idle."""
    readings = steps(LOOPING, 1.0)
    assert [holds(r) for r in readings].count(False) >= 2


def test_the_readme_replays_the_showcase():
    readme = (ROOT / "README.md").read_text()
    assert f"--replay tests/fixtures/{STEADY.name}" in readme


@needs("prometheus")
def test_prometheus_fires_hidden_idle_on_the_showcase_replay(tmp_path):
    prometheus = None
    try:
        with Exporter("--no-nvml", "--no-mps", "--replay", str(STEADY)) as exporter:  # the README's flags
            target = f"127.0.0.1:{exporter.port}"
            prometheus = Prometheus(tmp_path, {"gpu-spatial-exporter": [target]}, alert_for="20s")
            firing = wait_for(lambda: prometheus.query('ALERTS{alertname="HiddenIdleSMs", alertstate="firing"}'),
                              180, 1, "HiddenIdleSMs firing on the showcase replay")
            assert [a["metric"]["instance"] for a in firing] == [target]
    finally:
        if prometheus:
            prometheus.stop()
