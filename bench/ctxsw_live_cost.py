"""What the live context-switch source (--workload-ctxsw) costs: exporter plus nsys CPU and memory at a
duty, and the slowdown a capture causes to the workloads. On the device (root, one GPU or more):

    NSYS_EXTRA_LIB=DIR timeout 2400 python3 bench/ctxsw_live_cost.py OUTDIR [--minutes 10] [--full-duty-minutes 3]
        [--phases default,full,slowdown] [--holders slurm|kubelet] [--nsys PATH]
        (calls with different --phases add up in OUTDIR)

Phases (each writes OUTDIR/cost_<name>.json, all together OUTDIR/ctxsw_live_cost.json):
- default: the exporter with --workload-ctxsw at the default duty (10 s every 180 s, 500 Hz) for --minutes, while a
  bf16 matmul loop and a launch-bound loop (bench/ctxsw_jobs.py) share GPU 0 by time slices;
- full: the same at ~100 % duty (--ctxsw-window W --ctxsw-period W + 1 s) for --full-duty-minutes;
- slowdown: each of the two loops alone on the GPU for --toggle-minutes, the exporter capturing
  --toggle-window seconds every --toggle-period: the seconds with a capture against those without, within
  one run (bench/capture_slowdown.py; separate runs differ by more than the effect on a power-capped card).
Every phase also reports that slowdown for its own windows, and polls /api/v1/workloads every 5 s.

CPU: from /proc, measured over the steady part of a phase (after --warm-up seconds): the exporter's
utime + stime + cutime + cstime (cutime: the nsys processes it started and waited for), plus the CPU of its
live descendants (a capture still running), plus nsys processes outside its tree (a daemon nsys leaves
behind), sampled every second. Memory: the exporter's VmHWM, and the peak of the exporter's and its
descendants' summed RSS, sampled every second. Holders (the source runs only where holders exist): a
Slurm mapping file listing one job on GPU 0, or with --holders kubelet one pod per loop (class Holders).
Never asserts; every failure is recorded.
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
import threading
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
    found = nsight_systems(done.stdout.split())
    if found is None:
        raise SystemExit("nsys not found: give --nsys PATH")
    return found


def nsight_systems(paths: list[str]) -> str | None:
    """The nsys to run among the files named nsys that a search found: Nsight Systems' own where it is installed,
    else the copy Nsight Compute carries (host/target-linux-x64/nsys: Nsight Systems 2025.3.1, the only one on the
    device's image, which records GPU context switches once its importer finds libdw: NSYS_EXTRA_LIB; without it
    the capture ends 'nsys profile wrote no report', as in the device run of 2026-11-28 that carried no .device),
    the newest first, whatever order the file system lists them in."""
    return max(paths, key=lambda p: ("nsight-systems" in p, p), default=None)


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
        self.stray_names: dict[int, str] = {}
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
        nsys_rss = sum(table[pid]["rss"] for pid in tree if pid in table and self.is_nsys(pid))
        self.peak_nsys_rss = max(self.peak_nsys_rss, nsys_rss + self._note_strays(table, tree))
        return total

    def sample_stray(self) -> None:
        """Only the nsys processes outside the exporter's tree."""
        table = processes()
        self._note_strays(table, descendants(self.exporter, table))

    def _note_strays(self, table: dict[int, dict], tree: set[int]) -> int:
        """Records the CPU of the nsys processes outside the exporter's tree; returns their summed RSS."""
        rss = 0
        for pid, info in table.items():
            if pid != self.exporter and pid not in tree and self.is_nsys(pid):
                self.stray_first.setdefault(pid, info["own_cpu"])
                self.stray_names.setdefault(pid, cmdline(pid)[:160])
                self.stray_last[pid] = info["own_cpu"]
                rss += info["rss"]
        return rss

    def is_nsys(self, pid: int) -> bool:
        """An nsys process (its CLI, agent, launcher): by the program it runs, not by its arguments (this
        script's own command line names the nsys path too)."""
        program = cmdline(pid).split(" ")[0]
        return program.startswith(self.nsys_dir) or os.path.basename(program).startswith("nsys")

    def stray_cpu(self) -> float:
        return sum(self.stray_last[p] - self.stray_first[p] for p in self.stray_last)

    def stray_by_command(self) -> dict[str, float]:
        """CPU seconds of the nsys processes outside the exporter's tree, by command line, since first seen."""
        out: dict[str, float] = {}
        for pid, last in self.stray_last.items():
            name = self.stray_names.get(pid, "?")
            out[name] = round(out.get(name, 0.0) + last - self.stray_first[pid], 2)
        return out


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


JOBS = ("matmul --size 8192", "launch")
KUBEPODS = "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice"


class Holders:
    """Who holds GPU 0 for the exporter. slurm: one mapping file listing job 1 (every process on the GPU
    is its). kubelet: each job in its own pod, as a container runtime places it: a cgroup v2 directory
    named cri-containerd-<64 hex>.scope under kubepods, the kubelet's log link naming the container, and a
    real gRPC PodResources server (tests/kubelet_server.py) answering that each pod holds a time-sliced
    replica of the GPU. Only the kubelet itself is a stand-in (there is no cluster on the device)."""

    def __init__(self, kind: str, tmp: Path, jobs: list[str]):
        self.kind, self.tmp, self.server = kind, tmp, None
        self.cgroups: list[str | None] = [None] * len(jobs)
        if kind == "slurm":
            (tmp / "map").mkdir()
            (tmp / "map" / "0").write_text("1\n")
            self.flags = ["--kubelet-socket", "none", "--hpc-job-mapping-dir", str(tmp / "map")]
            return
        from tests.kubelet_server import KubeletServer, pod

        uuid = gpu_uuid(0)
        (tmp / "containers").mkdir()
        self.server = KubeletServer(str(tmp / "kubelet.sock")).start()
        for n, job in enumerate(jobs):
            name, container_id = f"{job.split()[0]}-{n}", f"{n + 1:x}" * 64
            folder = Path(KUBEPODS) / f"kubepods-besteffort-pod{n + 1:08d}.slice" / f"cri-containerd-{container_id}.scope"
            folder.mkdir(parents=True, exist_ok=True)
            self.cgroups[n] = str(folder / "cgroup.procs")
            (tmp / "containers" / f"{name}_bench_main-{container_id}.log").symlink_to("/dev/null")
            self.server.service.pods.append(pod("bench", name, {"main": [("nvidia.com/gpu", [f"{uuid}::{n}"])]}))
        self.server.service.allocatable = [("nvidia.com/gpu", [f"{uuid}::{n}" for n in range(len(jobs))])]
        self.flags = ["--kubelet-socket", str(tmp / "kubelet.sock"), "--kubelet-container-logs", str(tmp / "containers"),
                      "--kubelet-interval", "5s"]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        for procs in filter(None, self.cgroups):  # empty by now: the jobs have exited
            for folder in (Path(procs).parent, Path(procs).parent.parent):
                try:
                    folder.rmdir()
                except OSError:
                    pass


def gpu_uuid(index: int) -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
    finally:
        pynvml.nvmlShutdown()


def workers(seconds: float, env: dict, jobs: list[str], cgroups: list[str | None], progress: Path) -> list[subprocess.Popen]:
    """The jobs on GPU 0, time-sliced, each logging its progress to progress/<n>.txt; a job with a cgroup
    moves there (its shell writes its own pid, then execs the job) before CUDA starts."""
    progress.mkdir(exist_ok=True)
    out = []
    for n, (job, procs) in enumerate(zip(jobs, cgroups)):
        cmd = [sys.executable, str(ROOT / "bench" / "ctxsw_jobs.py"), *job.split(), "--seconds", f"{seconds:g}",
               "--progress", str(progress / f"{n}.txt")]
        if procs:
            cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *cmd]
        out.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    return out


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def is_sleep(command: str, seconds: str) -> bool:
    """`sleep SECONDS`, however the program is named (nsys' launcher may start it by its full path)."""
    args = command.split()
    return len(args) == 2 and os.path.basename(args[0]) == "sleep" and args[1] == seconds


class Timeline(threading.Thread):
    """Every 0.2 s: whether a capture of the exporter runs (its `sleep WINDOW`, which nsys' daemon starts, so
    looked for system-wide) and whether any process the exporter started lives (nsys starting, finishing,
    exporting), appended to a JSON-lines file (bench/capture_slowdown.py reads it). nsys' daemon outside the
    exporter's tree lingers between captures and does not count."""

    def __init__(self, path: Path, window: float, exporter: int):
        super().__init__(daemon=True)
        self.path, self.sleep, self.exporter = path, f"{window:g}", exporter
        self.halt = threading.Event()

    def run(self) -> None:
        uncaught = 0  # polls with nsys running and no sleep seen: after 25 (5 s), the processes are listed once
        with open(self.path, "a", buffering=1) as out:
            while not self.halt.wait(0.2):
                table = processes()
                tree = descendants(self.exporter, table)
                capturing = any(is_sleep(cmdline(pid), self.sleep) for pid in table)
                out.write(json.dumps({"t": round(time.time(), 3), "capturing": capturing, "nsys": bool(tree)}) + "\n")
                uncaught = uncaught + 1 if tree and not capturing else 0
                if uncaught == 25:
                    newer = {pid: cmdline(pid)[:200] for pid in table if pid > self.exporter}
                    self.path.with_suffix(".processes.json").write_text(json.dumps(newer, indent=1))


def phase(name: str, nsys: str, window: float, period: float, minutes: float, warm_up: float, env: dict,
          out: Path, extra: list[str], jobs: list[str] = JOBS, holders: str = "slurm") -> dict:
    from tests.capture_slowdown import read_progress, read_timeline, slowdown

    tmp = Path(tempfile.mkdtemp(prefix="ctxsw-cost-"))
    held = Holders(holders, tmp, list(jobs))
    port = free_port()
    progress = out / f"progress_{name}"
    workers_ = workers(minutes * 60 + warm_up + 60, env, list(jobs), held.cgroups, progress)
    time.sleep(10)  # contexts up before the first capture
    log = open(out / f"exporter_{name}.log", "w")
    exporter = subprocess.Popen([sys.executable, "-m", "exporter", "--port", str(port), "--interval", "1",
                                 "--no-mps", *held.flags,
                                 "--workload-ctxsw", "--ctxsw-window", f"{window:g}s", "--ctxsw-period", f"{period:g}s",
                                 "--nsys-binary", nsys, *extra], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    meter = Meter(exporter.pid, nsys)
    timeline = Timeline(out / f"timeline_{name}.jsonl", window, exporter.pid)
    timeline.start()
    result: dict = {"phase": name, "window_s": window, "period_s": period, "duty": round(window / period, 4),
                    "holders": holders, "jobs": list(jobs)}
    try:
        end_warm = time.time() + warm_up
        while time.time() < end_warm:
            meter.sample()
            time.sleep(1)
        stray0 = meter.stray_cpu()
        cpu0, t0 = meter.sample(), time.monotonic()
        windows, states = set(), {}
        deadline = t0 + minutes * 60
        with open(out / f"workloads_{name}.jsonl", "a") as polled:
            while time.monotonic() < deadline and exporter.poll() is None:
                time.sleep(1)
                tree_cpu = meter.sample()
                if int(time.monotonic() - t0) % 5 == 0:
                    answer = get_json(f"http://127.0.0.1:{port}/api/v1/workloads") or {}
                    polled.write(json.dumps({"t": round(time.time(), 2), "tree_cpu": round(tree_cpu - cpu0, 2),
                                             "stray_cpu": round(meter.stray_cpu() - stray0, 2), "workloads": answer}) + "\n")
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
            "stray_nsys_by_command": meter.stray_by_command(),
            "exporter_peak_rss_bytes": peak_memory(exporter.pid),
            "peak_rss_exporter_and_children_bytes": meter.peak_tree_rss,
            "peak_rss_nsys_bytes": meter.peak_nsys_rss,
            "windows_captured": len(windows),
            "state_polls": states,
            "metrics_ctxsw": [line for line in (_metrics(port) or "").splitlines()
                              if line.startswith(("gpu_workload_ctxsw", 'gpu_exporter_collector_success{collector="ctxsw"',
                                                  "gpu_workload_time_share", "gpu_workload_sm_active"))],
        })
        cpu = result["exporter_tree_cpu_seconds"] + result["stray_nsys_cpu_seconds"]
        result["cpu_share_of_one_core"] = round(cpu / max(result["seconds"], 1e-9), 5)
    finally:
        timeline.halt.set()
        stop(exporter)
        log.close()
        for job in workers_:
            stop(job)
        result["workers"] = [job.stdout.read().strip()[-300:] if job.stdout else "" for job in workers_]
        held.close()
        shutil.rmtree(tmp, ignore_errors=True)
    result["exporter_exit"] = exporter.returncode
    result["leftover_capture_dirs"] = len(list(Path(tempfile.gettempdir()).glob("gpu-exporter-ctxsw-*")))
    polls = read_timeline(out / f"timeline_{name}.jsonl")
    result["slowdown"] = {job.split()[0]: slowdown(read_progress(progress / f"{n}.txt"), polls)
                          for n, job in enumerate(jobs) if (progress / f"{n}.txt").exists()}
    (out / f"cost_{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _metrics(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return answer.read().decode()
    except OSError:
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", type=Path)
    p.add_argument("--nsys", help="the nsys executable (default: on the PATH, else found under /)")
    p.add_argument("--minutes", type=float, default=10.0, help="length of the default-duty phase")
    p.add_argument("--full-duty-minutes", type=float, default=3.0, help="length of the ~100%% duty phase (0: skip)")
    p.add_argument("--window", type=float, default=10.0, help="capture length (the default duty: 10 s every 180 s)")
    p.add_argument("--period", type=float, default=180.0)
    p.add_argument("--warm-up", type=float, default=30.0, help="seconds of each phase left out of the CPU figure")
    p.add_argument("--holders", choices=("slurm", "kubelet"), default="slurm",
                   help="who holds the GPU: a Slurm mapping file, or pods (cgroups, log links, a PodResources server)")
    p.add_argument("--toggle-window", type=float, default=10.0, help="capture length of the slowdown phases")
    p.add_argument("--toggle-period", type=float, default=25.0, help="period of the slowdown phases' captures")
    p.add_argument("--toggle-minutes", type=float, default=2.5, help="length of each slowdown phase")
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
    phases = [("default", args.window, args.period, args.minutes, JOBS)]
    if args.full_duty_minutes > 0:  # back to back: a tick (window + nsys' own start and export) outlasts the period
        phases.append(("full", args.window, args.window + 1.0, args.full_duty_minutes, JOBS))
    if "slowdown" in wanted:  # each loop alone, captures toggled on and off within the one run
        wanted |= {f"slowdown_{job.split()[0]}" for job in JOBS}
        phases += [(f"slowdown_{job.split()[0]}", args.toggle_window, args.toggle_period, args.toggle_minutes, (job,))
                   for job in JOBS]
    for name, window, period, minutes, jobs in (p for p in phases if p[0] in wanted):
        try:
            result["phases"][name] = phase(name, nsys, window, period, minutes, args.warm_up, env, args.outdir,
                                           args.exporter_args.split(), jobs, args.holders)
        except Exception as exc:  # noqa: BLE001 - unattended: record and go on
            result["phases"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        (args.outdir / "ctxsw_live_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    result["finished"] = time.time()
    (args.outdir / "ctxsw_live_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({name: {k: v for k, v in ph.items() if k in ("cpu_share_of_one_core", "windows_captured",
                                                                 "exporter_peak_rss_bytes", "peak_rss_nsys_bytes", "error")}
                      for name, ph in result["phases"].items()}, indent=1))
    print(json.dumps({name: {job: {k: v for k, v in found.items() if k.startswith("slowdown_")}
                             for job, found in (ph.get("slowdown") or {}).items()}
                      for name, ph in result["phases"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
