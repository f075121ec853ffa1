#!/usr/bin/env bash
# On the device (one H100): record the test fixtures from real runs, then run the GPU tests.
#   bash tools/record_fixtures.sh OUTDIR
# Needs nsys (see tools/nsys-capture.sh) and CuPy/PyTorch. Writes into OUTDIR:
#   h100_phases_100hz.sqlite + nvml_h100_phases.json + phases.json: one run sampled by nsys and NVML/GPM at once
#   h100_quarter_sms_50hz.sqlite (hidden idle), h100_matmul_50hz.sqlite (busy, tensor cores)
set -uo pipefail
out=${1:?usage: record_fixtures.sh OUTDIR [all|phases|replays]}; which=${2:-all}
here=$(cd "$(dirname "$0")/.." && pwd)
capture="bash $here/tools/nsys-capture.sh"
cd "$here"
nvidia-smi --query-gpu=name,driver_version,count --format=csv,noheader
[[ $which == replays ]] || $capture "$out/h100_phases_100hz.sqlite" 100 -- bash -c "
  python3 -m exporter.nvml_replay record '$out/nvml_h100_phases.json' --seconds 22 --interval 0.5 \
      --note 'H100: idle, spin on 33 SMs, idle, spin on 132 SMs, bf16 matmul, idle' &
  python3 tests/gpu/workloads.py --phases idle:3,33:4,idle:1,132:4,matmul:4,idle:2 > '$out/phases.json'; wait"
[[ $which == phases ]] || $capture "$out/h100_quarter_sms_50hz.sqlite" 50 -- python3 tests/gpu/workloads.py --phases 33:8 > /dev/null
[[ $which == phases ]] || $capture "$out/h100_matmul_50hz.sqlite" 50 -- python3 tests/gpu/workloads.py --phases matmul:8 > /dev/null
ls -la "$out"
