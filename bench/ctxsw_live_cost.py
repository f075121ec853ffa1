"""What the live context-switch source (--workload-ctxsw) costs: exporter plus nsys CPU and memory at a
duty, and the slowdown a capture causes to the workloads. On the device (root, one GPU or more):

    NSYS_EXTRA_LIB=DIR timeout 2400 python3 bench/ctxsw_live_cost.py OUTDIR [--minutes 10] [--full-duty-minutes 3]
        [--phases default,full,slowdown] [--nsys PATH]   (calls with different --phases add up in OUTDIR)

Phases (each writes OUTDIR/cost_<name>.json, all together OUTDIR/ctxsw_live_cost.json):
- default: the exporter with --workload-ctxsw at the default duty (10 s every 60 s) for --minutes, while a
  bf16 matmul loop and a launch-bound loop (bench/ctxsw_jobs.py) share GPU 0 by time slices;
- full: the same at ~100 % duty (--ctxsw-window W --ctxsw-period W + 1 s) for --full-duty-minutes;
- slowdown: each of the two loops alone on the GPU, --slowdown-runs alternating runs of --slowdown-seconds
  without and with a capture running (the live source's own `nsys profile` command line), rates compared.

CPU: from /proc, measured over the steady part of a phase (after --warm-up seconds): the exporter's
utime + stime + cutime + cstime (cutime: the nsys processes it started and waited for), plus the CPU of its
live descendants (a capture still running), plus nsys processes outside its tree (a daemon nsys leaves
behind), sampled every second. Memory: the exporter's VmHWM, and the peak of the exporter's and its
descendants' summed RSS, sampled every second. The exporter's holder is a Slurm mapping file listing one
job on GPU 0 (the source runs only where holders exist). Never asserts; every failure is recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def find_nsys(given: str | None) -> str:
    """--nsys, else nsys on the PATH, else an install under / (target-linux-x64/nsys: not on every PATH)."""
    if given:
        return given
    found = shutil.which("nsys")
    if found:
        return found
    done = subprocess.run(["find", "/", "-xdev", "-type", "f", "-name", "nsys", "-path", "*target-linux-x64*"],
                          capture_output=True, text=True, timeout=300, check=False)
    paths = done.stdout.split()
    if not paths:
        raise SystemExit("nsys not found: give --nsys PATH")
    return paths[0]


def environment() -> dict:
    env = dict(os.environ)
    extra = env.get("NSYS_EXTRA_LIB")
    if extra:
        env["LD_LIBRARY_PATH"] = extra + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


# -- /proc --------------------------------------------------------------------------------------------
def stat(pid: int) -> dict | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return {"ppid": int(fields[1]), "cpu": sum(int(x) for x in fields[11:15]) / TICKS,  # utime stime cutime cstime
            "own_cpu": (int(fields[11]) + int(fields[12])) / TICKS, "rss": int(fields[21]) * PAGE}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes() -> dict[int, dict]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = stat(int(entry))
            if found is not None:
                out[int(entry)] = found
    return out


def descendants(root: int, table: dict[int, dict]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info["ppid"], []).append(pid)
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def peak_memory(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Meter:
    """CPU of the exporter's tree plus stray nsys processes, and peak RSS, sampled once a second."""

    def __init__(self, exporter: int, nsys: str):
        self.exporter, self.nsys_dir = exporter, str(Path(nsys).parent)
        self.stray_first: dict[int, float] = {}
        self.stray_last: dict[int, float] = {}
        self.peak_tree_rss = 0
        self.peak_nsys_rss = 0

    def sample(self) -> float:
        """The exporter tree's CPU seconds now (monotone: a child's CPU moves into its parent's cutime)."""
        table = processes()
        tree = descendants(self.exporter, table)
        own = table.get(self.exporter)
        if own is None:
            return float("nan")
        total = own["cpu"] + sum(table[p]["cpu"] for p in tree if p in table)
        self.peak_tree_rss = max(self.peak_tree_rss, own["rss"] + sum(table[p]["rss"] for p in tree))
        nsys_rss = 0
        for pid, info in table.items():
            if pid == self.exporter or pid in tree:
                if pid in tree and self.nsys_dir in cmdline(pid):
                    nsys_rss += info["rss"]
                continue
            if self.nsys_dir in cmdline(pid) or "nsys" in cmdline(pid).split(" ")[0]:
                self.stray_first.setdefault(pid, info["own_cpu"])
                self.stray_last[pid] = info["own_cpu"]
                nsys_rss += info["rss"]
        self.peak_nsys_rss = max(self.peak_nsys_rss, nsys_rss)
        return total

    def stray_cpu(self) -> float:
        return sum(self.stray_last[p] - self.stray_first[p] for p in self.stray_last)


# -- phases -------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return None


def workers(seconds: float, env: dict) -> list[subprocess.Popen]:
    """A matmul loop and a launch-bound loop on GPU 0, time-sliced."""
    return [subprocess.Popen([sys.executable, str(ROOT / "bench" / "ctxsw_jobs.py"), *kind.split(), "--seconds",
                              f"{seconds:g}"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True) for kind in ("matmul --size 8192", "launch")]


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def phase(name: str, nsys: str, window: float, period: float, minutes: float, warm_up: float, env: dict,
          out: Path, extra: list[str]) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="ctxsw-cost-"))
    (tmp / "map").mkdir()
    (tmp / "map" / "0").write_text("1\n")
    port = free_port()
    jobs = workers(minutes * 60 + warm_up + 60, env)
    time.sleep(10)  # contexts up before the first capture
    log = open(out / f"exporter_{name}.log", "w")
    exporter = subprocess.Popen([sys.executable, "-m", "exporter", "--port", str(port), "--interval", "1",
                                 "--kubelet-socket", "none", "--no-mps", "--hpc-job-mapping-dir", str(tmp / "map"),
                                 "--workload-ctxsw", "--ctxsw-window", f"{window:g}s", "--ctxsw-period", f"{period:g}s",
                                 "--nsys-binary", nsys, *extra], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    meter = Meter(exporter.pid, nsys)
    result: dict = {"phase": name, "window_s": window, "period_s": period, "duty": round(window / period, 4)}
    try:
        end_warm = time.time() + warm_up
        while time.time() < end_warm:
            meter.sample()
            time.sleep(1)
        stray0 = meter.stray_cpu()
        cpu0, t0 = meter.sample(), time.monotonic()
        windows, states = set(), {}
        deadline = t0 + minutes * 60
        while time.monotonic() < deadline and exporter.poll() is None:
            time.sleep(1)
            meter.sample()
            if int(time.monotonic() - t0) % 5 == 0:
                answer = get_json(f"http://127.0.0.1:{port}/api/v1/workloads") or {}
                for gpu in answer.get("ctxsw") or ():
                    states[gpu["state"]] = states.get(gpu["state"], 0) + 1
                    if gpu["window"]:
                        windows.add(round(gpu["window"][1], 3))
                        result["last_reason"] = gpu["reason"]
        cpu1, t1 = meter.sample(), time.monotonic()
        result.update({
            "seconds": round(t1 - t0, 1),
            "exporter_tree_cpu_seconds": round(cpu1 - cpu0, 2),
            "stray_nsys_cpu_seconds": round(meter.stray_cpu() - stray0, 2),
            "exporter_peak_rss_bytes": peak_memory(exporter.pid),
            "peak_rss_exporter_and_children_bytes": meter.peak_tree_rss,
            "peak_rss_nsys_bytes": meter.peak_nsys_rss,
            "windows_captured": len(windows),
            "state_polls": states,
            "metrics_ctxsw": [line for line in (_metrics(port) or "").splitlines()
                              if line.startswith(("gpu_workload_ctxsw", 'gpu_exporter_collector_success{collector="ctxsw"'))],
        })
        cpu = result["exporter_tree_cpu_seconds"] + result["stray_nsys_cpu_seconds"]
        result["cpu_share_of_one_core"] = round(cpu / max(result["seconds"], 1e-9), 5)
    finally:
        stop(exporter)
        log.close()
        for job in jobs:
            stop(job)
        result["workers"] = [job.stdout.read().strip()[-300:] if job.stdout else "" for job in jobs]
        shutil.rmtree(tmp, ignore_errors=True)
    result["exporter_exit"] = exporter.returncode
    result["leftover_capture_dirs"] = len(list(Path(tempfile.gettempdir()).glob("gpu-exporter-ctxsw-*")))
    (out / f"cost_{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _metrics(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return answer.read().decode()
    except OSError:
        return None


def slowdown(nsys: str, runs: int, seconds: float, env: dict, out: Path) -> dict:
    """Each loop alone on GPU 0, alternating runs without and with a capture running."""
    from exporter.samplers.ctxsw import profile_command

    result = {}
    for kind in ("matmul --size 8192", "launch"):
        rates = {"off": [], "on": []}
        for run in range(runs):
            for capture in ("off", "on"):
                tmp = Path(tempfile.mkdtemp(prefix="ctxsw-slow-"))
                nsys_proc = None
                if capture == "on":
                    nsys_proc = subprocess.Popen(profile_command(nsys, "all", 1000, tmp / "r", seconds + 10), env=env,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(4)  # the capture is running before the loop's clock starts
                done = subprocess.run([sys.executable, str(ROOT / "bench" / "ctxsw_jobs.py"), *kind.split(), "--seconds",
                                       f"{seconds:g}"], cwd=ROOT, env=env, capture_output=True, text=True,
                                      timeout=seconds + 120, check=False)
                if nsys_proc is not None:
                    try:
                        nsys_proc.wait(timeout=seconds + 120)
                    except subprocess.TimeoutExpired:
                        stop(nsys_proc)
                shutil.rmtree(tmp, ignore_errors=True)
                try:
                    line = json.loads(done.stdout.strip().splitlines()[-1])
                except (IndexError, ValueError):
                    line = {"error": (done.stderr or done.stdout)[-300:]}
                line.update({"capture": capture, "run": run})
                with open(out / "slowdown.jsonl", "a") as f:
                    f.write(json.dumps(line) + "\n")
                rate = line.get("rate") or line.get("per_second")
                if isinstance(rate, (int, float)):
                    rates[capture].append(rate)
        mean = {k: (sum(v) / len(v) if v else None) for k, v in rates.items()}
        result[kind.split()[0]] = {"rates": rates, "mean": mean,
                                   "slowdown": None if None in mean.values() else round(1 - mean["on"] / mean["off"], 5)}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path)
    p.add_argument("--nsys", help="the nsys executable (default: on the PATH, else found under /)")
    p.add_argument("--minutes", type=float, default=10.0, help="length of the default-duty phase")
    p.add_argument("--full-duty-minutes", type=float, default=3.0, help="length of the ~100%% duty phase (0: skip)")
    p.add_argument("--window", type=float, default=10.0, help="capture length (the default duty: 10 s every 60 s)")
    p.add_argument("--period", type=float, default=60.0)
    p.add_argument("--warm-up", type=float, default=30.0, help="seconds of each phase left out of the CPU figure")
    p.add_argument("--slowdown-runs", type=int, default=3, help="alternating runs per loop (0: skip)")
    p.add_argument("--slowdown-seconds", type=float, default=8.0)
    p.add_argument("--phases", default="default,full,slowdown",
                   help="which to run (comma-separated; each call adds its results to OUTDIR/ctxsw_live_cost.json)")
    p.add_argument("--exporter-args", default="", help="more exporter flags (a dry run without a GPU: "
                                                       "'--nvml-replay tests/fixtures/nvml_h100_time_sliced.json')")
    args = p.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    nsys, env = find_nsys(args.nsys), environment()
    version = subprocess.run([nsys, "--version"], env=env, capture_output=True, text=True, check=False)
    wanted = set(args.phases.split(","))
    saved = args.outdir / "ctxsw_live_cost.json"
    result = json.loads(saved.read_text()) if saved.exists() else {"phases": {}}  # an earlier call's phases
    result.update({"nsys": nsys, "nsys_version": (version.stdout or version.stderr).strip()[-200:],
                   "euid": os.geteuid(), "cpus": os.cpu_count(), "started": time.time()})
    phases = [("default", args.window, args.period, args.minutes)]
    if args.full_duty_minutes > 0:  # back to back: a tick (window + nsys' own start and export) outlasts the period
        phases.append(("full", args.window, args.window + 1.0, args.full_duty_minutes))
    for name, window, period, minutes in (p for p in phases if p[0] in wanted):
        try:
            result["phases"][name] = phase(name, nsys, window, period, minutes, args.warm_up, env, args.outdir,
                                           args.exporter_args.split())
        except Exception as exc:  # noqa: BLE001 - unattended: record and go on
            result["phases"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        (args.outdir / "ctxsw_live_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.slowdown_runs > 0 and "slowdown" in wanted:
        try:
            result["slowdown"] = slowdown(nsys, args.slowdown_runs, args.slowdown_seconds, env, args.outdir)
        except Exception as exc:  # noqa: BLE001
            result["slowdown"] = {"error": f"{type(exc).__name__}: {exc}"}
    result["finished"] = time.time()
    (args.outdir / "ctxsw_live_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({name: {k: v for k, v in ph.items() if k in ("cpu_share_of_one_core", "windows_captured",
                                                                 "exporter_peak_rss_bytes", "peak_rss_nsys_bytes", "error")}
                      for name, ph in result["phases"].items()}, indent=1))
    print(json.dumps({k: v.get("slowdown") if isinstance(v, dict) else v for k, v in (result.get("slowdown") or {}).items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
