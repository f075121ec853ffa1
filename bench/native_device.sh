#!/bin/bash
# The native tracer on the device (issue 43), in one call from the repository root (no wheels needed):
#   bash bench/native_device.sh [PHASES]      # default: spins,deepqueue,d2d,cxx,resnet
# Builds gpu_trace/native/gputrace.c with the system C compiler and bench/spin_inject.cu with nvcc, checks the
# record offsets gputrace.c reads against the toolkit's cupti_activity.h, starts MPS in its own folders, runs
# bench/native_tracer_device.py (accuracy and the trainer's cost), then the launch-bound loop's cost traced
# (bench/cupti_slowdown.py) and under PyTorch's profiler (bench/cupti_overhead.py --mode kineto).
# Writes into $OUT (or /tmp/native_device): machine.txt, native_device.json, slowdown.json, kineto.json, logs.tgz.
set -u
out=${OUT:-/tmp/native_device}
mkdir -p "$out/logs"
phases=${1:-spins,deepqueue,d2d,cxx,resnet}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
{ date -u; nvidia-smi -L; python3 --version; echo "cuda $cuda"; } > "$out/machine.txt" 2>&1
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
cupti=$(find "$cuda" /usr/local/cuda* /opt -name 'libcupti.so*' 2>/dev/null | sort | head -1)
echo "libcupti $cupti" >> "$out/machine.txt"
export GPU_SPATIAL_TRACE_LIBRARY=$lib GPU_SPATIAL_CUPTI_LIBRARY=$cupti
tmp=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$tmp/pipe CUDA_MPS_LOG_DIRECTORY=$tmp/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d >> "$out/machine.txt" 2>&1 || echo "MPS did not start" >> "$out/machine.txt"
timeout 420 python3 bench/native_tracer_device.py "$out" --lib $lib --cxx /tmp/spin_inject --phases "$phases" \
  > "$out/logs/native.log" 2>&1
echo "native_tracer_device exit $?" >> "$out/machine.txt"
echo quit | nvidia-cuda-mps-control
if [ "${LAUNCH_COST:-1}" = 1 ]; then
  timeout 90 python3 bench/cupti_slowdown.py "$out/slowdown.json" --kinds launch --window 5 --period 10 --windows 3 \
    > "$out/logs/slowdown.log" 2>&1
  timeout 40 python3 bench/cupti_overhead.py "$out/kineto.json" --mode kineto --seconds 3 > "$out/logs/kineto.log" 2>&1
fi
cp -r "$out/work"/*.txt "$out/logs/" 2>/dev/null
rm -rf "$out/work"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
cat "$out/machine.txt"
