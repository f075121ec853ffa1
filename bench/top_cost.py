"""CPU and memory of `gpu-spatial top` at 1 s refresh, next to nvitop in the same run, each in its own
tmux window (a real terminal, 160x48), plus the text of both screens.

    # on a GPU host, next to a time-sliced load (two processes spinning on 33 of the SMs each):
    python3 bench/top_cost.py --load 2 --out bench/results/top_cost
    # anywhere, against a replay (nvitop needs a GPU: it is left out when it cannot start):
    python3 bench/top_cost.py --no-nvitop --out /tmp/top_cost -- --no-nvml \\
        --replay tests/fixtures/h100_quarter_sms_50hz.sqlite --nvml-replay tests/fixtures/nvml_h100_phases.json

Flags after `--` go to `gpu-spatial top` (default: in-process on the real NVML, default sources).
--rich-baseline adds the same screen painted by rich's Live (what the library choice saves).
Writes OUT/top.txt and OUT/nvitop.txt (tmux capture-pane) and OUT/cost.json: CPU seconds (utime+stime
from /proc/PID/stat) over --window seconds after --warmup, as a share of one core, and VmRSS.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.soak import cpu_seconds, rss_bytes  # noqa: E402

SOCKET = "top-cost"


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, timeout=10,
                          check=True).stdout


def start_window(name: str, command: list[str]) -> int:
    """Runs `command` as the pane's process itself (exec), so the pane pid is the measured pid."""
    shell = "exec " + " ".join(f"'{part}'" for part in command)
    if name == "top":
        tmux("new-session", "-d", "-s", "cost", "-n", name, "-x", "160", "-y", "48", f"cd '{ROOT}'; {shell}")
    else:
        tmux("new-window", "-d", "-t", "cost", "-n", name, f"cd '{ROOT}'; {shell}")
    return int(tmux("display-message", "-p", "-t", f"cost:{name}", "#{pane_pid}").strip())


def rich_baseline(top_args: list[str]) -> int:
    """The same feed and screen painted by rich's Live instead of curses, for the library choice:
    what a rich-based top would cost at the same refresh (no keys, colour styles dropped)."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from gpu_spatial.top import build_parser, make_feed
    from gpu_spatial.top.render import View, plain, render

    args, rest = build_parser().parse_known_args(top_args)
    feed = make_feed(args, rest)
    feed.start()
    console = Console()
    with Live(console=console, auto_refresh=False, screen=True) as live:
        while True:
            size = console.size
            live.update(Text(plain(render(feed.state(), View(), size.width, size.height))), refresh=True)
            time.sleep(args.interval)


def nvitop_command() -> list[str] | None:
    if shutil.which("nvitop"):
        return ["nvitop", "--interval", "1"]  # its default refresh is 2 s: the same 1 s as top
    probe = subprocess.run([sys.executable, "-c", "import nvitop"], capture_output=True)
    return [sys.executable, "-m", "nvitop", "--interval", "1"] if probe.returncode == 0 else None


def start_load(processes: int, seconds: float, sms: int) -> list[subprocess.Popen]:
    """Time-sliced load: each process its own context spinning on `sms` SMs (bench/workloads.py)."""
    return [subprocess.Popen([sys.executable, str(ROOT / "bench" / "workloads.py"), "--phases", f"{sms}:{seconds}"],
                             stdout=subprocess.DEVNULL) for _ in range(processes)]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--rich-baseline-child"]:
        return rich_baseline(argv[1:])
    top_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for top.txt, nvitop.txt, cost.json")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--load", type=int, default=0, help="time-sliced spin processes to start (GPU hosts)")
    parser.add_argument("--load-sms", type=int, default=33, help="SMs each load process spins on")
    parser.add_argument("--no-nvitop", action="store_true", help="measure top alone")
    parser.add_argument("--rich-baseline", action="store_true",
                        help="also measure the same screen painted by rich's Live (the library choice)")
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("top_cost: tmux not found (apt-get install tmux)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = start_load(args.load, args.warmup + args.window + 30, args.load_sms) if args.load else []
    pids = {}
    try:
        time.sleep(8 if load else 0)  # CUDA contexts up before the tools look
        pids["top"] = start_window("top", [sys.executable, "-m", "gpu_spatial", "top", "--interval", "1", *top_args])
        command = None if args.no_nvitop else nvitop_command()
        if command:
            pids["nvitop"] = start_window("nvitop", command)
        elif not args.no_nvitop:
            print("top_cost: nvitop not installed (pip install nvitop): measuring top alone", file=sys.stderr)
        if args.rich_baseline:
            pids["rich"] = start_window("rich", [sys.executable, str(Path(__file__).resolve()),
                                                 "--rich-baseline-child", "--interval", "1", *top_args])
        time.sleep(args.warmup)
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        started = time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - started
        result = {"window_s": round(elapsed, 1), "load_processes": args.load, "top_args": top_args, "tools": {}}
        for name, pid in pids.items():
            used = cpu_seconds(pid) - before[name]
            result["tools"][name] = {"command": tmux("display-message", "-p", "-t", f"cost:{name}",
                                                     "#{pane_current_command}").strip(),
                                     "cpu_seconds": round(used, 3), "cpu_percent_of_core": round(100 * used / elapsed, 2),
                                     "rss_mb": round(rss_bytes(pid) / 1e6, 1)}
            (out / f"{name}.txt").write_text(tmux("capture-pane", "-p", "-t", f"cost:{name}"))
        (out / "cost.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
        return 0
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True, timeout=10)
        for process in load:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    sys.exit(main())
