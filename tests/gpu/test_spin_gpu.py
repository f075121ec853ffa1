"""On a real GPU: a spin kernel on a quarter of the SMs reads busy in time but a quarter in space.

Run on the device: `pytest -m gpu tests/gpu -s`. Skipped where there is no GPU.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from tests.gpu import needs
from tests.helpers import ROOT, Exporter

pytestmark = [pytest.mark.gpu, needs.CUPY]


def _sm_count() -> int:
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from workloads import sm_count

    return sm_count()


def _readings(exporter, seconds: float) -> list[dict]:
    rows = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        gpu = exporter.gpus()["gpus"][0]
        spatial = gpu["spatial"] or {}
        rows.append({"time": gpu["time_utilization"], "sm_active": spatial.get("sm_active"),
                     "source": spatial.get("source"), "hidden": gpu["hidden_idle_sm_ratio"]})
        time.sleep(0.5)
    return [r for r in rows if r["time"] is not None and r["sm_active"] is not None]


def _spin_and_read(exporter, sms: int) -> dict:
    load = subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu" / "workloads.py"), "--phases", f"{sms}:9"],
                            stdout=subprocess.DEVNULL)
    try:
        time.sleep(3)  # past start-up and one full window
        rows = _readings(exporter, 4)
    finally:
        load.wait(timeout=60)
    assert rows, "the exporter published no time and spatial readings"
    summary = {"sms": sms, "samples": len(rows), "source": rows[-1]["source"],
               "time_utilization": statistics.mean(r["time"] for r in rows),
               "sm_active": statistics.mean(r["sm_active"] for r in rows),
               "hidden_idle": statistics.mean(r["hidden"] for r in rows)}
    print(json.dumps(summary))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_spin_test.jsonl"), "a") as f:
            f.write(json.dumps(summary) + "\n")
    return summary


def test_quarter_of_the_sms_is_busy_in_time_and_a_quarter_in_space():
    total = _sm_count()
    with Exporter("--interval", "0.5", "--no-mps", "--spatial-sources", "gpm") as exporter:
        quarter = _spin_and_read(exporter, total // 4)
        assert quarter["source"] == "gpm"
        assert quarter["time_utilization"] >= 0.9
        assert 0.18 <= quarter["sm_active"] <= 0.32
        assert quarter["hidden_idle"] >= 0.5

        full = _spin_and_read(exporter, total)
        assert full["sm_active"] >= 0.9
