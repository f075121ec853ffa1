#!/usr/bin/env bash
# On the device: record NVML answers (compute process lists and MIG mode included) while N small spin
# workers share the GPU, first time-sliced, then under CUDA MPS. Writes into OUTDIR:
#   nvml_h100_time_sliced.json, nvml_h100_mps.json (replayable with --nvml-replay), sharing.log
#   bash tools/record_sharing.sh OUTDIR [WORKERS]
set -uo pipefail
out=${1:?usage: record_sharing.sh OUTDIR [WORKERS]}; n=${2:-4}
cd "$(dirname "$0")/.."
workers() { for _ in $(seq "$n"); do python3 tests/gpu/workloads.py --phases 8:14 >/dev/null & done; }
probe() { python3 -c "
from exporter.nvml import Nvml
from exporter.samplers.nvml import compute_processes
nv = Nvml(); print('$1', 'mig', nv.mig_devices(0)); print('$1', [(p.pid, p.command, p.kind) for p in compute_processes(nv.compute_processes(0))])"; }
{
  nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader
  workers; sleep 5; probe time_sliced
  python3 -m exporter.nvml_replay record "$out/nvml_h100_time_sliced.json" --seconds 5 --interval 0.5 \
      --note "H100: $n processes, each spinning on 8 SMs, time-sliced"
  wait
  base=$(mktemp -d); export CUDA_MPS_PIPE_DIRECTORY=$base/pipe CUDA_MPS_LOG_DIRECTORY=$base/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  workers; sleep 6; probe mps
  python3 -m exporter.nvml_replay record "$out/nvml_h100_mps.json" --seconds 5 --interval 0.5 \
      --note "H100: $n processes, each spinning on 8 SMs, under CUDA MPS"
  wait
  echo quit | nvidia-cuda-mps-control
} 2>&1 | tee "$out/sharing.log"
