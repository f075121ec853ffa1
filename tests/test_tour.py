"""The README's tour without a GPU, walked as written (issue 36): its command lines typed one by one into a
shell under Debian's tmux, and what each is said to show read off the pane. Only the ports differ: 9478 and
9090 may be taken on a shared machine, so each run gets free ones (in the commands and in the copy of
deploy/demo/prometheus-local.yaml the tour names). The installed commands are this tree's, run as
`python3 -m ...`, like the console scripts pip writes."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.helpers import free_port, http_get, needs, wait_for
from tests.test_top import Tmux

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"gpu-spatial-exporter": "exporter", "gpu-spatial": "gpu_spatial", "nsys-ingest": "nsys_ingest"}


def tour_lines() -> list[str]:
    """The sh blocks of the README's tour, one command line each (continuations joined, comments kept)."""
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("## A tour without a GPU", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", tour, flags=re.S | re.M)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


class Shell(Tmux):
    """bash in a private tmux server (test_top's, with a shell instead of top): lines are typed, the pane
    (with its scrollback) is read."""

    def __init__(self, home: Path, path: str):
        self.directory = str(home / "tmux-dir")
        os.mkdir(self.directory)
        self.socket = os.path.join(self.directory, "tmux")
        env = {"PATH": path, "HOME": str(home), "TMPDIR": str(home), "PS1": "tour$ ", "TERM": "xterm-256color",
               "LANG": os.environ.get("LANG", "C.UTF-8")}
        self._tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "50", "-c", str(ROOT),
                   "env -i " + " ".join(f"{k}='{v}'" for k, v in env.items()) + " bash --norc --noprofile -i")
        self.wait(lambda text: "tour$" in text, what="the prompt")

    def type(self, line: str) -> None:
        self.keys("-l", line)
        self.keys("Enter")

    def capture(self, *flags: str) -> str:
        return super().capture("-J", "-S", "-2000", *flags)

    def clear(self) -> None:
        self.keys("clear", "Enter")
        # bash may still report a job that ended (`kill %1`) after the clear: a prompt last is enough
        self.wait(lambda text: text.strip().endswith("tour$") and len(text.strip().splitlines()) <= 3,
                  what="a clear screen")
        self._tmux("clear-history", "-t", "t")

    def close(self):
        with contextlib.suppress(subprocess.SubprocessError, OSError, TimeoutError):
            self.type("kill %1 %2 %3 2>/dev/null")
            wait_for(lambda: "tour$" in self.capture(), 10, 0.2, "the jobs stopped")
        super().close()


@pytest.fixture
def shell(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for script, module in SCRIPTS.items():  # what pip's console scripts do, on this tree
        (bin_dir / script).write_text(f"#!/bin/sh\nPYTHONPATH='{ROOT}' exec '{sys.executable}' -m {module} \"$@\"\n")
        (bin_dir / script).chmod(0o755)
    session = Shell(tmp_path, f"{bin_dir}:{os.environ['PATH']}")
    try:
        yield session
    finally:
        session.close()


def metric(port: int, name: str) -> float | None:
    """The first sample of `name` on the exporter at port; None while it has none or nothing answers."""
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return None
    found = re.search(rf"^{name}{{[^}}]*}} (\S+)$", body.decode(), re.M) if status == 200 else None
    return float(found.group(1)) if found else None


def prometheus_has(port: int, expr: str) -> bool:
    status, body = http_get(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    return status == 200 and '"result":[{' in body.decode()


@needs("tmux")
@needs("curl")
@needs("prometheus")
def test_the_readme_tour_as_written(shell, tmp_path):
    exporter_port, prometheus_port = free_port(), free_port()
    # the Prometheus configuration the tour names, pointed at this run's exporter; the rules where it finds them
    demo = tmp_path / "deploy" / "demo"
    demo.mkdir(parents=True)
    (tmp_path / "rules").symlink_to(ROOT / "rules")
    config = (ROOT / "deploy" / "demo" / "prometheus-local.yaml").read_text()
    assert "127.0.0.1:9478" in config
    # "after a minute": three scrapes as written fit in one; this run scrapes every second instead
    written = re.search(r"^  scrape_interval: (\d+)s$", config, re.M)
    assert written and 3 * int(written.group(1)) <= 60, config
    config = config.replace(written.group(0), "  scrape_interval: 1s")
    (demo / "prometheus-local.yaml").write_text(config.replace("127.0.0.1:9478", f"127.0.0.1:{exporter_port}"))

    def as_run(line: str) -> str:
        line = line.replace("9478", str(exporter_port)).replace("9090", str(prometheus_port))
        return line.replace("deploy/demo/prometheus-local.yaml", str(demo / "prometheus-local.yaml"))

    lines = tour_lines()
    commands = [line.split()[0] for line in lines]
    assert commands == ["gpu-spatial-exporter", "curl", "gpu-spatial", "nsys-ingest", "kill", "gpu-spatial-exporter",
                        "prometheus", "gpu-spatial"], lines
    replay, curl, top, diagnose, kill, users, prometheus, report = map(as_run, lines)
    assert all(f"--port {exporter_port}" not in line for line in lines)  # the tour runs on the default port
    replay, users = (re.sub(r" &$", f" --port {exporter_port} &", line) for line in (replay, users))

    # 1. the replay, as a background job; its log says where it serves
    shell.type(replay)
    shell.wait(lambda t: metric(exporter_port, "gpu_sm_active_ratio") is not None, what="the replay published", timeout=60)
    # 2. what Prometheus would scrape: time 1, SM active 0.25
    shell.clear()
    shell.type(curl)
    text = shell.wait(lambda t: "gpu_hidden_idle_sm_ratio{" in t and t.rstrip().endswith("tour$"), what="the three ratios")
    values = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(gpu_\w+_ratio)\{[^}]*\} (\S+)$", text, re.M)}
    assert values["gpu_time_utilization_ratio"] >= 0.99 and values["gpu_sm_active_ratio"] == pytest.approx(0.25, abs=0.01)
    # 3. top: the two bars, hidden idle between them; q quits
    shell.clear()
    shell.type(top)
    text = shell.wait(lambda t: "SM[" in t and "hid" in t and "verdict" in t, what="top's screen", timeout=60)
    assert re.search(r"time\[#+\]100% SM\[#+~+\] 25% hid 75%", text), text
    shell.keys("q")
    shell.wait(lambda t: t.rstrip().endswith("tour$"), what="top quit")
    # 4. diagnose on the time-sliced capture
    shell.clear()
    shell.type(diagnose)
    text = shell.wait(lambda t: "change:" in t and t.rstrip().endswith("tour$"), what="the verdict", timeout=120)
    assert "verdict: time_sliced_small_kernels" in text
    # 5. the account: the replay stopped, the users demo and a Prometheus that scrapes it
    shell.type(kill)
    wait_for(lambda: metric(exporter_port, "gpu_sm_active_ratio") is None, 20, 0.2, "the replay stopped")
    shell.type(users)
    shell.wait(lambda t: metric(exporter_port, "gpu_workload_held_share_ratio") is not None, what="the users", timeout=60)
    shell.type(prometheus)
    # "after a minute": once Prometheus holds three scrapes of the held counters
    wait_for(lambda: prometheus_has(prometheus_port, "count_over_time(gpu_workload_held_gpu_seconds_total[1h]) >= 3"),
             90, 0.5, "three scrapes of the users")
    shell.clear()
    shell.type(report)
    text = shell.wait(lambda t: "used/held" in t and t.rstrip().endswith("tour$"), what="the account", timeout=90)
    rows = {m.group(1) for m in re.finditer(r"^\s*(alice|bob|1003)\s+\d", text, re.M)}
    assert rows == {"alice", "bob", "1003"}, text
