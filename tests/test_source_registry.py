"""A spatial source declares its name, flags and needs in its own module (exporter/sources.py SOURCES, issue 44):
tests/dummy_spatial.py, registered from the test suite only, is first in the default order, has its flags and
their check, is published and chosen per GPU, and the nsys captures leave a GPU it profiles alone."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exporter import sources
from exporter.snapshot import OK, SourceResult
from tests.helpers import FIXTURES, ROOT, Exporter, parse_metrics, wait_for


@pytest.fixture
def fixed_registered(monkeypatch):
    monkeypatch.setattr(sources, "SOURCES", {"fixed": "tests.dummy_spatial", **sources.SOURCES})


def test_a_new_spatial_source_is_one_module_first_in_the_default_order():
    with Exporter("--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), "--no-mps", "--interval", "0.2",
                  "--fixed-sm-active", "0.3", module="tests.dummy_spatial") as running:
        wait_for(lambda: running.gpus()["gpus"][0]["spatial"], 20, what="a spatial reading")
        samples = parse_metrics(running.metrics())
        gpu = running.gpus()["gpus"][0]
    assert [s["source"] for s in gpu["sources"]] == ["fixed", "dcgm", "gpm", "nsys"]
    assert gpu["spatial"]["source"] == "fixed" and gpu["spatial"]["sm_active"] == 0.3
    states = {(l["source"], l["state"]): v for l, v in samples["gpu_spatial_source_state"]}
    assert states[("fixed", "active")] == 1 and states[("gpm", "active")] == 0
    assert {l["source"]: v for l, v in samples["gpu_sm_active_ratio"]} == {"fixed": 0.3}


def test_its_flags_are_checked_and_listed():
    run = [sys.executable, "-m", "tests.dummy_spatial"]
    done = subprocess.run([*run, "--fixed-sm-active", "1.5"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--fixed-sm-active 1.5: a ratio is 0..1" in done.stderr
    done = subprocess.run([*run, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert "\nfixed:\n  --fixed-sm-active" in done.stdout and "(default: fixed,dcgm,gpm,nsys)" in done.stdout


def test_the_config_engine_and_chain_read_the_registry(fixed_registered):
    from exporter.config import parse_args
    from exporter.engine import Engine

    assert parse_args([]).spatial_sources == ("fixed", "dcgm", "gpm", "nsys")
    assert parse_args(["--spatial-sources", "gpm,fixed"]).spatial_sources == ("gpm", "fixed")
    assert Engine(type("Nvml", (), {"name": "nvml", "in_nvml_loop": False})()).order == ("fixed", "dcgm", "gpm", "nsys")


def test_an_unregistered_source_is_refused(capsys):
    from exporter.config import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--spatial-sources", "gpm,fixed"])
    assert "want a list of distinct sources from dcgm,gpm,nsys, got 'gpm,fixed'" in capsys.readouterr().err


def test_captures_leave_a_gpu_a_profiling_source_serves_alone(fixed_registered):
    serving = type("Source", (), {"results": {"GPU-a": SourceResult(OK, "")}})()
    idle = type("Source", (), {"results": {"GPU-a": SourceResult("error", "down")}})()
    assert sources.profilers() == {"fixed": "fixedctl pause", "dcgm": "dcgmi profile --pause"}
    assert sources.profiled_by({"fixed": serving}, "GPU-a") == ("fixed", "fixedctl pause")
    assert sources.profiled_by({"fixed": idle, "gpm": serving}, "GPU-a") is None  # GPM profiles nothing
    assert sources.profiled_by({"fixed": serving}, "GPU-b") is None
