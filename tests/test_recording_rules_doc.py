"""docs/metrics.md lists every recording rule of rules/*.yaml, and names no rule that does not exist:
the dashboards, alerts and the report read these names like published series."""
import re

import yaml

from tests.helpers import ROOT

CONTRACT = ROOT / "docs" / "metrics.md"


def recorded() -> set[str]:
    names = set()
    for path in sorted((ROOT / "rules").glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(rule["record"] for rule in group["rules"] if "record" in rule)
    return names


def documented_rules(text: str) -> set[str]:
    section = text.split("\n## Recording rules\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_:][a-z0-9_:]*)` \|", section, re.M))


def test_every_recording_rule_is_documented_and_every_row_is_a_rule():
    names, rows = recorded(), documented_rules(CONTRACT.read_text())
    assert len(names) >= 25
    assert not names - rows, f"recorded but not in docs/metrics.md, Recording rules: {sorted(names - rows)}"
    assert not rows - names, f"in docs/metrics.md, Recording rules, but no rule records it: {sorted(rows - names)}"


def test_a_rule_missing_from_the_docs_fails():
    text = CONTRACT.read_text().replace("| `model:gpu_workload_busy_gpu_seconds:rate5m` |", "| busy |")
    assert recorded() - documented_rules(text) == {"model:gpu_workload_busy_gpu_seconds:rate5m"}
