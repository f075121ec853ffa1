"""The native tracer on the device, under MPS: per-client accuracy against each client's own truth, and
what tracing costs the job it measures (bench/native_device.sh runs it; bench/RESULTS.md has the figures).

    python3 bench/native_tracer_device.py OUTDIR --phases spins,deepqueue,d2d,cxx,resnet --lib LIB [--cxx BIN]

Windows are asked through the exporter's own cupti source (exporter/samplers/cupti.py, in this process);
every client is started with `python3 -m gpu_trace --socket ... --` (CUDA_INJECTION64_PATH: the native
library), the C++ one with the same environment. Each client's report is kept whole (its own window's
bounds); the truth is counted over that same window:
  spins: bench/ctxsw_jobs.py spin jobs (kernels of exactly --sms SMs, 4 ms on %globaltimer, the kernels
         finished at every synchronize logged): time = finished kernels x 4 ms / window, SM = time x SMs / 132.
         One runs under CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, asking for fewer SMs than it may use.
  deepqueue, d2d: bench/native_clients.py (CUDA events around every burst or copy, on the wall clock).
  cxx: bench/spin_inject.cu, the spin job in C++.
  resnet: ResNet-50 training: steps/s inside the windows against outside, GPM's SM active outside them
          against the client's unscaled SM share inside; then the same job under PyTorch's profiler.
Writes OUTDIR/native_device.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
GPU_SMS = 132
KERNEL_MS = 4.0
WARM_S = 10.0


def union_inside(intervals, lo, hi) -> float:
    from native_clients import union

    return union((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)


class Asker:
    """The exporter's cupti source, with every client's raw report kept."""

    def __init__(self, sock: str, window: float, period: float):
        import pynvml

        import exporter.samplers.cupti as cupti

        pynvml.nvmlInit()
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        self.uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        self.raw: list[dict] = []
        original = cupti.parse_report

        def keep(line, *a, **k):
            try:
                self.raw.append(json.loads(line))
            except ValueError:
                pass
            return original(line, *a, **k)

        cupti.parse_report = keep
        self.source = cupti.CuptiSource(SimpleNamespace(gpus=[SimpleNamespace(uuid=self.uuid, index=0)]), sock,
                                        window, period)
        self.source.open()
        self.asked: list[float] = []  # when each window was asked for

    def windows(self, count: int, period: float, started: float) -> list[list[dict]]:
        out = []
        for i in range(count):
            self.raw.clear()
            self.asked.append(time.time())
            self.source.tick()
            out.append(list(self.raw))
            time.sleep(max(0.0, started + WARM_S + (i + 1) * period - time.time()))
        return out


def traced(command, sock, env=None, python=True):
    full = [sys.executable, "-m", "gpu_trace", "--socket", sock, "--"] + command if python else command
    return subprocess.Popen(full, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def device_of(report: dict) -> dict | None:
    return (report.get("devices") or [None])[0]


def spin_truth(progress: Path, lo: float, hi: float, sms: int) -> dict:
    from cupti_accuracy import kernels_between

    time_share = kernels_between(progress, lo, hi) * KERNEL_MS / 1e3 / (hi - lo)
    return {"time": round(time_share, 4), "sm": round(time_share * sms / GPU_SMS, 4)}


def compare(report: dict, truth: dict) -> dict:
    d = device_of(report) or {}
    length = report["end"] - report["start"]
    got = {"time": round(d.get("busy_s", d.get("kernel_busy_s", 0.0)) / length, 4),
           "sm": round(d.get("sm_seconds", 0.0) / length, 4)}
    return {"window_s": round(length, 3), "reported": got, "truth": truth,
            "error": {k: round(got[k] - truth[k], 4) for k in truth if truth.get(k) is not None},
            "detail": {k: d.get(k) for k in ("kernels", "kernel_busy_s", "backlog_busy_s", "queue_gap_s",
                                             "sm_copy_busy_s", "copy_busy_s", "sms", "gpu_sms")},
            "native": report.get("native"), "records": report.get("records")}


def phase_accuracy(name, clients, args, work):
    """clients: name -> (command, env, python?, truth(report) -> dict)."""
    sock = str(work / f"{name}.sock")
    asker = Asker(sock, args.window, args.period)
    started = time.time()
    procs = {c: traced(cmd, sock, env, py) for c, (cmd, env, py, _t) in clients.items()}
    pids = {p.pid: c for c, p in procs.items()}
    time.sleep(WARM_S)
    windows = asker.windows(args.windows, args.period, started)
    rows = []
    for n, reports in enumerate(windows):
        for report in reports:
            client = pids.get(report.get("pid"))
            if client is None or "error" in report:
                rows.append({"window": n, "client": client, "error": report.get("error")})
                continue
            truth = clients[client][3](report)
            rows.append({"window": n, "client": client, **compare(report, truth)})
    for p in procs.values():
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
    asker.source.close()
    return {"phase": name, "rows": rows,
            "stderr": {c: (p.stderr.read() if p.stderr and not p.stderr.closed else "")[-600:] for c, p in procs.items()}}


def spins(args, work):
    seconds = str(WARM_S + args.windows * args.period + 3)
    jobs = {"spin40": (40, {}, []), "spin12_60pct": (12, {}, ["--on-ms", "60", "--off-ms", "40"]),
            # MPS lets it use 25 % of the threads (33 SMs): it asks for 20 SMs, so it holds 20 of 132
            "spin20_limited25": (20, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, [])}
    clients = {}
    for name, (sms, env, extra) in jobs.items():
        progress = work / f"{name}.txt"
        command = [sys.executable, "bench/ctxsw_jobs.py", "spin", "--sms", str(sms), "--kernel-ms", str(KERNEL_MS),
                   "--seconds", seconds, "--progress", str(progress)] + extra
        clients[name] = (command, env, True,
                         lambda r, p=progress, s=sms: spin_truth(p, r["start"], r["end"], s))
    return phase_accuracy("spins", clients, args, work)


def events_phase(kind, args, work, env=None):
    truth_file = work / f"{kind}{'_env' if env else ''}_truth.json"
    seconds = str(WARM_S + args.windows * args.period + 3)
    truth_cache = {}

    def truth(report):
        if "busy" not in truth_cache:
            deadline = time.time() + 90
            while not truth_file.exists() and time.time() < deadline:
                time.sleep(0.5)
            truth_cache["busy"] = json.loads(truth_file.read_text())["busy"] if truth_file.exists() else []
        busy = union_inside(truth_cache["busy"], report["start"], report["end"]) / (report["end"] - report["start"])
        return {"time": round(busy, 4)}

    clients = {kind: ([sys.executable, "bench/native_clients.py", kind, "--seconds", seconds, "--truth",
                       str(truth_file)], {}, True, truth)}
    sock = str(work / f"{kind}{'_env' if env else ''}.sock")
    asker = Asker(sock, args.window, args.period)
    started = time.time()
    proc = traced(clients[kind][0], sock, env)
    time.sleep(WARM_S)
    windows = asker.windows(args.windows, args.period, started)
    _, err = proc.communicate(timeout=120)
    asker.source.close()
    rows = []
    for n, reports in enumerate(windows):
        for report in reports:
            if "error" in report:
                rows.append({"window": n, "error": report["error"]})
            else:
                rows.append({"window": n, "client": kind, **compare(report, truth(report))})
    return {"phase": kind + ("_queued" if env else ""), "rows": rows, "stderr": err[-600:]}


def cxx(args, work):
    seconds = str(WARM_S + args.windows * args.period + 3)
    jobs = {"cxx30": (30, "1000", "0"), "cxx90_50pct": (90, "50", "50")}
    clients = {}
    for name, (sms, on, off) in jobs.items():
        progress = work / f"{name}.txt"
        clients[name] = ([args.cxx, str(sms), str(KERNEL_MS), on, off, seconds, str(progress)],
                         {"CUDA_INJECTION64_PATH": args.lib, "GPU_SPATIAL_TRACE_SOCKET": str(work / "cxx.sock")}, False,
                         lambda r, p=progress, s=sms: spin_truth(p, r["start"], r["end"], s))
    return phase_accuracy("cxx", clients, args, work)


def gpm_sampler(stop: threading.Event, out: list):
    try:
        from exporter.nvml import Nvml

        nvml = Nvml()
        nvml.gpm_metrics(0)
        while not stop.wait(1.0):
            m = nvml.gpm_metrics(0)  # exporter.nvml_answers.GpmMetrics, percent
            if m is not None and m.sm_active is not None:
                out.append((time.time(), {"sm_active": m.sm_active}))
    except Exception as exc:  # noqa: BLE001 - GPM is a side measurement here
        out.append((time.time(), {"error": repr(exc)}))


def finished_between(times: list[float], lo: float, hi: float) -> int:
    return sum(1 for t in times if lo <= t < hi)


def step_rates(gpu_progress: Path, marks: list[tuple[float, float]], first: float) -> dict:
    """Steps the GPU finished per second inside each window against the spans outside (0.5 s after a window
    and 0.2 s before the next left out: the tracer's start and end), counted, not averaged per step: the host
    runs ahead, so only the GPU's finishing times say how fast the job went."""
    times = [float(line.split()[0]) for line in gpu_progress.read_text().splitlines() if line.strip()]
    if not times or not marks:
        return {}
    marks = sorted(marks)
    gaps = [(first, marks[0][0] - 0.2)] + [(a[1] + 0.5, b[0] - 0.2) for a, b in zip(marks, marks[1:])] + \
        [(marks[-1][1] + 0.5, times[-1])]
    gaps = [(lo, hi) for lo, hi in gaps if hi - lo > 1.0]
    rate = lambda spans: (sum(finished_between(times, lo, hi) for lo, hi in spans) / sum(hi - lo for lo, hi in spans)
                          if spans else None)
    inside, outside = rate(marks), rate(gaps)
    per_window = []
    for lo, hi in marks:  # each window against the spans just before and after it
        near = [g for g in gaps if abs(g[1] - lo) < 1.0 or abs(g[0] - hi) < 1.0]
        r_in, r_out = rate([(lo, hi)]), rate(near)
        per_window.append(round(r_in / r_out, 4) if r_out else None)
    # inside a window, second by second: a cost at the window's start (CUPTI attaching) or all along
    seconds = int(min(hi - lo for lo, hi in marks))
    profile = [round(sum(finished_between(times, lo + k, lo + k + 1) for lo, _ in marks) / len(marks) / outside, 4)
               if outside else None for k in range(seconds)]
    return {"steps_per_s_inside": round(inside, 3), "steps_per_s_outside": round(outside, 3) if outside else None,
            "inside_over_outside": round(inside / outside, 4) if outside else None, "per_window": per_window,
            "by_second_of_window": profile}


def resnet(args, work, variant="default", env=None, traced_run=True):
    """The trainer (env: the tracer's switches, GPU_SPATIAL_TRACE_DETACH / _QUEUED), each CUPTI step logged
    (GPU_SPATIAL_TRACE_DEBUG); untraced (traced_run False) the same schedule of windows is asked of nobody:
    the noise of the inside/outside comparison itself. A trainer that stops stepping is killed, stacks kept."""
    seconds = WARM_S + args.windows * args.period + 3
    progress, gpu_progress = work / f"resnet_{variant}.txt", work / f"resnet_{variant}_gpu.txt"
    sock = str(work / f"resnet_{variant}.sock")
    asker = Asker(sock, args.window, args.period)
    gpm, stop = [], threading.Event()
    sampler = threading.Thread(target=gpm_sampler, args=(stop, gpm), daemon=True)
    sampler.start()
    started = time.time()
    command = [sys.executable, "-X", "faulthandler", "bench/native_clients.py", "resnet", "--seconds", str(seconds),
               "--progress", str(progress), "--gpu-progress", str(gpu_progress), "--stacks-after", str(seconds + 15)]
    if traced_run:
        proc = traced(command, sock, {"GPU_SPATIAL_TRACE_DEBUG": "1", **(env or {})})
    else:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(WARM_S)
    windows = asker.windows(args.windows, args.period, started)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        err = "KILLED: the trainer did not finish\n" + err
    stop.set()
    asker.source.close()
    if traced_run:
        marks = [(r["start"], r["end"]) for reports in windows for r in reports if "error" not in r]
    else:  # when a traced client's window would have run
        marks = [(t + 0.05, t + 0.05 + args.window) for t in asker.asked]
    mean = lambda v: sum(v) / len(v) if v else None
    gpm_out = [m.get("sm_active") for t, m in gpm if "sm_active" in m and all(t <= lo or t - 1 >= hi for lo, hi in marks)
               and t > started + WARM_S]
    rows = []
    for n, reports in enumerate(windows):
        for report in reports:
            rows.append({"window": n, **(compare(report, {}) if "error" not in report else {"error": report["error"]})})
    # the first window is left out: the untraced control ran at 0.29 of its later rate there (cuDNN's autotune
    # and the allocator settling after the warm-up steps), whatever the tracer does
    rates = step_rates(gpu_progress, marks[1:], marks[0][1] + 0.5) if gpu_progress.exists() and marks else {}
    result = {"phase": f"resnet_{variant}", "rows": rows, **rates, "marks": marks,
              "gpm_sm_active_outside_percent": mean([v for v in gpm_out if v is not None]), "stderr": err[-3000:]}
    if args.skip_kineto or not traced_run:
        return result
    # the same job under PyTorch's profiler (CUPTI read in C++ by kineto), windows of the same length
    progress_k, gpu_k, truth_k = work / "resnet_kineto.txt", work / "resnet_kineto_gpu.txt", work / "resnet_kineto.json"
    k = subprocess.run([sys.executable, "bench/native_clients.py", "resnet", "--seconds", str(seconds), "--progress",
                        str(progress_k), "--gpu-progress", str(gpu_k), "--profile-windows",
                        f"{args.window:g}:{args.period:g}", "--truth", str(truth_k)],
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    kineto = json.loads(truth_k.read_text()) if truth_k.exists() else {"stderr": k.stderr[-600:]}
    k_marks = [tuple(w["window"]) for w in kineto.get("profiler_windows", [])]
    k_first = k_marks[0][0] - 5.0 if k_marks else 0.0
    result["kineto"] = {**(step_rates(gpu_k, k_marks, k_first) if gpu_k.exists() else {}),
                        "windows": kineto.get("profiler_windows")}
    return result


def api_phase(args, work, env=None):
    """End to end: the real exporter (`python3 -m exporter`, NVML and GPM live, --workload-cupti) and spin
    clients of footprints named nowhere else (one limited by MPS to 30 % of the threads), read back from
    /api/v1/workloads' cupti section (each client's own shares); the truth as in spins, over the GPU's window."""
    from tests.helpers import Exporter, http_get

    sock = str(work / "api.sock")
    seconds = WARM_S + args.windows * args.period + 3
    jobs = {"spin28": (28, {}, []), "spin50_70pct": (50, {}, ["--on-ms", "35", "--off-ms", "15"]),
            "spin16_limited30": (16, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}, [])}
    procs, progress, seen = {}, {}, {}
    with Exporter("--workload-cupti", "--cupti-socket", sock, "--cupti-window", f"{args.window:g}", "--cupti-period",
                  f"{args.period:g}", "--kubelet-socket", "none", "--holders", "users", "--interval", "1") as exporter:
        for name, (sms, job_env, extra) in jobs.items():
            progress[name] = work / f"api_{name}.txt"
            procs[name] = traced([sys.executable, "bench/ctxsw_jobs.py", "spin", "--sms", str(sms), "--kernel-ms",
                                  str(KERNEL_MS), "--seconds", str(seconds), "--progress", str(progress[name])] + extra,
                                 sock, {**job_env, **(env or {})})
        end = time.time() + seconds
        while time.time() < end:
            try:  # a slow or failed answer is one lost look, not the phase's end
                status, body = http_get(exporter.url + "/api/v1/workloads")
                answer = json.loads(body) if status == 200 else {}
            except (OSError, ValueError):
                answer = {}
            for gpu in answer.get("cupti") or ():
                if gpu.get("clients") and gpu.get("window"):  # every GPU the clients' contexts are on
                    seen[(gpu["uuid"], *gpu["window"])] = gpu
            time.sleep(1.0)
        for proc in procs.values():
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        (work / "api_exporter.txt").write_text(exporter.log())
    pids = {proc.pid: name for name, proc in procs.items()}
    rows = []
    for (uuid, lo, hi), gpu in sorted(seen.items()):
        if gpu.get("gpu") != 0:  # the clients run on CUDA's device 0; another GPU reads 0 for them
            continue
        for pid, share in gpu["clients"].items():
            name = pids.get(int(pid))
            if name is None:
                continue
            truth = spin_truth(progress[name], lo, hi, jobs[name][0])
            rows.append({"window": [lo, hi], "client": name, "reported": {"time": share["time"], "sm": share["sm"]},
                         "truth": truth, "error": {k: round(share[k] - truth[k], 4) for k in ("time", "sm")},
                         "parts": share.get("parts"), "record_path": share.get("record_path"),
                         "gpu": {k: gpu.get(k) for k in ("gpu_sm_active", "estimated", "scale", "unattributed",
                                                         "traced", "untraced")}})
    return {"phase": "api" + ("_queued" if env else ""), "rows": rows, "windows_seen": len(seen)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--phases", default="spins,deepqueue,d2d,cxx,resnet")
    p.add_argument("--window", type=float, default=5.0)
    p.add_argument("--period", type=float, default=10.0)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--lib", required=True)
    p.add_argument("--cxx", default=None)
    p.add_argument("--skip-kineto", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    results = []
    phases = {"spins": spins, "deepqueue": lambda a, w: events_phase("deepqueue", a, w),
              "d2d": lambda a, w: events_phase("d2d", a, w), "cxx": cxx, "resnet": resnet,
              # the tracer's switches, where the default stalls a trainer: which CUPTI step is the cause
              "resnet_nodetach": lambda a, w: resnet(a, w, "nodetach", {"GPU_SPATIAL_TRACE_DETACH": "0"}),
              "resnet_queued": lambda a, w: resnet(a, w, "queued", {"GPU_SPATIAL_TRACE_QUEUED": "1"}),
              "resnet_untraced": lambda a, w: resnet(a, w, "untraced", traced_run=False),
              "resnet_warm": lambda a, w: resnet(a, w, "warm", {"GPU_SPATIAL_TRACE_WARM_S": "1"}),
              "launch": lambda a, w: phase_accuracy("launch", {"launch": (
                  [sys.executable, "bench/ctxsw_jobs.py", "launch", "--seconds", str(WARM_S + a.windows * a.period + 3)],
                  {}, True, lambda r: {})}, a, w),
              "api": api_phase, "api_queued": lambda a, w: api_phase(a, w, {"GPU_SPATIAL_TRACE_QUEUED": "1"}),
              "deepqueue_queued": lambda a, w: events_phase("deepqueue", a, w, {"GPU_SPATIAL_TRACE_QUEUED": "1"}),
              "d2d_queued": lambda a, w: events_phase("d2d", a, w, {"GPU_SPATIAL_TRACE_QUEUED": "1"})}
    for name in args.phases.split(","):
        try:
            results.append(phases[name](args, work))
        except Exception as exc:  # noqa: BLE001 - one phase's failure leaves the others' figures
            results.append({"phase": name, "failed": f"{type(exc).__name__}: {exc}"})
        print(json.dumps({k: v for k, v in results[-1].items() if k != "stderr"})[:3000], flush=True)
        (out / "native_device.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
