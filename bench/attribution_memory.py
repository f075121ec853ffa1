"""Memory and CPU of the ctxsw source's attribution, which runs in a child process (issues 37, 47), and what the
exporter's own process keeps:

    python3 bench/attribution_memory.py EXPORT.sqlite [EXPORT.sqlite ...] [--runs 3] [--before REV] [--device-like]
        (e.g. tests/fixtures/h200_ctxsw_1khz.sqlite, bench/results/ctxsw/h200_ctxsw_1khz_full.sqlite.xz unpacked)

For each export, --runs times: the child exactly as the source starts it (`python -m exporter.samplers.ctxsw
EXPORT`), its peak resident memory (getrusage's ru_maxrss of the reaped child, and the VmHWM it reports
itself; the latter is what the summaries give: ru_maxrss also counts the pages of this process it was forked
with), CPU (user + system) and, where the child says it, the CPU of its start-up (Python and its imports); and
this process, which has loaded what the exporter loads (exporter.engine) and waits for the child as the exporter
does: its VmRSS and VmHWM before and after.

--before REV: the same children of the tree at git revision REV too (unpacked with `git archive`), run
alternately with this tree's so both see the same load, and whether both answered the same attribution.
--device-like: two exports shaped like the last device run's windows (tests/synthetic_exports.py time_sliced: 6
processes in ~0.155 ms turns and ~0.09 ms gaps, 10 s at 500 Hz, ~41,000 slices a GPU; one GPU and two), then the
cost per GPU at the default duty modelled from --device-run (nsys' own share as measured there, the child's
scaled by what it costs here after against before on the device-like export of the same GPUs).
Prints one JSON document. Never asserts.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEVICE_RUN = ROOT / "bench" / "results" / "cost_per_gpu" / "h200x2_2026-11-26.json"


def status_mib(field: str) -> float:
    return round(int(Path("/proc/self/status").read_text().split(f"{field}:")[1].split()[0]) / 1024, 1)


def one(path: str, tree: Path = ROOT) -> dict:
    """One child, as the source runs it from `tree`, reaped with wait4 for its own peak and CPU."""
    proc = subprocess.Popen([sys.executable, "-m", "exporter.samplers.ctxsw", str(Path(path).resolve()), "--window", "10"],
                            cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    answer = json.loads(out.decode().strip().splitlines()[-1])
    return {"exit": proc.returncode, "child_peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "child_reported_vmhwm_mib": round((answer.get("peak_rss_bytes") or 0) / 2**20, 1),
            "child_cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "child_startup_cpu_s": answer.get("startup_cpu_s"),
            "gpus": len((answer.get("result") or {}).get("gpus", ())), "error": answer.get("error"),
            "answer": answer.get("result")}


def summed(runs: list[dict]) -> dict:
    """Median CPU (and start-up) and the highest peak of the runs; the answers left out."""
    startups = [r["child_startup_cpu_s"] for r in runs if r["child_startup_cpu_s"] is not None]
    return {"cpu_s_median": round(statistics.median(r["child_cpu_s"] for r in runs), 3),
            "cpu_s": [r["child_cpu_s"] for r in runs],
            "startup_cpu_s_median": round(statistics.median(startups), 3) if startups else None,
            # what the child says (VmHWM, reset at exec): ru_maxrss counts the parent's pages it was forked with
            "peak_rss_mib": max(r["child_reported_vmhwm_mib"] or r["child_peak_rss_mib"] for r in runs),
            "exit": [r["exit"] for r in runs],
            "error": runs[0]["error"], "gpus": runs[0]["gpus"]}


def unpacked(rev: str, into: Path) -> Path:
    """The tree at `rev`, as git archive gives it."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def device_like(folder: Path) -> list[str]:
    """The last device run's windows in shape (its state reasons: 44,328 slices of 6 processes in 10.4 s, gaps 35.5 %;
    two GPUs 44,103 and 37,835, 37.7 and 41.2 %), on one GPU and on two."""
    from tests.synthetic_exports import time_sliced

    densities = {pid: 0.35 + 0.1 * i for i, pid in enumerate(range(101, 107))}
    return [str(time_sliced(folder / f"device_like_{gpus}gpu.sqlite", densities, duration_ms=10_000, hz=500, seed=5,
                            turn_ms=(0.12, 0.19), gap_ms=(0.06, 0.12), gpus=gpus)[0]) for gpus in (1, 2)]


def modelled(report: dict, device_run: Path, duty_s: float) -> dict:
    """Per GPU at the default duty: each device window's CPU (the exporter's tree, nsys' agent, less the exporter's own
    rate) with its attribution child's CPU scaled by after / before here on the device-like export of as many GPUs."""
    from tests.cost_summary import summary

    device = json.loads(device_run.read_text())
    found = summary(device)["ctxsw"]
    out = {"device_run": str(device_run.relative_to(ROOT)), "duty_s": duty_s}
    for name, gpus in (("one_ctxsw", 1), ("all_ctxsw", 2)):
        here = report["runs"].get(next((k for k in report["runs"] if k.endswith(f"device_like_{gpus}gpu.sqlite")), ""))
        if name not in found or not here or "before" not in here:
            continue
        ratio = here["after"]["cpu_s_median"] / here["before"]["cpu_s_median"]
        child = found[name]["attribution_child"]["cpu_s"]
        window = found[name]["window_cpu_s"] - child + child * ratio
        out[name] = {"gpus": gpus, "device_window_cpu_s": found[name]["window_cpu_s"], "device_child_cpu_s": child,
                     "child_after_over_before_here": round(ratio, 3), "modelled_child_cpu_s": round(child * ratio, 2),
                     "modelled_window_cpu_s": round(window, 2),
                     "per_gpu_percent_before": found[name]["per_gpu_percent_at_default_duty"],
                     "per_gpu_percent_modelled": round(100 * window / duty_s / gpus, 3)}
    return out


def main(argv=None) -> int:
    from exporter.samplers.ctxsw import PERIOD_S

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("exports", nargs="*")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--before", help="a git revision whose children run alternately with this tree's")
    p.add_argument("--device-like", action="store_true", help="also the two exports shaped like the device run's windows")
    p.add_argument("--device-run", type=Path, default=DEVICE_RUN, help="bench/cost_per_gpu.py's result the model starts from")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="attribution-cost-"))
    exports = [*args.exports, *(device_like(work) if args.device_like else [])]
    before = unpacked(args.before, work / "before") if args.before else None
    report: dict = {"start": {"VmRSS": status_mib("VmRSS")}, "before": args.before}
    importlib.import_module("exporter.engine")  # what the exporter itself loads
    importlib.import_module("exporter.samplers.ctxsw")
    report["exporter imported"] = {"VmRSS": status_mib("VmRSS"), "VmHWM": status_mib("VmHWM")}
    report["runs"] = {}
    for path in exports:
        after_runs, before_runs = [], []
        for _ in range(args.runs):  # alternately: both trees under the same load
            if before is not None:
                before_runs.append(one(path, before))
            after_runs.append(one(path))
        entry = {"after": summed(after_runs)}
        if before_runs:
            entry["before"] = summed(before_runs)
            entry["same_answer"] = all(r["answer"] == after_runs[0]["answer"] for r in before_runs + after_runs)
        report["runs"][path] = entry
    report["after the attributions"] = {"VmRSS": status_mib("VmRSS"), "VmHWM": status_mib("VmHWM")}
    report["pandas_in_this_process"] = "pandas" in sys.modules
    if args.device_like and before is not None and args.device_run.is_file():
        report["modelled_per_gpu_at_default_duty"] = modelled(report, args.device_run, PERIOD_S)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
