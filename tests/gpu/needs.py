"""What a GPU test needs beyond the GPU, as skip marks whose one reason names what is missing and how
to get it. The GPU itself is checked once for all of them (tests/gpu/conftest.py: "no GPU: ...")."""
from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def module(name: str, why: str, install: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(name) is None,
                              reason=f"missing tool: Python module {name} ({why}): {install}")


def tool(binary: str | None, name: str, install: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not binary or shutil.which(binary) is None, reason=f"missing tool: {name}: {install}")


def root(why: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(os.geteuid() != 0, reason=f"missing privilege: {why} needs root")


CUPY = module("cupy", "the spin workload of tests/gpu/workloads.py", "pip install cupy-cuda12x")
TORCH = module("torch", "the trainer of tests/gpu/train_worker.py", "pip install torch")
MPS_CONTROL = tool("nvidia-cuda-mps-control", "nvidia-cuda-mps-control (CUDA MPS)", "install the NVIDIA driver's MPS tools")
