#!/usr/bin/env bash
# On the GPU machine (issue 30): the new NVML series against nvidia-smi of the same moment, an NVML
# recording with every new call, and the exporter's footprint side by side with today's.
#
#   timeout 300 bash bench/telemetry_check.sh OUTDIR [BASELINE_DIR]
#
# BASELINE_DIR: a tree of the exporter before this change (exporter/ and nsys_ingest/ at least), e.g.
#   git archive 02ce79e exporter nsys_ingest | tar -x -C /tmp/baseline
# Without it the script makes one with `git archive $BASE_REV` when this is a git checkout, else the
# footprint comparison is skipped (said in OUTDIR/footprint.txt). Finishes in about 3.5 minutes.
# Writes into OUTDIR:
#   nvml_h200_health.json    python3 -m exporter.nvml_replay record, 12 s at 0.5 s (every new call each tick)
#   nvidia-smi-q.txt, dmon.txt, metrics.prom, gpus.json, moments.txt
#                            taken during the recording, at the same moment (dmon: 5 one-second samples)
#   load.json / load.log     a bf16 matmul phase under the recording, if PyTorch is there (else idle)
#   footprint_{base,new}_{1,2}.json, footprint.txt
#                            CPU share of a core at --interval 1 and VmRSS, runs alternated base/new/base/new
#   nvml_call_cost.json      bench/nvml_call_cost.py: CPU and wall time of every NVML call the exporter makes
#   compare.txt              bench/telemetry_compare.py OUTDIR: each new series next to nvidia-smi's figure
set -uo pipefail
out=${1:?usage: telemetry_check.sh OUTDIR [BASELINE_DIR]}
baseline=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
mkdir -p "$out"
out=$(cd "$out" && pwd)
BASE_REV=${BASE_REV:-02ce79e}
py=${PYTHON:-python3}
stamp() { echo "$1 $(date -u +%Y-%m-%dT%H:%M:%S.%NZ)" >> "$out/moments.txt"; }
fetch() { $py -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=10).read())' "$1"; }

nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv > "$out/gpus.csv" 2>&1
$py -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))' >> "$out/gpus.csv" 2>&1

# 1. The new exporter, a recording and nvidia-smi at the same moment (under a matmul load when PyTorch is there).
port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$py -m exporter --port "$port" --interval 1 > "$out/exporter.log" 2>&1 &
exporter=$!
for _ in $(seq 100); do fetch "http://127.0.0.1:$port/healthz" > /dev/null 2>&1 && break; sleep 0.2; done
stamp "recording start"
$py -m exporter.nvml_replay record "$out/nvml_h200_health.json" --seconds 12 --interval 0.5 \
    --note "H200 via bench/telemetry_check.sh: idle 2 s, bf16 matmul 8 s, idle (if PyTorch is installed)" \
    > "$out/record.log" 2>&1 &
recorder=$!
$py tests/gpu/workloads.py --phases idle:2,matmul:8,idle:2 > "$out/load.json" 2> "$out/load.log" &
load=$!
sleep 6  # inside the matmul phase
stamp "nvidia-smi -q, dmon, /metrics"
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1 &
smi=$!
nvidia-smi dmon -c 5 -s pucvmet > "$out/dmon.txt" 2>&1 &
dmon=$!
fetch "http://127.0.0.1:$port/metrics" > "$out/metrics.prom"
fetch "http://127.0.0.1:$port/api/v1/gpus" > "$out/gpus.json"
wait $smi
stamp "nvidia-smi -q done"
wait $dmon
fetch "http://127.0.0.1:$port/metrics" > "$out/metrics_after_dmon.prom"
stamp "dmon done"
wait $recorder; echo "recorder exit $?" >> "$out/record.log"
wait $load; echo "load exit $?" >> "$out/load.log"
kill "$exporter"; wait "$exporter" 2>/dev/null

# 2. What each NVML call costs on this GPU (CPU and wall, mean of 50 calls): the new ones next to the old.
$py bench/nvml_call_cost.py --calls 50 --out "$out/nvml_call_cost.json" > /dev/null 2> "$out/nvml_call_cost.log"

# 3. Footprint: today's exporter and this one, alternated (a drift of the machine hits both alike).
if [[ -z $baseline ]] && git rev-parse --verify -q "$BASE_REV^{commit}" > /dev/null 2>&1; then
    baseline=$(mktemp -d)
    git archive "$BASE_REV" exporter nsys_ingest | tar -x -C "$baseline"
fi
if [[ -n $baseline && -d $baseline/exporter ]]; then
    for round in 1 2; do
        for which in base new; do
            dir=$here; [[ $which == base ]] && dir=$baseline
            $py bench/footprint.py --label "$which" --source-dir "$dir" --warmup 10 --window 25 --early 8 \
                --out "$out/footprint_${which}_${round}.json" >> "$out/footprint.txt" 2>&1
        done
    done
else
    echo "no baseline tree (pass BASELINE_DIR, or run from a git checkout that has $BASE_REV): footprint skipped" \
        > "$out/footprint.txt"
fi

$py bench/telemetry_compare.py "$out" > "$out/compare.txt" 2>&1
ls -la "$out"
cat "$out/compare.txt"
