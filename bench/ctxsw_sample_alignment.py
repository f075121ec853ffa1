"""Which interval a GPU-metrics sample describes, read off a context-switch capture.

    python3 bench/ctxsw_sample_alignment.py CAPTURE_10KHZ.sqlite PID

For every slice of PID (RESTORE_START .. SAVE_END), the mean SM activity of the samples stamped just
before and after the switch. Where PID's activity differs from its neighbours' (the matmul, pid 514 in
bench/results/ctxsw/h200_ctxsw_10khz_full.sqlite.xz, next to a launch loop), the sample stamped 50 us
before RESTORE_START reads about half and the one stamped 50 us after reads the full activity: a sample
at t describes [t, next sample), not the interval since the previous one.
"""
from __future__ import annotations

import bisect
import sqlite3
import sys
from collections import defaultdict

RESTORE_START, SAVE_END = 8, 7


def main(argv=None) -> int:
    path, target = (argv or sys.argv[1:])[:2]
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    events = con.execute("select timestamp, tag, (globalPid >> 24) & 16777215 from GPU_CONTEXT_SWITCH_EVENTS "
                         "where gpuId = 0 order by timestamp").fetchall()
    metric = con.execute("select metricId from TARGET_INFO_GPU_METRICS where metricName = "
                         "'SMs Active [Throughput %]'").fetchone()[0]
    samples = con.execute("select timestamp, value from GPU_METRICS where metricId = ? order by timestamp",
                          (metric,)).fetchall()
    stamps = [t for t, _ in samples]
    around = {RESTORE_START: defaultdict(list), SAVE_END: defaultdict(list)}
    for t, tag, pid in events:
        if pid != int(target) or tag not in around:
            continue
        first = bisect.bisect_left(stamps, t)  # the first sample stamped at or after the switch
        for k in range(-3, 4):
            if 0 <= first + k < len(samples):
                around[tag][k].append((samples[first + k][0] - t, samples[first + k][1]))
    print(f"sample period {(stamps[1] - stamps[0]) / 1000:.1f} us")
    for tag, name in ((RESTORE_START, "RESTORE_START"), (SAVE_END, "SAVE_END")):
        for k, rows in sorted(around[tag].items()):
            offset = sum(o for o, _ in rows) / len(rows) / 1000
            active = sum(v for _, v in rows) / len(rows)
            print(f"{name:13} sample {k:+d}: stamped {offset:+7.1f} us from the switch, SM active {active:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
