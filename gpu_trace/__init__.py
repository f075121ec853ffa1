"""The client side of per-client shares under CUDA MPS: a process's own kernels, traced in windows.

A process opts in (docs/mps-clients.md): `gpu-spatial trace -- python train.py`, or
GPU_SPATIAL_TRACE=1 with gpu_trace/autostart on PYTHONPATH. A thread of its own then connects to the
exporter's socket (GPU_SPATIAL_TRACE_SOCKET, default /run/gpu-spatial/cupti.sock) and waits; when the
exporter asks for a window, it records the process's kernels, copies and memsets with CUPTI's activity
API, summarises them per GPU and answers with one line. The records are read natively (gpu_trace/native:
C, no Python object per record; also loaded by the CUDA driver into non-Python programs through
CUDA_INJECTION64_PATH); where that library is not built, NVIDIA's cupti-python does it (gpu_trace.tracer,
gpu_trace.summary), slowing the process inside each window. Nothing is recorded while nobody asks;
without CUPTI it says so once and does nothing. This package imports nothing from the exporter: it runs
inside the user's application.
"""
