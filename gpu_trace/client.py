"""The traced process's side of the channel: a daemon thread that waits for the exporter's windows.

It connects to the exporter's socket (and again, with back-off, whenever it is not there), reads one
command line at a time, traces the asked window on its own thread and answers with one line. It
starts CUPTI only at the first window, and only once this process has loaded the CUDA driver (a
Python process that never touches a GPU loads nothing). Problems are printed once, to stderr, with
the prefix "gpu_trace:"; the application is never interrupted.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading

from gpu_trace import protocol
from gpu_trace.tracer import WindowLate

RETRY_S = (1.0, 5.0, 30.0)  # back-off while the exporter's socket is absent
CUDA_POLL_S = 2.0  # how often a process not yet using CUDA looks again (/proc/self/maps)


def say_once(said: set, key: str, text: str) -> None:
    if key not in said:
        said.add(key)
        print(f"gpu_trace: {text}", file=sys.stderr, flush=True)


def cuda_loaded(maps: str = "/proc/self/maps") -> bool:
    """Whether this process has mapped the CUDA driver (it made, or is about to make, a context)."""
    try:
        with open(maps, "rb") as f:
            return any(b"libcuda.so" in line for line in f)
    except OSError:
        return True  # no /proc: let CUPTI decide


class Client(threading.Thread):
    def __init__(self, path: str | None = None, tracer_factory=None, pid: int | None = None,
                 cuda_check=cuda_loaded, cuda_poll_s: float = CUDA_POLL_S):
        super().__init__(name="gpu_trace", daemon=True)
        self.path = path or os.environ.get(protocol.SOCKET_ENV) or protocol.DEFAULT_SOCKET
        self._factory = tracer_factory  # () -> Tracer; the real one imports CUPTI
        self._tracer = None
        self._broken: str | None = None  # CUPTI cannot run here: answered as an error, once said
        self.pid = pid or os.getpid()
        self.cuda_check = cuda_check
        self.cuda_poll_s = cuda_poll_s
        self.stop = threading.Event()
        self.said: set[str] = set()
        self.windows = 0

    def run(self) -> None:
        # A process that never loads CUDA (a data loader's worker, a tool) takes none of the exporter's
        # per-user connection slots: the client connects once this process has mapped the driver.
        while not self.stop.is_set() and not self.cuda_check():
            self.stop.wait(self.cuda_poll_s)
        attempt = 0
        while not self.stop.is_set():
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                    conn.connect(self.path)
                    attempt = 0
                    self._serve(conn)
            except OSError:
                pass  # no exporter (yet), or it went away: try again later
            self.stop.wait(RETRY_S[min(attempt, len(RETRY_S) - 1)])
            attempt += 1

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        while not self.stop.is_set():
            line = reader.readline(protocol.MAX_COMMAND_BYTES + 1)
            if not line:
                return
            try:
                command = json.loads(line)
                seconds = min(float(command["trace"]), protocol.MAX_WINDOW_S)
                window = int(command["window"])
            except (ValueError, TypeError, KeyError):
                return  # not our exporter: hang up
            conn.sendall(json.dumps(self.window(window, seconds)).encode() + b"\n")

    def window(self, window: int, seconds: float) -> dict:
        head = {"window": window, "pid": self.pid}
        if not self.cuda_check():
            return {**head, "error": "no CUDA in this process yet"}
        if self._broken is None and self._tracer is None:
            try:
                self._tracer = (self._factory or default_tracer)()
            except Exception as exc:  # noqa: BLE001 - CuptiUnavailable, or CUPTI's own error at registration
                self._broken = str(exc)
                say_once(self.said, "cupti", f"CUPTI is not available, this process is not traced: {exc}")
        if self._broken is not None:
            return {**head, "error": self._broken}
        try:
            body = self._tracer.trace(seconds, self.stop)
        except WindowLate as exc:  # CUPTI is still busy with a window: answered on time, with the reason
            say_once(self.said, "late", f"window {window} not reported: {exc}")
            return {**head, "error": str(exc)[:500]}
        except Exception as exc:  # noqa: BLE001 - a CUPTI call failed mid-window: say it, keep the application running
            say_once(self.said, f"trace {type(exc).__name__}", f"a window failed: {exc}")
            return {**head, "error": f"window failed: {type(exc).__name__}: {exc}"[:500]}
        self.windows += 1
        if not body.get("complete", True):
            say_once(self.said, "cut", f"window {window}: CUPTI's flush had not returned in time; reported the "
                     f"part whose records had arrived ({body['end'] - body['start']:.2f} s, {body['records']} records)")
        return {**head, **body}


def default_tracer():
    from gpu_trace.tracer import Tracer

    return Tracer()
