"""The verdict table of bench/RESULTS.md: every H100 recording x (live verdict, offline verdict), with
the evidence behind each.

    python3 bench/verdict_table.py          # markdown table on stdout

Offline: `nsys_ingest diagnose` on tests/fixtures/h100_diag_NAME.sqlite. Live: the exporter's
/api/v1/gpus recorded on the H100 while the workload ran (bench/results/verdicts/live_NAME.jsonl every
0.5 s, bench/results/diagnosis_recordings.json mid-run), each snapshot's recorded evidence judged again
with today's rules; the verdict the exporter published then is shown beside it.
"""
from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.verdict_recordings import RECORDINGS, live_diagnoses, offline, rejudge


def _most(counter: Counter) -> str:
    (top, n), total = counter.most_common(1)[0], sum(counter.values())
    return top if n == total else f"{top} ({n}/{total})"


def _live_cell(diagnoses: list[dict]) -> tuple[str, str, str]:
    if not diagnoses:
        return "not recorded", "", ""
    ev = [d["evidence"] for d in diagnoses]

    def median(key):
        values = [e[key] for e in ev if e.get(key) is not None]
        return f"{statistics.median(values):.2f}" if values else "?"

    modes = Counter(e.get("sharing_mode") for e in ev)
    evidence = (f"{median('time_utilization')} / {median('sm_active')} / {median('dram_active')}, "
                f"{_most(modes)}, n={len(ev)}")
    return evidence, _most(Counter(rejudge(d) for d in diagnoses)), _most(Counter(d["verdict"] for d in diagnoses))


def _offline_cell(gpu: dict) -> str:
    m, k, c = gpu["gpu_metrics"] or {}, gpu["kernels"], gpu["copies"]
    parts = [f"{m.get('gr_active', 0):.2f} / {m.get('sm_active', 0):.2f} / {m.get('dram_active', 0):.2f}"]
    if k["kernels"]:
        parts.append(f"{k['kernels']} kernels, median {k['median_us']:.1f} us, grid {k['median_grid_blocks']}, "
                     f"running {k['busy_share']:.0%}, overlap {k['overlap']:.2f} (short {_num(k['short_kernel_overlap'])})")
    else:
        parts.append("no kernels")
    if k["long_gap_idle_share"] is not None:
        parts.append(f"idle in gaps >= 1 ms {k['long_gap_idle_share']:.0%}")
    if c and c["busy_share"]:
        parts.append(f"copies running {c['busy_share']:.0%}")
    parts.append(f"{gpu['verdict']['evidence'].get('sharing_mode')}")
    return "; ".join(parts)


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _mark(got: str, right: str) -> str:
    verdict = got.split(" (")[0]
    return f"`{got}`" if verdict == right else f"**`{got}` (wrong: {right})**"


def table() -> str:
    lines = ["| recording | workload | live: time / SM / DRAM, mode | live verdict, today's rules (published then) "
             "| offline: GR / SM / DRAM active; kernels; copies; mode | offline verdict |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, what, right_live, right_offline in RECORDINGS:
        evidence, live_now, live_then = _live_cell(live_diagnoses(name))
        live = _mark(live_now, right_live) + (f" (`{live_then}`)" if live_then else "") if live_now else ""
        gpu = offline(name)
        lines.append(f"| h100_diag_{name} | {what} | {evidence} | {live} | {_offline_cell(gpu)} "
                     f"| {_mark(gpu['verdict']['verdict'], right_offline)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
