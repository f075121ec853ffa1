#!/bin/bash
# Cost per GPU on the device (issue 37), in one call (under 10 min) from the repository root, .whl and .device carried:
#   bash bench/cost_per_gpu.sh [cost_per_gpu.py flags]
# Installs the carried wheels (nvitop-exporter 1.7.2 and what the exporter lacks there), then runs
# bench/cost_per_gpu.py into $OUT (or /tmp/cost_per_gpu), each step bounded in time.
set -u
out=${OUT:-/tmp/cost_per_gpu}
mkdir -p "$out"
{ date -u; nvidia-smi -L; nproc; python3 --version; } > "$out/machine.txt" 2>&1
timeout 180 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > "$out/pip.log" 2>&1 || echo "wheel install failed: see pip.log" >> "$out/machine.txt"
export PYTHONPATH=/tmp/site:$PWD
export NSYS_EXTRA_LIB=$PWD/.device/lib  # libdw for nsys' importer (shared/device-nsys.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 490 python3 bench/cost_per_gpu.py --out "$out" "$@" > "$out/run.log" 2>&1
echo "cost_per_gpu.py exit $?" >> "$out/run.log"
# /metrics at 8 GPUs x 64 pods, replayed (no GPU needed; the device's cores, not the 2 of CI)
timeout 70 python3 bench/scrape_8x64.py --seconds 5 --out "$out/scrape_8x64.json" > "$out/scrape_8x64.log" 2>&1
echo "scrape_8x64.py exit $?" >> "$out/run.log"
tail -c 6000 "$out/run.log"
