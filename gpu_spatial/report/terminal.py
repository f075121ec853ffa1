"""The report's text table fitted to the terminal it is printed to (COLUMNS, else the terminal's width, 80
when piped): a unit in which the figures do not round to 0, columns left out by priority until every line
fits (they stay in --format json/csv/html), the group name cut last, and every other line wrapped."""
from __future__ import annotations

import math
import shutil
import textwrap
from dataclasses import dataclass

MIN_NAME = 12  # the group name is cut to this at the narrowest
UNITS = (("GPU-h", 1.0), ("GPU-min", 60.0), ("GPU-s", 3600.0))


def width() -> int:
    """COLUMNS where set, the terminal's width on a terminal, 80 when piped (or to a file)."""
    return max(shutil.get_terminal_size((80, 24)).columns, 40)


def unit(gpu_hours) -> tuple[str, float]:
    """(name, factor from GPU-hours): GPU-h where the largest figure is at least 1 GPU-h, GPU-min where it is
    at least 1 GPU-minute, GPU-s below: figures that would print as 0.00 hours keep their digits."""
    top = max((abs(v) for v in gpu_hours if v is not None and not math.isnan(v)), default=0.0)
    for name, factor in UNITS:
        if top * factor >= 1.0:
            return name, factor
    return UNITS[-1]


def figure(value, factor: float, prefix: str = "") -> str:
    if value is None or math.isnan(value):
        return "unknown"
    return f"{prefix}{value * factor:,.3f}"


def share(value) -> str:
    return "unknown" if value is None or math.isnan(value) else f"{value * 100:.1f}%"


@dataclass
class Column:
    title: str
    cells: list[str]
    keep: int  # priority: the lowest is left out first; 0 (the name) is never left out
    meaning: str = ""  # said in the key under the table

    @property
    def width(self) -> int:
        return max(len(self.title), *(len(c) for c in self.cells)) if self.cells else len(self.title)


def fit(columns: list[Column], room: int) -> tuple[list[str], list[Column]]:
    """(the table's lines, the columns left out): columns dropped lowest priority first until the lines fit
    in `room`, then the first (name) column cut to what is left (never under MIN_NAME)."""
    shown, left_out = list(columns), []

    def total(cols):
        return sum(min(c.width, _name_cap(c, i)) for i, c in enumerate(cols)) + 2 * (len(cols) - 1)

    while total(shown) > room and len(shown) > 1:
        drop = min(shown[1:], key=lambda c: c.keep)
        shown.remove(drop)
        left_out.append(drop)
    name = shown[0]
    others = total(shown) - min(name.width, _name_cap(name, 0))
    name_width = max(min(MIN_NAME, name.width), min(name.width, room - others))
    lines = []
    for row in range(-1, len(name.cells)):
        parts = [_cut(name.title if row < 0 else name.cells[row], name_width).ljust(name_width)]
        parts += [(c.title if row < 0 else c.cells[row]).rjust(c.width) for c in shown[1:]]
        lines.append("  ".join(parts).rstrip())
    return lines, [c for c in columns if c in left_out]


NAME_CAP = 24  # the name's width while columns are chosen: a long name is cut before a column is left out


def _name_cap(column: Column, position: int) -> int:
    return NAME_CAP if position == 0 else column.width


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[:room - 1] + "~"


def wrap(lines, room: int) -> list[str]:
    """Each line wrapped to `room`, continuation lines indented; an empty line stays empty."""
    out = []
    for line in lines:
        indent = " " * min(len(line) - len(line.lstrip(" ")) + 2, room // 4)
        out += textwrap.wrap(line, room, subsequent_indent=indent, break_long_words=True,
                             break_on_hyphens=False) or [""]
    return out
