"""What a tick costs in NVML calls per GPU (issue 37), counted on the stand-in NVML library (tests/nvml_library.py)
under the live wrapper, with a clock that moves only when told: the counts are exact.

Rules guarded:
- a GPU that lists no compute process gets no per-process utilization call, one that lists some gets one a tick;
- where GPM measured the tick's busy time, NVML's GPU utilization samples are not read (only the memory
  samples, every 2 s); without GPM, or where another spatial source (DCGM) publishes the GPU, they are read
  every tick;
- process names come from the process lists (every 2 s), not from a call per process and tick;
- every slower read keeps its cadence (2 s, 10 s, 30 s, 60 s) through the one schedule;
- the exact calls per tick and GPU, idle and with 6 time-sliced processes (bench/RESULTS.md, "Cost per GPU").
"""
from __future__ import annotations

import pytest

from exporter.snapshot import OK, SourceResult
from tests.nvml_library import calls_per_tick

IDLE = {"nvmlDeviceGetClockInfo": 2.0, "nvmlDeviceGetComputeRunningProcesses": 0.5,
        "nvmlDeviceGetCurrentClocksEventReasons": 1.0, "nvmlDeviceGetDecoderUtilization": 0.1,
        "nvmlDeviceGetEncoderUtilization": 0.1, "nvmlDeviceGetFieldValues": 0.117,
        "nvmlDeviceGetMPSComputeRunningProcesses": 0.5, "nvmlDeviceGetMemoryInfo": 1.0, "nvmlDeviceGetMigMode": 0.033,
        "nvmlDeviceGetPowerUsage": 1.0, "nvmlDeviceGetSamples": 0.5, "nvmlDeviceGetTemperature": 1.0,
        "nvmlGpmMetricsGet": 1.0, "nvmlGpmSampleGet": 1.0}


def test_an_idle_gpu_costs_its_telemetry_gpm_and_the_memory_samples_every_2_s():
    found = calls_per_tick(gpus=2, processes={}, ticks=60)
    assert found["by_function_per_tick"] == IDLE
    assert found["per_tick"] == {0: 9.85, 1: 9.85}
    assert found["most_in_one_tick"] == {0: 16, 1: 16}  # a tick with the 2 s, 10 s and 30 s reads together


def test_six_time_sliced_processes_add_one_utilization_call_a_tick_and_their_names_every_2_s():
    found = calls_per_tick(gpus=2, processes={0: 6, 1: 6}, ticks=60, busy=99.0)
    calls = found["by_function_per_tick"]
    assert calls["nvmlDeviceGetProcessUtilization"] == 1.0
    assert calls["nvmlSystemGetProcessName"] == 3.0  # 6 names with each list, every 2 s: none per tick
    assert calls["nvmlDeviceGetComputeRunningProcesses"] == 1.0  # pynvml: the count, then the list
    assert calls["nvmlDeviceGetSamples"] == 0.5
    assert found["per_tick"] == {0: 14.35, 1: 14.35}


def test_a_gpu_without_processes_on_one_side_pays_nothing_for_the_other_sides_processes():
    found = calls_per_tick(gpus=2, processes={1: 6}, ticks=60, busy=99.0)
    assert found["per_tick"] == {0: 9.85, 1: 14.35}


def test_without_gpm_the_gpu_utilization_samples_are_read_every_tick():
    found = calls_per_tick(gpus=1, processes={}, ticks=60, gpm=False)
    assert found["by_function_per_tick"]["nvmlDeviceGetSamples"] == 1.5  # GPU each tick, memory every 2 s
    assert "nvmlGpmSampleGet" not in found["by_function_per_tick"]


class Serving:
    """A spatial source that publishes every GPU (DCGM as the chain sees it)."""

    def __init__(self):
        self.results = {f"GPU-00000000-0000-0000-0000-{i:012d}": SourceResult(OK, "serving") for i in range(4)}


def test_where_dcgm_publishes_the_gpu_its_hidden_idle_keeps_nvmls_samples():
    found = calls_per_tick(gpus=1, processes={}, ticks=20, others={"dcgm": Serving()})
    assert found["by_function_per_tick"]["nvmlDeviceGetSamples"] == 1.5


@pytest.mark.parametrize("interval, memory_samples", [(1.0, 0.5), (0.5, 0.25), (2.0, 1.0), (0.25, 0.125)])
def test_the_memory_samples_and_process_lists_keep_their_2_s_cadence_at_any_interval(interval, memory_samples):
    found = calls_per_tick(gpus=1, processes={}, ticks=80, interval=interval)
    assert found["by_function_per_tick"]["nvmlDeviceGetSamples"] == memory_samples
    assert found["by_function_per_tick"]["nvmlDeviceGetComputeRunningProcesses"] == memory_samples


def test_the_slow_reads_keep_10_30_and_60_s():
    found = calls_per_tick(gpus=1, processes={}, ticks=120)
    calls = found["by_function_per_tick"]
    assert calls["nvmlDeviceGetEncoderUtilization"] == round(12 / 120, 3)  # every 10 s
    assert calls["nvmlDeviceGetMigMode"] == round(4 / 120, 3)  # every 30 s
    assert calls["nvmlDeviceGetFieldValues"] == round((12 + 2) / 120, 3)  # health every 10 s, errors every 60 s
