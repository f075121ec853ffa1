"""What tracing costs a client: its slowdown inside a cupti window and outside, and the tracer's memory.

    python3 bench/cupti_slowdown.py OUT.json [--kinds launch,matmul] [--window 5] [--period 12] [--windows 3]

Per kind (bench/ctxsw_jobs.py: `launch`, a launch-bound x.add_(1) loop; `matmul`, bf16 8192^3 products):
a baseline run without the tracer, then a run under `python3 -m gpu_trace` that this script asks for
--windows windows of --window seconds every --period seconds, through the exporter's own cupti source
(exporter/samplers/cupti.py, in this process). Both jobs log their progress every 0.2 s; the rate inside
the windows, outside them (after a 1 s margin) and of the baseline are compared; the average slowdown at
a duty d is d x inside + (1 - d) x outside. Memory: VmRSS and VmHWM of each job 2 s before its end.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WARM_S = 8.0


def status(pid: int) -> dict:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}


def rates(progress: Path, keep) -> list[float]:
    rows = [tuple(map(float, line.split())) for line in progress.read_text().splitlines() if line.strip()]
    out = []
    for (t0, d0), (t1, d1) in zip(rows, rows[1:]):
        if t1 > t0 and keep(t0, t1):
            out.append((d1 - d0) / (t1 - t0))
    return out


def job(kind: str, seconds: float, progress: Path, traced: bool, sock: str) -> subprocess.Popen:
    command = [sys.executable, str(ROOT / "bench" / "ctxsw_jobs.py"), kind, "--seconds", str(seconds),
               "--progress", str(progress)]
    if traced:
        command = [sys.executable, "-m", "gpu_trace", "--socket", sock, "--"] + command
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def mean(values):
    return sum(values) / len(values) if values else None


def measure(kind: str, args, work: Path) -> dict:
    from exporter.samplers.cupti import CuptiSource
    import pynvml

    pynvml.nvmlInit()
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    sock = str(work / f"{kind}.sock")
    base_seconds = 15.0
    base = job(kind, base_seconds, work / f"{kind}_base.txt", False, sock)
    time.sleep(base_seconds - 2)
    base_mem = status(base.pid)
    base.communicate(timeout=120)
    source = CuptiSource(SimpleNamespace(gpus=[SimpleNamespace(uuid=uuid, index=0)]), sock, args.window, args.period)
    source.open()
    seconds = WARM_S + args.windows * args.period
    traced = job(kind, seconds, work / f"{kind}_traced.txt", True, sock)
    started = time.time()
    time.sleep(WARM_S)
    marks, reports = [], []
    for i in range(args.windows):
        asked = time.time()
        source.tick()
        win = source.readings.get(uuid)
        marks.append((asked, asked + args.window))
        reports.append(None if win is None else {str(p): s.to_json() for p, s in win.shares.items()})
        time.sleep(max(0.0, started + WARM_S + (i + 1) * args.period - time.time()))
    traced_mem = status(traced.pid)
    _, err = traced.communicate(timeout=120)
    source.close()
    first = marks[0][0]
    inside = rates(work / f"{kind}_traced.txt", lambda a, b: any(lo + 0.3 <= a and b <= hi for lo, hi in marks))
    outside = rates(work / f"{kind}_traced.txt", lambda a, b: a >= first - WARM_S + 3 and all(
        b <= lo - 0.2 or a >= hi + 1.0 for lo, hi in marks))
    baseline = rates(work / f"{kind}_base.txt", lambda a, b: a >= 0)[15:]  # after its first 3 s
    r_in, r_out, r_base = mean(inside), mean(outside), mean(baseline)
    result = {"kind": kind, "window_s": args.window, "period_s": args.period, "windows": reports,
              "rate_baseline": r_base, "rate_outside": r_out, "rate_inside": r_in,
              "slowdown_inside_percent": round(100 * (1 - r_in / r_out), 2) if r_in and r_out else None,
              "outside_vs_baseline_percent": round(100 * (1 - r_out / r_base), 2) if r_out and r_base else None,
              "samples": {"inside": len(inside), "outside": len(outside), "baseline": len(baseline)},
              "memory_kib": {"baseline": base_mem, "traced": traced_mem}, "stderr": err[-2000:]}
    if r_in and r_out:
        result["average_slowdown_percent_at_duty"] = {
            f"{w:g}/{p:g}": round(100 * (w / p) * (1 - r_in / r_out), 3) for w, p in ((10, 60), (10, 120), (5, 120),
                                                                                      (10, 300))}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--kinds", default="launch,matmul")
    p.add_argument("--window", type=float, default=5.0)
    p.add_argument("--period", type=float, default=12.0)
    p.add_argument("--windows", type=int, default=3)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cupti-slowdown-"))
    results = []
    for kind in args.kinds.split(","):
        results.append(measure(kind, args, work))
        print(json.dumps({k: v for k, v in results[-1].items() if k not in ("stderr", "windows")}), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
