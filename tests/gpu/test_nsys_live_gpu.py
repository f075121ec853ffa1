"""On a real GPU with Nsight Systems: --nsys-live profiles the device in short windows and publishes
SM activity with source="nsys". Give nsys with NSYS_BINARY when it is not on the PATH."""
import os
import shutil
import statistics
import subprocess
import sys
import time

import pytest

from tests.gpu import needs
from tests.helpers import ROOT, Exporter, wait_for

pytestmark = pytest.mark.gpu
NSYS = os.environ.get("NSYS_BINARY") or shutil.which("nsys")


@needs.tool(NSYS, "Nsight Systems (nsys)", "put nsys on the PATH or set NSYS_BINARY")
@needs.CUPY
def test_live_captures_publish_the_quarter_sm_load():
    sms = 33
    load = subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu" / "workloads.py"), "--phases", f"{sms}:45"],
                            stdout=subprocess.DEVNULL)
    try:
        # GPM would serve this H100 first; leave nsys as the only spatial source.
        with Exporter("--spatial-sources", "nsys", "--nsys-live", "--nsys-binary", NSYS, "--nsys-window", "3",
                      "--nsys-frequency", "100", "--no-mps", "--interval", "1") as exporter:
            def live_reading():
                gpu = exporter.gpus()["gpus"][0]
                spatial = gpu["spatial"]
                return spatial if spatial and spatial["source"] == "nsys" and spatial["sm_active"] > 0.05 else None

            try:
                wait_for(live_reading, 35, 1, "a live nsys window with the load in it")
            except TimeoutError:
                raise AssertionError(f"no live window; exporter log:\n{exporter.log()[-3000:]}") from None
            readings = []
            for _ in range(3):
                readings.append(live_reading()["sm_active"])
                time.sleep(4)
            print({"nsys_live_sm_active": readings})
            assert 0.18 <= statistics.median(readings) <= 0.32
    finally:
        load.kill()
        load.wait()
