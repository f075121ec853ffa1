#!/usr/bin/env bash
# On the device (one H100): exports for the verdicts that the first recordings did not cover, each with a
# CUDA kernel trace and GPU metrics at 100 Hz, plus the live exporter's /api/v1/gpus in the middle of each.
#   NSYS_EXTRA_LIB=DIR bash tools/record_verdicts.sh OUTDIR
# Writes into OUTDIR (trimmed with tools/trim_export.py; scrub before committing):
#   membound.sqlite  a = b + 2c over 1.5 GiB fp32 tensors (DRAM-bound kernels)
#   copy.sqlite      device-to-device copies of 3 GiB fp16 tensors (copies, no kernels)
#   launch.sqlite    one process adding to a 16-element tensor in a loop (tiny kernels, host between)
#   oneblock.sqlite  one block spinning 50 ms kernels on one SM
#   ts_long.sqlite   three time-sliced processes (spin on 8 SMs, 4096 bf16 matmuls at 50% duty, a launch
#                    loop) and one that only holds a context; ts_long_nvml.json: NVML per-process samples
#                    read two ways meanwhile (bench/process_util_probe.py)
#   live_NAME.jsonl  the exporter's /api/v1/gpus every 0.5 s while NAME runs (pick the phase's window from
#                    NAME.json, the phases' wall times)
#   ts_long_diagnose.json: nsys_ingest diagnose of the whole untrimmed probe window (per-process busy time)
set -uo pipefail
out=${1:?usage: record_verdicts.sh OUTDIR}
cd "$(dirname "$0")/.."
export NSYS_TRACE=cuda
raw=$(mktemp -d)
port=9478
python3 -m exporter --port $port --interval 0.5 > "$out/exporter_verdicts.log" 2>&1 &
exporter=$!
watch_live() {  # watch_live NAME: /api/v1/gpus every 0.5 s into live_NAME.jsonl until killed
  while true; do curl -s localhost:$port/api/v1/gpus >> "$out/live_$1.jsonl"; echo >> "$out/live_$1.jsonl"; sleep 0.5; done
}

phase() {  # phase NAME SECONDS TRIM_SECONDS: one workloads.py phase after 1 s idle
  local name=$1 seconds=$2 keep=$3 watcher
  watch_live "$name" & watcher=$!
  bash tools/nsys-capture.sh "$raw/$name.sqlite" 100 -- \
      bash -c "python3 tests/gpu/workloads.py --phases idle:1,$name:$seconds > $out/$name.json" || echo "capture $name failed"
  kill $watcher
  python3 tools/trim_export.py "$raw/$name.sqlite" "$out/$name.sqlite" $(python3 -c "
import json; p = json.load(open('$out/$name.json'))['phases'][-1]; mid = (p['start'] + p['end']) / 2
print('--from-epoch', mid - $keep / 2, '--to-epoch', mid + $keep / 2)")
}

phase triad 6 1.5
for f in triad.sqlite live_triad.jsonl triad.json; do mv "$out/$f" "$out/${f/triad/membound}"; done
phase copy 6 1.5
phase launch 6 0.4
phase oneblock 6 1.5
[[ ${PHASES_ONLY:-} ]] && { kill $exporter; wait $exporter; ls -la "$out"; exit 0; }

watch_live ts_long & watcher=$!
bash tools/nsys-capture.sh "$raw/ts_long.sqlite" 100 -- \
    python3 bench/process_util_probe.py --scenario ts3 --seconds 8 --out "$out/ts_long_nvml.json"
kill $watcher
python3 -m nsys_ingest diagnose "$raw/ts_long.sqlite" --json $(python3 -c "
import json, datetime as d; w = json.load(open('$out/ts_long_nvml.json'))['window']
print(*(f'--{k} ' + d.datetime.fromtimestamp(t, d.timezone.utc).isoformat() for k, t in zip(('start', 'end'), w)))") \
    > "$out/ts_long_diagnose.json" || echo "diagnose of the probe window failed"
python3 tools/trim_export.py "$raw/ts_long.sqlite" "$out/ts_long.sqlite" $(python3 -c "
import json; w = json.load(open('$out/ts_long_nvml.json'))['window']; print('--from-epoch', w[0] + 2, '--to-epoch', w[0] + 3.5)")
kill $exporter; wait $exporter
rm -rf "$raw"
ls -la "$out"
