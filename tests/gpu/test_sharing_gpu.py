"""On a real GPU: N workers time-sliced read gpu_sharing_mode time_sliced with N processes; the same
N under CUDA MPS read mps (each worker spins on 8 SMs, tests/gpu/workloads.py); a trainer starved by its
input reads input_bound."""
import os
import subprocess
import sys
import tempfile
import time

import pytest

from tests.gpu import needs
from tests.helpers import ROOT, Exporter, parse_metrics, sample_value, wait_for

pytestmark = pytest.mark.gpu
WORKERS = 4


def _workers(env=None):
    return [subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu" / "workloads.py"), "--phases", "8:25"],
                             env=env, stdout=subprocess.DEVNULL) for _ in range(WORKERS)]


def _settle(exporter, mode, kind):
    def seen():
        samples = parse_metrics(exporter.metrics())
        ok = (sample_value(samples, "gpu_sharing_mode", mode=mode) == 1
              and sample_value(samples, "gpu_compute_processes", kind=kind) == WORKERS)
        return samples if ok else None

    return wait_for(seen, 40, 0.5, f"{WORKERS} {kind} processes, mode {mode}")


def _stop(procs):
    for p in procs:
        p.kill()
        p.wait()


@needs.MPS_CONTROL
@needs.CUPY
def test_time_sliced_then_mps():
    with Exporter("--interval", "0.5", "--no-mps") as exporter:
        procs = _workers()
        try:
            samples = _settle(exporter, "time_sliced", "time_sliced")
            assert sample_value(samples, "gpu_diagnosis", verdict="time_sliced_small_kernels") == 1
        finally:
            _stop(procs)
        base = tempfile.mkdtemp(prefix="mps-sharing-")
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{base}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{base}/log"}
        os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"]), os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
        procs = _workers(env)
        try:
            samples = _settle(exporter, "mps", "mps")
            assert sample_value(samples, "gpu_compute_processes", kind="time_sliced") == 0
            assert sample_value(samples, "gpu_diagnosis", verdict="mps_shared") == 1
        finally:
            _stop(procs)
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True, timeout=30)


@needs.TORCH  # the trainer needs PyTorch, not CuPy
def test_a_trainer_waiting_on_its_input_reads_input_bound():
    """One trainer that makes each batch on the host for 8 ms (tests/gpu/train_worker.py --cpu-input-ms)."""
    with Exporter("--interval", "0.5", "--no-mps") as exporter:
        trainer = subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu" / "train_worker.py"), "--start-at",
                                    str(time.time() + 5), "--seconds", "40", "--batch", "512", "--hidden", "4096",
                                    "--cpu-input-ms", "8"], stdout=subprocess.DEVNULL)
        try:
            gpus = wait_for(lambda: (lambda g: g if (g["diagnosis"] or {}).get("verdict") == "input_bound" else None)(
                exporter.gpus()["gpus"][0]), 45, 0.5, "verdict input_bound")
            assert gpus["sharing_mode"] == "exclusive" and gpus["diagnosis"]["evidence"]["time_utilization"] < 0.5
        finally:
            _stop([trainer])
