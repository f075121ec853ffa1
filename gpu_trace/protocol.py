"""What the exporter and a traced process say to each other over the exporter's Unix socket.

One JSON object per line, each way:
    exporter -> client   {"trace": SECONDS, "window": N}
    client -> exporter   {"window": N, "pid": PID, "start": WALL_S, "end": WALL_S,
                          "devices": [{"uuid": "GPU-...", "kernels": K, "kernel_busy_s": S, "sm_seconds": S,
                                       "copy_busy_s": S}, ...], "records": R, "refused": R, "buffer_bytes": B}
                         the native library (gpu_trace/native) adds per device "busy_s" (all its SM work),
                         "sm_copy_busy_s", "backlog_busy_s", "queue_gap_s", "sms" (the SMs it may use) and
                         "gpu_sms" (the GPU's), and "native": true
                         or {"window": N, "pid": PID, "error": "why this process cannot be traced"}
The exporter trusts none of it: the pid it uses is the socket peer's (SO_PEERCRED), a "pid" that
differs is refused, and every number is checked against the window (exporter/samplers/cupti.py).
"""
SOCKET_ENV = "GPU_SPATIAL_TRACE_SOCKET"
ENABLE_ENV = "GPU_SPATIAL_TRACE"
DEFAULT_SOCKET = "/run/gpu-spatial/cupti.sock"
MAX_COMMAND_BYTES = 256  # exporter -> client
MAX_REPORT_BYTES = 16384  # client -> exporter: a report of 16 GPUs is ~2.5 KB
MAX_DEVICES = 16
MAX_WINDOW_S = 120.0
