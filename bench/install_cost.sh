#!/usr/bin/env bash
# What the install costs (issue 36): `pip install .` (the exporter node's install) and `pip install '.[plots]'`
# in fresh venvs, no pip cache, from this tree's tracked files; then the exporter alone, run from the first
# venv on the README's replay: its resident memory and CPU over 60 s. bash bench/install_cost.sh [WORKDIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work/src"
git -C "$root" ls-files | grep -v '^tests/\|^bench/' | (cd "$root" && tar cf - -T -) | tar xf - -C "$work/src"
for what in core plots; do
  rm -rf "$work/venv-$what"; python3 -m venv "$work/venv-$what"
  spec="$work/src"; [ "$what" = plots ] && spec="$work/src[plots]"
  start=$(date +%s.%N)
  "$work/venv-$what/bin/pip" install -q --disable-pip-version-check --no-cache-dir "$spec" >"$work/pip-$what.log" 2>&1
  end=$(date +%s.%N)
  echo "pip install ${spec#$work/}: $(echo "$end - $start" | bc) s, venv $(du -sm "$work/venv-$what" | cut -f1) MB," \
       "$("$work/venv-$what/bin/pip" list 2>/dev/null | tail -n +3 | wc -l) packages (pip and setuptools included)"
done
"$work/venv-core/bin/gpu-spatial-exporter" --no-nvml --port 0 \
    --replay "$root/tests/fixtures/h100_quarter_sms_steady_50hz.sqlite" >"$work/exporter.log" 2>&1 &
pid=$!
sleep 15
ticks0=$(awk '{print $14+$15}' "/proc/$pid/stat")
sleep 60
ticks1=$(awk '{print $14+$15}' "/proc/$pid/stat")
echo "exporter on the replay: $(awk '/VmRSS/{print $2}' "/proc/$pid/status") kB resident," \
     "peak $(awk '/VmHWM/{print $2}' "/proc/$pid/status") kB, CPU $(echo "scale=2; ($ticks1 - $ticks0) * 100 / $(getconf CLK_TCK) / 60" | bc) % of a core over 60 s"
kill "$pid"
