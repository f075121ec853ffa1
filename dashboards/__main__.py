"""python -m dashboards [--check]: write (or compare) dashboards/generated/*.json."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder

from dashboards import gpu_utilization, mps_host_memory, workloads
from dashboards.generate import write_or_check

GENERATED = Path(__file__).resolve().parent / "generated"
DASHBOARDS = {"gpu-utilization.json": gpu_utilization, "mps-host-memory.json": mps_host_memory,
              "workloads.json": workloads}


def render(module) -> str:
    data = module.build().to_json_data()
    return json.dumps(data, sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON is not what the code builds")
    args = parser.parse_args(argv)
    files = {GENERATED / name: render(module) for name, module in DASHBOARDS.items()}
    return write_or_check(files, args.check, "python -m dashboards")

if __name__ == "__main__":
    sys.exit(main())
