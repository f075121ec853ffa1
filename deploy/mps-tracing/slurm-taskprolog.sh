#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/slurm-taskprolog.sh): every task's Python
# processes trace their own kernels for the exporter's cupti source (docs/mps-clients.md). Lines printed as
# "export NAME=VALUE" become the task's environment. gpu_trace lives where `pip install gpu-spatial-exporter`
# put it (GPU_TRACE_HOME: the folder holding the gpu_trace package); the job's Python needs cupti-python.
GPU_TRACE_HOME=${GPU_TRACE_HOME:-/opt/gpu-spatial}
echo "export GPU_SPATIAL_TRACE=1"
echo "export GPU_SPATIAL_TRACE_SOCKET=/run/gpu-spatial/cupti.sock"
echo "export PYTHONPATH=$GPU_TRACE_HOME/gpu_trace/autostart${PYTHONPATH:+:$PYTHONPATH}"
