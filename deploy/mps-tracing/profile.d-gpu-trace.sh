# /etc/profile.d/gpu-trace.sh on a shared host: every login shell's Python processes trace their own kernels
# for the exporter's cupti source (docs/mps-clients.md). GPU_TRACE_HOME: the folder holding the gpu_trace
# package; each user's Python needs cupti-python (without it: one line, the program runs untraced).
GPU_TRACE_HOME=${GPU_TRACE_HOME:-/opt/gpu-spatial}
export GPU_SPATIAL_TRACE=1 GPU_SPATIAL_TRACE_SOCKET=/run/gpu-spatial/cupti.sock
export PYTHONPATH="$GPU_TRACE_HOME/gpu_trace/autostart${PYTHONPATH:+:$PYTHONPATH}"
