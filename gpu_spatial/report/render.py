"""The report in each output format: text (terminal), markdown, csv, json, html (charts embedded)."""
from __future__ import annotations

import functools
import html
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd

from exporter.vocabulary import (BUSY_UNSPLIT, GPU_CELLS, HIDDEN_IDLE, HOLDER_CELLS, LOST, SM_ACTIVE_WORK, SWITCH_OVERHEAD,
                                 TIME_IDLE, UNATTRIBUTED_BUSY_UNSPLIT, UNATTRIBUTED_HIDDEN_IDLE,
                                 UNATTRIBUTED_SM_ACTIVE_WORK, UNATTRIBUTED_TIME_IDLE, UNHELD, UNMEASURED, UNOBSERVED,
                                 UNSPLIT_CELLS, WASTE_CELLS)

from .account import BASES, EXACT_BASES, QUANTITIES, WITH_BASIS, Collected
from .summary import TOTAL, columns, group_name, top_wasters
from .terminal import Column, figure, fit, share, unit, width, wrap

TITLES = {"held": "held", "busy": "busy", "sm_active": "SM-active", "hidden_idle": "hidden-idle",
          "held_idle": "held-idle"}
CELL_TITLES = {SM_ACTIVE_WORK: "work", HIDDEN_IDLE: "hidden idle", BUSY_UNSPLIT: "busy unsplit",
               TIME_IDLE: "time idle"}
ALLOCATION, PHYSICAL = "allocation", "ledger"  # the two views' column prefixes: never added
ALLOCATION_COLUMNS = ("held", "used", "used/held")  # the text table's allocation view; the rest is the ledger


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

    @functools.cached_property
    def existed_seconds(self) -> dict:
        """Seconds that existed per node and per GPU ((instance,), (instance, uuid)) and in all (TOTAL)."""
        out = {TOTAL: 0.0}
        for book in self.collected.ledger.books.values():
            for key in ((book.instance,), (book.instance, book.uuid), TOTAL):
                out[key] = out.get(key, 0.0) + book.existed
        return out

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


UNKNOWN_CAUSES = (  # (quantities with no series, why): the cause a holder's split cannot be known
    (("busy", "sm_active"), "MPS clients without the tracer (NVML charges the MPS server; gpu-spatial trace, "
                            "docs/mps-clients.md)"),
    (("busy",), "MIG: NVML has no per-process time on MIG devices"),
    (("sm_active",), "no spatial reading on its GPU (no DCGM, GPM or nsys source: work and hidden idle unsplit)"))


def unknown_causes(row) -> list[tuple[float, str]]:
    """(held GPU-hours, cause) of the held time whose split cannot be known. Held time without busy and SM
    series is an MPS client's, without busy alone a MIG holder's, without SM alone a GPU without a spatial
    reading's (the per-quantity sums do not say which holder, so the overlap is read as MPS)."""
    unknown = {q: row[f"{q}_unknown_gpu_hours"] for q in ("busy", "sm_active")}
    both = min(unknown.values())
    amounts = {("busy", "sm_active"): both, ("busy",): unknown["busy"] - both, ("sm_active",): unknown["sm_active"] - both}
    return [(amounts[quantities], why) for quantities, why in UNKNOWN_CAUSES if amounts[quantities] > 5e-7]


def basis_note(row) -> str:
    """Per quantity its GPU-hours by basis (measured exactly: exact, ctxsw; estimated: nvml, time_share; a
    quantity measured at 0 says so), and the held GPU-hours whose split is unknown, with the cause."""
    parts = []
    for quantity in WITH_BASIS:
        if quantity == "hidden_idle" or math.isnan(row[f"{quantity}_gpu_hours"]):
            continue  # hidden idle follows SM-active's basis; a quantity without series is in the causes
        bases = [f"{basis} {row[f'{quantity}_{basis}_gpu_hours']:.3f}" for basis in BASES[quantity]
                 if row[f"{quantity}_{basis}_gpu_hours"] > 0]
        parts.append(f"{TITLES[quantity]} " + (" + ".join(bases) if bases else "measured 0"))
    for value, why in unknown_causes(row):
        parts.append(f"unknown on {value:.3f} held GPU-h: {why}")
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


def existed(report: Report, row=None) -> float | None:
    """GPU-hours that existed (the GPU ledger) for a row: of its node (--by node), of its GPU (--by gpu), of
    every GPU in the report otherwise; None where the ledger is not read."""
    seconds = report.existed_seconds
    if row is not None and row[report.labels[0]] != TOTAL and report.by in ("node", "gpu"):
        seconds = seconds.get(tuple(row[label] for label in report.labels), 0.0)
    else:
        seconds = seconds[TOTAL]
    return seconds / 3600 if seconds > 0 else None


def of_existed(report: Report, row) -> float:
    whole = existed(report, row)
    return row["ledger_gpu_hours"] / whole if whole else math.nan


def display(report: Report) -> pd.DataFrame:
    """Per group the allocation view (held, used of held: can exceed 100%) and the physical view (its ledger
    cells, % of the GPU-hours that existed: a row never exceeds 100%), under their own prefixes."""
    name = "/".join(report.labels) if report.by != "node" else "node (instance)"
    rows = []
    for row in records(report.table):
        shown = {name: row[report.labels[0]] if row[report.labels[0]] == TOTAL else group_name(row, report.labels),
                 f"{ALLOCATION}: held GPU-h": hours(row["held_gpu_hours"]),
                 f"{ALLOCATION}: used GPU-h": hours(row["busy_gpu_hours"]),
                 f"{ALLOCATION}: used of held": percent(row["busy_share"])}
        for cell in HOLDER_CELLS:
            shown[f"{PHYSICAL}: {CELL_TITLES[cell]} GPU-h"] = hours(row[f"ledger_{cell}_gpu_hours"])
        shown[f"{PHYSICAL}: waste GPU-h"] = waste(row)
        shown[f"{PHYSICAL}: of what existed"] = percent(of_existed(report, row))
        shown["basis"] = basis_note(row)
        rows.append(shown)
    return pd.DataFrame(rows)


# The GPU ledger's cells as its table shows them (JSON keeps every cell)
LEDGER_COLUMNS = (("work", (SM_ACTIVE_WORK, UNATTRIBUTED_SM_ACTIVE_WORK)),
                  ("hid.idle", (HIDDEN_IDLE, UNATTRIBUTED_HIDDEN_IDLE)),
                  ("unsplit", (BUSY_UNSPLIT, UNATTRIBUTED_BUSY_UNSPLIT, UNMEASURED)),
                  ("t.idle", (TIME_IDLE, UNATTRIBUTED_TIME_IDLE)), ("unheld", (UNHELD,)),
                  ("switch", (SWITCH_OVERHEAD,)), ("lost", (LOST,)), ("unobserved", (UNOBSERVED,)))
ERROR = ("error: each series is exact to one scrape interval at its edges: the seconds between a GPU's last "
         "scrape and its exporter's stop are in no counter (they read as unobserved), a GPU seen in the 10 "
         "minutes before the range counts from its start and one (or its node) seen in its last 10 minutes to its "
         "end, Prometheus' increase() extrapolates up to half an "
         "interval past a series that ends inside the range, and the rollups are within 0.5% of the counters "
         "(docs/ledger.md, \"How exact\")")


def gpu_ledger_lines(report: Report) -> list[str]:
    """The whole GPUs' ledger: every GPU-hour that existed in one cell (what the exporters observed, what none
    did, what was lost), the holders' cells and the ones no holder has, how closely each GPU's counters add
    up, and the error of the edges."""
    ledger = report.collected.ledger
    if ledger.skipped:
        return [f"GPU ledger: not shown: {ledger.skipped}"]
    if ledger.existed <= 0:
        return ["GPU ledger: no gpu_ledger_* series in the range (exporters before the ledger)"]
    cells, whole = ledger.cells, ledger.existed
    name, factor = unit([whole / 3600])

    def amount(seconds):
        return figure(seconds / 3600, factor)

    parts = [f"{cell} {amount(cells[cell])}" for cell in (*GPU_CELLS, UNOBSERVED)
             if cells.get(cell, 0.0) / 3600 * factor >= 0.005]  # what prints as 0.00 is left out
    wasted = sum(cells.get(c, 0.0) for c in WASTE_CELLS)
    unsplit = sum(cells.get(c, 0.0) for c in UNSPLIT_CELLS)
    count = len(ledger.books)
    return [f"GPU ledger (physical, {count} GPU{'s' * (count != 1)}, {name}): {amount(whole)} existed (from each "
            f"GPU's first sighting in the range to its last, or to the end while its node is up or it is listed "
            f"lost); {amount(ledger.observed)} observed ({ledger.observed / whole:.1%}), unobserved "
            f"{amount(cells.get(UNOBSERVED, 0.0))} (no exporter accounted for it), lost {amount(cells.get(LOST, 0.0))} "
            f"(the GPU answered GPU_IS_LOST)",
            f"GPU ledger cells: {' + '.join(parts)} = {amount(sum(cells.values()))} {name} (worst GPU's counters "
            f"{ledger.worst:.3%} off its observed seconds)",
            f"GPU ledger waste: {'>=' if unsplit > 1.8 else ''}{amount(wasted)} {name} ({wasted / whole:.1%} of what "
            f"existed): hidden idle + time idle + switch overhead, attributed or not",
            ERROR]


def ledger_rows(report: Report) -> list[tuple[str, list]]:
    """(name, books) per row of the GPU ledger's own table: a GPU each (--by gpu) or a node each (--by node),
    then all of them; none for other groupings."""
    ledger = report.collected.ledger
    if report.by == "gpu":
        rows = [(f"{b.instance}/{b.gpu or b.uuid}", [b]) for b in sorted(ledger.books.values(),
                                                                         key=lambda b: (b.instance, b.gpu, b.uuid))]
    elif report.by == "node":
        rows = sorted(ledger.by_node().items())
    else:
        return []
    return [*rows, (TOTAL, list(ledger.books.values()))] if rows else []


def ledger_table(report: Report, room: int) -> list[str]:
    """Each GPU's (node's) ledger: what existed and its cells, in one unit; the cells sum to what existed."""
    rows = ledger_rows(report)
    if not rows:
        return []
    ledger = report.collected.ledger
    sums = [(name, ledger.sums(books), sum(b.existed for b in books), sum(b.observed for b in books))
            for name, books in rows]
    name, factor = unit([existed / 3600 for _n, _c, existed, _o in sums])
    columns = [Column(report.by, [_ascii(n) for n, *_ in sums], 0),
               Column("existed", [figure(e / 3600, factor) for _n, _c, e, _o in sums], 9)]
    for keep, (title, names) in zip((8, 7, 2, 6, 4, 1, 5, 5), LEDGER_COLUMNS):
        columns.append(Column(title, [figure(sum(c.get(n, 0.0) for n in names) / 3600, factor)
                                      for _n, c, _e, _o in sums], keep))
    columns.append(Column("observed", [share(o / e if e > 0 else math.nan) for _n, _c, e, o in sums], 3))
    lines, left_out = fit(columns, room)
    said = [f"in {name}: existed = the cells on the right (work and hid.idle include the unattributed; unsplit: "
            f"busy unsplit and unmeasured; t.idle: time idle of holders and unattributed); observed: by an exporter"]
    if left_out:
        said.append(f"left out at {room} columns: {', '.join(c.title for c in left_out)} (--format json, csv or html)")
    return ["", f"GPU ledger by {report.by}:", *lines, *wrap(said, room)]


def _ascii(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


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
          "reading), time idle (no kernel ran: its part by held share), unknown where its split cannot be known (basis: "
          "the cause); 'of what existed' is of the GPU-hours of every GPU in the report (of its node's with --by node, "
          "of its GPU's with --by gpu), so the rows add up to at most 100%. waste = hidden idle + time idle, '>=' "
          "where busy is unsplit or unknown (a lower bound). Switch overhead, unheld, unattributed, lost and "
          "unobserved time belong to no group: GPU ledger lines.")


def wasters_lines(report: Report) -> list[str]:
    top = top_wasters(report.table, report.labels)
    return [f"{i}. {group_name(row, report.labels)}: {waste(row)} GPU-h wasted (time idle "
            f"{hours(row[f'ledger_{TIME_IDLE}_gpu_hours'])}, hidden idle {hours(row[f'ledger_{HIDDEN_IDLE}_gpu_hours'])})"
            for i, row in enumerate(records(top), 1)]


def holder_columns(report: Report) -> tuple[str, list[Column]]:
    """(unit, columns) of the groups' table: allocation (held, used, used/held) and ledger (its cells, waste,
    its share of what existed), priorities for a narrow terminal."""
    rows = list(records(report.table))
    figures_ = [row[k] for row in rows for k in ("held_gpu_hours", "busy_gpu_hours", "waste_gpu_hours",
                                                 *(f"ledger_{c}_gpu_hours" for c in HOLDER_CELLS))]
    name, factor = unit(figures_)
    names = [row[report.labels[0]] if row[report.labels[0]] == TOTAL else group_name(row, report.labels)
             for row in rows]
    of = {"node": "of its node's", "gpu": "of its GPU's"}.get(report.by, "of every GPU's")
    columns = [Column(report.by, names, 0),
               Column("held", [figure(r["held_gpu_hours"], factor) for r in rows], 9, "allocated to it"),
               Column("used", [figure(r["busy_gpu_hours"], factor) for r in rows], 3, "its kernels ran"),
               Column("used/held", [share(r["busy_share"]) for r in rows], 6,
                      "share of its held time in which its kernels ran (above 100% where the others left it the "
                      "GPU)"),
               Column("work", [figure(r[f"ledger_{SM_ACTIVE_WORK}_gpu_hours"], factor) for r in rows], 7,
                      "its kernels ran, SMs active"),
               Column("hid.idle", [figure(r[f"ledger_{HIDDEN_IDLE}_gpu_hours"], factor) for r in rows], 5,
                      "its kernels ran, SMs idle"),
               Column("unsplit", [figure(r[f"ledger_{BUSY_UNSPLIT}_gpu_hours"], factor) for r in rows], 1,
                      "its kernels ran, no spatial reading splits them"),
               Column("t.idle", [figure(r[f"ledger_{TIME_IDLE}_gpu_hours"], factor) for r in rows], 4,
                      "no kernel ran on its GPU: its held share of that time"),
               Column("waste", [figure(r["waste_gpu_hours"], factor, ">=" if r["waste_is_lower_bound"] else "")
                                for r in rows], 8, "hid.idle + t.idle ('>=': a lower bound)"),
               Column("existed", [share(of_existed(report, r)) for r in rows], 2,
                      f"its ledger cells' share of the GPU-hours that existed ({of} ledger)")]
    return name, columns


def as_text(report: Report) -> str:
    """Every line within the terminal's width (COLUMNS; 80 when piped): the groups' table in the unit its
    figures need, columns left out by priority (named; the other formats have them), the rest wrapped."""
    room = width()
    name, columns = holder_columns(report)
    lines, left_out = fit(columns, room)
    shown = [c for c in columns if c.meaning and c not in left_out]
    key = [f"in {name}. {ALLOCATION}: " + "; ".join(f"{c.title}: {c.meaning}" for c in shown
                                                   if c.title in ALLOCATION_COLUMNS)
           + f". {PHYSICAL} (physical, never added to the allocation): "
           + "; ".join(f"{c.title}: {c.meaning}" for c in shown if c.title not in ALLOCATION_COLUMNS)]
    if left_out:
        key.append(f"left out at {room} columns: {', '.join(c.title for c in left_out)} (--format json, csv or html)")
    bases = [f"  {n}: {basis_note(row)}" for n, row in zip(columns[0].cells, records(report.table))]
    wasters = wasters_lines(report)
    return "\n".join([*wrap(header_lines(report), room), "", *lines, *wrap(key, room),
                      *ledger_table(report, room), "", "basis:", *wrap(bases, room), "", "top wasters:",
                      *wrap(wasters or ["none"], room), "", *wrap([LEGEND], room)]) + "\n"


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


def group_json(report: Report, row) -> dict:
    labels = report.labels
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
                     "gpu_hours": _number(row["ledger_gpu_hours"]), "waste_gpu_hours": _number(row["waste_gpu_hours"]),
                     "of_what_existed": _number(of_existed(report, row)),
                     "unknown_because": [{"held_gpu_hours": round(v, 6), "cause": why} for v, why in unknown_causes(row)]}
    out["waste_gpu_hours"] = _number(row["waste_gpu_hours"])
    out["waste_is_lower_bound"] = bool(row["waste_is_lower_bound"])
    return out


def _ledger_entry(ledger, books=None) -> dict:
    """A GPU's, node's or (books None) the fleet's ledger in GPU-hours: the cells (unobserved included) sum to
    existed."""
    cells = ledger.sums(books)
    books = ledger.books.values() if books is None else books
    existed = sum(b.existed for b in books)
    return {"existed_gpu_hours": round(existed / 3600, 6),
            "observed_gpu_hours": round(sum(b.observed for b in books) / 3600, 6),
            "unobserved_gpu_hours": round(cells.get(UNOBSERVED, 0.0) / 3600, 6),
            "lost_gpu_hours": round(cells.get(LOST, 0.0) / 3600, 6),
            "cells": {cell: round(v / 3600, 6) for cell, v in sorted(cells.items())},
            "cells_sum_gpu_hours": round(sum(cells.values()) / 3600, 6),
            "waste_gpu_hours": round(sum(cells.get(c, 0.0) for c in WASTE_CELLS) / 3600, 6)}


def gpu_ledger_json(report: Report) -> dict:
    ledger = report.collected.ledger
    out = {"skipped": ledger.skipped or None, "gpus": len(ledger.books), **_ledger_entry(ledger),
           "worst_gpu_relative_error": round(ledger.worst, 9), "error": ERROR}
    if report.by == "gpu":
        out["by_gpu"] = [{"instance": b.instance, "uuid": b.uuid, "gpu": b.gpu, "model": b.model,
                          "first_seen": b.first if math.isfinite(b.first) else None,
                          "last_seen": b.last if math.isfinite(b.last) else None, "listed_lost": b.listed_lost,
                          **_ledger_entry(ledger, [b])} for b in ledger.books.values()]
    if report.by == "node":
        out["by_node"] = [{"instance": node, **_ledger_entry(ledger, books)}
                          for node, books in sorted(ledger.by_node().items())]
    return out


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
        "groups": GROUPS, "total": group_json(report, report.total), "gpu_ledger": gpu_ledger_json(report),
        "top_wasters": [group_name(row, report.labels) for row in records(top)],
    }
    head, tail = (json.dumps(document, indent=2) + "\n").split(json.dumps(GROUPS))
    yield head + "["
    for number, row in enumerate(records(report.groups)):
        yield ("," if number else "") + "\n    " + json.dumps(group_json(report, row))
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
