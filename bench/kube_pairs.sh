#!/bin/bash
# bench/kube_attacks.py on two source trees, each case back to back, so both see the same load:
#   bench/kube_pairs.sh BEFORE_TREE AFTER_TREE > pairs.log   (e.g. `git archive 02ca08e | tar -x -C /tmp/before`)
cd "$(dirname "$0")/.."
for case in baseline nested_json huge_quantity drip_body drip_chunks drip_headers empty_objects claims_100k claims_10k device_plugin_10k; do
  for code in "$1" "$2"; do
    echo "{\"code\": \"$code\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\"}"
    timeout 600 python3 bench/kube_attacks.py --code "$code" --only "$case" --seconds 36
  done
done
