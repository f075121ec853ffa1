#!/bin/bash
# The native tracer on the device (issue 43), in one call from the repository root:
#   bash bench/native_device.sh [PHASES]      # default: cxx,deepqueue,d2d (spins: the MPS spin clients)
#   TRAINER_PHASES=resnet_untraced,resnet,resnet_queued WINDOWS=5 bash bench/native_device.sh deepqueue_queued,api_queued
# Builds gpu_trace/native/gputrace.c with the system C compiler and bench/spin_inject.cu with nvcc, checks the
# record offsets gputrace.c reads against the toolkit's cupti_activity.h, starts MPS in its own folders, runs
# bench/native_tracer_device.py one phase a process (the trainer's phases first: each bounded in time, so a
# stalled trainer costs only its own), then the launch-bound loop's cost traced (bench/cupti_slowdown.py) and
# under PyTorch's profiler (bench/cupti_overhead.py --mode kineto) unless LAUNCH_COST=0. The api phases run
# the real exporter: carry .whl (bench/device_wheels.sh), installed here when present. KINETO=1 (default)
# runs the trainer's phase `resnet` beside PyTorch's profiler.
# Writes into $OUT (or /tmp/native_device): machine.txt, native_device.json, slowdown.json, kineto.json, logs.tgz.
set -u
out=${OUT:-/tmp/native_device}
mkdir -p "$out/logs"
phases=${1:-cxx,deepqueue,d2d}
windows=${WINDOWS:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
{ date -u; nvidia-smi -L; python3 --version; echo "cuda $cuda"; } > "$out/machine.txt" 2>&1
if ls .whl/*.whl > /dev/null 2>&1; then  # the exporter's own packages, for the api phases
  timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl > "$out/logs/pip.log" 2>&1 || echo "wheel install failed: see pip.log" >> "$out/machine.txt"
  export PYTHONPATH=/tmp/site:$PWD
fi
lib=/tmp/libgputrace.so
gcc -O2 -Wall -fPIC -shared -fvisibility=hidden -o $lib gpu_trace/native/gputrace.c -ldl -lpthread \
  >> "$out/machine.txt" 2>&1 || { echo "the library did not build" >> "$out/machine.txt"; exit 1; }
nvcc -O2 -arch=sm_90 -o /tmp/spin_inject bench/spin_inject.cu >> "$out/machine.txt" 2>&1
header=$(find "$cuda" /usr/local/cuda* -name cupti_activity.h 2>/dev/null | head -1)
if [ -n "$header" ]; then
  cat > /tmp/layout.c <<'C'
#include <stdio.h>
#include <stddef.h>
#include <cupti_activity.h>
#define P(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(t, f))
int main(void) {
  P(CUpti_ActivityKernel10, registersPerThread); P(CUpti_ActivityKernel10, start); P(CUpti_ActivityKernel10, deviceId);
  P(CUpti_ActivityKernel10, streamId); P(CUpti_ActivityKernel10, gridX); P(CUpti_ActivityKernel10, blockX);
  P(CUpti_ActivityKernel10, staticSharedMemory); P(CUpti_ActivityKernel10, queued);
  P(CUpti_ActivityMemcpy6, copyKind); P(CUpti_ActivityMemcpy6, start); P(CUpti_ActivityMemcpy6, deviceId);
  P(CUpti_ActivityMemset4, start); P(CUpti_ActivityMemset4, deviceId);
  return 0;
}
C
  gcc -I"$(dirname "$header")" -I"$cuda/include" /tmp/layout.c -o /tmp/layout >> "$out/machine.txt" 2>&1 \
    && /tmp/layout >> "$out/machine.txt"
fi
# the toolkit's CUPTI, the driver's version (Nsight Compute ships an older one of its own)
find / -xdev -name 'libcupti.so*' 2>/dev/null | sed 's/^/found /' >> "$out/machine.txt"
cupti=$(find -L "$cuda" /usr/local/cuda* /opt/torch -name 'libcupti.so*' 2>/dev/null | grep -v nsight | sort | head -1)
echo "libcupti $cupti" >> "$out/machine.txt"
export GPU_SPATIAL_TRACE_LIBRARY=$lib GPU_SPATIAL_CUPTI_LIBRARY=$cupti
tmp=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$tmp/pipe CUDA_MPS_LOG_DIRECTORY=$tmp/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d >> "$out/machine.txt" 2>&1 || echo "MPS did not start" >> "$out/machine.txt"
# one phase a process, each bounded by its windows (a trainer that stalls is killed with its stacks kept)
run_phase() {  # run_phase PHASE SECONDS [FLAGS...]
  local phase=$1 limit=$2; shift 2
  timeout "$limit" python3 bench/native_tracer_device.py "$out/phases/$phase" --lib $lib --cxx /tmp/spin_inject \
    --phases "$phase" --windows "$windows" "$@" > "$out/logs/$phase.log" 2>&1
  echo "$phase exit $?" >> "$out/machine.txt"
}
per_phase=$((windows * 10 + 60))
for phase in $(echo "${TRAINER_PHASES:-resnet}" | tr , ' '); do
  if [ "$phase" = resnet ] && [ "${KINETO:-1}" = 1 ]; then run_phase "$phase" $((2 * per_phase + 30))
  else run_phase "$phase" $per_phase --skip-kineto; fi
done
for phase in $(echo "$phases" | tr , ' '); do run_phase "$phase" $per_phase; done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = [r for f in sorted((out / "phases").glob("*/native_device.json")) for r in json.loads(f.read_text())]
(out / "native_device.json").write_text(json.dumps(rows, indent=1))
PY
echo quit | nvidia-cuda-mps-control
if [ "${LAUNCH_COST:-1}" = 1 ]; then
  timeout 90 python3 bench/cupti_slowdown.py "$out/slowdown.json" --kinds launch --window 5 --period 10 --windows 2 \
    > "$out/logs/slowdown.log" 2>&1
  timeout 40 python3 bench/cupti_overhead.py "$out/kineto.json" --mode kineto --seconds 3 > "$out/logs/kineto.log" 2>&1
fi
for d in "$out"/phases/*/work; do cp "$d"/*.txt "$out/logs/" 2>/dev/null; done
rm -rf "$out/phases"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
cat "$out/machine.txt"
