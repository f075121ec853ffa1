"""python -m dashboards [--check]: write (or compare) dashboards/generated/*.json and the generated parts of
rules/gpu-utilization.rules.yaml (dashboards/rules.py), both made from the registered holder kinds."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboards.generate import write_or_check
from nsys_ingest.commandline import missing_extra

GENERATED = Path(__file__).resolve().parent / "generated"
RULES = Path(__file__).resolve().parent.parent / "rules" / "gpu-utilization.rules.yaml"


def render(module) -> str:
    from grafanalib._gen import DashboardEncoder
    data = module.build().to_json_data()
    return json.dumps(data, sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON is not what the code builds")
    args = parser.parse_args(argv)
    missing = missing_extra("python3 -m dashboards", "grafanalib", "dashboards")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from dashboards import gpu_utilization, mps_host_memory, rules, workloads
    modules = {"gpu-utilization.json": gpu_utilization, "mps-host-memory.json": mps_host_memory,
               "workloads.json": workloads}
    files = {GENERATED / name: render(module) for name, module in modules.items()}
    files[RULES] = rules.render(RULES.read_text())
    return write_or_check(files, args.check, "python -m dashboards")


if __name__ == "__main__":
    sys.exit(main())
