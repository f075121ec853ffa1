#!/usr/bin/env bash
# On the device (one H100): per-workload numbers against nsys, as Slurm would leave holders.
#   NSYS_EXTRA_LIB=DIR bash bench/record_workloads.sh OUTDIR
# Four Slurm jobs share GPU 0 (mapping file "0" lists 101-104, a quarter each), each worker moved into its
# job's cgroup (slurmstepd's v2 layout) before it starts CUDA: 101 spins on 8 SMs with 1 ms kernels, 102 runs
# 4096 bf16 matmuls at 50% duty, 103 a launch loop of tiny kernels, 104 holds a context and launches
# nothing. (a) time-sliced under nsys --trace=cuda; (b) the same under MPS. Writes into OUTDIR:
#   ts_workloads.jsonl, mps_workloads.jsonl   the exporter's /api/v1/workloads every 0.5 s
#   ts_pids.json, mps_pids.json               job -> worker pid, and the run's wall window
#   ts_diagnose.json                          nsys_ingest diagnose --json of the steady window (per-process busy)
#   ts_metrics.prom, mps_metrics.prom         /metrics at the end (counters, held idle)
#   accuracy.json                             bench/workload_accuracy.py: exporter vs nsys per job
set -uo pipefail
out=${1:?usage: record_workloads.sh OUTDIR}
cd "$(dirname "$0")/.."
seconds=${SECONDS_PER_RUN:-30}
port=9479
map=$(mktemp -d)
for job in 101 102 103 104; do echo $job; done > "$map/0"
cg=/sys/fs/cgroup/system.slice/slurmstepd.scope
mkdir -p $cg 2>/dev/null && for job in 101 102 103 104; do mkdir -p $cg/job_$job/step_0/user/task_0; done \
  || echo "cannot make cgroups under $cg (cgroup v2 not writable?)"
mount | grep cgroup | head -3
python3 -m exporter --port $port --interval 0.5 --kubelet-socket none --hpc-job-mapping-dir "$map" \
    --held-idle-after 10s > "$out/exporter_workloads.log" 2>&1 &
exporter=$!
sleep 3

workers() {  # workers NAME: the four jobs' workers, each in its cgroup; pids and window to NAME_pids.json
  local name=$1 t0
  t0=$(python3 -c "import time; print(time.time())")
  declare -A spec=([101]="spin 8 2 0" [102]="matmul 4096 30 30" [103]="launch 0 1 1" [104]="hold 0 0 0")
  local pids=() started=()
  for job in 101 102 103 104; do
    bash -c "echo \$\$ > $cg/job_$job/step_0/user/task_0/cgroup.procs 2>/dev/null; exec timeout $((seconds + 60)) python3 bench/process_util_probe.py --out - --seconds $seconds --worker ${spec[$job]}" \
        2> "$out/${name}_worker_$job.log" &
    pids+=("$job:$!"); started+=($!)
  done
  wait "${started[@]}"  # the workers only: a watcher may run in the background of this shell
  python3 -c "
import json, sys, time
print(json.dumps({'window': [$t0, time.time()], 'jobs': {p.split(':')[0]: int(p.split(':')[1]) for p in sys.argv[1:]}}))" "${pids[@]}" > "$out/${name}_pids.json"
}

watch() {  # watch NAME: /api/v1/workloads every 0.5 s until killed
  while true; do curl -s localhost:$port/api/v1/workloads >> "$out/$1_workloads.jsonl"; echo >> "$out/$1_workloads.jsonl"; sleep 0.5; done
}

export NSYS_TRACE=cuda
if [[ -z ${MPS_ONLY:-} ]]; then
watch ts & watcher=$!
raw=$(mktemp -d)
bash tools/nsys-capture.sh "$raw/ts.sqlite" 100 -- bash -c "$(declare -f workers); out=$out cg=$cg seconds=$seconds; workers ts"
kill $watcher
curl -s localhost:$port/metrics | grep -E '^gpu_workload' > "$out/ts_metrics.prom"
python3 -m nsys_ingest diagnose "$raw/ts.sqlite" --json $(python3 -c "
import json, datetime as d; w = json.load(open('$out/ts_pids.json'))['window']
print(*(f'--{k} ' + d.datetime.fromtimestamp(t, d.timezone.utc).isoformat() for k, t in zip(('start', 'end'), (w[0] + 10, w[1] - 2))))") \
    > "$out/ts_diagnose.json" || echo "diagnose failed"
rm -rf "$raw"
fi

base=$(mktemp -d); export CUDA_MPS_PIPE_DIRECTORY=$base/pipe CUDA_MPS_LOG_DIRECTORY=$base/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
watch mps & watcher=$!
( sleep 15; nvidia-smi ) > "$out/mps_nvidia_smi.txt" 2>&1 &
workers mps
kill $watcher
curl -s localhost:$port/metrics | grep -E '^gpu_workload' > "$out/mps_metrics.prom"
echo quit | nvidia-cuda-mps-control
kill $exporter; wait $exporter
python3 bench/workload_accuracy.py "$out" > "$out/accuracy.json"
cat "$out/accuracy.json"
