#!/usr/bin/env bash
# On the device (one H200, root): the live context-switch source (--workload-ctxsw, default duty) and the NVML
# basis, per Slurm job, against the 10 kHz context-switch truth of the same steady workloads.
#   NSYS_EXTRA_LIB=DIR bash tools/record_ctxsw_live.sh OUTDIR
# The five jobs of tools/record_ctxsw.sh share GPU 0 in their cgroups. Exporter A (port 9479, NVML basis only)
# runs throughout; nsys records 10 s at 10 kHz (the truth); then exporter B (port 9480, --workload-ctxsw,
# default 10 s every 60 s) runs two windows. Both exporters' /api/v1/workloads are read every second.
# Writes into OUTDIR: truth.json (nsys_ingest workloads --json --estimator within, and fit), jobs.json (job ->
# pids from their cgroups), nvml_workloads.jsonl, ctxsw_workloads.jsonl, exporter_{a,b}.log; then
# python3 bench/ctxsw_accuracy.py OUTDIR prints the table (also accuracy.json).
set -uo pipefail
out=${1:?usage: record_ctxsw_live.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
source tools/ctxsw_setup.sh
common=(--interval 1 --kubelet-socket none --hpc-job-mapping-dir "$map" --held-idle-after 10s)
python3 -m exporter --port 9479 "${common[@]}" > "$out/exporter_a.log" 2>&1 &
exporter_a=$!
pids=()
for job in "${jobs[@]}"; do
  bash -c "echo \$\$ > $cg/job_$job/step_0/user/task_0/cgroup.procs; exec timeout 400 python3 bench/ctxsw_jobs.py ${spec[$job]} --seconds 400" \
      > /dev/null 2> "$tmp/job_$job.err" &
  pids+=($!)
done
sleep 12
python3 - "$cg" "${jobs[@]}" > "$out/jobs.json" <<'PY'
import json, sys
cg, jobs = sys.argv[1], sys.argv[2:]
print(json.dumps({j: [int(p) for p in open(f"{cg}/job_{j}/step_0/user/task_0/cgroup.procs").read().split()] for j in jobs}))
PY
poll() {  # poll PORT FILE: /api/v1/workloads every second
  while true; do printf '{"t": %s, "w": %s}\n' "$(date +%s.%N)" "$(curl -s localhost:$1/api/v1/workloads)"; sleep 1; done >> "$2"
}
poll 9479 "$out/nvml_workloads.jsonl" & poll_a=$!
t0=$(date +%s.%N)
"$ns" profile --gpuctxsw=true --trace=none --gpu-metrics-devices=all --gpu-metrics-frequency=10000 \
    --sample=none --cpuctxsw=none -o "$tmp/truth" -f true sleep 10 > "$tmp/truth.log" 2>&1 || tail -3 "$tmp/truth.log"
echo "{\"truth_capture\": [$t0, $(date +%s.%N)]}" > "$out/windows.json"
python3 -m exporter --port 9480 "${common[@]}" --workload-ctxsw --nsys-binary "$ns" > "$out/exporter_b.log" 2>&1 &
exporter_b=$!
poll 9480 "$out/ctxsw_workloads.jsonl" & poll_b=$!
"$ns" export --type sqlite -o "$tmp/truth.sqlite" -f true "$tmp/truth.nsys-rep" > "$tmp/export.log" 2>&1 || tail -3 "$tmp/export.log"
for est in within fit; do
  python3 -m nsys_ingest workloads --json --estimator $est "$tmp/truth.sqlite" > "$out/truth_$est.json" || echo "truth $est failed"
done
sleep 100  # two windows of the live source at its default duty (the first at its start, the second 60 s later)
kill $poll_a $poll_b
curl -s localhost:9480/metrics | grep -E '^gpu_workload|ctxsw' > "$out/metrics_b.prom"
kill "${pids[@]}" $exporter_a $exporter_b; wait "${pids[@]}" $exporter_a $exporter_b
python3 bench/ctxsw_accuracy.py "$out" | tee "$out/accuracy.txt"
rm -rf "$tmp"
