#!/bin/bash
# Runs pytest arguments on a busy machine: three busy loops and the tests, all pinned to core 0.
#   bash bench/under_load.sh OUT.log tests/test_http.py -k signal
# A test that fails here and passes alone depends on the machine's pace (a defect: STYLE, "timing").
out=$1; shift
loops=()
for _ in 1 2 3; do taskset -c 0 python3 -c "while True: pass" & loops+=($!); done
PYTHONPATH=$PWD timeout 1500 taskset -c 0 python3 -m pytest -q -p no:cacheprovider "$@" > "$out" 2>&1
status=$?
kill "${loops[@]}"
tail -3 "$out"
exit $status
