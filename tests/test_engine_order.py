"""Engine start order (issue 27 item 14): holder samplers (Slurm, kubelet) start once NVML's first
tick has listed the GPUs, so the first Slurm tick on a host with a GPU never says "NVML knows no GPU".

NVML here lists its GPUs only when the test lets it (a slow NVML init, as on the H200): a Slurm tick
before that is the bug. Mutation caught: the Slurm loop started with the others (Engine.start)."""
from __future__ import annotations

import logging
import threading
import time

from exporter.engine import Engine
from exporter.nvml_replay import ReplayNvml
from exporter.samplers.gpm import GpmSource
from exporter.samplers.nvml import NvmlSampler
from exporter.samplers.slurm import SlurmSampler
from tests.helpers import FIXTURES, wait_for

RECORDING = FIXTURES / "nvml_h100_quarter_sms_frame.json"


class SlowToListNvml(ReplayNvml):
    """The recorded NVML, whose device count answers only once `listed` is set."""

    def __init__(self, path):
        super().__init__(path)
        self.listed = threading.Event()
        self.asked = threading.Event()

    def device_count(self):
        self.asked.set()
        self.listed.wait(60)
        return super().__getattr__("device_count")()


def test_slurm_first_tick_sees_the_gpus_nvml_lists(tmp_path, caplog):
    backend = SlowToListNvml(RECORDING)
    nvml = NvmlSampler(backend, interval=0.1)
    mapping = tmp_path / "mapping"
    mapping.mkdir()
    (mapping / "0").write_text("4242\n")
    slurm = SlurmSampler(str(mapping), nvml, proc_root=str(tmp_path), interval=0.1)
    ticks = []
    original = slurm.tick
    slurm.tick = lambda: (ticks.append(len(nvml.gpus)), original())
    engine = Engine(nvml, [GpmSource(nvml), slurm], interval=0.1)
    with caplog.at_level(logging.INFO):
        engine.start()
        try:
            assert backend.asked.wait(30), "NVML never asked for its devices"
            # Give a wrongly started Slurm loop its chance to tick before NVML has answered (bounded).
            deadline = time.monotonic() + 2.0
            while not ticks and time.monotonic() < deadline:
                time.sleep(0.05)
            backend.listed.set()
            wait_for(lambda: ticks, 30, 0.05, "the first Slurm tick")
        finally:
            engine.stop()
    assert ticks[0] == 1, "Slurm ticked before NVML had listed the GPU"
    assert "knows no GPU" not in caplog.text
    assert slurm.snapshot.jobs == {nvml.gpus[0].uuid: ("4242",)}
