#!/bin/bash
# On the device: record system-wide GPU metrics with Nsight Systems while COMMAND runs, and write a scrubbed
# SQLite export. Usage: nsys-capture.sh OUT.sqlite [FREQ_HZ] -- COMMAND [ARGS...]
# The device has nsys but not on its PATH, and its importer lacks libdw: this script brings both together.
# NSYS_EXTRA_LIB names the folder with libdw.so.1 and its companions (shared/tools/lib; not in this repo).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1; shift; freq=100
[[ ${1:-} != -- ]] && { freq=$1; shift; }
[[ ${1:-} == -- ]] && shift || { echo "usage: $0 OUT.sqlite [FREQ_HZ] -- COMMAND..." >&2; exit 2; }
ns=$(find / -xdev -type f -name nsys -path '*target-linux-x64*' 2>/dev/null | head -1)
imp=$(find / -xdev -type f -name QdstrmImporter 2>/dev/null | head -1)
[[ -n $ns && -n $imp ]] || { echo "nsys or QdstrmImporter not found on this machine" >&2; exit 1; }
export LD_LIBRARY_PATH=${NSYS_EXTRA_LIB:-$here/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# NSYS_TRACE (e.g. cuda) narrows what is traced; nsys' default is cuda,nvtx,osrt,opengl.
"$ns" profile --gpu-metrics-devices=all --gpu-metrics-frequency="$freq" --sample=none --cpuctxsw=none ${NSYS_TRACE:+--trace=$NSYS_TRACE} \
  -o "$tmp/rep" -f true "$@" >"$tmp/profile.log" 2>&1 || { tail -5 "$tmp/profile.log" >&2; exit 1; }
"$imp" -i "$tmp/rep.qdstrm" >"$tmp/import.log" 2>&1 || true
[[ -f $tmp/rep.nsys-rep ]] || { echo "import failed:" >&2; tail -5 "$tmp/import.log" >&2; exit 1; }
"$ns" export --type sqlite -o "$out" -f true "$tmp/rep.nsys-rep" >"$tmp/export.log" 2>&1 || { tail -5 "$tmp/export.log" >&2; exit 1; }
python3 - "$out" <<'PY'
import re, sqlite3, sys
c = sqlite3.connect(sys.argv[1])
tabs = {r[0] for r in c.execute("select name from sqlite_master where type='table'")}
if "META_DATA_CAPTURE" in tabs:
    c.execute("delete from META_DATA_CAPTURE where name like '%ENVIRONMENT%'")
if "TARGET_INFO_SYSTEM_ENV" in tabs:
    c.execute("delete from TARGET_INFO_SYSTEM_ENV where value like '%=%' or name like '%Env%' or name like '%Host%'")
if "StringIds" in tabs:
    env = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
    c.executemany("update StringIds set value='' where id=?",
                  [(i,) for i, v in c.execute("select id, value from StringIds") if env.match(v)])
c.commit(); c.execute("vacuum")
n = c.execute("select count(*) from GPU_METRICS").fetchone()[0] if "GPU_METRICS" in tabs else 0
print(f"{sys.argv[1]}: {n} GPU metric samples (environment scrubbed)")
PY
