"""NVML's loop reads at the rate its readers need (issue 47): every --interval while a reader of the JSON API
watches, every --unwatched-interval otherwise; each tick reads every sample NVML buffered since the previous
one and says the window its values describe (docs/exporter.md, "Freshness")."""
import itertools
import json

import pytest

import exporter.engine as engine_module
import exporter.nvml as nvml_module
import exporter.samplers.nvml as sampler_module
from exporter.__main__ import build_engine
from exporter.chain import build_view
from exporter.config import parse_args
from exporter.engine import WATCHED_FOR_S, Engine
from exporter.nvml import Nvml
from exporter.samplers.nvml import NVML_BUFFER_S, NvmlSampler
from exporter.samplers.xid import XidWatcher
from tests.helpers import (
    FIXTURES,
    Exporter,
    http_get,
    parse_metrics,
    sample_value,
    wait_for,
)
from tests.nvml_library import SAMPLE_PERIOD_US, Clock, NvmlLibrary

REPLAY = str(FIXTURES / "nvml_h200_health.json")


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    for module in (sampler_module, engine_module, nvml_module):
        monkeypatch.setattr(module, "time", clock)
    return clock


def every_fifth_busy(seconds: float) -> float:
    """100 % for one sample in five, 0 for the others: exactly 20 % over any whole number of seconds."""
    return 100.0 if round(seconds * 1e6 / SAMPLE_PERIOD_US) % 5 == 0 else 0.0


def ticked(library, sampler):
    with library.installed():
        sampler.tick()
    return next(iter(sampler.telemetry.values()))


def test_an_unwatched_tick_reads_every_buffered_sample_since_the_last_and_says_its_window(clock):
    library = NvmlLibrary(gpus=1, clock=clock)
    library.samples_at = every_fifth_busy
    with library.installed():
        sampler = NvmlSampler(Nvml(), interval=1.0)  # no GPM: NVML's GPU samples are the time utilization
    sampler.xid = XidWatcher(sampler.backend)  # not started: its thread's waits are no tick's calls
    first = ticked(library, sampler)
    clock.advance(10.0)
    calls = len(library.calls)
    tel = ticked(library, sampler)
    assert [name for name, _ in library.calls[calls:]].count("nvmlDeviceGetSamples") == 2  # GPU and memory, once
    view = build_view(tel.identity, tel, {}, (), {}, 1.0)
    assert view.time_window == (first.taken_at, tel.taken_at)
    inside = [v for t, v in tel.gpu_samples if first.taken_at < t <= tel.taken_at]
    assert len(inside) == 50  # every sample of the 10 s, none twice
    assert view.time_utilization == 0.2 and view.memory_time_utilization == 0.2  # not the last second's 0 or 1

    clock.advance(NVML_BUFFER_S + 6.0)  # longer than NVML keeps: the window is what it kept, never more
    tel = ticked(library, sampler)
    view = build_view(tel.identity, tel, {}, (), {}, 1.0)
    assert view.time_window == (tel.taken_at - NVML_BUFFER_S, tel.taken_at)
    assert view.time_utilization == 0.2


def test_the_device_loop_ticks_at_interval_while_watched_and_unwatched_otherwise(clock):
    engine = Engine(NvmlSampler(), interval=1.0)
    assert engine.device_interval() == 1.0  # no unwatched interval: always --interval
    engine.watch()
    assert not engine._watched.is_set()  # and no wait to end: the loop's ticks stay where they were
    clock.advance(WATCHED_FOR_S)
    engine.unwatched_interval = 10.0
    assert engine.device_interval() == 10.0 and engine.longest_interval == 10.0
    engine.watch()
    assert engine.device_interval() == 1.0 and engine._watched.is_set()  # the waiting loop wakes at once
    engine._watched.clear()
    clock.advance(WATCHED_FOR_S / 2)
    engine.watch()  # still watched: no wake-up, the watch extended
    watched_at = clock.now
    assert not engine._watched.is_set()
    clock.now = watched_at + WATCHED_FOR_S - 0.01
    assert engine.device_interval() == 1.0
    clock.now = watched_at + WATCHED_FOR_S
    assert engine.device_interval() == 10.0
    engine.interval = 12.0
    assert engine.device_interval() == 12.0  # never faster than --interval
    engine.watch()  # the watch has just ended: this reader wakes the loop again
    assert engine._watched.is_set()


def test_the_slower_cadence_applies_only_where_no_source_needs_nvml_samples_as_its_windows_end():
    nvml_only = ["--nvml-replay", REPLAY, "--no-mps", "--holders", "none"]
    engine, _ = build_engine(parse_args(nvml_only))
    assert engine.unwatched_interval == 10.0
    engine, _ = build_engine(parse_args([*nvml_only, "--unwatched-interval", "0"]))
    assert engine.unwatched_interval is None
    engine, _ = build_engine(parse_args([*nvml_only, "--replay", str(FIXTURES / "h100_matmul_50hz.sqlite")]))
    assert engine.unwatched_interval is None  # nsys' windows need NVML's samples as they end
    with pytest.raises(SystemExit):
        parse_args(["--unwatched-interval", "10.01"])  # NVML keeps ~14 s: a longer cadence would lose samples


def stamps_seen(running, count: int, read) -> list[float]:
    """The first `count` distinct GPM window ends (gpu_spatial_sample_timestamp_seconds) seen while calling read()."""
    seen: list[float] = []

    def more():
        read()
        stamp = sample_value(parse_metrics(running.metrics()), "gpu_spatial_sample_timestamp_seconds")
        if stamp is not None and (not seen or stamp != seen[-1]):
            seen.append(stamp)
        return len(seen) >= count

    wait_for(more, 60, 0.05, f"{count} GPM windows")
    return seen


def test_scrapes_alone_leave_the_slow_cadence_and_an_api_reader_brings_interval_back():
    with Exporter("--nvml-replay", REPLAY, "--no-mps", "--interval", "0.2", "--unwatched-interval", "2",
                  env={"GPU_EXPORTER_UNWATCHED_INTERVAL": "2"}) as running:
        unwatched = stamps_seen(running, 3, lambda: None)
        # A tick never comes sooner than the cadence after the last (a busy machine can only make it later).
        assert all(later - earlier >= 1.9 for earlier, later in itertools.pairwise(unwatched)), unwatched

        ends = []  # (a replay's GPM windows are as long as recorded: the ticks' times tell the cadence)

        def ticking_at_interval():
            status, body = http_get(running.url + "/api/v1/gpus")
            end = (json.loads(body)["gpus"][0]["spatial"] or {}).get("window_end")
            if status == 200 and end is not None and (not ends or end != ends[-1]):
                ends.append(end)
            return len(ends) >= 3 and ends[-1] - ends[-2] < 1.0

        wait_for(ticking_at_interval, 60, 0.05, "NVML's loop at --interval while the API is read")
