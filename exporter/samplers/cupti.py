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
namespace): a report naming another pid is refused. Bounded: --cupti-max-clients connections (more are
closed at once), 16 KiB per report (gpu_trace.protocol), read until the window's end plus a grace
(a client that drips, stays silent or sends garbage is disconnected; it may connect again), every
number checked against the window. A refused report is one log line per client and kind of fault.
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
from dataclasses import dataclass, field

from exporter import vocabulary as V
from exporter.config import duration
from exporter.sampler import LatestWindows, ProcessShare, ProcessWindow, SourceState
from exporter.snapshot import CollectorHealth, LogOnce
from gpu_trace import protocol

log = logging.getLogger(__name__)
# After the window: a client answers at most 4.1 s after it (gpu_trace.tracer: CUPTI's disable 2 s, settle, its
# flush 2 s; what had not arrived by then is left out), plus the GIL and its summary. The first H200 run waited
# 5 s and lost a trainer whose tracer answered only after CUPTI's flush had drained a backlog (bench/RESULTS.md).
REPLY_GRACE_S = 10.0
START_SLACK_S = 2.0  # a client starts its window this long after being asked, at most
SLACK = 1.001  # measured seconds may exceed the window by float rounding, no more
UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
NO_CLIENTS = "no tracing client is connected (clients opt in: docs/mps-clients.md)"
NOT_ON_GPU = "no tracing client reported this GPU in the last window"


class BadReport(ValueError):
    """A client's answer that is refused (one log line): the message says why."""


@dataclass(frozen=True)
class DeviceReport:
    kernel_busy_s: float
    sm_seconds: float
    copy_busy_s: float
    kernels: int


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
    pending: bytearray = field(default_factory=bytearray)


def _number(value, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadReport(f"{name} is not a number")
    if not lo <= value <= hi:
        raise BadReport(f"{name} {value:g} outside [{lo:g}, {hi:g}]")
    return float(value)


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
        # busy_s (the native tracer): kernels, device-side copies and work queued before the window, all on
        # the SMs; an older client reports its kernels only
        key = "busy_s" if "busy_s" in entry else "kernel_busy_s"
        busy = _number(entry.get(key), key, 0.0, length * SLACK)
        out[entry["uuid"]] = DeviceReport(
            busy, _number(entry.get("sm_seconds"), "sm_seconds", 0.0, busy * SLACK + 1e-9),
            _number(entry.get("copy_busy_s"), "copy_busy_s", 0.0, length * SLACK),
            int(_number(entry.get("kernels"), "kernels", 0, 1e12)))
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
            shares[report.pid] = ProcessShare(time=round(min(device.kernel_busy_s / length, 1.0), 6),
                                              sm=round(min(device.sm_seconds / length, 1.0), 6))
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
                 period_s: float = 600.0, max_clients: int = 128, clock=time.time):
        self._nvml = nvml
        self.path = socket_path
        self.window_s = window_s
        self.interval = period_s
        self.max_tick_seconds = window_s + REPLY_GRACE_S + 5.0
        self.max_clients = max_clients
        self.max_age = 2 * period_s + window_s
        self.clock = clock
        self.health = CollectorHealth(True, 0.0, "")
        self.readings: dict[str, ProcessWindow] = {}  # GPU UUID -> the last window
        self.states: dict[str, SourceState] = {}
        self.refused: dict[str, int] = {}  # kind of fault -> reports and connections refused so far
        self._clients: dict[int, _Client] = {}  # fd -> client
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
        """Every pending connection: kept up to --cupti-max-clients, the rest closed at once."""
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            if len(self._clients) >= self.max_clients:
                sock.close()
                self._refuse("connections", f"more than --cupti-max-clients {self.max_clients} connections: "
                             "the rest are closed")
                continue
            pid, uid, _gid = PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
            sock.setblocking(False)
            self._clients[sock.fileno()] = _Client(sock, pid, uid)

    def _drop(self, client: _Client) -> None:
        self._clients.pop(client.sock.fileno(), None)
        client.sock.close()

    def _refuse(self, kind: str, why: str) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1
        self._log.problem(f"cupti refused ({kind})", why)

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
                self._refuse("late", f"pid {key.data.pid} did not answer within the window and "
                             f"{REPLY_GRACE_S:g} s: disconnected")
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
        if end < 0:
            if len(client.pending) > protocol.MAX_REPORT_BYTES:
                self._refuse("oversized", f"pid {client.pid}: a report over {protocol.MAX_REPORT_BYTES} bytes: "
                             "disconnected")
                self._drop(client)
                return None
            return False
        line = bytes(client.pending[:end])
        client.pending.clear()
        if end > protocol.MAX_REPORT_BYTES:
            self._refuse("oversized", f"pid {client.pid}: a report over {protocol.MAX_REPORT_BYTES} bytes: "
                         "disconnected")
            self._drop(client)
            return None
        try:
            return parse_report(line, client.pid, self._window, asked_at, self.window_s, self.clock(), gpus)
        except BadReport as exc:
            self._refuse("bad report", f"pid {client.pid} (uid {client.uid}): {exc}: ignored, disconnected")
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
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


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


def check_arguments(args) -> str | None:
    if not getattr(args, "workload_cupti", False):
        return None
    if not 1.0 <= args.cupti_window <= min(protocol.MAX_WINDOW_S, args.cupti_period / 2):
        return (f"--cupti-window {args.cupti_window:g}s: give 1 to {protocol.MAX_WINDOW_S:g} s, at most half of "
                f"--cupti-period ({args.cupti_period:g}s)")
    if not 1 <= args.cupti_max_clients <= 4096:
        return f"--cupti-max-clients {args.cupti_max_clients}: give 1 to 4096"
    return None


def build(args, nvml, spatial=None):
    """`spatial` is unused: a client's trace excludes no spatial source (CUPTI's activity API is not a
    profiling session, so DCGM and GPM keep sampling)."""
    if not getattr(args, "workload_cupti", False):
        return None
    return CuptiSource(nvml, args.cupti_socket, args.cupti_window, args.cupti_period, args.cupti_max_clients)
