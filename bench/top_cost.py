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
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.soak import cpu_seconds, rss_bytes

SOCKET = "top-cost"
COLS, ROWS = 160, 48


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, timeout=10,
                          check=True).stdout


class TmuxWindows:
    """Each tool in a tmux window of COLSxROWS; the screens are tmux capture-pane text."""

    def start(self, name: str, command: list[str]) -> int:
        """Runs `command` as the pane's process itself (exec), so the pane pid is the measured pid."""
        shell = "exec " + " ".join(f"'{part}'" for part in command)
        if name == "top":
            tmux("new-session", "-d", "-s", "cost", "-n", name, "-x", str(COLS), "-y", str(ROWS), f"cd '{ROOT}'; {shell}")
        else:
            tmux("new-window", "-d", "-t", "cost", "-n", name, f"cd '{ROOT}'; {shell}")
        return int(tmux("display-message", "-p", "-t", f"cost:{name}", "#{pane_pid}").strip())

    def screen(self, name: str) -> str:
        return tmux("capture-pane", "-p", "-t", f"cost:{name}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True, timeout=10)
        with contextlib.suppress(OSError):  # the server leaves its socket behind
            os.unlink(os.path.join(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}", SOCKET))


class PtyWindows:
    """Where tmux is missing (a bare GPU host): each tool on a pseudo-terminal of COLSxROWS whose output
    is read and dropped; the screens are each tool's own one-shot text (`top --once`, `nvitop --once`)."""

    def __init__(self):
        self.procs: dict[str, tuple[subprocess.Popen, list[str]]] = {}

    def start(self, name: str, command: list[str]) -> int:
        import fcntl
        import struct
        import termios
        import threading

        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, start_new_session=True,
                                env={**os.environ, "TERM": os.environ.get("TERM", "xterm-256color")})
        os.close(slave)

        def drain():
            with contextlib.suppress(OSError):
                while os.read(master, 65536):
                    pass

        threading.Thread(target=drain, daemon=True).start()
        self.procs[name] = (proc, command)
        return proc.pid

    def screen(self, name: str) -> str:
        command = self.procs[name][1]
        once = [*command, "--once"] + (["--size", f"{COLS}x{ROWS}"] if "gpu_spatial" in command else [])
        if name == "rich":
            return "(rich baseline: same screen as top)\n"
        return subprocess.run(once, capture_output=True, text=True, timeout=60, cwd=ROOT).stdout

    def close(self) -> None:
        for proc, _ in self.procs.values():
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


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
    """Time-sliced load: each process its own context spinning on `sms` SMs (tests/gpu/workloads.py)."""
    return [subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu" / "workloads.py"), "--phases", f"{sms}:{seconds}"],
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
    parser.add_argument("--pty", action="store_true", help="pseudo-terminals even where tmux is installed")
    parser.add_argument("--rich-baseline", action="store_true",
                        help="also measure the same screen painted by rich's Live (the library choice)")
    args = parser.parse_args(argv)
    windows = TmuxWindows() if shutil.which("tmux") and not args.pty else PtyWindows()
    if isinstance(windows, PtyWindows):
        print("top_cost: tmux not found: tools on pseudo-terminals, screens from --once", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = start_load(args.load, args.warmup + args.window + 30, args.load_sms) if args.load else []
    pids = {}
    try:
        time.sleep(8 if load else 0)  # CUDA contexts up before the tools look
        pids["top"] = windows.start("top", [sys.executable, "-m", "gpu_spatial", "top", "--interval", "1", *top_args])
        command = None if args.no_nvitop else nvitop_command()
        if command:
            pids["nvitop"] = windows.start("nvitop", command)
        elif not args.no_nvitop:
            print("top_cost: nvitop not installed (pip install nvitop): measuring top alone", file=sys.stderr)
        if args.rich_baseline:
            pids["rich"] = windows.start("rich", [sys.executable, str(Path(__file__).resolve()),
                                                 "--rich-baseline-child", "--interval", "1", *top_args])
        time.sleep(args.warmup)
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        started = time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - started
        result = {"window_s": round(elapsed, 1), "terminal": type(windows).__name__, "load_processes": args.load,
                  "top_args": top_args, "tools": {}}
        for name, pid in pids.items():
            used = cpu_seconds(pid) - before[name]
            result["tools"][name] = {"cpu_seconds": round(used, 3), "cpu_percent_of_core": round(100 * used / elapsed, 2),
                                     "rss_mb": round(rss_bytes(pid) / 1e6, 1)}
            (out / f"{name}.txt").write_text(windows.screen(name))
        (out / "cost.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
        return 0
    finally:
        windows.close()
        for process in load:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    sys.exit(main())
