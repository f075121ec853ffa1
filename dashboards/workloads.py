"""Workloads: who holds each GPU, how much of it they use, and which ones hold it idle; the GPU ledger.

Per-workload series (docs/metrics.md, Workloads): each holder's own share, never the GPU total copied
onto every pod. GPU-hours come from the GPU-second counters, exact over the dashboard's range."""
from grafanalib.core import Dashboard, GridPos, Templating, Time

from dashboards.common import INPUTS, datasource_variable, table, target, timeseries, variable
from exporter.holders import kind_views, report_groups
from exporter.holders import labels as holder_labels
from exporter.vocabulary import HIDDEN_IDLE, SM_ACTIVE_WORK, TIME_IDLE

UID = "gpu-workloads"
HOST = 'instance=~"$host"'


def hours(counter: str, by: str, where: str = "") -> str:
    """GPU-hours of a GPU-second counter over the dashboard's range, per `by`, largest first."""
    selector = ", ".join(s for s in (HOST, where) if s)
    return f"sort_desc(sum by ({by}) (increase(gpu_workload_{counter}_gpu_seconds_total{{{selector}}}[$__range])) / 3600)"


def cells(by: str, where: str, names) -> str:
    """GPU-hours of the holders' ledger cells `names` over the dashboard's range, per `by`."""
    return hours("ledger", by, ", ".join(s for s in (where, f'cell=~"{"|".join(names)}"') if s))


# Two views, never added (docs/ledger.md): the allocation (held, used of it) and the physical ledger
# (the holders' cells: work, hidden idle, time idle; waste = hidden idle + time idle)
COLUMNS = (("allocation: held", lambda by, where: hours("held", by, where)),
           ("allocation: used (busy)", lambda by, where: hours("busy", by, where)),
           ("ledger: work", lambda by, where: cells(by, where, (SM_ACTIVE_WORK,))),
           ("ledger: hidden idle", lambda by, where: cells(by, where, (HIDDEN_IDLE,))),
           ("ledger: time idle", lambda by, where: cells(by, where, (TIME_IDLE,))),
           ("ledger: waste", lambda by, where: cells(by, where, (HIDDEN_IDLE, TIME_IDLE))))


def ranked(title: str, by: str, where: str, pos, description: str, empty: str):
    """A table of holders (`by`) with GPU-hours of both views, each column named after its view."""
    columns = COLUMNS
    return table(title, empty, description, unit="h",
                 targets=[target(expr(by, where), ref=chr(ord("A") + i), instant=True, table=True)
                          for i, (_, expr) in enumerate(columns)],
                 gridPos=GridPos(h=pos[0], w=pos[1], x=pos[2], y=pos[3]),
                 transformations=[{"id": "merge", "options": {}},
                                  {"id": "organize", "options": {
                                      "excludeByName": {"Time": True},
                                      "renameByName": {f"Value #{chr(ord('A') + i)}": f"GPU-hours {name}"
                                                       for i, (name, _) in enumerate(columns)}}},
                                  {"id": "sortBy", "options": {"sort": [{"field": "GPU-hours ledger: waste", "desc": True}]}}])


# The first holder table's description starts with this, its no-data text ends with MEASURED.
VIEWS = ("Two views, never added (docs/ledger.md). Allocation: held (what the scheduler allocated) and used (busy: the "
         "time share of its processes, absent under MPS; more than held when the others leave the GPU to it). Ledger "
         "(physical: each GPU-hour in one cell): work (its kernels ran, SMs active), hidden idle (its kernels ran, SMs "
         "idle), time idle (no kernel ran: its part by held share); waste = hidden idle + time idle.")
MEASURED = (" Busy, SM-active and hidden idle stay empty under MPS unless the clients trace themselves (basis cupti: "
            "docs/mps-clients.md), and busy on MIG.")
TABLE_HEIGHT = 8


def holder_tables() -> list:
    """A table of GPU-hours per grouping a registered kind gives one (its PANELS, exporter/holders.py KINDS), in
    their order, two to a row (a last one alone spans the row)."""
    groups = report_groups()
    wanted = [(grouping, *panel) for kind in kind_views() for grouping, panel in kind.panels.items()]
    tables = []
    for i, (grouping, title, description, empty) in enumerate(wanted):
        labels = groups[grouping]
        alone = i == len(wanted) - 1 and i % 2 == 0
        pos = (TABLE_HEIGHT, 24 if alone else 12, 12 * (i % 2), TABLE_HEIGHT * (i // 2))
        if i == 0:
            description, empty = f"{VIEWS} {description}".strip(), empty + MEASURED
        tables.append(ranked(f"{title}: GPU-hours over the range", ", ".join(labels), f'{labels[-1]}!=""', pos,
                             description, empty))
    return tables


def holder_legend() -> str:
    """A holder in a legend, whatever its kind: each kind's naming labels (a pod's namespace and pod), side by side
    (a holder has one kind's labels only)."""
    return "".join("/".join(f"{{{{{label}}}}}" for label in kind.named) for kind in kind_views())


def build() -> Dashboard:
    tables = holder_tables()
    top = TABLE_HEIGHT * ((len(tables) + 1) // 2)  # the panels below the holder tables
    holder = holder_legend()
    every_label = ", ".join(("instance", "uuid", *holder_labels()))
    panels = [
        *tables,
        timeseries("Per workload: time share vs SM active",
                   [(f"gpu_workload_time_share_ratio{{{HOST}}}",
                     f"{{{{instance}}}} GPU {{{{gpu}}}} {holder} time ({{{{basis}}}})"),
                    (f"gpu_workload_sm_active_ratio{{{HOST}}}",
                     f"{{{{instance}}}} GPU {{{{gpu}}}} {holder} SM active ({{{{basis}}}})"),
                    (f"gpu_workload_cupti_sm_estimate_ratio{{{HOST}}}",
                     f"{{{{instance}}}} GPU {{{{gpu}}}} {holder} SM estimate (cupti, unscaled)")],
                   (9, 12, 0, top),
                   description="Shares of the whole GPU, each with its basis. Time: basis=nvml (NVML's per-process "
                               "samples, an estimate), ctxsw (the GPU's context switches, exact) or cupti (an MPS "
                               "client's own kernels). SM active: basis=exact (alone on the GPU), ctxsw (its own "
                               "slices), cupti (its kernels' grids, scaled so that the clients' sum stays within the "
                               "GPU's SM active; the unscaled estimate beside it) or time_share (the GPU's SM "
                               "activity split by time shares, an estimate). Under MPS only clients that trace "
                               "themselves have either (docs/mps-clients.md).",
                   empty="no holder runs CUDA work with a time share: under MPS NVML has no per-client time (it "
                         "charges the MPS server), MIG devices have no per-process utilization, and outside "
                         "Kubernetes and Slurm no holder is known."),
        table("Shared GPUs: each holder's own share", "no GPU has two or more holders now (each is held whole, or "
              "no holder is known).", gridPos=GridPos(h=9, w=12, x=12, y=top),
              description="GPUs with two or more holders (time-slicing or MPS replicas, Slurm sharing): held share, "
                          "time share and processes of each holder side by side.",
              targets=[target(f"gpu_workload_held_share_ratio{{{HOST}}} and on (instance, uuid) "
                              f"(count by (instance, uuid) (gpu_workload_held_share_ratio{{{HOST}}}) > 1)",
                              instant=True, table=True),
                       target(f"gpu_workload_time_share_ratio{{{HOST}}}", ref="B", instant=True, table=True),
                       target(f"gpu_workload_processes{{{HOST}}}", ref="C", instant=True, table=True)],
              transformations=[{"id": "merge", "options": {}},
                               {"id": "filterByValue", "options": {"filters": [{"fieldName": "Value #A", "config": {
                                   "id": "isNull", "options": {}}}], "type": "exclude", "match": "any"}},
                               {"id": "organize", "options": {
                                   "excludeByName": {"Time": True, "job": True, "__name__": True},
                                   "renameByName": {"Value #A": "held share", "Value #B": "time share",
                                                    "Value #C": "processes"}}}]),
        timeseries("GPU ledger: every GPU-second in one cell",
                   [(f"sum by (cell) (rate(gpu_ledger_gpu_seconds_total{{{HOST}}}[$__rate_interval]))", "{{cell}}")],
                   (8, 12, 0, top + 9), unit="short", ratio=False, stacking={"mode": "normal", "group": "cells"},
                   description="Physical view, in GPUs: the cells of every GPU's ledger stack up to the GPUs that "
                               "existed (gpu_ledger_observed_seconds_total), never above. Holders' work, hidden idle, busy unsplit "
                               "and time idle, and the cells of no holder: switch overhead (gaps between time "
                               "slices), unheld, unattributed (MPS clients and MIG instances without per-process "
                               "numbers, processes of no holder) and unmeasured. Waste = hidden idle + time idle + "
                               "switch overhead.",
                   empty="no ledger series: the exporter runs --holders none or is older than the ledger."),
        table("GPU ledger over the range: GPU-hours by cell", "no ledger series in the range (--holders none, or an "
              "exporter older than the ledger).", gridPos=GridPos(h=8, w=12, x=12, y=top + 9), unit="h",
              description="Every GPU-hour that existed on the selected hosts, in exactly one cell (physical view; "
                          "the cells sum to the GPU-hours observed). Never add held GPU-hours (allocation) to these.",
              targets=[target(f"sort_desc(sum by (cell) (increase(gpu_ledger_gpu_seconds_total{{{HOST}}}"
                              f"[$__range])) / 3600)", instant=True, table=True)],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                              "renameByName": {"Value": "GPU-hours (ledger)"}}}]),
        table("Held idle now", "no holder has been idle for --held-idle-after (30 m by default): good news.",
              gridPos=GridPos(h=7, w=24, x=0, y=top + 17), unit="s",
              description="Holders idle for --held-idle-after or longer (alert GPUHeldIdle), with how long.",
              targets=[target(f"gpu_workload_idle_seconds{{{HOST}}} and on ({every_label}) "
                              f"(gpu_workload_held_idle{{{HOST}}} == 1)", instant=True, table=True)],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "job": True},
                                                              "renameByName": {"Value": "idle for"}}}]),
        table("How the GPU-hours were measured: by basis", "no busy or SM-active GPU-seconds in the range: no "
              "holder ran CUDA work, or every one was under MPS (no per-client time).",
              gridPos=GridPos(h=6, w=24, x=0, y=top + 24), unit="h",
              description="GPU-hours over the range by basis. Measured exactly: SM-active basis exact or ctxsw, busy "
                          "basis ctxsw or cupti (MPS clients' own kernels). Estimated: SM-active time_share or cupti "
                          "(grids against SMs, scaled to the GPU's), busy nvml. Held GPU-hours with no busy or SM "
                          "series (MPS clients that do not trace; busy on MIG) are unknown and appear in no row here.",
              targets=[target(f"sum by (basis) (increase(gpu_workload_sm_active_gpu_seconds_total{{{HOST}}}[$__range])) "
                              f"/ 3600", instant=True, table=True),
                       target(f"sum by (basis) (increase(gpu_workload_busy_gpu_seconds_total{{{HOST}}}[$__range])) "
                              f"/ 3600", ref="B", instant=True, table=True)],
              transformations=[{"id": "merge", "options": {}},
                               {"id": "organize", "options": {
                                   "excludeByName": {"Time": True},
                                   "renameByName": {"Value #A": "GPU-hours SM-active", "Value #B": "GPU-hours busy"}}}]),
    ]
    return Dashboard(
        title="GPU workloads: held, used, wasted", uid=UID, tags=["gpu", "workloads"], refresh="30s",
        time=Time("now-24h", "now"), inputs=INPUTS,
        templating=Templating([datasource_variable(),
                               variable("host", "Host", "label_values(gpu_workload_held_share_ratio, instance)")]),
        panels=panels,
    ).auto_panel_ids()
