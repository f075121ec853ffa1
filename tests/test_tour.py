"""The README's tour without a GPU, walked as written (issue 36): its command lines typed one by one into a
shell under Debian's tmux, and what each is said to show read off the pane. Only the ports differ: 9478 and
9090 may be taken on a shared machine, so each run gets free ones (in the commands and in the copy of
deploy/demo/prometheus-local.yaml the tour names). The installed commands are this tree's, run as
`python3 -m ...`, like the console scripts pip writes."""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
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


def console_scripts(home: Path) -> str:
    """A PATH whose gpu-spatial-exporter, gpu-spatial and nsys-ingest run this tree, as pip's console scripts do."""
    bin_dir = home / "bin"
    bin_dir.mkdir()
    for script, module in SCRIPTS.items():
        (bin_dir / script).write_text(f"#!/bin/sh\nPYTHONPATH='{ROOT}' exec '{sys.executable}' -m {module} \"$@\"\n")
        (bin_dir / script).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.fixture
def shell(tmp_path):
    session = Shell(tmp_path, console_scripts(tmp_path))
    try:
        yield session
    finally:
        session.close()


NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "a half": 1 / 2,
           "a third": 1 / 3, "a quarter": 1 / 4}
TOP_FIGURES = re.compile(r"time\[#+\](\d+)% SM\[#+~+\]\s*(\d+)% hid (\d+)%")


def readme_claims() -> dict:
    """What the README says its tour shows, read from its sentences (so that a test holds each to the output)."""
    readme = (ROOT / "README.md").read_text()
    time_ratio, sm_active = re.search(r"`gpu_time_utilization_ratio` reads (\S+) while `gpu_sm_active_ratio` reads "
                                      r"([\d.]+)", readme).groups()
    return {"time": float(time_ratio), "sm_active": float(sm_active), "top": TOP_FIGURES.search(readme).groups(),
            "diagnosed": NUMBERS[re.search(r"here, (\w+) processes time-sliced", readme).group(1)],
            "user_share": NUMBERS[re.search(r"Each user holds (a \w+) of the GPU", readme).group(1)]}


def test_the_readme_counts_the_processes_diagnose_finds():
    """The diagnose sentence's number, against the verdict and the table of processes diagnose prints."""
    line = next(line for line in tour_lines() if line.startswith("nsys-ingest diagnose "))
    done = subprocess.run([sys.executable, "-m", "nsys_ingest", *line.split()[1:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    table = done.stdout.split("       pid process", 1)[1].split("\n  copies", 1)[0]
    said = readme_claims()["diagnosed"]
    assert done.returncode == 0 and f" {said} processes take turns" in done.stdout, done.stdout
    assert len(re.findall(r"^\s+\d+ \S+\s+[\d.]+", table, re.M)) == said, table


def held_shares(port: int) -> dict[str, float] | None:
    """Each user's gpu_workload_held_share_ratio on the exporter at port; None until it has them."""
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return None
    found = re.findall(r'^gpu_workload_held_share_ratio\{[^}]*\buser="([^"]+)"[^}]*\} (\S+)$', body.decode(), re.M)
    return {user: float(value) for user, value in found} if status == 200 and found else None


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
    claims = readme_claims()
    assert values["gpu_time_utilization_ratio"] == pytest.approx(claims["time"], abs=0.01)
    assert values["gpu_sm_active_ratio"] == pytest.approx(claims["sm_active"], abs=0.01)
    # 3. top: the two bars, hidden idle between them, as the README's picture; q quits
    shell.clear()
    shell.type(top)
    text = shell.wait(lambda t: "SM[" in t and "hid" in t and "verdict" in t, what="top's screen", timeout=60)
    assert TOP_FIGURES.search(text).groups() == claims["top"], text
    shell.keys("q")
    shell.wait(lambda t: t.rstrip().endswith("tour$"), what="top quit")
    # 4. diagnose on the time-sliced capture
    shell.clear()
    shell.type(diagnose)
    text = shell.wait(lambda t: "change:" in t and t.rstrip().endswith("tour$"), what="the verdict", timeout=120)
    assert "verdict: time_sliced_small_kernels" in text
    assert f"{claims['diagnosed']} processes take turns" in text, text
    # 5. the account: the replay stopped, the users demo and a Prometheus that scrapes it
    shell.type(kill)
    wait_for(lambda: metric(exporter_port, "gpu_sm_active_ratio") is None, 20, 0.2, "the replay stopped")
    shell.type(users)
    shares = wait_for(lambda: (found := held_shares(exporter_port)) and len(found) == 3 and found, 60, 0.2, "the users")
    assert shares == pytest.approx({"alice": claims["user_share"], "bob": claims["user_share"],
                                    "1003": claims["user_share"]}), shares
    shell.type(prometheus)
    # "after a minute": once Prometheus holds three scrapes of the held counters
    wait_for(lambda: prometheus_has(prometheus_port, "count_over_time(gpu_workload_held_gpu_seconds_total[1h]) >= 3"),
             90, 0.5, "three scrapes of the users")
    shell.clear()
    shell.type(report)
    text = shell.wait(lambda t: len(re.findall(r"^\s*(alice|bob|1003)\s+\d", t, re.M)) >= 3
                      and t.rstrip().endswith("tour$"), what="the account", timeout=90)
    rows = {m.group(1) for m in re.finditer(r"^\s*(alice|bob|1003)\s+\d", text, re.M)}
    assert rows == {"alice", "bob", "1003"}, text


# -- the demo without Docker (issue 46): deploy/demo/local.sh ----------------------------------------------------
DEMO = ROOT / "deploy" / "demo" / "local.sh"


def start_demo(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """The demo script in a session of its own (whatever it leaves is killed with it), its output in a file."""
    out = tmp_path / "demo.out"
    with open(out, "w") as sink:
        demo = subprocess.Popen(["bash", str(DEMO), *args], stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PATH": console_scripts(tmp_path), "TMPDIR": str(tmp_path)})
    return demo, out


def stopped(demo: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(demo.pid, 9)
    demo.wait(10)


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
    return False


@needs("prometheus", "prometheus-alertmanager", "amtool")
def test_the_demo_without_docker_fires_hidden_idle_and_stops(tmp_path):
    """As the README runs it, on free ports with every alert's `for:` at 0 s: the amtool line it prints shows
    HiddenIdleSMs active; SIGTERM stops all three parts and removes what it wrote."""
    ports = {flag: free_port() for flag in ("--exporter-port", "--prometheus-port", "--alertmanager-port")}
    demo, out = start_demo(tmp_path, "--alert-for", "0s", *(str(x) for pair in ports.items() for x in pair))
    try:
        said = wait_for(lambda: "amtool " in out.read_text() and out.read_text(), 90, 0.2, "the demo running")
        amtool = shlex.split(next(line for line in said.splitlines() if line.strip().startswith("amtool ")))
        alert = wait_for(lambda: "HiddenIdleSMs" in (done := subprocess.run(amtool, capture_output=True, text=True,
                                                                              timeout=30)).stdout and done.stdout,
                         90, 0.5, "HiddenIdleSMs in Alertmanager")
        assert "active" in alert and f"127.0.0.1:{ports['--exporter-port']}" in alert, alert
        assert all(f"127.0.0.1:{port}" in said for port in ports.values())
        assert "dashboards/generated/*.json" in said
        demo.terminate()
        assert demo.wait(60) == 0, out.read_text()
        # before the session is killed below: the script itself stopped its parts
        assert not any(listening(port) for port in ports.values())
        assert not list(tmp_path.glob("gpu-spatial-demo.*"))
    finally:
        stopped(demo)


@needs("prometheus", "prometheus-alertmanager")
def test_the_demo_stops_whole_when_a_part_cannot_start(tmp_path):
    """The exporter's port taken: the exporter's own line, exit 1, and the parts that did start are stopped."""
    ports = {flag: free_port() for flag in ("--prometheus-port", "--alertmanager-port")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        demo, out = start_demo(tmp_path, "--exporter-port", str(taken.getsockname()[1]),
                               *(str(x) for pair in ports.items() for x in pair))
        try:
            assert demo.wait(90) == 1, out.read_text()
            assert not any(listening(port) for port in ports.values())
            assert not list(tmp_path.glob("gpu-spatial-demo.*"))
        finally:
            stopped(demo)
    said = out.read_text()
    assert said.startswith("deploy/demo/local.sh: exporter did not start:\n") and "is in use" in said, said
