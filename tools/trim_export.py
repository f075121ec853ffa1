"""Keep one time window of a recorded export, and only what diagnose and summary read: small fixtures.

    python3 tools/trim_export.py IN.sqlite OUT.sqlite --from-epoch 1795330000.5 --to-epoch 1795330002.0

Deletes GPU metric samples and kernels outside the window (wall seconds, as tests/gpu/train_worker.py's
--start-at) and empties the tables neither reads (CUDA API calls, synchronisations, OS runtime calls, callchains), then
vacuums. Run `python3 -m nsys_ingest scrub` on the result before it is committed.
"""
from __future__ import annotations

import argparse
import shutil
import sqlite3

UNREAD = ("CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API", "OSRT_CALLCHAINS", "SAMPLING_CALLCHAINS", "COMPOSITE_EVENTS",
          "CUDA_CALLCHAINS", "PROFILER_OVERHEAD", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source")
    p.add_argument("target")
    p.add_argument("--from-epoch", type=float, required=True)
    p.add_argument("--to-epoch", type=float, required=True)
    args = p.parse_args(argv)
    shutil.copyfile(args.source, args.target)
    con = sqlite3.connect(args.target)
    tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    start_ns = con.execute("select utcEpochNs from TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    low, high = int(args.from_epoch * 1e9) - start_ns, int(args.to_epoch * 1e9) - start_ns
    if "GPU_METRICS" in tables:
        con.execute("delete from GPU_METRICS where timestamp < ? or timestamp > ?", (low, high))
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table in tables:
            con.execute(f"delete from {table} where end < ? or start > ?", (low, high))
    for table in tables & set(UNREAD):
        con.execute(f"delete from {table}")
    con.commit()
    con.execute("vacuum")
    counts = {t: con.execute(f"select count(*) from {t}").fetchone()[0]
              for t in ("GPU_METRICS", "CUPTI_ACTIVITY_KIND_KERNEL") if t in tables}
    con.close()
    print(f"{args.target}: window {low / 1e9:.3f}-{high / 1e9:.3f} s of the capture, {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
