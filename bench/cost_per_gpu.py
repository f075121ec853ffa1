"""Cost per GPU (issue 37): this exporter and nvitop-exporter side by side on every GPU of the node and on one,
idle and with time-sliced processes, and what one window of the context-switch source costs. On the device:

    bash bench/cost_per_gpu.sh          (installs the carried wheels, then runs this with OUT=$OUT)
    python3 bench/cost_per_gpu.py --out DIR [--measure 60] [--warmup 15] [--workers-per-gpu 6] [--no-ctxsw]
    python3 bench/cost_per_gpu.py --out DIR --nvml-replay FILE --no-nvitop --no-workers --no-ctxsw   (no GPU: a dry run)

Phases, in this order (the exporters are restarted only where the GPUs they see change):
  all_idle       both exporters (defaults, --interval 1) on every GPU, no process on them
  all_loaded     the same with --workers-per-gpu time-sliced torch loops per GPU (bench/ctxsw_jobs.py matmul)
  all_ctxsw      this exporter alone with --workload-ctxsw (its first window starts at once): one capture of every GPU
  one_loaded     both exporters told there is one GPU (a launcher sets NVML's device count to 1: GPU 0), loops running
  one_ctxsw      the context-switch window on that one GPU
  one_idle       one GPU, the loops stopped
Each side-by-side phase: --warmup seconds, then CPU from /proc (utime+stime+cutime+cstime) of each exporter over
the same --measure seconds, both scraped every 15 s, VmRSS/VmHWM/threads at the end. A ctxsw phase: the exporter's
tree CPU (its nsys steps and the attribution child) plus nsys processes outside it (the agent: bench/ctxsw_live_cost.py's
Meter) from start until every GPU's window is attributed, less this exporter's own CPU rate of the loaded phase;
the attribution child's CPU (of it start-up) and peak from the source's state reason; per GPU at the default duty
(exporter.samplers.ctxsw: a WINDOW_S capture every PERIOD_S). Also bench/nvml_call_cost.py on GPU 0.

Writes DIR/cost_per_gpu.json after every phase (what was measured so far), each process's log under DIR/logs/,
and prints the summary tables: the side-by-side phases, then the context-switch source's own phases. Every step
has a timeout; a failing step is recorded and the next one runs; only processes this script started are stopped.
Never asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.ctxsw_live_cost import Meter, environment, nsight_systems, peak_memory
from exporter.samplers.ctxsw import PERIOD_S, WINDOW_S
from tests.cost_summary import child_cost, settled, summary, table
from tests.helpers import free_port

TICKS = os.sysconf("SC_CLK_TCK")
SCRAPE_EVERY_S = 15.0
# A launcher that makes NVML answer one GPU to the exporter it starts (GPU 0): neither exporter has a flag
# to watch one GPU of several, so both are told the same way.
ONE_GPU = {
    "ours": "import sys, exporter.nvml as n; n.Nvml.device_count = lambda self: 1; "
            "from exporter.__main__ import main; sys.exit(main(sys.argv[1:]))",
    "nvitop": "import sys, nvitop; nvitop.Device.count = classmethod(lambda cls: 1); "
              "sys.argv[0] = 'nvitop-exporter'; from nvitop_exporter.cli import main; sys.exit(main())",
}


# -- /proc ------------------------------------------------------------------------------------------------
def cpu_with_children(pid: int) -> float | None:
    """utime + stime + cutime + cstime, seconds (children this process waited for included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in fields[11:15]) / TICKS


def status(pid: int) -> dict:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key.lower() + "_mib"] = round(int(value.split()[0]) / 1024, 1)
            elif key == "Threads":
                out["threads"] = int(value)
    except OSError:
        pass
    return out


STEPS = (("exporter.samplers.ctxsw", "attribution"), (" profile ", "profile"), (" export ", "export"))


def doing(pid: int) -> str:
    """Which context-switch step the exporter `pid` waits for, from its children's command lines: profile,
    export, attribution; else idle."""
    try:
        children = [c for t in os.listdir(f"/proc/{pid}/task")
                    for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        return "gone"
    for child in children:
        try:
            cmd = " " + Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for needle, name in STEPS:
            if needle in cmd:
                return name
    return "idle"


def get(url: str, timeout: float = 5.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.read().decode(errors="replace")
    except OSError:
        return None


# -- processes this script starts -------------------------------------------------------------------------
class Started:
    """Every process this script started, stopped by its own pid (a worker with its process group) only."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.groups: set[int] = set()

    def start(self, cmd: list[str], log: Path, env: dict | None = None, group: bool = False) -> subprocess.Popen:
        with open(log, "ab") as handle:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env or os.environ.copy(), stdout=handle, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=group)
        self.procs.append(proc)
        if group:
            self.groups.add(proc.pid)
        return proc

    def _signal(self, proc: subprocess.Popen, sig: int) -> None:
        try:
            (os.killpg if proc.pid in self.groups else os.kill)(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, proc: subprocess.Popen, timeout: float = 20.0) -> None:
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)


def wait_up(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if get(f"http://127.0.0.1:{port}/metrics", 2) is not None:
            return True
        time.sleep(0.3)
    return False


def exporter_command(kind: str, port: int, one_gpu: bool, extra: list[str]) -> list[str]:
    if kind == "ours":
        args = ["--port", str(port), "--interval", "1", *extra]
        return [sys.executable, "-c", ONE_GPU["ours"], *args] if one_gpu else [sys.executable, "-m", "exporter", *args]
    args = ["--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1"]
    return [sys.executable, "-c", ONE_GPU["nvitop"], *args] if one_gpu else [sys.executable, "-m", "nvitop_exporter", *args]


# -- phases -----------------------------------------------------------------------------------------------
def side_by_side(started: Started, out: Path, name: str, kinds: list[str], one_gpu: bool, warmup: float, measure: float,
                 extra: list[str], running: dict | None = None) -> tuple[dict, dict]:
    """Both exporters (`running`: kind -> (proc, port) kept from the previous phase, else started now) over the
    same `measure` seconds. Returns (the phase's result, the exporters now running)."""
    result: dict = {"phase": name, "one_gpu": one_gpu, "exporters": {}}
    running = dict(running or {})
    for kind in kinds:
        if kind in running and running[kind][0].poll() is None:
            continue
        port = free_port()
        proc = started.start(exporter_command(kind, port, one_gpu, extra if kind == "ours" else []),
                             out / "logs" / f"{kind}_{name}.log")
        if wait_up(port, proc, 60):
            running[kind] = (proc, port)
        else:
            result["exporters"][kind] = {"error": f"not up within 60 s (exit {proc.poll()})"}
            started.stop(proc)
    time.sleep(warmup)
    before = {k: cpu_with_children(p.pid) for k, (p, _) in running.items()}
    t0 = time.monotonic()
    scrapes = {k: [] for k in running}
    next_scrape = t0
    while time.monotonic() - t0 < measure:
        if time.monotonic() >= next_scrape:
            for kind, (proc, port) in running.items():
                s0 = time.perf_counter()
                body = get(f"http://127.0.0.1:{port}/metrics", 10)
                scrapes[kind].append({"ok": body is not None, "ms": round(1000 * (time.perf_counter() - s0), 2),
                                      "bytes": len(body or ""),
                                      "gpu_series": sum(1 for line in (body or "").splitlines()
                                                        if line and not line.startswith("#"))})
            next_scrape += SCRAPE_EVERY_S
        time.sleep(0.2)
    elapsed = time.monotonic() - t0
    for kind, (proc, port) in running.items():
        after = cpu_with_children(proc.pid)
        entry = {"cpu_percent_of_core": None if after is None or before[kind] is None
                 else round(100 * (after - before[kind]) / elapsed, 3), "seconds": round(elapsed, 1),
                 **status(proc.pid), "scrapes": scrapes[kind], "alive": proc.poll() is None}
        result["exporters"][kind] = entry
    return result, running


def ctxsw_window(started: Started, out: Path, name: str, one_gpu: bool, gpus: int, nsys: str, env: dict,
                 timeout: float, baseline_percent: float | None, extra: list[str]) -> dict:
    """This exporter with the context-switch source on (default duty: its first window starts at once): the
    CPU from its start until every GPU's window is attributed, less what it costs without a window."""
    tmp = Path(tempfile.mkdtemp(prefix="cost-ctxsw-"))
    (tmp / "map").mkdir()
    for index in range(1 if one_gpu else gpus):
        (tmp / "map" / str(index)).write_text(f"{100 + index}\n")  # a Slurm job holds each GPU
    port = free_port()
    flags = [*extra, "--no-mps", "--kubelet-socket", "none", "--hpc-job-mapping-dir", str(tmp / "map"), "--workload-ctxsw",
             "--nsys-binary", nsys]
    proc = started.start(exporter_command("ours", port, one_gpu, flags), out / "logs" / f"ours_{name}.log", env)
    meter = Meter(proc.pid, nsys)
    result: dict = {"phase": name, "one_gpu": one_gpu, "gpus": 1 if one_gpu else gpus}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and get(f"http://127.0.0.1:{port}/metrics", 2) is None:
            meter.sample()  # nsys' agent seen from its start
            time.sleep(0.2)
        # From here: the exporter's own CPU (its start and imports left out), its children's whole CPU (the
        # nsys steps and the attribution, reaped later), nsys outside its tree since first seen.
        t0, cpu0 = time.monotonic(), cpu_with_children(proc.pid) or 0.0
        # the exporter's memory through the window, each second with the step it waits for: where it grows
        timeline = [(0.0, doing(proc.pid), status(proc.pid))]
        while time.monotonic() - t0 < timeout and proc.poll() is None:
            time.sleep(1)
            meter.sample()
            timeline.append((round(time.monotonic() - t0, 1), doing(proc.pid), status(proc.pid)))
            if settled(get(f"http://127.0.0.1:{port}/metrics", 5) or ""):
                break
        time.sleep(1)  # the child reaped, its CPU in the exporter's cutime
        cpu1, t1 = meter.sample(), time.monotonic()
        # the exporter's memory before the JSON API is asked anything (FastAPI loads on first use: ~18 MB)
        memory = {**status(proc.pid), "vmhwm_bytes": peak_memory(proc.pid)}
        answer = get(f"http://127.0.0.1:{port}/api/v1/workloads", 10)
        try:
            states = (json.loads(answer).get("ctxsw") or []) if answer else []
        except (ValueError, AttributeError):
            states = []
        result.update({
            "seconds": round(t1 - t0, 1), "states": [{k: s.get(k) for k in ("uuid", "state", "reason", "window")}
                                                     for s in states],
            "exporter_tree_cpu_s": round(cpu1 - cpu0, 3), "nsys_outside_cpu_s": round(meter.stray_cpu(), 3),
            "nsys_outside_by_command": meter.stray_by_command(),
            "exporter": memory,
            "peak_rss_exporter_and_children_mib": round(meter.peak_tree_rss / 2**20, 1),
            "peak_rss_nsys_mib": round(meter.peak_nsys_rss / 2**20, 1),
            "baseline_percent_of_core": baseline_percent,
            "exporter_timeline": [{"s": t, "step": step, **mem} for t, step, mem in timeline],
        })
        found = [cost for cost in (child_cost(s.get("reason")) for s in states) if cost]
        if found:
            result["attribution_child"] = found[0]
    finally:
        started.stop(proc)
    return result


def workers(started: Started, out: Path, gpus: int, per_gpu: int, seconds: float, env: dict) -> list[subprocess.Popen]:
    """`per_gpu` small torch loops on each GPU, time-sliced (bf16 2048^3 products back to back)."""
    procs = []
    for gpu in range(gpus):
        for n in range(per_gpu):
            procs.append(started.start([sys.executable, str(ROOT / "bench" / "ctxsw_jobs.py"), "matmul", "--size", "2048",
                                        "--seconds", f"{seconds:g}"], out / "logs" / f"worker_{gpu}_{n}.log",
                                       {**env, "CUDA_VISIBLE_DEVICES": str(gpu)}, group=True))
    return procs


def locate_nsys(given: str | None) -> str | None:
    """--nsys, the PATH, the usual install folders, else a bounded search of / (bench/ctxsw_live_cost.py's
    find_nsys searches without a bound that fits this run)."""
    import glob
    import shutil

    if given or shutil.which("nsys"):
        return given or shutil.which("nsys")
    for pattern in ("/opt/nvidia/nsight-systems*/*/target-linux-x64/nsys", "/opt/nvidia/nsight-systems*/target-linux-x64/nsys",
                    "/usr/local/cuda*/nsight-systems*/target-linux-x64/nsys", "/usr/lib/nsight-systems*/target-linux-x64/nsys"):
        found = nsight_systems(glob.glob(pattern))
        if found:
            return found
    try:
        done = subprocess.run(["find", "/", "-xdev", "-type", "f", "-name", "nsys", "-path", "*target-linux-x64*"],
                              capture_output=True, text=True, timeout=45, check=False)
    except subprocess.TimeoutExpired:
        return None
    return nsight_systems(done.stdout.split())


def gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver (a dry run on the replay)
        return 0


def processes_on_gpus() -> int | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20, check=False)
        return len([line for line in done.stdout.splitlines() if line.strip()])
    except (OSError, subprocess.SubprocessError):
        return None


def save(out: Path, report: dict) -> None:
    report["summary"] = summary(report)
    (out / "cost_per_gpu.json").write_text(json.dumps(report, indent=1) + "\n")


def step(report: dict, out: Path, name: str, fn):
    """One phase: its result, or its error, recorded; the report saved either way."""
    try:
        report["phases"][name] = fn()
    except Exception as exc:  # noqa: BLE001 - unattended: record and go on
        report["phases"][name] = {"error": f"{type(exc).__name__}: {exc}"}
    save(out, report)
    print(json.dumps({name: {k: v for k, v in report["phases"][name].items() if k != "states"}})[:2000], flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--measure", type=float, default=60.0, help="seconds over which CPU is compared")
    p.add_argument("--warmup", type=float, default=15.0)
    p.add_argument("--workers-per-gpu", type=int, default=6)
    p.add_argument("--ctxsw-timeout", type=float, default=60.0, help="longest wait for a window's attribution")
    p.add_argument("--no-nvitop", action="store_true")
    p.add_argument("--no-workers", action="store_true")
    p.add_argument("--no-ctxsw", action="store_true")
    p.add_argument("--no-call-cost", action="store_true")
    p.add_argument("--nvml-replay", help="our exporter on a recording (a dry run without a GPU)")
    p.add_argument("--nsys")
    args = p.parse_args(argv)
    (args.out / "logs").mkdir(parents=True, exist_ok=True)  # every process's log: one folder, tarred by cost_per_gpu.sh
    env = environment()
    extra = ["--nvml-replay", args.nvml_replay] if args.nvml_replay else []
    kinds = ["ours"] + ([] if args.no_nvitop else ["nvitop"])
    gpus = gpu_count() if not args.nvml_replay else 1
    report: dict = {"started": time.time(), "gpus": gpus, "cpus": os.cpu_count(), "measure_s": args.measure,
                    "warmup_s": args.warmup, "workers_per_gpu": args.workers_per_gpu, "ctxsw_period_s": PERIOD_S,
                    "ctxsw_window_s": WINDOW_S,
                    "phases": {}}
    started = Started()
    try:
        if not args.no_call_cost and not args.nvml_replay:
            def call_cost():
                done = subprocess.run([sys.executable, str(ROOT / "bench" / "nvml_call_cost.py"), "--calls", "50"],
                                      cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
                return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]}
            step(report, args.out, "nvml_call_cost_gpu0", call_cost)
        running: dict = {}

        def phase(name, one_gpu):
            nonlocal running
            result, running = side_by_side(started, args.out, name, kinds, one_gpu, args.warmup, args.measure, extra,
                                           running)
            result["processes_on_gpus"] = processes_on_gpus()
            return result

        step(report, args.out, "all_idle", lambda: phase("all_idle", False))
        loops = [] if args.no_workers else workers(started, args.out, gpus, args.workers_per_gpu, 3600, env)
        time.sleep(0 if args.no_workers else 20)  # contexts up, loops running
        step(report, args.out, "all_loaded", lambda: phase("all_loaded", False))
        for proc, _ in running.values():
            started.stop(proc)
        running = {}
        ours_loaded = ((report["phases"].get("all_loaded") or {}).get("exporters") or {}).get("ours", {})
        nsys = None if args.no_ctxsw else locate_nsys(args.nsys)
        report["nsys"] = nsys
        if not args.no_ctxsw and nsys is None:
            report["phases"]["all_ctxsw"] = {"error": "nsys not found: give --nsys PATH"}
        if nsys:
            step(report, args.out, "all_ctxsw", lambda: ctxsw_window(
                started, args.out, "all_ctxsw", False, gpus, nsys, env, args.ctxsw_timeout,
                ours_loaded.get("cpu_percent_of_core"), extra))
        step(report, args.out, "one_loaded", lambda: phase("one_loaded", True))
        ours_one = ((report["phases"].get("one_loaded") or {}).get("exporters") or {}).get("ours", {})
        if nsys:
            step(report, args.out, "one_ctxsw", lambda: ctxsw_window(
                started, args.out, "one_ctxsw", True, gpus, nsys, env, args.ctxsw_timeout,
                ours_one.get("cpu_percent_of_core"), extra))
        for proc in loops:
            started.stop(proc)
        time.sleep(0 if args.no_workers else 5)
        step(report, args.out, "one_idle", lambda: phase("one_idle", True))
    finally:
        started.stop_all()
        report["finished"] = time.time()
        save(args.out, report)
    print(table(report["summary"]))
    print(json.dumps({k: v for k, v in report["summary"].items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
