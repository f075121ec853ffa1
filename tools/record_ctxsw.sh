#!/usr/bin/env bash
# On the device (one H200, root): per-workload truth from the GPU's own context switches, next to the
# exporter's NVML basis, for jobs of different footprints time-sliced on GPU 0.
#   NSYS_EXTRA_LIB=DIR bash tools/record_ctxsw.sh OUTDIR
# Five Slurm jobs hold GPU 0 (mapping file "0"), each worker moved into its job's cgroup (slurmstepd's v2
# layout) before it starts CUDA:
#   201 spin on 66 of 132 SMs, 4 ms kernels back to back      202 bf16 8192^3 products back to back
#   203 spin on 8 SMs, 2 ms kernels, 100 ms on / 150 ms off   204 a launch-bound loop of tiny kernels
#   205 holds a context and launches nothing
# While they run: the exporter (NVML basis) is read every 0.5 s, and nsys records GPU context switches and
# GPU metrics system-wide, first 10 s at 10 kHz (the truth), then 25 s at 1 kHz (what the live source sees).
# Then the slowdown a capture costs: a matmul loop and a launch-bound loop alone, alternating runs of 8 s with
# and without a 1 kHz context-switch capture. Writes into OUTDIR:
#   ctxsw_10khz.sqlite, ctxsw_1khz.sqlite   the exports, trimmed to the tables attribution needs, env scrubbed
#   nvml_workloads.jsonl                    /api/v1/workloads every 0.5 s (with the time it was read)
#   run.json                                job -> pid and spec, each capture's wall window
#   slowdown.jsonl                          one line per run: kind, capture on/off, rate
set -uo pipefail
out=${1:?usage: record_ctxsw.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
source tools/ctxsw_setup.sh
"$ns" --version
seconds=${SECONDS_PER_RUN:-240}  # an upper bound: the workers are stopped once both captures are done
port=9479
python3 -m exporter --port $port --interval 0.5 --kubelet-socket none --hpc-job-mapping-dir "$map" \
    --held-idle-after 10s > "$out/exporter.log" 2>&1 &
exporter=$!
sleep 3

capture() {  # capture NAME FREQ SECONDS: system-wide context switches and GPU metrics; wall window to $tmp/NAME.win
  local t0; t0=$(date +%s.%N)
  "$ns" profile --gpuctxsw=true --trace=none --gpu-metrics-devices=all --gpu-metrics-frequency="$2" \
      --sample=none --cpuctxsw=none -o "$tmp/$1" -f true sleep "$3" > "$tmp/$1.log" 2>&1 || tail -3 "$tmp/$1.log"
  echo "$t0 $(date +%s.%N)" > "$tmp/$1.win"
}

pids=()
for job in "${jobs[@]}"; do
  bash -c "echo \$\$ > $cg/job_$job/step_0/user/task_0/cgroup.procs; exec timeout $((seconds + 60)) python3 bench/ctxsw_jobs.py ${spec[$job]} --seconds $seconds" \
      > "$tmp/job_$job.out" 2> "$tmp/job_$job.err" &
  pids+=($!); echo "$job $!" >> "$tmp/pids"
done
sleep 12  # contexts up, kernels compiled, NVML's per-process samples settled
( while true; do printf '{"t": %s, "w": %s}\n' "$(date +%s.%N)" "$(curl -s localhost:$port/api/v1/workloads)"; sleep 0.5; done ) \
    >> "$out/nvml_workloads.jsonl" 2>/dev/null &
watcher=$!
capture hi 10000 10
capture lo 1000 25
kill $watcher
curl -s localhost:$port/metrics | grep -E '^gpu_workload' > "$out/metrics_end.prom"
kill "${pids[@]}"; wait "${pids[@]}"
kill $exporter; wait $exporter

for name in hi lo; do
  "$ns" export --type sqlite -o "$tmp/$name.sqlite" -f true "$tmp/$name.nsys-rep" > "$tmp/$name.export.log" 2>&1 \
      || tail -3 "$tmp/$name.export.log"
done
python3 - "$tmp" "$out" <<'PY'
# Keep what attribution needs: context switches, processes, GPUs, the session start, and the spatial metrics;
# blank anything that holds the device's paths or environment.
import json, re, shutil, sqlite3, sys
tmp, out = sys.argv[1:]
keep_metrics = re.compile(r"SMs? Active|GR Active|Warps in Flight|Tensor Active|DRAM (Read|Write)|Sync Compute|Async Compute", re.I)
for name, dest in (("hi", "ctxsw_10khz.sqlite"), ("lo", "ctxsw_1khz.sqlite")):
    src = f"{tmp}/{name}.sqlite"
    c = sqlite3.connect(src)
    tabs = {r[0] for r in c.execute("select name from sqlite_master where type='table'")}
    keep = {"GPU_CONTEXT_SWITCH_EVENTS", "ENUM_GPU_CTX_SWITCH", "PROCESSES", "TARGET_INFO_GPU", "TARGET_INFO_GPU_METRICS",
            "GPU_METRICS", "TARGET_INFO_SESSION_START_TIME", "META_DATA_CAPTURE", "META_DATA_EXPORT", "StringIds",
            "TARGET_INFO_CUDA_DEVICE", "ENUM_GPU_CTX_SWITCH_TYPE"}
    for t in tabs - keep:
        if not t.startswith("ENUM_") and not t.startswith("sqlite_"):
            c.execute(f'drop table "{t}"')
    if "TARGET_INFO_GPU_METRICS" in tabs:
        drop = [(t, m) for t, m, n in c.execute("select typeId, metricId, metricName from TARGET_INFO_GPU_METRICS")
                if not keep_metrics.search(n)]
        c.executemany("delete from GPU_METRICS where typeId=? and metricId=?", drop)
    c.execute("delete from META_DATA_CAPTURE where name like '%ENVIRONMENT%' or value like '%/%'") if "META_DATA_CAPTURE" in tabs else None
    env = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=|/")
    c.executemany("update StringIds set value='' where id=?",
                  [(i,) for i, v in c.execute("select id, value from StringIds") if env.search(v or "")])
    if "PROCESSES" in tabs:  # a command's path names the device's folders: keep its last part
        c.executemany("update PROCESSES set name=? where rowid=?",
                      [((n or "").rsplit("/", 1)[-1], r) for r, n in c.execute("select rowid, name from PROCESSES")])
    c.commit(); c.execute("vacuum"); c.close()
    shutil.copy(src, f"{out}/{dest}")
    c = sqlite3.connect(f"{out}/{dest}")
    n = {t: c.execute(f'select count(*) from "{t}"').fetchone()[0] for t in ("GPU_CONTEXT_SWITCH_EVENTS", "GPU_METRICS", "PROCESSES")
         if c.execute("select 1 from sqlite_master where name=?", (t,)).fetchone()}
    print(dest, n)
PY
python3 - "$tmp" "$out" <<'PY'
import json, sys
tmp, out = sys.argv[1:]
run = {"jobs": {}, "captures": {}}
for line in open(f"{tmp}/pids"):
    job, pid = line.split()
    run["jobs"][job] = {"pid": int(pid), "result": open(f"{tmp}/job_{job}.out").read().strip(),
                        "stderr_tail": open(f"{tmp}/job_{job}.err").read()[-300:]}
for name in ("hi", "lo"):
    t0, t1 = open(f"{tmp}/{name}.win").read().split()
    run["captures"][name] = [float(t0), float(t1)]
json.dump(run, open(f"{out}/run.json", "w"), indent=1)
PY

# The slowdown a capture costs: alternating runs, each kind alone on the GPU.
for kind in "matmul --size 8192" launch; do
  for i in 1 2 3; do
    for cap in off on; do
      if [[ $cap == on ]]; then capture slow 1000 18 & cpid=$!; sleep 3; fi
      r=$(timeout 60 python3 bench/ctxsw_jobs.py $kind --seconds 8 | tail -1)
      [[ $cap == on ]] && wait $cpid
      echo "{\"capture\": \"$cap\", \"run\": $i, \"result\": $r}" >> "$out/slowdown.jsonl"
    done
  done
done
python3 tools/nvml_probe.py > "$out/nvml_probe.json"
nvidia-smi -q > "$out/nvidia_smi_q.txt"
rm -rf "$tmp"
