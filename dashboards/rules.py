"""The parts of rules/gpu-utilization.rules.yaml that name holder labels, generated from the holder kinds
(exporter/holders.py KINDS): the rollups `gpu-spatial report` reads (one per ruled grouping and quantity) and
GPUHeldIdle's holder name and lookups. Each part stands between `# generated: NAME` and `# end generated: NAME`
lines; the rest of the file is written by hand. `python3 -m dashboards` rewrites the parts (--check compares)."""
from __future__ import annotations

import re

from exporter.holders import kind_views, labels
from gpu_spatial.report.account import (COVERED, GPU_LEDGER, HEARTBEAT, KEY_LABEL, OBSERVED, QUANTITIES, WITH_BASIS,
                                        counter, group_labels, rollup, ruled)
from exporter.vocabulary import LEDGER

WINDOW_S = 300  # each rollup is increase() over this window / the window (the file's comments say why not rate())
PART = re.compile(r"^(?P<indent> *)# generated: (?P<name>\w+)\n.*?^(?P=indent)# end generated: (?P=name)\n",
                  re.M | re.S)


def _rule(record: str, by: str, inner: str) -> list[str]:
    return [f"- record: {record}", f"  expr: sum by ({by}) ({inner}) / {WINDOW_S}"]


def _increase(metric: str) -> str:
    return f"increase({metric}[{WINDOW_S // 60}m])"


def rollups() -> list[str]:
    """The heartbeat, then per ruled grouping (report.account.ruled) every quantity's rollup, the held GPU-time
    of holders with no series of a covered quantity (unknown, not 0), the ledger's cells; the GPUs' ledger
    by node and model."""
    lines = [f"- record: {HEARTBEAT}", f"  expr: vector({WINDOW_S})"]
    for by in ruled():
        label = group_labels()[by][-1]
        for quantity in QUANTITIES:
            keyed = f"{label}, basis" if quantity in WITH_BASIS else label
            lines += _rule(rollup(label, quantity), keyed, _increase(counter(quantity)))
        for quantity in COVERED:
            lines += _rule(rollup(label, f"held_without_{quantity}"), label,
                           f"{_increase(counter('held'))} unless ignoring (basis) {_increase(counter(quantity))}")
        lines += _rule(rollup(label, LEDGER), f"{label}, {KEY_LABEL[LEDGER]}", _increase(counter(LEDGER)))
    for label in (group_labels()[by][-1] for by in ruled() if by in ("node", "model")):
        lines += _rule(f"{label}:gpu_ledger_gpu_seconds:rate5m", f"{label}, cell", _increase(GPU_LEDGER))
        lines += _rule(f"{label}:gpu_ledger_observed_seconds:rate5m", label, _increase(OBSERVED))
    return lines


def held_idle_annotations() -> list[str]:
    """GPUHeldIdle's summary (the holder named as its kind names it: the first kind with its label set) and its
    lookups of the holder's own series, on every registered label (one missing would match several holders)."""
    name = ""  # {{ with <first kind's label> }}<its name>{{ else }}<the next kind's, nested alike>{{ end }}
    for kind in reversed(kind_views()):
        if len(kind.own) == 1:
            text = f"{kind.noun} {{{{ . }}}}"
        else:
            text = "/".join(f"{{{{ $labels.{label} }}}}" for label in kind.own)
        text += "".join(f"{{{{ with $labels.{label} }}}} ({label} {{{{ . }}}}){{{{ end }}}}" for label in kind.through)
        otherwise = f"{{{{ else }}}}{name}" if name else ""
        name = f"{{{{ with $labels.{kind.own[-1]} }}}}{text}{otherwise}{{{{ end }}}}"
    return ["summary: >-", f"  {name}",
            "  holds GPU {{ $labels.gpu }} ({{ $labels.model }}) on {{ $labels.instance }} and does not use it",
            *_lookup("idle_for", "gpu_workload_idle_seconds", "humanizeDuration", ""),
            *_lookup("held_share", "gpu_workload_held_share_ratio", "humanizePercentage", " of the GPU")]


def _lookup(annotation: str, metric: str, humanize: str, unit: str) -> list[str]:
    keys = ("instance", "uuid", *labels())
    selector = ",".join(f"{key}='%s'" for key in keys)
    args = " ".join(f"$labels.{key}" for key in keys)
    return [f"{annotation}: >-", f'  {{{{ with printf "{metric}{{{selector}}}" {args} | query }}}}'
            f"{{{{ . | first | value | {humanize} }}}}{unit}{{{{ else }}}}unknown{{{{ end }}}}"]


PARTS = {"rollups": rollups, "held_idle": held_idle_annotations}


def render(text: str) -> str:
    """The rules file `text` with every generated part made again from the registry."""
    def part(match: re.Match) -> str:
        indent, name = match.group("indent"), match.group("name")
        body = "".join(f"{indent}{line}\n" for line in PARTS[name]())
        return f"{indent}# generated: {name}\n{body}{indent}# end generated: {name}\n"
    return PART.sub(part, text)
