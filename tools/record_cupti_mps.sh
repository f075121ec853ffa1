#!/usr/bin/env bash
# On the device (one H200, root, cupti-python importable), from the repo root:
#   bash tools/record_cupti_mps.sh OUTDIR [PHASE ...]     # phases: acc models probe cost8 (default: all four)
# Under CUDA MPS (own pipe and log folders, quit at the end), the exporter with --workload-cupti (10 s windows
# every 20 s, GPM for the GPU's SM active, Slurm jobs as holders: one mapping file, cgroups in slurmstepd's
# layout) and clients started with `python3 -m gpu_trace --socket ... --`:
#   acc:    301 spins 4 ms kernels on 66 SMs back to back, 302 on 8 SMs, 303 on 33 SMs at 50 % duty
#           (100 ms on, 100 ms off), 304 a launch-bound loop; each spin job logs every kernel it finished
#           (bench/ctxsw_jobs.py --progress): the truth (python3 bench/cupti_accuracy.py OUTDIR).
#   models: 311 an MLP trainer, 312 a transformer's inference loop (bench/cupti_models.py).
#   probe:  the trainer alone, tracing itself in 10 s windows (bench/cupti_models.py --probe 3): how long each
#           CUPTI step took and how long its flush drained after the answer.
#   cost8:  eight traced launch-bound clients, the exporter with --workload-cupti, then without: its CPU.
# Writes OUTDIR/{acc,models,cost8_on,cost8_off}_{workloads.jsonl,exporter.log,cpu.json} and progress files; the
# exporter logs at debug level, so its log has every client's own window ("cupti window N: pid P traced S to E").
set -uo pipefail
out=${1:?usage: record_cupti_mps.sh OUTDIR [PHASE ...]}
shift
phases=" ${*:-acc models probe cost8} "
mkdir -p "$out"
cd "$(dirname "$0")/.."
# the exporter's HTTP server needs httptools (not in the device image: carry its wheel, like cupti-python's)
python3 -c "import exporter.server" || { echo "the exporter does not import here" >&2; exit 1; }
tmp=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" "$tmp/map"
nvidia-cuda-mps-control -d || { echo "MPS did not start" >&2; exit 1; }
sock=$tmp/cupti.sock
cg=/sys/fs/cgroup/system.slice/slurmstepd.scope
port=9481

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

phase() {  # phase NAME SECONDS CUPTI(on|off) JOB=SPEC ...
  local name=$1 seconds=$2 cupti=$3; shift 3
  local jobs=() pids=() spec job
  for arg in "$@"; do jobs+=("${arg%%=*}"); done
  printf '%s\n' "${jobs[@]}" > "$tmp/map/0"
  local extra=()
  [[ $cupti == on ]] && extra=(--workload-cupti --cupti-socket "$sock" --cupti-window 10 --cupti-period 20)
  python3 -m exporter --port $port --interval 1 --kubelet-socket none --hpc-job-mapping-dir "$tmp/map" \
      --mps-pipe-dir "$CUDA_MPS_PIPE_DIRECTORY" --spatial-sources gpm --log-level debug "${extra[@]}" > "$out/${name}_exporter.log" 2>&1 &
  local exporter=$!
  sleep 3
  for arg in "$@"; do
    job=${arg%%=*}; spec=${arg#*=}
    mkdir -p "$cg/job_$job/step_0/user/task_0"
    bash -c "echo \$\$ > $cg/job_$job/step_0/user/task_0/cgroup.procs; exec timeout $((seconds + 30)) python3 -m gpu_trace \
        --socket $sock -- python3 $spec --seconds $seconds" > "$out/${name}_job_$job.out" 2> "$out/${name}_job_$job.err" &
    pids+=($!)
  done
  ( while true; do printf '{"t": %s, "w": %s}\n' "$(date +%s.%N)" "$(curl -s localhost:$port/api/v1/workloads)"
      sleep 1; done >> "$out/${name}_workloads.jsonl" ) &
  local poller=$!
  sleep 5
  local t0 c0; t0=$(date +%s.%N); c0=$(cpu_ticks $exporter)
  sleep $((seconds - 5))
  local t1 c1; t1=$(date +%s.%N); c1=$(cpu_ticks $exporter)
  python3 -c "import json, sys; t0, t1, c0, c1, hz = map(float, sys.argv[1:]); print(json.dumps({'seconds': round(t1 - t0, 3),
      'cpu_seconds': round((c1 - c0) / hz, 3), 'cpu_percent_of_a_core': round(100 * (c1 - c0) / hz / (t1 - t0), 2)}))" \
      "$t0" "$t1" "$c0" "$c1" "$(getconf CLK_TCK)" > "$out/${name}_cpu.json"
  curl -s localhost:$port/metrics | grep -E '^gpu_workload|^gpu_sm_active|cupti' > "$out/${name}_metrics.prom"
  kill $poller "${pids[@]}" 2>/dev/null; kill $exporter; wait $exporter "${pids[@]}" 2>/dev/null
  sleep 2
}

spin="bench/ctxsw_jobs.py spin --kernel-ms 4"
[[ $phases == *" acc "* ]] && phase acc 75 on 301="$spin --sms 66 --progress $out/acc_progress_301.txt" \
    302="$spin --sms 8 --progress $out/acc_progress_302.txt" \
    303="$spin --sms 33 --on-ms 100 --off-ms 100 --progress $out/acc_progress_303.txt" \
    304="bench/ctxsw_jobs.py launch"
[[ $phases == *" models "* ]] && phase models 75 on 311="bench/cupti_models.py train" 312="bench/cupti_models.py infer"
[[ $phases == *" probe "* ]] && timeout 150 python3 bench/cupti_models.py train --seconds 80 --probe 3 \
    > "$out/probe_train.jsonl" 2> "$out/probe_train.err"
if [[ $phases == *" cost8 "* ]]; then
  eight=(); for i in 1 2 3 4 5 6 7 8; do eight+=("32$i=bench/ctxsw_jobs.py launch"); done
  phase cost8_on 45 on "${eight[@]}"
  phase cost8_off 45 off "${eight[@]}"
fi
echo quit | nvidia-cuda-mps-control
rm -rf "$tmp"
