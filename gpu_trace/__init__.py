"""The client side of per-client shares under CUDA MPS: a process's own kernels, traced in windows.

A process opts in (docs/mps-clients.md): `gpu-spatial trace -- python train.py`, or
GPU_SPATIAL_TRACE=1 with gpu_trace/autostart on PYTHONPATH. A thread of its own then connects to the
exporter's socket (GPU_SPATIAL_TRACE_SOCKET, default /run/gpu-spatial/cupti.sock) and waits; when the
exporter asks for a window, it records the process's kernels, copies and memsets with CUPTI's activity
API (through NVIDIA's cupti-python bindings), summarises them per GPU (gpu_trace.summary) and answers
with one line. Nothing is recorded while nobody asks; without CUPTI it says so once and does nothing.
This package imports nothing from the exporter: it runs inside the user's application.
"""
