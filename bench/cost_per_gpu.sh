#!/bin/bash
# Cost per GPU on the device (issue 37), in one call (under 10 min) from the repository root, .whl and .device carried
# (bench/device_wheels.sh fetches .whl here):
#   bash bench/cost_per_gpu.sh [cost_per_gpu.py flags]
# Installs the carried wheels (nvitop-exporter 1.7.2, what the exporter lacks there, the gRPC stubs' grpcio and
# protobuf), then runs bench/cost_per_gpu.py and bench/scrape_8x64.py into $OUT (or /tmp/cost_per_gpu), each step
# bounded in time. What comes back is at most 8 files: machine.txt, pip.log, run.log, cost_per_gpu.json,
# scrape_8x64.json, scrape_8x64.log and logs.tgz (every process's log).
set -u
out=${OUT:-/tmp/cost_per_gpu}
mkdir -p "$out"
{ date -u; nvidia-smi -L; nproc; python3 --version; } > "$out/machine.txt" 2>&1
timeout 180 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > "$out/pip.log" 2>&1 || echo "wheel install failed: see pip.log" >> "$out/machine.txt"
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import grpc, google.protobuf as p; print('grpcio', grpc.__version__, 'protobuf', p.__version__)" \
  >> "$out/machine.txt" 2>&1
export NSYS_EXTRA_LIB=$PWD/.device/lib  # libdw for nsys' importer (shared/device-nsys.md)
ls "$NSYS_EXTRA_LIB"/libdw.so.1 >> "$out/machine.txt" 2>&1 || echo "no libdw carried (.device/lib): nsys' importer may fail" >> "$out/machine.txt"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 460 python3 bench/cost_per_gpu.py --out "$out" "$@" > "$out/run.log" 2>&1
echo "cost_per_gpu.py exit $?" >> "$out/run.log"
# /metrics at 8 GPUs x 64 pods, replayed (no GPU needed; the device's cores, not the 2 of CI); its error, if
# any, is in scrape_8x64.json
timeout 110 python3 bench/scrape_8x64.py --seconds 5 --out "$out/scrape_8x64.json" > "$out/scrape_8x64.log" 2>&1
echo "scrape_8x64.py exit $?" >> "$out/run.log"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
tail -c 6000 "$out/run.log"
