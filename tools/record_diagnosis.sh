#!/usr/bin/env bash
# On the device (one H100): the exports `nsys_ingest diagnose` is tested on, each with a CUDA kernel
# trace and GPU metrics at 100 Hz, plus what the live exporter says about sharing meanwhile.
#   NSYS_EXTRA_LIB=DIR bash tools/record_diagnosis.sh OUTDIR [WORKERS]
# Writes into OUTDIR (trimmed to a steady window with tools/trim_export.py; scrub before committing):
#   time_sliced.sqlite  WORKERS small training processes (tests/gpu/train_worker.py) sharing the GPU by time slices
#   mps.sqlite          the same under CUDA MPS
#   matmul.sqlite       one process of large bf16 matrix products (tests/gpu/workloads.py)
#   input_bound.sqlite  one trainer that makes each batch on the host for 8 ms first
#   live_time_sliced.{prom,json}, live_mps.{prom,json}: the exporter's /metrics and /api/v1/gpus mid-run
#   NAME_workers.jsonl: each trainer's steps
set -uo pipefail
out=${1:?usage: record_diagnosis.sh OUTDIR [WORKERS]}; n=${2:-6}
cd "$(dirname "$0")/.."
export NSYS_TRACE=cuda
raw=$(mktemp -d)
port=9478
nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader
python3 -m exporter --port $port --interval 0.5 > "$out/exporter.log" 2>&1 &
exporter=$!

probe() {  # probe NAME EPOCH: the exporter's view at that wall time
  python3 -c "import time,sys; time.sleep(max(0, float(sys.argv[1]) - time.time()))" "$2"
  curl -s localhost:$port/metrics | grep -E '^gpu_(sharing_mode|compute_processes|diagnosis|sm_active|time_utilization)' > "$out/live_$1.prom"
  curl -s localhost:$port/api/v1/gpus > "$out/live_$1.json"
}

trainers() {  # trainers NAME COUNT WARMUP SECONDS EXTRA-ARGS: capture COUNT trainers starting together
  local name=$1 count=$2 t0
  t0=$(python3 -c "import time; print(round(time.time() + $3, 3))")
  local prober=""
  if [[ $name != input_bound ]]; then probe "$name" "$(python3 -c "print($t0 + 2)")" & prober=$!; fi
  bash tools/nsys-capture.sh "$raw/$name.sqlite" 100 -- bash -c "
    for i in \$(seq $count); do python3 tests/gpu/train_worker.py --start-at $t0 --seconds $4 $5 >> $out/${name}_workers.jsonl & done; wait"
  python3 tools/trim_export.py "$raw/$name.sqlite" "$out/$name.sqlite" --from-epoch "$(python3 -c "print($t0 + 1)")" \
      --to-epoch "$(python3 -c "print($t0 + 2.5)")"
  [[ -z $prober ]] || wait "$prober"
}

trainers time_sliced "$n" 25 4 ""
base=$(mktemp -d); export CUDA_MPS_PIPE_DIRECTORY=$base/pipe CUDA_MPS_LOG_DIRECTORY=$base/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
trainers mps "$n" 25 4 ""
echo quit | nvidia-cuda-mps-control
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
sleep 2
trainers input_bound 1 15 4 "--batch 512 --hidden 4096 --cpu-input-ms 8"
bash tools/nsys-capture.sh "$raw/matmul.sqlite" 100 -- bash -c "python3 tests/gpu/workloads.py --phases idle:1,matmul:3 > $raw/matmul.json"
python3 tools/trim_export.py "$raw/matmul.sqlite" "$out/matmul.sqlite" \
    $(python3 -c "import json; p = json.load(open('$raw/matmul.json'))['phases'][-1]; print('--from-epoch', p['start'] + 0.5, '--to-epoch', p['start'] + 2)")
kill $exporter; wait $exporter
rm -rf "$raw"
ls -la "$out"
