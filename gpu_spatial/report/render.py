"""The report in each output format: text (terminal), markdown, csv, json, html (charts embedded)."""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd

from exporter.vocabulary import (BUSY_UNSPLIT, GPU_CELLS, HIDDEN_IDLE, HOLDER_CELLS, SM_ACTIVE_WORK, TIME_IDLE,
                                 UNSPLIT_CELLS, WASTE_CELLS)

from .account import BASES, COVERED, EXACT_BASES, QUANTITIES, WITH_BASIS, Collected
from .summary import TOTAL, columns, group_name, top_wasters

TITLES = {"held": "held", "busy": "busy", "sm_active": "SM-active", "hidden_idle": "hidden-idle",
          "held_idle": "held-idle"}
CELL_TITLES = {SM_ACTIVE_WORK: "work", HIDDEN_IDLE: "hidden idle", BUSY_UNSPLIT: "busy unsplit",
               TIME_IDLE: "time idle"}
ALLOCATION, PHYSICAL = "allocation", "ledger"  # the two views' column prefixes: never added


@dataclass
class Report:
    prometheus: str
    start: float
    end: float
    by: str
    labels: tuple[str, ...]
    matchers: list[str]
    table: pd.DataFrame
    collected: Collected
    charts: dict | None = None  # title -> PNG bytes (html only)

    @property
    def notes(self) -> list[str]:
        return self.collected.notes

    @property
    def groups(self) -> pd.DataFrame:
        return self.table[self.table[self.labels[0]] != TOTAL]

    @property
    def total(self) -> pd.Series:
        return self.table[self.table[self.labels[0]] == TOTAL].iloc[0]

    def source_line(self) -> str:
        parts = [f"{source} for {seconds / 3600:.2f} h ({held / 3600:.3f} GPU-h held)"
                 for source, (seconds, held) in sorted(self.collected.source_seconds().items(), reverse=True)]
        line = f"source: {', '.join(parts) or 'nothing'}"
        rules = [s for s in self.collected.spans if s.source == "rules"]
        if rules:
            steps = sorted({s.step for s in rules})
            line += (f" (rules: <{self.labels[0]}>:gpu_workload_*:rate5m, evaluated every "
                     f"{'/'.join(f'{s:g}' for s in steps)} s over a {rules[0].window:g} s window as found in the data, "
                     f"each sample x its spacing)")
        if any(s.source == "counters" for s in self.collected.spans):
            line += " (counters: increase() of gpu_workload_*_gpu_seconds_total)"
        return line

    def span_lines(self) -> list[str]:
        return [f"  {iso(s.start)} .. {iso(s.end)}: {s.source}, {s.held_gpu_seconds / 3600:.3f} GPU-h held"
                for s in self.collected.spans]


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def hours(value) -> str:
    return "unknown" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def percent(value) -> str:
    return "unknown" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value * 100:.1f}%"


def basis_note(row) -> str:
    """Per quantity its GPU-hours by basis (measured exactly: exact, ctxsw; estimated: nvml, time_share), and
    which held GPU-hours had no busy/SM series."""
    parts = []
    for quantity in WITH_BASIS:
        if quantity == "hidden_idle":
            continue  # follows SM-active's basis
        bases = [f"{basis} {row[f'{quantity}_{basis}_gpu_hours']:.3f}" for basis in BASES[quantity]
                 if row[f"{quantity}_{basis}_gpu_hours"] > 0]
        if bases:
            parts.append(f"{TITLES[quantity]} " + " + ".join(bases))
    unknown: dict[float, list[str]] = {}
    for quantity in COVERED:
        value = row[f"{quantity}_unknown_gpu_hours"]
        if value > 0:
            unknown.setdefault(round(value, 3), []).append(TITLES[quantity])
    for value, names in unknown.items():
        parts.append(f"{'/'.join(names)} unknown on {value:.3f} GPU-h (no series: MPS, MIG)")
    return "; ".join(parts) or "nothing measured"


def exactness_line(total) -> str:
    """How many GPU-hours were measured exactly (basis exact or ctxsw) and how many estimated."""
    parts = []
    for quantity in ("sm_active", "busy"):
        exact, estimated = total[f"{quantity}_exactly_measured_gpu_hours"], total[f"{quantity}_estimated_gpu_hours"]
        parts.append(f"{TITLES[quantity]} {exact:.3f} GPU-h measured exactly "
                     f"({', '.join(b for b in BASES[quantity] if b in EXACT_BASES)}), {estimated:.3f} estimated "
                     f"({', '.join(b for b in BASES[quantity] if b not in EXACT_BASES)}), "
                     f"{total[f'{quantity}_unknown_gpu_hours']:.3f} held GPU-h unknown")
    return "measured: " + "; ".join(parts)


def waste(row) -> str:
    return (">=" if row["waste_is_lower_bound"] else "") + hours(row["waste_gpu_hours"])


def existed(report: Report) -> float | None:
    """GPU-hours that existed on the GPUs the report covers (the GPU ledger), None where it is not read."""
    observed = report.collected.ledger.observed
    return observed / 3600 if observed > 0 else None


def display(report: Report) -> pd.DataFrame:
    """Per group the allocation view (held, used of held: can exceed 100%) and the physical view (its ledger
    cells, % of the GPU-hours that existed: a row never exceeds 100%), under their own prefixes."""
    name = "/".join(report.labels) if report.by != "node" else "node (instance)"
    whole = existed(report)
    rows = []
    for row in records(report.table):
        shown = {name: row[report.labels[0]] if row[report.labels[0]] == TOTAL else group_name(row, report.labels),
                 f"{ALLOCATION}: held GPU-h": hours(row["held_gpu_hours"]),
                 f"{ALLOCATION}: used GPU-h": hours(row["busy_gpu_hours"]),
                 f"{ALLOCATION}: used of held": percent(row["busy_share"])}
        for cell in HOLDER_CELLS:
            shown[f"{PHYSICAL}: {CELL_TITLES[cell]} GPU-h"] = hours(row[f"ledger_{cell}_gpu_hours"])
        shown[f"{PHYSICAL}: waste GPU-h"] = waste(row)
        shown[f"{PHYSICAL}: of what existed"] = percent(row["ledger_gpu_hours"] / whole) if whole else "unknown"
        shown["basis"] = basis_note(row)
        rows.append(shown)
    return pd.DataFrame(rows)


def gpu_ledger_lines(report: Report) -> list[str]:
    """The whole GPUs' ledger: every GPU-hour that existed in one cell, the holders' cells and the ones no
    holder has (switch overhead, unheld, unattributed, unmeasured), and how closely each GPU's cells add up."""
    ledger = report.collected.ledger
    if ledger.skipped:
        return [f"GPU ledger: not shown: {ledger.skipped}"]
    if ledger.observed <= 0:
        return ["GPU ledger: no gpu_ledger_* series in the range (exporters before the ledger)"]
    whole = ledger.observed / 3600
    parts = [f"{cell} {ledger.cells[cell] / 3600:.3f}" for cell in GPU_CELLS
             if ledger.cells.get(cell, 0.0) >= 1.8]  # shown to 0.001 GPU-h: 3.6 s and more
    lost = sum(ledger.cells.get(c, 0.0) for c in WASTE_CELLS) / 3600
    unsplit = sum(ledger.cells.get(c, 0.0) for c in UNSPLIT_CELLS) / 3600
    return [f"GPU ledger (physical, {len(ledger.gpus)} GPU{'s' * (len(ledger.gpus) != 1)}): {whole:.3f} GPU-h existed = "
            + " + ".join(parts)
            + f" (cells sum to {sum(ledger.cells.values()) / 3600:.3f}; worst GPU off by {ledger.worst:.3%})",
            f"GPU ledger waste: {'>=' if unsplit > 5e-4 else ''}{lost:.3f} GPU-h ({lost / whole:.1%} of what existed): "
            f"hidden idle + time idle + switch overhead, attributed or not"]


def header_lines(report: Report) -> list[str]:
    lines = [f"GPU account from {report.prometheus}, {iso(report.start)} to {iso(report.end)}, by {report.by}"
             + (f", matching {', '.join(report.matchers)}" if report.matchers else ""),
             report.source_line(), exactness_line(report.total), *gpu_ledger_lines(report)]
    if len(report.collected.spans) > 1:
        lines += ["spans:", *report.span_lines()]
    lines += [f"note: {note}" for note in report.notes]
    return lines


LEGEND = ("Two views, never added (docs/ledger.md). allocation: GPU-hours held (what the scheduler gave) and used "
          "(a kernel ran: time share); 'used of held' can exceed 100% when the others leave the GPU to a holder. "
          "ledger: the group's cells of the physical GPU ledger, where every GPU-hour that existed is in exactly one "
          "cell: work (its kernels ran, SMs active), hidden idle (its kernels ran, SMs idle), busy unsplit (no spatial "
          "reading), time idle (no kernel ran: its part by held share); 'of what existed' is of the GPU-hours of every "
          "GPU in the report, so the rows add up to at most 100%. waste = hidden idle + time idle, '>=' where busy is "
          "unsplit (a lower bound). Switch overhead, unheld and unattributed time belong to no group: GPU ledger line.")


def wasters_lines(report: Report) -> list[str]:
    top = top_wasters(report.table, report.labels)
    return [f"{i}. {group_name(row, report.labels)}: {waste(row)} GPU-h wasted (time idle "
            f"{hours(row[f'ledger_{TIME_IDLE}_gpu_hours'])}, hidden idle {hours(row[f'ledger_{HIDDEN_IDLE}_gpu_hours'])})"
            for i, row in enumerate(records(top), 1)]


def as_text(report: Report) -> str:
    """The table without its wide basis column, which follows as lines of its own."""
    wasters = wasters_lines(report)
    shown = display(report)
    bases = [f"  {row.iloc[0]}: {row['basis']}" for _, row in shown.iterrows()]
    return "\n".join([*header_lines(report), "", shown.drop(columns="basis").to_string(index=False), "",
                      "basis:", *bases, "", "top wasters:", *(wasters or ["none"]), "", LEGEND]) + "\n"


def markdown_table(frame: pd.DataFrame) -> str:
    def cell(value) -> str:
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(c) for c in frame.columns) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def as_markdown(report: Report) -> str:
    wasters = wasters_lines(report)
    return "\n".join(["# GPU account", "", *[f"{line}  " for line in header_lines(report)], "",
                      markdown_table(display(report)), "", "## Top wasters", "", *(wasters or ["none"]), "",
                      LEGEND]) + "\n"


def records(table: pd.DataFrame):
    """The table's rows as dicts, one at a time (iterrows builds a Series per row: slow at 70,000 pods)."""
    names = list(table.columns)
    for values in table.itertuples(index=False, name=None):
        yield dict(zip(names, values))


ROWS_PER_CHUNK = 5000


def as_csv(report: Report):
    """Chunks of CSV text: the rows are written as they are formatted, never all in one string."""
    table = report.table[[*report.labels, *columns()]]
    for first in range(0, max(len(table), 1), ROWS_PER_CHUNK):
        yield table.iloc[first:first + ROWS_PER_CHUNK].to_csv(index=False, header=first == 0, na_rep="unknown",
                                                              float_format="%.6f")


def _number(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(float(value), 6)


def group_json(row, labels) -> dict:
    out = {"group": {label: row[label] for label in labels}, "name": group_name(row, labels),
           "held": {"gpu_hours": _number(row["held_gpu_hours"]), "basis": "exact"}}
    for quantity in QUANTITIES[1:]:
        entry = {"gpu_hours": _number(row[f"{quantity}_gpu_hours"]), "share": _number(row[f"{quantity}_share"])}
        if f"{quantity}_unknown_gpu_hours" in row:
            entry["unknown_gpu_hours"] = _number(row[f"{quantity}_unknown_gpu_hours"])
        if quantity in WITH_BASIS:
            entry["basis"] = {basis: _number(row[f"{quantity}_{basis}_gpu_hours"]) for basis in BASES[quantity]}
            entry["exactly_measured_gpu_hours"] = _number(row[f"{quantity}_exactly_measured_gpu_hours"])
            entry["estimated_gpu_hours"] = _number(row[f"{quantity}_estimated_gpu_hours"])
        out[quantity] = entry
    out["allocation"] = {"held_gpu_hours": _number(row["held_gpu_hours"]), "used_gpu_hours": _number(row["busy_gpu_hours"]),
                         "used_of_held": _number(row["busy_share"])}
    out["ledger"] = {"cells": {cell: _number(row[f"ledger_{cell}_gpu_hours"]) for cell in HOLDER_CELLS},
                     "gpu_hours": _number(row["ledger_gpu_hours"]), "waste_gpu_hours": _number(row["waste_gpu_hours"])}
    out["waste_gpu_hours"] = _number(row["waste_gpu_hours"])
    out["waste_is_lower_bound"] = bool(row["waste_is_lower_bound"])
    return out


def gpu_ledger_json(report: Report) -> dict:
    ledger = report.collected.ledger
    return {"skipped": ledger.skipped or None, "gpus": len(ledger.gpus),
            "observed_gpu_hours": round(ledger.observed / 3600, 6),
            "cells": {cell: round(v / 3600, 6) for cell, v in sorted(ledger.cells.items())},
            "cells_sum_gpu_hours": round(sum(ledger.cells.values()) / 3600, 6),
            "waste_gpu_hours": round(sum(ledger.cells.get(c, 0.0) for c in WASTE_CELLS) / 3600, 6),
            "worst_gpu_relative_error": round(ledger.worst, 9)}


def as_json(report: Report):
    """Chunks of one JSON document; the groups are written one by one."""
    top = top_wasters(report.table, report.labels)
    document = {
        "prometheus": report.prometheus, "start": iso(report.start), "end": iso(report.end),
        "start_unix": report.start, "end_unix": report.end, "by": report.by, "group_labels": list(report.labels),
        "match": report.matchers,
        "source": {"summary": report.source_line(), "notes": report.notes, "queries": report.collected.queries,
                   "rule_step_seconds": report.collected.rule_step, "rule_window_seconds": report.collected.rule_window,
                   "hours": {source: round(seconds / 3600, 6) for source, (seconds, _held)
                             in report.collected.source_seconds().items()},
                   "held_gpu_hours": {source: round(held / 3600, 6) for source, (_seconds, held)
                                      in report.collected.source_seconds().items()},
                   "spans": [{"start": iso(s.start), "end": iso(s.end), "start_unix": s.start, "end_unix": s.end,
                              "source": s.source, "held_gpu_hours": round(s.held_gpu_seconds / 3600, 6),
                              **({"rule_step_seconds": s.step, "rule_window_seconds": s.window,
                                  "evaluations_stored_twice": len(s.twice)}
                                 if s.source == "rules" else {})} for s in report.collected.spans]},
        "groups": GROUPS, "total": group_json(report.total, report.labels), "gpu_ledger": gpu_ledger_json(report),
        "top_wasters": [group_name(row, report.labels) for row in records(top)],
    }
    head, tail = (json.dumps(document, indent=2) + "\n").split(json.dumps(GROUPS))
    yield head + "["
    for number, row in enumerate(records(report.groups)):
        yield ("," if number else "") + "\n    " + json.dumps(group_json(row, report.labels))
    yield "\n  ]" + tail


GROUPS = "\0groups\0"  # where the streamed groups go in the document


STYLE = """body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
td:first-child,th:first-child,td:last-child,th:last-child{text-align:left}
tr:last-child{font-weight:bold}img{max-width:100%;display:block;margin:1em 0}.note{color:#555;font-size:13px}"""


def as_html(report: Report) -> str:
    import base64

    esc = html.escape
    charts = "".join(f'<h2>{esc(title)}</h2><img alt="{esc(title)}" src="data:image/png;base64,'
                     f'{base64.b64encode(png).decode()}">' for title, png in (report.charts or {}).items())
    wasters = "".join(f"<li>{esc(line.split('. ', 1)[1])}</li>" for line in wasters_lines(report)) or "<li>none</li>"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>GPU account</title><style>{STYLE}</style>"
            f"</head><body><h1>GPU account</h1>"
            + "".join(f"<p class='note'>{esc(line)}</p>" for line in header_lines(report))
            + display(report).to_html(index=False, escape=True, border=0)
            + f"<p class='note'>{esc(LEGEND)}</p><h2>Top wasters</h2><ol>{wasters}</ol>{charts}</body></html>\n")


FORMATS = {"text": as_text, "markdown": as_markdown, "csv": as_csv, "json": as_json, "html": as_html}
