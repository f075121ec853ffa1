# Sourced by tools/record_ctxsw.sh and tools/record_ctxsw_live.sh (on the device, as root, from the repo root):
# nsys found as the device has it ($ns, with NSYS_EXTRA_LIB's libdw), a scratch folder ($tmp) and the five
# Slurm jobs of the issue-26 runs: their specs (bench/ctxsw_jobs.py), one mapping file "0" listing them
# all ($map), and their cgroup v2 directories in slurmstepd's layout ($cg).
lib=${NSYS_EXTRA_LIB:?set NSYS_EXTRA_LIB to the folder holding libdw for nsys}
ns=$(find / -xdev -type f -name nsys -path '*target-linux-x64*' 2>/dev/null | head -1)
[[ -n $ns ]] || { echo "nsys not found" >&2; exit 1; }
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tmp=$(mktemp -d)
map=$tmp/map; mkdir -p "$map"
jobs=(201 202 203 204 205)
declare -A spec=([201]="spin --sms 66 --kernel-ms 4" [202]="matmul --size 8192"
                 [203]="spin --sms 8 --kernel-ms 2 --on-ms 100 --off-ms 150" [204]="launch" [205]="hold")
printf '%s\n' "${jobs[@]}" > "$map/0"
cg=/sys/fs/cgroup/system.slice/slurmstepd.scope
for job in "${jobs[@]}"; do mkdir -p $cg/job_$job/step_0/user/task_0 || echo "cannot make cgroup for $job"; done
