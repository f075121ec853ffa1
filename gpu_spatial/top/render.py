"""The screen as lines of (text, style) segments, from a ScreenState: no curses here, so the layout is
tested without a terminal and `--once` prints the same screen as plain text.

Styles are names (tui.py maps them to colours, or to nothing in plain mode)."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from exporter.holders import holder_name
from exporter.sources import default_order
from exporter.vocabulary import (BUSY_UNSPLIT, HIDDEN_IDLE, SM_ACTIVE_WORK, SWITCH_OVERHEAD, TIME_IDLE,
                                 UNATTRIBUTED_BUSY_UNSPLIT, UNATTRIBUTED_HIDDEN_IDLE, UNATTRIBUTED_SM_ACTIVE_WORK,
                                 UNATTRIBUTED_TIME_IDLE, UNHELD, UNMEASURED)
from gpu_spatial.top.feeds import clock
from gpu_spatial.top.state import NA, Gpu, Process, ScreenState

VERDICT_LINES = 2
MAX_BAR = 40  # wider bars read no better
SORTS = ("time", "memory", "pid", "user", "command")  # `s` cycles, `<` and `>` step
HELP = """\
time[####    ]  share of the interval in which a kernel ran (nvidia-smi, nvitop)
SM[##~~      ]  share of the SMs doing work (#); ~ hidden idle: busy, SMs idle
occ     SM occupancy (resident warps / max)   tensor  tensor pipes active
DRAM    memory bandwidth active               hid     hidden idle (time - SM)
mode    exclusive, time_sliced, mps, mig, idle
M       an MPS client                         S       the MPS server

q       quit
up/down j/k 0-9   select a GPU (digits: its place in the list)
s       cycle the sort column     < >  previous / next column   i  reverse
w       why: the reason behind every n/a, and why a spatial source is not live
?       this help (any key returns)"""


@dataclass
class View:
    selected: int = 0
    sort: str = "time"
    reverse: bool = False
    page: str = "main"  # main, help, why
    log: tuple[str, ...] = ()  # the in-process engine's recent log lines (shown under `w`)


def pct(value: float | None) -> str:
    """A ratio as the screen shows it: whole percent, right-aligned in 4, or n/a."""
    return f"{value * 100:3.0f}%" if value is not None else " n/a"


def gib(value: float | None) -> str:
    return NA if value is None else f"{value / 2**30:.1f}G"


def bar(width: int, full: float | None, hidden_to: float | None = None) -> list[tuple[str, str]]:
    """[###~~~   ]: '#' up to `full`, '~' from there up to `hidden_to` (hidden idle)."""
    if full is None:
        return [("[", ""), ("n/a".center(width), "na"), ("]", "")]
    cells = round(full * width)
    hidden = max(0, round(hidden_to * width) - cells) if hidden_to is not None else 0
    return [("[", ""), ("#" * cells, "fill"), ("~" * hidden, "hidden"), (" " * (width - cells - hidden), ""),
            ("]", "")]


def short_model(model: str, width: int) -> str:
    return model.replace("NVIDIA ", "").replace("GeForce ", "")[:width].ljust(width)


def gpu_line(gpu: Gpu, width: int, selected: bool) -> list[tuple[str, str]]:
    """One GPU in one line: the time bar and the SM bar side by side, hidden idle between them."""
    index = "?" if gpu.index is None else str(gpu.index)
    mark = ((">" if selected else " ") + f"{index:>2} ", "sel" if selected else "bold")
    model = (short_model(gpu.model, 10 if width < 100 else 16) + " ", "")
    if gpu.lost:
        return [mark, model, ("GPU lost: no values (w: why)", "bad")]
    extra = f"  {gpu.sharing_mode or NA:<11} {gpu.verdict or NA}" if width >= 120 else ""
    # Narrow screens drop the model, then the hidden-idle figure, so that both bars keep at least 4 cells.
    for head, tail in (([mark, model], f" hid{pct(gpu.hidden_idle)}"), ([mark], f" hid{pct(gpu.hidden_idle)}"),
                       ([mark], "")):
        used = sum(len(t) for t, _ in head) + len("time[]") + 4 + len(" SM[]") + 4 + len(tail) + len(extra)
        if (width - used) // 2 >= 4:
            break
    width_each = min(MAX_BAR, max(1, (width - used) // 2))
    time_bar = [("time", "bold")] + bar(width_each, gpu.time_utilization) + [(pct(gpu.time_utilization), "time")]
    sm_bar = [(" SM", "bold")] + bar(width_each, gpu.sm_active, gpu.time_utilization) + [(pct(gpu.sm_active), "sm")]
    return head + time_bar + sm_bar + [(tail, "hidden" if (gpu.hidden_idle or 0) >= 0.25 else "")] * bool(tail) + \
        ([(extra, "")] if extra else [])


def detail_lines(gpu: Gpu, width: int) -> list[list[tuple[str, str]]]:
    index = "?" if gpu.index is None else str(gpu.index)
    source = gpu.source or NA
    lines = [
        [(f"GPU {index} ", "bold"), (f"{gpu.uuid[:20]}  ", "dim"), ("mode ", "dim"), (f"{gpu.sharing_mode or NA}", "bold"),
         ("  spatial ", "dim"), (source, "bold" if gpu.source else "na"), (" (w: why)  ", "dim"),
         (f"mem {gib(gpu.memory_used)}/{gib(gpu.memory_total)}", "")],
        [(f"time {pct(gpu.time_utilization)}  SM {pct(gpu.sm_active)}  occ {pct(gpu.sm_occupancy)}  "
          f"tensor {pct(gpu.tensor_active)}  DRAM {pct(gpu.dram_active)}  hidden idle {pct(gpu.hidden_idle)}", "")],
    ]
    if gpu.power_watts is not None or gpu.temperature is not None:
        lines[1].append((f"  {NA if gpu.power_watts is None else f'{gpu.power_watts:.0f}W'} "
                         f"{NA if gpu.temperature is None else f'{gpu.temperature:.0f}C'}", "dim"))
    if gpu.mps_server_faults_per_s:
        lines.append([(f"MPS server paging: {gpu.mps_server_faults_per_s:.1f} major faults/s", "bad")])
    verdict = gpu.verdict or NA
    advice = gpu.advice or ("too little evidence for a verdict" if gpu.verdict is None else "")
    # What to change is the point of the screen: up to VERDICT_LINES lines rather than cut at 80 columns.
    first, *more = textwrap.wrap(f"verdict {verdict}: {advice}", width, subsequent_indent="  ") or [""]
    lines.append([("verdict ", "bold"), (verdict, "verdict"), (first[len("verdict ") + len(verdict):], "")])
    lines += [[(line, "")] for line in more[:VERDICT_LINES - 1]]
    for holder in gpu.holders[:2]:
        lines.append([("held by ", "dim"), (holder, "")])
    for record in gpu.workloads[:3]:
        lines.append([("workload ", "dim"), (_workload(record), "")])
    if gpu.ledger:
        lines.append([("ledger ", "dim"), (_ledger(gpu.ledger), "")])
    return lines


LEDGER_SHOWN = (("work", (SM_ACTIVE_WORK, UNATTRIBUTED_SM_ACTIVE_WORK)),
                ("hidden idle", (HIDDEN_IDLE, UNATTRIBUTED_HIDDEN_IDLE)),
                ("busy unsplit", (BUSY_UNSPLIT, UNATTRIBUTED_BUSY_UNSPLIT)),
                ("time idle", (TIME_IDLE, UNATTRIBUTED_TIME_IDLE)), ("switch", (SWITCH_OVERHEAD,)),
                ("unheld", (UNHELD,)), ("unmeasured", (UNMEASURED,)))


def _ledger(cells: dict) -> str:
    """The GPU's ledger now (physical: its second in cells that sum to 1), unattributed parts named."""
    parts = []
    for name, names in LEDGER_SHOWN:
        value = sum(cells.get(c, 0.0) for c in names)
        if value >= 0.0005:
            unattributed = sum(cells.get(c, 0.0) for c in names if c.startswith("unattributed_"))
            parts.append(f"{name} {pct(value)}" + (f" ({pct(unattributed)} nobody's)" if unattributed >= 0.0005 else ""))
    return "  ".join(parts) + "  (physical: sums to 100%)"


def _workload(record: dict) -> str:
    """A workload record of the exporter, whatever its exact fields: the holder, then its figures, each with
    its basis where the record names one (`time_share_basis` nvml|ctxsw|cupti, `sm_active_basis` exact|ctxsw|time_share|cupti)."""
    holder = holder_name(record) or (record.get("holder") if isinstance(record.get("holder"), str) else "") or "?"

    def basis(key):
        value = record.get(f"{key}_basis")
        return f" ({''.join(c if c.isprintable() else '?' for c in value[:16])})" if isinstance(value, str) else ""
    figures = [f"{k} {v:.2f}{basis(k)}" for k, v in record.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("index", "gpu")]
    cells = record.get("ledger")
    if isinstance(cells, dict) and cells:  # the two views apart: what it held and used, and its ledger cells
        own = [f"{CELL_NAMES[c]} {v:.2f}" for c, v in cells.items() if c in CELL_NAMES and isinstance(v, (int, float))]
        return f"{holder}  alloc: " + "  ".join(figures) + "  | ledger: " + "  ".join(own)
    return f"{holder}  " + "  ".join(figures)


CELL_NAMES = {SM_ACTIVE_WORK: "work", HIDDEN_IDLE: "hidden idle", BUSY_UNSPLIT: "busy unsplit", TIME_IDLE: "time idle"}


def sort_key(name: str):
    return {
        "time": lambda p: (p.time_share is not None, p.time_share or 0.0),
        "memory": lambda p: (p.memory_bytes is not None, p.memory_bytes or 0.0),
        "pid": lambda p: p.pid,
        "user": lambda p: p.user or "",
        "command": lambda p: p.command,
    }[name]


def sorted_processes(processes: list[Process], sort: str, reverse: bool) -> list[Process]:
    descending = sort in ("time", "memory")  # biggest first, as top does
    return sorted(processes, key=sort_key(sort), reverse=descending != reverse)


def process_lines(gpu: Gpu, view: View, width: int, rows: int) -> list[list[tuple[str, str]]]:
    if rows <= 0:
        return []
    columns = [("pid", "    PID"), ("user", " USER    "), ("time", " TIME%"), ("memory", " GPU-MEM"),
               ("command", "  HOLDER/COMMAND")]
    header = [(label + ("*" if name == view.sort else " "), "header") for name, label in columns]
    if not gpu.processes:
        return [header, [("  no processes on this GPU", "dim")]][:rows]
    lines = [header]
    procs = sorted_processes(gpu.processes, view.sort, view.reverse)
    for p in procs[:rows - 1]:
        user = (p.user or NA)[:8]
        holder = f"[{p.holder}] " if p.holder else ""
        lines.append([(p.mark, "mps" if p.mark != " " else ""),
                      (f"{p.pid:>7} {user:<8} {pct(p.time_share):>6} {gib(p.memory_bytes):>8}  ", ""),
                      (holder, "dim"), (p.command, "")])
    if len(procs) > rows - 1:
        lines[-1] = [(f"  ... {len(procs) - rows + 2} more processes (a taller terminal shows them)", "dim")]
    return lines


def header_line(state: ScreenState, view: View) -> list[tuple[str, str]]:
    when = f"snapshot {state.version} {clock(state.created)}" if state.version is not None and state.created else \
        "no snapshot"
    return [("gpu-spatial top", "title"), (f"  {when}  {state.origin}  sort {view.sort}  ", "dim"),
            ("?:help q:quit", "dim")]


def why_lines(state: ScreenState, gpu: Gpu | None, view: View, width: int) -> list[list[tuple[str, str]]]:
    lines = [[("why (any key returns)", "title")]]
    if state.problem:
        lines.append([(state.problem, "bad")])
    if gpu is not None:
        lines.append([(f"GPU {gpu.index} {gpu.uuid} {gpu.model}", "bold")])
        for name, value in (("time utilization", gpu.time_utilization), ("SM active", gpu.sm_active),
                            ("SM occupancy", gpu.sm_occupancy), ("tensor active", gpu.tensor_active),
                            ("DRAM active", gpu.dram_active)):
            if value is None:
                lines.append([(f"  {name}: n/a: ", "na"), (gpu.why("time" if name.startswith("time") else name), "")])
        lines.append([("spatial sources, in order of preference:", "bold")])
        named = max(map(len, default_order())) + 1  # the registered sources' names (exporter/sources.py)
        for source, source_state, reason in gpu.sources:
            lines.append([(f"  {source:<{named}} {source_state:<11} ", "sel" if source_state == "active" else "dim"),
                          (reason, "")])
        if gpu.sharing_mode is None:
            lines.append([("  sharing mode: n/a: NVML did not list the GPU's compute processes", "")])
        if gpu.verdict:
            lines.append([("verdict ", "bold"), (f"{gpu.verdict}: {gpu.verdict_reason}", "")])
        for error in gpu.errors:
            lines.append([("  NVML: ", "dim"), (error, "")])
        if any(p.kind == "mps" and p.time_share is None for p in gpu.processes):
            lines.append([("  TIME% n/a for MPS clients (M): NVML charges their kernels to the MPS server (S)", "dim")])
        if any(p.memory_bytes is None for p in gpu.processes):
            lines.append([("  GPU-MEM n/a: the snapshot carries no per-process memory", "dim")])
        if any(p.user is None for p in gpu.processes):
            lines.append([("  user n/a: the pid is not a process of this host with the same command "
                           "(a replay, a remote exporter, another pid namespace)", "dim")])
    for error in state.collector_errors:
        lines.append([("collector ", "bad"), (error, "")])
    for paging in state.mps_paging:
        lines.append([(paging, "bad")])
    if view.log:
        lines.append([("recent log:", "bold")])
        lines += [[("  " + line, "dim")] for line in view.log[-8:]]
    return wrap(lines, width)


def wrap(lines, width: int):
    """Lines longer than the screen continue on the next, indented (the why and help pages)."""
    out = []
    for line in lines:
        flat = "".join(t for t, _ in line)
        if len(flat) <= width:
            out.append(line)
            continue
        style = next((s for t, s in line if s), "")
        out += [[(part, style)] for part in textwrap.wrap(flat, width, subsequent_indent="    ")]
    return out


def render(state: ScreenState, view: View, width: int, height: int, cut: bool = True) -> list[list[tuple[str, str]]]:
    """The whole screen: at most `height` lines, each at most `width` characters (laid out for `width` but
    never cut without `cut`: a pipe has no edge)."""
    gpu = state.gpus[min(view.selected, len(state.gpus) - 1)] if state.gpus else None
    if view.page == "help":
        lines = [header_line(state, view)] + wrap([[(line, "")] for line in HELP.splitlines()], width)
    elif view.page == "why":
        lines = [header_line(state, view)] + why_lines(state, gpu, view, width)
    else:
        lines = [header_line(state, view)]
        if state.problem:
            lines.append([(state.problem, "bad")])
        if not state.gpus and not state.refused:
            lines.append([("no GPUs in this snapshot" if not state.problem else "no values shown: they would be stale",
                           "dim")])
            lines += [[("collector ", "bad"), (error, "")] for error in state.collector_errors[:3]]
        for g in state.gpus:
            lines.append(gpu_line(g, width, g is gpu))
        if gpu is not None:
            lines.append([("", "")])
            lines += detail_lines(gpu, width)
            lines += process_lines(gpu, view, width, height - len(lines) - 1)
        for paging in state.mps_paging[:1]:
            lines.append([(paging, "bad")])
    return [clip(line, width) if cut else line for line in lines[:height]]


def clip(line, width: int):
    out, room = [], width
    for text, style in line:
        if room <= 0:
            break
        out.append((text[:room], style))
        room -= len(text[:room])
    return out


def plain(lines) -> str:
    return "\n".join("".join(t for t, _ in line).rstrip() for line in lines)
