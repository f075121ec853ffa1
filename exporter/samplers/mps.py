"""MPS sampler: CUDA MPS control and server daemons from a proc root, clients from the control pipe.

Under MPS every client's CUDA calls go through one nvidia-cuda-mps-server per user; when the host
pages that server out, every client stalls behind its major page faults. This reads what
`pidstat -r` shows for the daemons (majflt, minflt, RSS) plus swap, CPU time and clients.
"""
from __future__ import annotations

import logging
import os
import pwd
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hostio.files import read_capped, read_text_capped
from exporter.sampler import SamplerDefaults
from exporter.snapshot import CollectorHealth, LogOnce

log = logging.getLogger(__name__)
ROLES = {"nvidia-cuda-mps-control": "control", "nvidia-cuda-mps-server": "server"}
COMM_PREFIX = "nvidia-cuda-mps"  # comm is cut at 15 characters: both daemons read the same there
CONTROL_QUERY_EVERY_S = 2.0
FAULT_RATE_WINDOW_S = 10.0
FULL_RESCAN_EVERY_S = 30.0  # pids seen as something else are skipped until then (pid reuse is rare)
# /proc files are read capped (hostio/files.py): a process's stat is ~300 bytes, its status ~1.5 KB,
# the host's stat a few KB per hundred CPUs; argv[0] is all that is read of a command line.
MAX_STAT_BYTES = 4096
MAX_STATUS_BYTES = 65536
MAX_PROC_STAT_BYTES = 1 << 20  # only its btime line matters: a cut-off file still has it near the top
MAX_ARGV0_BYTES = 4096


@dataclass(frozen=True)
class DaemonStats:
    role: str
    user: str
    pid: int
    start_time: float  # wall seconds: a new daemon is a new counter series
    major_faults: int
    minor_faults: int
    cpu_seconds: float
    resident_bytes: int | None
    swap_bytes: int | None
    major_faults_per_s: float | None = None  # over the last FAULT_RATE_WINDOW_S; None until one has passed


@dataclass(frozen=True)
class MpsSnapshot:
    daemons: tuple[DaemonStats, ...] = ()
    clients: dict[str, int] = field(default_factory=dict)  # by server user
    default_active_thread_percentage: float | None = None
    control_reachable: bool = False
    control_error: str = ""

    def up(self, role: str) -> bool:
        return any(d.role == role for d in self.daemons)

    def to_json(self) -> dict:
        return asdict(self)


class StatError(ValueError):
    pass


def parse_stat(text: str) -> dict:
    """Fields of /proc/PID/stat. The command sits in parentheses and may hold spaces and ')' itself,
    so the fields start after the last ')'."""
    close = text.rfind(")")
    if close < 0 or "(" not in text[:close]:
        raise StatError("no command in parentheses")
    rest = text[close + 1:].split()
    if len(rest) < 20:
        raise StatError(f"{len(rest)} fields after the command, want at least 20")
    try:
        # man 5 proc: field n (1-based) is rest[n - 3].
        return {
            "comm": text[text.index("(") + 1:close],
            "state": rest[0],
            "minflt": int(rest[7]),
            "majflt": int(rest[9]),
            "utime": int(rest[11]),
            "stime": int(rest[12]),
            "starttime": int(rest[19]),
        }
    except ValueError as exc:
        raise StatError(f"not a number: {exc}") from None


def parse_status(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmSwap"):
            parts = value.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * 1024  # kB
        elif key == "Uid":
            parts = value.split()
            if parts and parts[0].isdigit():
                out["uid"] = int(parts[0])
    return out


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class MpsSampler(SamplerDefaults):
    name = "mps"

    def __init__(self, proc_root="/proc", pipe_dir=None, control_binary="nvidia-cuda-mps-control",
                 timeout: float = 2.0, interval: float = 1.0, query_control: bool = True):
        self.proc_root = Path(proc_root)
        self.pipe_dir = pipe_dir
        self.control_binary = control_binary
        self.timeout = timeout
        self.interval = interval
        self.query_control = query_control
        self.snapshot = MpsSnapshot()
        self.health = CollectorHealth(False, 0.0, "not sampled yet")
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")
        self._roles: dict[tuple[int, str], str | None] = {}  # (pid, stat start) -> role or None
        self._high_water: dict[tuple, tuple] = {}  # counters, and the mark the fault rate is taken from
        self._last_query = float("-inf")
        self._btime: float | None = None  # boot time: fixed while the host runs
        self._others: set[int] = set()  # pids that are not MPS daemons
        self._last_rescan = float("-inf")
        self._clients: dict[str, int] = {}
        self._thread_pct: float | None = None
        self._control_error = ""
        self._log = LogOnce(log)

    @property
    def max_tick_seconds(self) -> float:
        """The engine's deadline for a tick: the control queries of a tick (servers, their clients, the
        thread percentage) may each take `timeout`."""
        return 4 * self.timeout + 5

    # -- /proc ----------------------------------------------------------------------------------
    def _boot_time(self) -> float:
        if self._btime is not None:
            return self._btime
        for line in read_text_capped(self.proc_root / "stat", MAX_PROC_STAT_BYTES, truncate=True).splitlines():
            if line.startswith("btime "):
                self._btime = float(line.split()[1])
                return self._btime
        raise StatError("no btime in stat")

    def _role(self, pid: int, stat: dict) -> str | None:
        key = (pid, str(stat["starttime"]))
        if key not in self._roles:
            role = None
            if stat["comm"].startswith(COMM_PREFIX):
                cmdline = read_capped(self.proc_root / str(pid) / "cmdline", MAX_ARGV0_BYTES, truncate=True)
                argv0 = cmdline.split(b"\0", 1)[0]
                role = ROLES.get(os.path.basename(argv0.decode(errors="replace")))
            self._roles[key] = role
        return self._roles[key]

    def _scan(self) -> tuple[list[DaemonStats], list[str]]:
        boot = self._boot_time()
        daemons, problems = [], []
        alive = set()
        if time.monotonic() - self._last_rescan >= FULL_RESCAN_EVERY_S:
            self._others.clear()
            self._last_rescan = time.monotonic()
        pids = [int(e.name) for e in os.scandir(self.proc_root) if e.name.isdigit()]
        self._others.intersection_update(pids)
        for pid in pids:
            if pid in self._others:
                continue
            folder = self.proc_root / str(pid)
            try:
                text = read_text_capped(folder / "stat", MAX_STAT_BYTES)
                stat = parse_stat(text)
                role = self._role(pid, stat)
                alive.add((pid, str(stat["starttime"])))
                if role is None:
                    self._others.add(pid)
                    continue
                status = parse_status(read_text_capped(folder / "status", MAX_STATUS_BYTES))
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited between listing and reading: normal
            except StatError as exc:
                if COMM_PREFIX in text:  # only a daemon's garbage is this collector's problem
                    problems.append(f"pid {pid}: unreadable stat ({exc})")
                continue
            except OSError as exc:
                problems.append(f"pid {pid}: {exc}")
                continue
            if stat["state"] == "Z":
                continue
            daemons.append(self._stats(pid, role, stat, status, boot))
        self._roles = {k: v for k, v in self._roles.items() if k in alive and v is not None}
        return daemons, problems

    def _stats(self, pid, role, stat, status, boot) -> DaemonStats:
        user = user_name(status["uid"]) if "uid" in status else "unknown"
        start = boot + stat["starttime"] / self._ticks_per_s
        cpu = (stat["utime"] + stat["stime"]) / self._ticks_per_s
        # Within one daemon's life the counters only grow: never publish a step back.
        key = (role, user, pid, stat["starttime"])
        now = time.monotonic()
        prev = self._high_water.get(key, (0, 0, 0.0, now, stat["majflt"], None))
        major, minor, cpu = max(stat["majflt"], prev[0]), max(stat["minflt"], prev[1]), max(cpu, prev[2])
        marked_at, marked_major, rate = prev[3:]
        if now - marked_at >= FAULT_RATE_WINDOW_S:  # the live diagnosis reads a rate, not a counter
            rate = (major - marked_major) / (now - marked_at)
            marked_at, marked_major = now, major
        self._high_water[key] = (major, minor, cpu, marked_at, marked_major, rate)
        return DaemonStats(role, user, pid, round(start, 2), major, minor, cpu,
                           status.get("VmRSS"), status.get("VmSwap"), rate)

    # -- the control pipe -----------------------------------------------------------------------
    def _control(self, command: str) -> str:
        env = dict(os.environ)
        if self.pipe_dir:
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        done = subprocess.run([self.control_binary], input=command + "\n", capture_output=True, text=True,
                              timeout=self.timeout, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError((done.stderr or done.stdout).strip() or f"exit {done.returncode}")
        return done.stdout

    def _query_control(self, daemons: list[DaemonStats]) -> None:
        users = {d.pid: d.user for d in daemons if d.role == "server"}
        try:
            servers = [int(p) for p in self._control("get_server_list").split() if p.isdigit()]
            clients: dict[str, int] = {}
            for pid in servers:
                listed = [c for c in self._control(f"get_client_list {pid}").split() if c.isdigit()]
                user = users.get(pid, "unknown")
                clients[user] = clients.get(user, 0) + len(listed)
            pct = self._control("get_default_active_thread_percentage").strip()
            self._thread_pct = float(pct) if pct.replace(".", "", 1).isdigit() else None
            self._clients, self._control_error = clients, ""
            self._log.clear("mps control")
        except FileNotFoundError:
            self._control_error = f"{self.control_binary} not found: clients are not counted"
        except subprocess.TimeoutExpired:
            self._control_error = f"MPS control did not answer within {self.timeout} s"
        except (RuntimeError, OSError, ValueError) as exc:
            self._control_error = f"MPS control query failed: {exc}"
        if self._control_error:  # nothing the pipe answered earlier is published as current
            self._clients, self._thread_pct = {}, None
            self._log.problem("mps control", self._control_error)

    # -- one tick -------------------------------------------------------------------------------
    def tick(self) -> None:
        started = time.perf_counter()
        try:
            daemons, problems = self._scan()
        except OSError as exc:
            self._log.problem("mps", f"cannot read {self.proc_root}: {exc}")
            self.snapshot = MpsSnapshot()
            self.health = CollectorHealth(False, time.perf_counter() - started, str(exc))
            return
        if problems:  # one line while daemons stay unreadable, whichever pids they are
            self._log.problem("mps", "; ".join(problems), kind="unreadable daemons")
        else:
            self._log.clear("mps")
        control_up = any(d.role == "control" for d in daemons)
        if not control_up:  # no MPS is a normal state, not an error
            self._clients, self._thread_pct, self._control_error = {}, None, ""
        elif self.query_control and time.monotonic() - self._last_query >= CONTROL_QUERY_EVERY_S:
            self._last_query = time.monotonic()
            self._query_control(daemons)
        current = {(d.role, d.user, d.pid) for d in daemons}
        self._high_water = {k: v for k, v in self._high_water.items() if k[:3] in current}
        self.snapshot = MpsSnapshot(
            daemons=tuple(sorted(daemons, key=lambda d: (d.role, d.user, d.start_time))),
            clients=dict(self._clients),
            default_active_thread_percentage=self._thread_pct,
            control_reachable=control_up and self.query_control and not self._control_error,
            control_error=self._control_error,
        )
        self.health = CollectorHealth(not problems, time.perf_counter() - started, "; ".join(problems))
