"""Live per-client time and SM shares under CUDA MPS, from the clients' own CUPTI traces (basis "cupti").

Under MPS every client shares the server's context: NVML charges the server, and the GPU's context
switches have no per-client slices. Only a client can see its own kernels. A process that opts in
(gpu_trace: `gpu-spatial trace -- python train.py`, docs/mps-clients.md) connects to this source's
Unix socket (--cupti-socket) and waits; every --cupti-period this source asks every connected client
for one window of --cupti-window seconds, and each answers with one line: per GPU its kernel-busy
seconds (the union of its kernel intervals), its SM-seconds (each kernel's SMs from its grid and
resources) and the window's wall-clock bounds (gpu_trace.protocol). fresh() hands the join
(exporter/workloads.py) one ProcessWindow per GPU with each client's UNSCALED estimates; the join
scales the SM estimates so that their sum never exceeds the GPU's measured SM active.

Everything a client says is hostile. The pid is the socket peer's (SO_PEERCRED, in this process's pid
namespace): a report naming another pid is refused. A connection is bound to its process, not to the pid
number: the process's start time (/proc/PID/stat, under --proc-root) is read at connect and checked at
every report, so a socket kept by a parent after its child exited, or passed on, cannot speak for the
process that later gets the pid. Bounded: one connection per process (a newer one replaces the older),
--cupti-max-clients-per-user per user and --cupti-max-clients in all (more are closed at once, once the
slots of processes that exited are freed), 16 KiB
per report (gpu_trace.protocol), read until the window's end plus a grace (a client that drips, stays
silent or sends garbage is disconnected; it may connect again), every number checked against the window
(one too large for a float is refused like any other). A refusal is one log line per client and kind of
fault, naming the pid and uid; it costs that client its report, never the others theirs.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import selectors
import socket
import stat
import struct
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from exporter import vocabulary as V
from exporter.config import duration
from exporter.samplers.mps import MAX_STAT_BYTES, StatError, parse_stat
from exporter.sampler import LatestWindows, ProcessShare, ProcessWindow, SourceState
from exporter.snapshot import CollectorHealth, LogOnce, loggable
from gpu_trace import protocol
from hostio.files import read_text_capped

log = logging.getLogger(__name__)
# After the window: a client answers at most 4.1 s after it (gpu_trace.tracer: CUPTI's disable 2 s, settle, its
# flush 2 s; what had not arrived by then is left out), plus the GIL and its summary. The first H200 run waited
# 5 s and lost a trainer whose tracer answered only after CUPTI's flush had drained a backlog (bench/RESULTS.md).
REPLY_GRACE_S = 10.0
START_SLACK_S = 2.0  # a client starts its window this long after being asked, at most
SLACK = 1.001  # measured seconds may exceed the window by float rounding, no more
UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
LISTEN_BACKLOG = 128
MAX_KERNELS = 1e12
MAX_REMEMBERED_REFUSALS = 1024  # (kind, client) pairs already logged: a host's churn of pids cannot grow it
NO_CLIENTS = "no tracing client is connected (clients opt in: docs/mps-clients.md)"
NOT_ON_GPU = "no tracing client reported this GPU in the last window"


NATIVE = "native"  # gpu_trace/native: CUPTI's records read in C
PERTURBING = "cupti-python (slows the job inside its windows)"


class BadReport(ValueError):
    """A client's answer that is refused (one log line): the message says why."""


@dataclass(frozen=True)
class DeviceReport:
    kernel_busy_s: float  # the union of its kernels
    sm_seconds: float  # the integral of the share of the GPU's SMs its SM work held
    copy_busy_s: float  # host-device and peer copies (copy engines: no SMs)
    kernels: int
    busy_s: float | None = None  # the union of all its SM work (None: its kernels', an older client's meaning)
    sm_copy_busy_s: float = 0.0  # device-to-device copies and memsets (on the SMs)
    backlog_busy_s: float = 0.0  # work queued before the window that ran inside it
    queue_gap_s: float = 0.0  # turns between queued work of one stream
    sms: int | None = None  # the SMs its device lets it use (an MPS active-thread limit lowers it); None: not said
    gpu_sms: int | None = None  # the whole GPU's, which its SM share is of
    native: bool = False  # recorded in C (gpu_trace/native); False: through cupti-python, which slows the job

    def __post_init__(self):
        if self.busy_s is None:
            object.__setattr__(self, "busy_s", self.kernel_busy_s)

    def parts(self, length: float) -> tuple[tuple[str, float], ...]:
        """What its busy time is made of, each as a share of the window (the API shows them apart)."""
        return tuple((name, round(min(getattr(self, f"{name}_s") / length, 1.0), 6)) for name in BUSY_PARTS)


@dataclass(frozen=True)
class ClientReport:
    pid: int
    start: float
    end: float
    devices: dict[str, DeviceReport]
    error: str | None = None  # the client cannot trace (no CUPTI there): it says why


@dataclass
class _Client:
    sock: socket.socket
    pid: int
    uid: int
    start: int | None  # the process's start time at connect (/proc/PID/stat): None, no live process
    pending: bytearray = field(default_factory=bytearray)

    @property
    def process(self) -> tuple[int, int | None]:
        return self.pid, self.start

    @property
    def who(self) -> str:
        return f"pid {self.pid} (uid {self.uid})"


REQUIRED = object()  # a field every client reports
BUSY_PARTS = ("kernel_busy", "sm_copy_busy", "backlog_busy", "queue_gap", "copy_busy")
MAX_SMS = 4096  # a GPU's SMs: 132 on an H100 or H200


def _within_busy(length: float, got: dict) -> float:
    return got["busy_s"] * SLACK + 1e-9


@dataclass(frozen=True)
class DeviceField:
    """One number of a device entry: its name in the report, its lowest and highest value given the
    window's length and the fields read before it, and its value where an older client leaves it out."""
    name: str
    high: Callable[[float, dict], float]
    whole: bool = False  # a count
    low: Callable[[float, dict], float] = lambda length, got: 0.0
    absent: object = REQUIRED  # REQUIRED, or got -> its value in a report without it


# A device entry's numbers, in the order their bounds need them; DeviceReport has one attribute per field,
# so a new field is one line here and one there.
DEVICE_FIELDS = (
    DeviceField("kernel_busy_s", lambda length, got: length * SLACK),  # no busier than the window is long
    # all SM work covers its kernels (the union of a superset); the Python tracer reports kernels only
    DeviceField("busy_s", lambda length, got: length * SLACK, low=lambda length, got: got["kernel_busy_s"] / SLACK,
                absent=lambda got: got["kernel_busy_s"]),
    DeviceField("sm_seconds", _within_busy),  # the whole GPU while busy
    DeviceField("copy_busy_s", lambda length, got: length * SLACK),
    DeviceField("sm_copy_busy_s", _within_busy, absent=lambda got: 0.0),
    DeviceField("backlog_busy_s", _within_busy, absent=lambda got: 0.0),
    DeviceField("queue_gap_s", _within_busy, absent=lambda got: 0.0),
    DeviceField("kernels", lambda length, got: MAX_KERNELS, whole=True),
    DeviceField("sms", lambda length, got: MAX_SMS, whole=True, low=lambda length, got: 1, absent=lambda got: None),
    DeviceField("gpu_sms", lambda length, got: MAX_SMS, whole=True,
                low=lambda length, got: got["sms"] if got["sms"] is not None else 1, absent=lambda got: got["sms"]),
)


def _number(value, name: str, lo: float, hi: float, whole: bool = False) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadReport(f"{name} is not a number")
    try:
        number = float(value)  # JSON's integers have no bound: 400 digits do not fit a float
    except OverflowError:
        raise BadReport(f"{name} is too large for a number") from None
    if not math.isfinite(number):
        raise BadReport(f"{name} is not a number")
    if not lo <= number <= hi:
        raise BadReport(f"{name} {number:g} outside [{lo:g}, {hi:g}]")
    if whole and not number.is_integer():
        raise BadReport(f"{name} {number:g} is not a whole number")
    return int(number) if whole else number


def process_start(proc_root: Path, pid: int) -> int | None:
    """The start time of the live process `pid` (/proc/PID/stat field 22, clock ticks after boot): what
    tells it from a later process given the same number. None: no such process (exited, a zombie, one of
    another pid namespace, whose SO_PEERCRED pid is 0; unreadable)."""
    try:
        stat = parse_stat(read_text_capped(proc_root / str(pid) / "stat", MAX_STAT_BYTES))
    except (OSError, StatError):
        return None
    return None if stat["state"] in ("Z", "X") else stat["starttime"]


def parse_report(line: bytes, peer_pid: int, window: int, asked_at: float, asked_s: float, now: float,
                 gpus: frozenset[str]) -> ClientReport:
    """One client's answer, checked against what was asked and when; BadReport says why it is refused."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise BadReport(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise BadReport("not a JSON object")
    if data.get("pid") != peer_pid:
        raise BadReport(f"speaks for pid {str(data.get('pid'))[:20]}, but the socket's peer is pid {peer_pid}")
    if data.get("window") != window:
        raise BadReport(f"answers window {str(data.get('window'))[:20]}, not the window asked ({window})")
    if "error" in data:
        return ClientReport(peer_pid, asked_at, now, {}, str(data["error"])[:200])
    start = _number(data.get("start"), "start", asked_at - START_SLACK_S, asked_at + START_SLACK_S)
    end = _number(data.get("end"), "end", start, min(now + 1.0, start + asked_s + START_SLACK_S))
    length = end - start
    if length <= 0:
        raise BadReport("an empty window")
    devices = data.get("devices")
    if not isinstance(devices, list) or len(devices) > protocol.MAX_DEVICES:
        raise BadReport(f"devices is not a list of at most {protocol.MAX_DEVICES}")
    out = {}
    for entry in devices:
        if not isinstance(entry, dict) or not isinstance(entry.get("uuid"), str) or not UUID.fullmatch(entry["uuid"]):
            raise BadReport("a device without a GPU UUID")
        if entry["uuid"] not in gpus:
            raise BadReport(f"{entry['uuid']} is not a GPU of this host")
        if entry["uuid"] in out:
            raise BadReport(f"{entry['uuid']} reported twice")
        got: dict = {}
        for f in DEVICE_FIELDS:
            if f.name not in entry and f.absent is not REQUIRED:  # an older client's report: its meaning then
                got[f.name] = f.absent(got)
                continue
            got[f.name] = _number(entry.get(f.name), f.name, f.low(length, got), f.high(length, got), f.whole)
        out[entry["uuid"]] = DeviceReport(**got, native=data.get("native") is True)
    return ClientReport(peer_pid, start, end, out)


def gpu_windows(reports: list[ClientReport]) -> dict[str, ProcessWindow]:
    """Per GPU: every reporting client's kernel-busy and SM share of its own window (unscaled)."""
    per_gpu: dict[str, list[tuple[ClientReport, DeviceReport]]] = {}
    for report in reports:
        for uuid, device in report.devices.items():
            per_gpu.setdefault(uuid, []).append((report, device))
    out = {}
    for uuid, entries in per_gpu.items():
        shares = {}
        for report, device in entries:
            length = report.end - report.start
            shares[report.pid] = ProcessShare(time=round(min(device.busy_s / length, 1.0), 6),
                                              sm=round(min(device.sm_seconds / length, 1.0), 6),
                                              parts=device.parts(length),
                                              record_path=NATIVE if device.native else PERTURBING)
        out[uuid] = ProcessWindow(basis=V.CUPTI, window_start=min(r.start for r, _ in entries),
                                  window_end=max(r.end for r, _ in entries), listed=frozenset(shares),
                                  shares=shares, switch_overhead=None)
    return out


class CuptiSource(LatestWindows):
    """The exporter's end of the channel (an exporter.sampler.WorkloadSource of basis cupti)."""

    name = "cupti"
    basis = V.CUPTI
    description = "cupti source of MPS clients' own time and SM shares (--workload-cupti)"
    not_yet = "the first window has not been asked for yet"
    after_nvml = True  # the GPUs' UUIDs come from NVML

    def __init__(self, nvml, socket_path: str = protocol.DEFAULT_SOCKET, window_s: float = 5.0,
                 period_s: float = 600.0, max_clients: int = 128, clock=time.time, max_per_user: int | None = None,
                 proc_root="/proc"):
        self._nvml = nvml
        self.path = socket_path
        self.proc_root = Path(proc_root)
        self.window_s = window_s
        self.interval = period_s
        self.max_tick_seconds = window_s + REPLY_GRACE_S + 5.0
        self.max_clients = max_clients
        self.max_per_user = max_per_user or per_user_default(max_clients)
        self.max_age = 2 * period_s + window_s
        self.clock = clock
        self.health = CollectorHealth(True, 0.0, "")
        self.readings: dict[str, ProcessWindow] = {}  # GPU UUID -> the last window
        self.states: dict[str, SourceState] = {}
        self.refused: dict[str, int] = {}  # kind of fault -> reports and connections refused so far
        self._clients: dict[int, _Client] = {}  # fd -> client
        self._by_process: dict[tuple, _Client] = {}  # (pid, start time) -> its one connection
        self._per_user: Counter[int] = Counter()  # uid -> connections
        self._said: OrderedDict[tuple[str, str], None] = OrderedDict()  # refusals logged, oldest first
        self._purged = False  # in this accept pass, the slots of processes that exited were freed
        self._listener: socket.socket | None = None
        self._window = 0
        self._log = LogOnce(log)
        self._stopping = threading.Event()

    # -- one tick: one window -------------------------------------------------------------------------
    def tick(self) -> None:
        started = time.perf_counter()
        try:
            self._tick()
            self.health = CollectorHealth(True, time.perf_counter() - started)
            self._log.clear("cupti")
        except OSError as exc:
            self._log.problem("cupti", f"{self.path}: {exc}")
            self.health = CollectorHealth(False, time.perf_counter() - started, str(exc))
            for uuid in self.states:
                self.states[uuid] = SourceState(V.ERROR, str(exc))
            self.readings.clear()

    def open(self) -> None:
        """Listens on the socket (at the first tick, or earlier); clients connect between windows."""
        if self._listener is None:
            self._listener = listen(self.path)

    def _tick(self) -> None:
        self.open()
        self._accept()
        gpus = frozenset(g.uuid for g in getattr(self._nvml, "gpus", ()))
        if not gpus:  # NVML has not listed the GPUs yet: their UUIDs are what reports are checked against
            return
        if not self._clients:
            self.readings.clear()
            self.states = {uuid: SourceState(V.STANDBY, NO_CLIENTS) for uuid in gpus}
            return
        reports = self._ask(gpus)
        if self._stopping.is_set():
            return
        self.readings = gpu_windows([r for r in reports if r.error is None])
        failing = sorted(r.pid for r in reports if r.error is not None)
        note = f"; {len(failing)} client(s) cannot trace (pid {', '.join(map(str, failing[:5]))})" if failing else ""
        self.states = {}
        for uuid in gpus:
            window = self.readings.get(uuid)
            self.states[uuid] = SourceState(V.STANDBY, NOT_ON_GPU + note) if window is None else SourceState(
                V.ACTIVE, f"{len(window.shares)} client(s) traced {window.window_end - window.window_start:.1f} s{note}",
                window.window_start, window.window_end)

    def _accept(self) -> None:
        """The pending connections, each bound to its process; at most a full table and a full backlog
        per tick, so that a process reconnecting in a loop cannot hold the tick."""
        self._purged = False
        for _ in range(self.max_clients + LISTEN_BACKLOG):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            pid, uid, _gid = PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
            client = _Client(sock, pid, uid, process_start(self.proc_root, pid))
            refusal = self._admit(client)
            if refusal is not None:
                sock.close()
                self._refuse(*refusal, client)
                continue
            sock.setblocking(False)
            self._clients[sock.fileno()] = self._by_process[client.process] = client
            self._per_user[uid] += 1

    def _admit(self, client: _Client) -> tuple[str, str] | None:
        """None, or why `client` is closed at once: one connection per process (its newer one replaces the
        older: a client reconnecting), at most --cupti-max-clients-per-user per user, --cupti-max-clients
        in all; so that one process or user cannot take every slot."""
        if client.start is None:
            return "no process", (f"no live process {client.pid} under {self.proc_root} to bind the connection to: "
                                  "closed")
        older = self._by_process.get(client.process)
        if older is not None:
            self._drop(older)
            self._refuse("per process", "connected again: its older connection is closed (one per process)", client)
        refusal = self._over_limit(client.uid)
        if refusal is not None and not self._purged:  # once per pass: it reads every client's /proc/PID/stat
            self._purged = True
            self._drop_exited()
            refusal = self._over_limit(client.uid)
        return refusal

    def _over_limit(self, uid: int) -> tuple[str, str] | None:
        if self._per_user[uid] >= self.max_per_user:
            return "per user", (f"uid {uid} already holds --cupti-max-clients-per-user {self.max_per_user} "
                                "connections: closed")
        if len(self._clients) >= self.max_clients:
            return "connections", f"--cupti-max-clients {self.max_clients} connections are held: closed"
        return None

    def _exited(self, client: _Client) -> bool:
        """Whether the process that opened the connection is gone (its pid free, a zombie's, or another's)."""
        return process_start(self.proc_root, client.pid) != client.start

    def _drop_exited(self) -> None:
        """Frees the slots of processes that have exited: a parent keeping the sockets its children opened
        holds no slot (else one process could fill the table through short-lived children)."""
        for client in list(self._clients.values()):
            if self._exited(client):
                self._refuse("not its process", "the process that connected has exited: its slot freed, "
                             "disconnected", client)
                self._drop(client)

    def _drop(self, client: _Client) -> None:
        if self._clients.pop(client.sock.fileno(), None) is not None:
            del self._by_process[client.process]
            self._per_user[client.uid] -= 1
            if not self._per_user[client.uid]:
                del self._per_user[client.uid]
        client.sock.close()

    def _refuse(self, kind: str, why: str, client: _Client) -> None:
        """Counted per kind; one log line per kind and client (the last MAX_REMEMBERED_REFUSALS remembered)."""
        self.refused[kind] = self.refused.get(kind, 0) + 1
        said = (kind, client.who)
        if said in self._said:
            self._said.move_to_end(said)
            return
        self._said[said] = None
        if len(self._said) > MAX_REMEMBERED_REFUSALS:
            self._said.popitem(last=False)
        log.warning("%s", loggable(f"cupti refused ({kind}): {client.who}: {why}"))

    def _ask(self, gpus: frozenset[str]) -> list[ClientReport]:
        """Sends the window's command to every client and reads their answers until the deadline."""
        self._window += 1
        asked_at = self.clock()
        command = json.dumps({"trace": self.window_s, "window": self._window}).encode() + b"\n"
        selector = selectors.DefaultSelector()
        for client in list(self._clients.values()):
            client.pending.clear()
            try:
                client.sock.send(command)  # a few bytes into an empty socket buffer: never blocks
                selector.register(client.sock, selectors.EVENT_READ, client)
            except OSError:
                self._drop(client)
        deadline = time.monotonic() + self.window_s + REPLY_GRACE_S
        reports = []
        try:
            while selector.get_map() and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in selector.select(min(left, 0.5)):
                    client = key.data
                    report = self._read(client, asked_at, gpus)
                    if report is not False:  # answered, refused or gone: done for this window
                        selector.unregister(client.sock)
                        if report is not None:
                            reports.append(report)
                            log.debug("cupti window %d: pid %d traced %.6f to %.6f%s", self._window, report.pid,
                                      report.start, report.end, f" (error {report.error!r})" if report.error else "")
            for key in list(selector.get_map().values()):  # silent or dripping until the deadline
                self._refuse("late", f"did not answer within the window and {REPLY_GRACE_S:g} s: disconnected",
                             key.data)
                self._drop(key.data)
        finally:
            selector.close()
        return reports

    def _read(self, client: _Client, asked_at: float, gpus: frozenset[str]):
        """The client's report; None when it was refused or hung up; False: not complete yet."""
        try:
            data = client.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return None
        client.pending += data
        end = client.pending.find(b"\n")
        if end < 0 and len(client.pending) <= protocol.MAX_REPORT_BYTES:
            return False  # not complete yet
        if end < 0 or end > protocol.MAX_REPORT_BYTES:
            return self._refused(client, "oversized", f"a report over {protocol.MAX_REPORT_BYTES} bytes")
        line = bytes(client.pending[:end])
        client.pending.clear()
        if self._exited(client):
            return self._refused(client, "not its process", "the process that connected has exited (its pid may "
                                 "name another process now)")
        try:
            return parse_report(line, client.pid, self._window, asked_at, self.window_s, self.clock(), gpus)
        except Exception as exc:  # noqa: BLE001 - whatever a report makes of the parser is that client's refusal, never the tick's
            return self._refused(client, "bad report", str(exc) if isinstance(exc, BadReport) else
                                 f"unreadable ({type(exc).__name__})")

    def _refused(self, client: _Client, kind: str, why: str) -> None:
        self._refuse(kind, f"{why}: report refused, disconnected", client)
        self._drop(client)
        return None

    def close(self) -> None:
        self._stopping.set()
        for client in list(self._clients.values()):
            self._drop(client)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    os.unlink(self.path)
            except OSError:
                pass


def listen(path: str) -> socket.socket:
    """The socket every local user's process may connect to (each can speak only for itself). A stale
    socket left by an earlier exporter is replaced; anything else at the path is an error."""
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, mode=0o755, exist_ok=True)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise OSError(f"{path} exists and is not a socket")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o666)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def per_user_default(max_clients: int) -> int:
    """Half the table: one user cannot lock out the rest. In Kubernetes every container run as root is uid 0."""
    return (max_clients + 1) // 2


def add_arguments(parser) -> None:
    g = parser.add_argument_group("cupti", "per-client shares under MPS from the clients' own CUPTI traces "
                                  "(docs/mps-clients.md)")
    g.add_argument("--workload-cupti", action="store_true",
                   help="listen on --cupti-socket for traced MPS clients (gpu-spatial trace) and ask them for a "
                        "--cupti-window every --cupti-period (basis cupti)")
    g.add_argument("--cupti-socket", default=protocol.DEFAULT_SOCKET, help="the Unix socket clients connect to")
    # 5 s every 600 s: inside a window a launch-bound loop (x.add_(1), 137k launches/s) ran 92.7 % slower on the
    # H200 (CUPTI through cupti-python), a matmul loop 0.09 %: averaged, 0.77 % and 0.001 % (bench/RESULTS.md)
    g.add_argument("--cupti-window", type=duration, default=5.0, help="how long each client traces per window")
    g.add_argument("--cupti-period", type=duration, default=600.0, help="from one window to the next")
    g.add_argument("--cupti-max-clients", type=int, default=128, help="connections kept; more are closed")
    g.add_argument("--cupti-max-clients-per-user", type=int, default=None,
                   help="connections kept per user (uid of the connecting process; default: half of "
                        "--cupti-max-clients); one per process in any case")


def check_arguments(args) -> str | None:
    if not getattr(args, "workload_cupti", False):
        return None
    if not 1.0 <= args.cupti_window <= min(protocol.MAX_WINDOW_S, args.cupti_period / 2):
        return (f"--cupti-window {args.cupti_window:g}s: give 1 to {protocol.MAX_WINDOW_S:g} s, at most half of "
                f"--cupti-period ({args.cupti_period:g}s)")
    if not 1 <= args.cupti_max_clients <= 4096:
        return f"--cupti-max-clients {args.cupti_max_clients}: give 1 to 4096"
    per_user = args.cupti_max_clients_per_user
    if per_user is not None and not 1 <= per_user <= args.cupti_max_clients:
        return f"--cupti-max-clients-per-user {per_user}: give 1 to --cupti-max-clients"
    return None


def build(args, nvml, spatial=None):
    """`spatial` is unused: a client's trace excludes no spatial source (CUPTI's activity API is not a
    profiling session, so DCGM and GPM keep sampling)."""
    if not getattr(args, "workload_cupti", False):
        return None
    return CuptiSource(nvml, args.cupti_socket, args.cupti_window, args.cupti_period, args.cupti_max_clients,
                       max_per_user=args.cupti_max_clients_per_user, proc_root=getattr(args, "proc_root", "/proc"))
