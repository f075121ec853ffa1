"""What bench/cost_per_gpu.py reports, computed from what it measured: the exporter's line on its attribution
child's cost, whether every GPU's context-switch window ended, and the summary (slope per GPU, 8-GPU projection,
RSS against nvitop-exporter's, a window's cost at the default duty). Tested in tests/test_cost.py."""
from __future__ import annotations

import re

CHILD_COST = re.compile(r"attributed in a child process: ([\d.]+) s CPU(?: \(([\d.]+) s of it start-up\))?, peak (\d+) MiB")


def child_cost(reason: str) -> dict | None:
    """The attribution child's cost as the source's state reason says it: CPU seconds, of them start-up, peak MiB."""
    found = CHILD_COST.search(reason or "")
    if found is None:
        return None
    cpu, startup, peak = found.groups()
    return {"cpu_s": float(cpu), "startup_cpu_s": None if startup is None else float(startup), "peak_mib": int(peak)}


CTXSW_PHASES = ("all_ctxsw", "one_ctxsw")  # one context-switch window of every GPU, then of one


def settled(metrics: str) -> bool:
    """Every GPU's context-switch state is one a window ends in (active, error, unsupported), from /metrics."""
    current = [line for line in metrics.splitlines() if line.startswith("gpu_workload_ctxsw_state{") and line.endswith(" 1.0")]
    return bool(current) and all(any(f'state="{s}"' in line for s in ("active", "error", "unsupported")) for line in current)


def summary(report: dict) -> dict:
    """Per phase and exporter: CPU (% of a core) and RSS; the per-GPU slope (all GPUs - one GPU) / (n - 1), the
    8-GPU projection from it, RSS against nvitop-exporter's + 10 MB, and the ctxsw window's cost at the default
    duty per GPU."""
    phases = report.get("phases", {})
    gpus = report.get("gpus") or 0
    out: dict = {"rows": [], "slope_percent_per_gpu": {}, "projection_8_gpus_percent": {}, "rss_within_nvitop_plus_10mb": {},
                 "ctxsw": {}}
    for name in ("all_idle", "all_loaded", "one_loaded", "one_idle"):
        phase = phases.get(name) or {}
        for kind, entry in (phase.get("exporters") or {}).items():
            out["rows"].append({"phase": name, "gpus": 1 if phase.get("one_gpu") else gpus, "exporter": kind,
                                "cpu_percent_of_core": entry.get("cpu_percent_of_core"), "rss_mib": entry.get("vmrss_mib"),
                                "error": entry.get("error")})
    cpu = {(r["phase"], r["exporter"]): r["cpu_percent_of_core"] for r in out["rows"]}
    rss = {(r["phase"], r["exporter"]): r["rss_mib"] for r in out["rows"]}
    for load in ("idle", "loaded"):
        for kind in ("ours", "nvitop"):
            many, one = cpu.get((f"all_{load}", kind)), cpu.get((f"one_{load}", kind))
            if many is not None and one is not None and gpus > 1:
                slope = (many - one) / (gpus - 1)
                out["slope_percent_per_gpu"][f"{kind}_{load}"] = round(slope, 3)
                out["projection_8_gpus_percent"][f"{kind}_{load}"] = round(one + 7 * slope, 2)
    for (phase, kind), value in rss.items():
        nvitop = rss.get((phase, "nvitop"))
        if kind == "ours" and value is not None and nvitop is not None:
            out["rss_within_nvitop_plus_10mb"][phase] = {"ours": value, "nvitop": nvitop, "met": value <= nvitop + 10 * 1.048576}
    duty = report.get("ctxsw_period_s", 180.0)
    for name in CTXSW_PHASES:
        phase = phases.get(name) or {}
        if "exporter_tree_cpu_s" not in phase:
            continue
        base = phase.get("baseline_percent_of_core") or 0.0
        window = phase["exporter_tree_cpu_s"] + phase["nsys_outside_cpu_s"] - base / 100 * phase["seconds"]
        n = phase.get("gpus") or 1
        out["ctxsw"][name] = {"window_cpu_s": round(window, 3), "gpus": n, "nsys_agent_cpu_s": phase["nsys_outside_cpu_s"],
                              "percent_of_core_at_default_duty": round(100 * window / duty, 3),
                              "per_gpu_percent_at_default_duty": round(100 * window / duty / n, 3),
                              "exporter_rss_mib": (phase.get("exporter") or {}).get("vmrss_mib"),
                              "exporter_vmhwm_mib": (phase.get("exporter") or {}).get("vmhwm_mib"),
                              "attribution_child": phase.get("attribution_child"),
                              "peak_rss_nsys_mib": phase.get("peak_rss_nsys_mib"),
                              # a window that was not attributed cost something, but not what the source costs
                              "not_attributed": next((f"{s.get('state')}: {s.get('reason')}" for s in phase.get("states", ())
                                                      if s.get("state") != "active"), None)}
    many, one = out["ctxsw"].get("all_ctxsw"), out["ctxsw"].get("one_ctxsw")
    if many and one and gpus > 1:
        out["ctxsw"]["window_cpu_s_per_added_gpu"] = round((many["window_cpu_s"] - one["window_cpu_s"]) / (gpus - 1), 3)
    return out


def table(found: dict) -> str:
    """The side-by-side phases, then the context-switch source's own phases (one window each, at the default duty)."""
    lines = ["| phase | GPUs | exporter | CPU, % of a core | VmRSS MiB |", "| --- | --- | --- | --- | --- |"]
    for r in found["rows"]:
        lines.append(f"| {r['phase']} | {r['gpus']} | {r['exporter']} | {r['cpu_percent_of_core']} | {r['rss_mib']} |"
                     + (f" {r['error']}" if r.get("error") else ""))
    windows = [(name, found["ctxsw"][name]) for name in CTXSW_PHASES if name in found.get("ctxsw", {})]
    if windows:
        lines += ["", "| ctxsw phase | GPUs | window CPU s | of it nsys' agent s | attribution child CPU s (start-up) "
                      "| child peak MiB | nsys peak MiB | % of a core at the default duty | per GPU |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, w in windows:
            child = w.get("attribution_child") or {}
            startup = f" ({child['startup_cpu_s']})" if child.get("startup_cpu_s") is not None else ""
            lines.append(f"| {name} | {w['gpus']} | {w['window_cpu_s']} | {w.get('nsys_agent_cpu_s')} | "
                         f"{child.get('cpu_s')}{startup} | {child.get('peak_mib')} | {w.get('peak_rss_nsys_mib')} | "
                         f"{w['percent_of_core_at_default_duty']} | {w['per_gpu_percent_at_default_duty']} |"
                         + (f" not the source's cost: {w['not_attributed']}" if w.get("not_attributed") else ""))
    return "\n".join(lines)
