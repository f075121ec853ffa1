#!/usr/bin/env bash
# The demo without Docker: the tour's replay (a spin kernel on a quarter of an H100's SMs, time 1.0 and SM
# active 0.25), Debian's Prometheus with the project's rules, and Debian's Alertmanager with the project's
# routes and inhibitions, all on 127.0.0.1, until Ctrl-C (or SIGTERM) stops all three.
#
#   apt-get install prometheus prometheus-alertmanager; pip install .     # once
#   deploy/demo/local.sh                      # HiddenIdleSMs fires after its 10 minutes, as written
#   deploy/demo/local.sh --alert-for 30s      # every alert's `for:` cut to 30 s, to see it fire sooner
#
# Ports: --exporter-port 9478, --prometheus-port 9090, --alertmanager-port 9093. No notification leaves
# the host (Alertmanager's receiver has no target here); amtool or Alertmanager's API show the alerts.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RECORDING="$ROOT/tests/fixtures/h100_quarter_sms_steady_50hz.sqlite"
exporter_port=9478 prometheus_port=9090 alertmanager_port=9093 alert_for=""

usage() { echo "usage: deploy/demo/local.sh [--alert-for DURATION] [--exporter-port N] [--prometheus-port N] [--alertmanager-port N]"; }
fail() { echo "deploy/demo/local.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --alert-for) alert_for="${2:-}"; [[ "$alert_for" =~ ^[0-9]+[smh]$ ]] || fail "--alert-for: a duration such as 30s or 2m"; shift 2 ;;
    --exporter-port|--prometheus-port|--alertmanager-port)
      [[ "${2:-}" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 65535 ] || fail "$1: a port number, 1 to 65535"
      declare "$(echo "${1#--}" | tr - _)=$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

# What it runs, checked before anything starts: each missing one named with how to get it.
command -v gpu-spatial-exporter >/dev/null || fail "gpu-spatial-exporter not found: pip install . (from $ROOT)"
command -v prometheus >/dev/null || fail "prometheus not found: apt-get install prometheus"
ALERTMANAGER="$(command -v prometheus-alertmanager || command -v alertmanager || true)"  # Debian's name, upstream's
[ -n "$ALERTMANAGER" ] || fail "alertmanager not found: apt-get install prometheus-alertmanager"

STATE="$(mktemp -d "${TMPDIR:-/tmp}/gpu-spatial-demo.XXXXXX")"
pids=()
stop() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$STATE"
}
trap stop EXIT
trap 'exit 0' INT TERM  # the EXIT trap stops the three

# The rules as written, or with every alert's `for:` cut to --alert-for.
if [ -n "$alert_for" ]; then
  sed -E "s/^(\s*for:) [0-9]+[smh]$/\1 $alert_for/" "$ROOT/rules/gpu-utilization.rules.yaml" >"$STATE/rules.yaml"
else
  cp "$ROOT/rules/gpu-utilization.rules.yaml" "$STATE/rules.yaml"
fi
cat >"$STATE/prometheus.yaml" <<EOF
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: ["$STATE/rules.yaml"]
alerting:
  alertmanagers: [{static_configs: [{targets: ["127.0.0.1:$alertmanager_port"]}]}]
scrape_configs:
  - job_name: gpu-spatial-exporter
    static_configs: [{targets: ["127.0.0.1:$exporter_port"], labels: {node: demo-host}}]
EOF
# deploy/alertmanager.yaml's routes and inhibitions; its receiver without a target (nothing leaves the host).
awk '/^receivers:/ { print "receivers:\n  - name: gpu-oncall  # the demo: no notification leaves this host\n"; skip = 1; next }
     /^[a-z_]+:/ { skip = 0 }
     !skip' "$ROOT/deploy/alertmanager.yaml" >"$STATE/alertmanager.yaml"

start() {  # NAME COMMAND...: in the background, its output in $STATE/NAME.log
  local name="$1"; shift
  "$@" >"$STATE/$name.log" 2>&1 &
  pids+=("$!")
}
ready() {  # NAME URL: wait up to 60 s for a 200; a process that ended says why
  local name="$1" url="$2"
  for _ in $(seq 600); do
    if python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$url" 2>/dev/null; then
      return 0
    fi
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "deploy/demo/local.sh: $name did not start:" >&2; tail -5 "$STATE/$name.log" >&2; exit 1; }
    done
    sleep 0.1
  done
  echo "deploy/demo/local.sh: $name not ready on $url after 60 s" >&2; exit 1
}

start exporter gpu-spatial-exporter --no-nvml --no-mps --replay "$RECORDING" --listen-address 127.0.0.1 --port "$exporter_port"
start alertmanager "$ALERTMANAGER" --config.file="$STATE/alertmanager.yaml" --storage.path="$STATE/alertmanager" \
  --web.listen-address="127.0.0.1:$alertmanager_port" --cluster.listen-address=
start prometheus prometheus --config.file="$STATE/prometheus.yaml" --storage.tsdb.path="$STATE/prometheus" \
  --web.listen-address="127.0.0.1:$prometheus_port"
ready exporter "http://127.0.0.1:$exporter_port/healthz"
ready alertmanager "http://127.0.0.1:$alertmanager_port/-/ready"
ready prometheus "http://127.0.0.1:$prometheus_port/-/ready"

cat <<EOF
demo running on 127.0.0.1 (Ctrl-C stops all three):
  exporter      http://127.0.0.1:$exporter_port/metrics    (gpu-spatial top --url 127.0.0.1:$exporter_port)
  Prometheus    http://127.0.0.1:$prometheus_port/alerts
  Alertmanager  http://127.0.0.1:$alertmanager_port
HiddenIdleSMs fires after ${alert_for:-10m} of hidden idle (plus a few scrapes); then:
  amtool --alertmanager.url=http://127.0.0.1:$alertmanager_port alert query alertname=HiddenIdleSMs
  curl -s 'http://127.0.0.1:$alertmanager_port/api/v2/alerts?filter=alertname%3D%22HiddenIdleSMs%22'
Dashboards into an existing Grafana: add http://127.0.0.1:$prometheus_port as a Prometheus data source, then
  Dashboards > New > Import each of $ROOT/dashboards/generated/*.json (it asks for that data source).
EOF
wait -n "${pids[@]}" || true  # until stopped, or one of the three ends
echo "deploy/demo/local.sh: a part stopped; stopping the others" >&2
exit 1
