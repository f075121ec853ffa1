"""python3 -m exporter.openapi [--check]: write (or compare) docs/openapi.json, the JSON API's schema as
the app serves it at /openapi.json (CI fails when the committed copy differs)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboards.generate import write_or_check

COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def schema() -> dict:
    from exporter.app import api

    return api(engine=None).openapi()  # routes are only described, never called


def render() -> str:
    return json.dumps(schema(), indent=1) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m exporter.openapi", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if docs/openapi.json is not what the app serves")
    args = parser.parse_args(argv)
    return write_or_check({COMMITTED: render()}, args.check, "python3 -m exporter.openapi")


if __name__ == "__main__":
    sys.exit(main())
