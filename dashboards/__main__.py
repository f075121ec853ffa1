"""python -m dashboards [--check]: write (or compare) dashboards/generated/*.json."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboards.generate import write_or_check

GENERATED = Path(__file__).resolve().parent / "generated"
MISSING_GRAFANALIB = ("python3 -m dashboards needs grafanalib, which `pip install .` leaves out: "
                      "pip install '.[dashboards]'")


def render(module) -> str:
    from grafanalib._gen import DashboardEncoder
    data = module.build().to_json_data()
    return json.dumps(data, sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON is not what the code builds")
    args = parser.parse_args(argv)
    try:  # an optional extra: a plain `pip install .` has no grafanalib
        from dashboards import gpu_utilization, mps_host_memory, workloads
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] != "grafanalib":
            raise
        print(MISSING_GRAFANALIB, file=sys.stderr)
        return 2
    modules = {"gpu-utilization.json": gpu_utilization, "mps-host-memory.json": mps_host_memory,
               "workloads.json": workloads}
    files = {GENERATED / name: render(module) for name, module in modules.items()}
    return write_or_check(files, args.check, "python -m dashboards")

if __name__ == "__main__":
    sys.exit(main())
