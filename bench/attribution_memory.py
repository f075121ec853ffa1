"""Resident memory an attribution leaves in the process, and what handing the freed heap back returns
(the ctxsw source calls exporter.samplers.ctxsw.release_free_memory after each window):

    python3 bench/attribution_memory.py EXPORT.sqlite   (e.g. bench/results/ctxsw/h200_ctxsw_1khz_full.sqlite.xz, unpacked)

Prints VmRSS in MiB after importing the exporter, after importing the attribution (numpy, pandas), after
one attribution, and after release_free_memory().
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss_mib() -> float:
    return round(int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024, 1)


def main(argv=None) -> int:
    path = (argv if argv is not None else sys.argv[1:])[0]
    steps = {"start": rss_mib()}
    importlib.import_module("exporter.engine")  # what the exporter itself loads
    from exporter.samplers.ctxsw import release_free_memory
    from exporter.nsys_exports import read_export

    steps["exporter imported"] = rss_mib()
    from nsys_ingest.ctxsw import attribute

    steps["attribution imported"] = rss_mib()
    read_export(path, attribute, require_metrics=False)
    steps["after one attribution"] = rss_mib()
    release_free_memory()
    steps["after release_free_memory"] = rss_mib()
    print(json.dumps(steps, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
