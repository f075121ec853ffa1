"""The HTTP server: uvicorn with httptools behind a guard that bounds what one client can cost.

Anything on the pod network can reach the exporter, so every connection is held to limits
(flags in exporter/config.py, "serving"; docs/exposure.md):
- the request line and headers: at most `max_header_bytes`. Bytes are counted before the parser
  sees them, so a larger header block is answered 431 and nothing beyond the limit is buffered.
- time: a connection waiting for a request (new, or kept alive after a response) is closed after
  `idle_timeout`; a request's line and headers must arrive within `header_timeout` of its first
  byte (slowloris); its body gets `body_timeout` plus one second per `body_min_rate` bytes
  received; a response that waits on a client that does not read gets `body_timeout`.
- connections: at most `max_connections`. One more closes the oldest connection of the client
  address holding the most (idle or slow, never a request being answered), so Prometheus and the
  kubelet's probes get in while an attacker holds the rest.
- requests: one answered at a time per connection and at most MAX_QUEUED pipelined behind it; one
  more stops the parser there (the rest of that read is dropped unparsed), reading stays paused and
  the connection closes once the queued ones are answered. A request target (path and query) over
  MAX_TARGET_BYTES is answered 414.
- a connection closed by a deadline drops what it had not sent (a client that does not read would
  otherwise hold its buffers until it left); where the answers waiting on clients that stopped reading
  hold more than MAX_UNSENT_BYTES in all, those waiting longest are closed the same way at once (400
  clients asking for the 1.5 MB Swagger UI script and never reading held 41 MB, 101 MB pipelined); an answer that
  closes the connection before the request
  body arrived (401, 413 to an upload) first reads and drops the rest of the body (at most
  DRAIN_MAX_BYTES, within the body deadline), so a client still sending sees the answer, not a reset.
The guard hooks uvicorn's httptools protocol (measured against uvicorn's h11: bench/RESULTS.md,
"Exposure"); deadlines are checked by one sweep a few times a second, not a timer per request, and
the request path reads the sweep's clock (deadlines are as exact as a sweep's interval, 0.2 s).
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import math
import resource
import signal
import socket
import warnings
from collections import Counter

import httptools
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

IDLE, HEADERS, BODY, RESPONSE, CLOSING = "idle", "headers", "body", "response", "closing"
LINGER_S = 1.0  # a refused client gets this long to read its 431 before the socket is closed
RESERVED_FDS = 128  # file descriptors kept for the samplers (NVML, SQLite, sockets, logs)
REPORT_EVERY_S = 60.0
IDLE_TICK_S = 1.0  # how often the server wakes when nothing happens (uvicorn: 0.1 s)
MAX_QUEUED = 8  # pipelined requests waiting behind the one being answered, per connection
MAX_TARGET_BYTES = 8 * 1024  # request target (path and query string); no endpoint takes a longer one
DRAIN_MAX_BYTES = 32 * 1024 * 1024  # body read and dropped after an answer that closes (a 401 to an upload)
MAX_UNSENT_BYTES = 8 * 1024 * 1024  # answered, unsent, over every connection whose client stopped reading


@dataclasses.dataclass(frozen=True)
class Limits:
    max_connections: int = 512
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 10.0
    idle_timeout: float = 5.0
    body_timeout: float = 30.0
    body_min_rate: float = 64 * 1024

    @classmethod
    def from_args(cls, args) -> "Limits":
        return cls(args.http_max_connections, args.http_max_header_bytes, args.http_header_timeout,
                   args.http_idle_timeout, args.http_body_timeout, args.http_body_min_rate)


def _response(status: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain\r\ncontent-length: " + \
        str(len(status) + 1).encode() + b"\r\nconnection: close\r\n\r\n" + status + b"\n"


TOO_LARGE = _response(b"431 Request Header Fields Too Large")
URI_TOO_LONG = _response(b"414 URI Too Long")
BAD_REQUEST = _response(b"400 Bad Request")
TIMED_OUT = _response(b"408 Request Timeout")
BUSY = _response(b"503 Service Unavailable")


class Guard:
    """The live connections with their deadlines; closes the ones past them and makes room for new ones."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.connections: dict[GuardedProtocol, None] = {}  # insertion-ordered sets
        self.by_host: dict[str, dict[GuardedProtocol, None]] = {}
        self.blocked: dict[GuardedProtocol, None] = {}  # clients not reading, longest first
        self.closed: Counter = Counter()  # why clients were cut off, since the last report
        self.now = 0.0  # the loop's clock at the last sweep: the request path reads it, not the clock
        self._sweeper = None
        self._reported = 0.0

    def admit(self, conn: "GuardedProtocol") -> None:
        """Registers a new connection. Over the bound, the client address holding the most
        connections gives up one that is not being answered (a refused one still lingering, else its
        oldest): one attacker address can never push out Prometheus or the kubelet. Where every
        connection is being answered, the new one is refused (503)."""
        self.connections[conn] = None
        self.by_host.setdefault(conn.host, {})[conn] = None
        if self._sweeper is None:
            self.now = conn.loop.time()
            self._sweeper = conn.loop.create_task(self._sweep_while_connected(conn.loop))
        if len(self.connections) <= self.limits.max_connections:
            return
        for host in sorted(self.by_host, key=lambda h: len(self.by_host[h]), reverse=True):
            mine = self.by_host[host]
            # a refused client still given time to read its answer goes first, then the oldest
            victim = next((c for c in mine if c is not conn and c.refused), None) or \
                next((c for c in mine if c is not conn and c.evictable()), None)
            if victim is not None:
                self.close(victim, "closed for a new connection")
                return
        self.close(conn, "refused, all connections busy", BUSY)

    def forget(self, conn: "GuardedProtocol") -> None:
        self.connections.pop(conn, None)
        self.blocked.pop(conn, None)
        mine = self.by_host.get(conn.host)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.by_host[conn.host]

    def close(self, conn: "GuardedProtocol", reason: str, answer: bytes = b"") -> None:
        self.forget(conn)
        conn.cut()
        if reason != "idle":  # routine: every kept-alive scraper's connection ends so
            self.closed[reason] += 1
        transport = conn.transport
        if answer and not transport.is_closing():
            transport.write(answer)
        if not answer and transport.get_write_buffer_size():
            transport.abort()  # past its deadline, unsent bytes would keep the socket until the client left
        elif not transport.is_closing():
            transport.close()

    def not_reading(self, conn: "GuardedProtocol") -> None:
        """`conn`'s client stopped reading (its transport paused the answer). Where the bytes waiting on
        such clients exceed MAX_UNSENT_BYTES, those waiting longest are closed, their bytes dropped, until
        the rest fit: counting them is one call per blocked connection, when one more blocks."""
        self.blocked[conn] = None
        unsent = {c: c.transport.get_write_buffer_size() for c in self.blocked}
        total = sum(unsent.values())
        for victim, held in unsent.items():
            if total <= MAX_UNSENT_BYTES:
                break
            total -= held
            self.close(victim, "not reading, over the unsent budget")

    def reading(self, conn: "GuardedProtocol") -> None:
        self.blocked.pop(conn, None)

    async def _sweep_while_connected(self, loop) -> None:
        """Sweeps while any connection is open; the next connection starts it again (an idle exporter
        between two scrapes has nothing to sweep and need not wake five times a second)."""
        tick = min(1.0, max(0.05, min(self.limits.header_timeout, self.limits.idle_timeout,
                                      self.limits.body_timeout, LINGER_S) / 5))
        while self.connections:
            await asyncio.sleep(tick)
            self.sweep(loop.time())
        self._sweeper = None

    def sweep(self, now: float) -> None:
        self.now = now
        for conn in list(self.connections):
            phase = conn.phase
            if phase != conn.seen_phase:
                conn.seen_phase = phase
                if phase == IDLE:  # answered since the last sweep (uvicorn's keep-alive timer is first)
                    conn.idle_since = now
            if conn.deadline(phase) < now:
                answer = TIMED_OUT if phase == HEADERS and not conn.answering() else b""
                self.close(conn, {IDLE: "idle", HEADERS: "slow headers", BODY: "slow body", RESPONSE: "not reading",
                                  CLOSING: "header cap"}[phase], answer)
        if self.closed and now - self._reported >= REPORT_EVERY_S:
            log.warning("HTTP limits: closed %s (docs/exposure.md)",
                        ", ".join(f"{n} {why}" for why, n in self.closed.most_common()))
            self.closed.clear()
            self._reported = now


class _Stop(Exception):
    """Raised from a parser callback to stop httptools mid-read; `answer` goes to the client, if any."""

    def __init__(self, reason: str, answer: bytes = b""):
        super().__init__(reason)
        self.reason, self.answer = reason, answer


class _Flow(FlowControl):
    """uvicorn's flow control, except that reading stays paused while `held` (a connection that
    pipelined too far ahead) whatever uvicorn asks, and that a closed transport is left alone (uvloop
    raises on pausing one)."""

    held = False

    def pause_reading(self) -> None:
        if not self._transport.is_closing():
            super().pause_reading()

    def resume_reading(self) -> None:
        if not self.held and not self._transport.is_closing():
            super().resume_reading()


class _LingeringTransport:
    """The transport a request with a body is answered through: an answer that closes the connection
    before the body arrived (a 401 to an upload) leaves the close to the protocol, which first reads
    and drops the rest of the body. Everything else is the real transport's."""

    def __init__(self, protocol: "GuardedProtocol"):
        self._protocol = protocol
        self._transport = protocol.transport

    def close(self) -> None:
        self._protocol.close_after_body()

    def __getattr__(self, name):
        return getattr(self._transport, name)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, counting header bytes before they are parsed and keeping the
    times the guard's deadlines start from. The phase is derived only when the guard asks (a sweep,
    a full house): a scrape pays for a few plain hooks, not for the bookkeeping. `guard` is set on
    a subclass per server (see `protocol_for`)."""

    guard: Guard

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.flow = _Flow(transport)
        self.host = self.client[0] if self.client else ""
        self.max_header_bytes = self.guard.limits.max_header_bytes
        self.header_bytes = self.body_bytes = 0  # of the header block / body being received
        self.receiving_body = self.refused = False
        self.drain_until = None  # body bytes after which a connection answered early is closed anyway
        self.since = self.idle_since = self.loop.time()  # header block or body start; idle start
        self.seen_phase = IDLE  # the phase the last sweep saw: a change to idle starts idle_since
        self.write_blocked_since = None
        self.running = None  # the request being answered (uvicorn's `cycle` is the newest parsed)
        self.guard.admit(self)

    def connection_lost(self, exc) -> None:
        self.guard.forget(self)
        self.cut()  # also the request being answered where others were queued, which uvicorn misses
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle, app) -> None:
        self.running = cycle
        super()._start_asgi_task(cycle, app)

    def cut(self) -> None:
        """Closed (by the guard, or the client left): for the app, the client is gone, so a response
        being sent stops instead of writing to a closed transport (uvloop raises), and the requests
        queued behind it go."""
        running = self.running
        if running is not None and not running.response_complete:
            running.disconnected = True
            running.message_event.set()
            running.flow.resume_writing()  # a send waiting for the client to read returns
        self.pipeline.clear()

    def answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    @property
    def phase(self) -> str:
        if self.refused:
            return CLOSING
        if self.receiving_body:
            return BODY
        if self.header_bytes:
            return HEADERS
        return RESPONSE if self.answering() else IDLE

    def evictable(self) -> bool:
        """Anything but a request being answered to a client that reads."""
        return self.phase != RESPONSE or self.write_blocked_since is not None

    def deadline(self, phase: str) -> float:
        limits = self.guard.limits
        if phase == IDLE:  # from the last request's start where it came and went between two sweeps
            return max(self.idle_since, self.since) + limits.idle_timeout
        if phase == HEADERS:
            return self.since + limits.header_timeout
        if phase == BODY:
            return self.since + limits.body_timeout + self.body_bytes / limits.body_min_rate
        if phase == CLOSING:
            return self.since + LINGER_S
        return math.inf if self.write_blocked_since is None else self.write_blocked_since + limits.body_timeout

    def data_received(self, data: bytes) -> None:
        if self.receiving_body:
            self.body_bytes += len(data)
            if self.drain_until is not None and self.body_bytes > self.drain_until:
                self.transport.close()  # answered already: more body than is worth reading to keep it open
                return
            self._feed(data)
            return
        if self.refused or self.flow.held:
            return
        # Header bytes (of a new request, or of a pipelined one while the last is answered),
        # counted before the parser buffers them.
        if not self.header_bytes:
            self.since = self.guard.now
        room = self.max_header_bytes - self.header_bytes
        if len(data) <= room:
            self.header_bytes += len(data)
            self._feed(data)
            return
        self.header_bytes = self.max_header_bytes
        self._feed(data[:room])
        if self.header_bytes == self.max_header_bytes:  # on_headers_complete did not reset it
            self._refuse(TOO_LARGE)
        elif not self.transport.is_closing():
            self.data_received(data[room:])  # body or the next request, counted as such

    def _feed(self, data: bytes) -> None:
        """uvicorn's data_received, with the guard's stops, and what a client gets wrong counted
        (logged once a minute with the other limits) instead of a log line per request."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            stop = exc.__context__
            if not isinstance(stop, _Stop):
                raise
            # The parser keeps its callback's exception: without its frames, not the whole read with it.
            stop.__traceback__ = None
            self.guard.closed[stop.reason] += 1
            if stop.answer:
                self._refuse(stop.answer)
            else:
                self._close_after_queued()
        except httptools.HttpParserUpgrade:  # no WebSocket here: the request is answered, then closed
            self.guard.closed["upgrade refused"] += 1
            self._close_after_queued()
        except httptools.HttpParserError:
            self.guard.closed["bad request"] += 1
            self._refuse(BAD_REQUEST)

    def _close_after_queued(self) -> None:
        """No more reading: what is queued is answered, then the connection closes (HTTP/1.1 lets a
        server close between pipelined requests; the client sends the rest again)."""
        self.flow.pause_reading()
        self.flow.held = True
        if self.answering():
            self.cycle.keep_alive = False  # the newest request: the last to be answered
        elif not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, answer: bytes) -> None:
        """`answer` (431, 414, 400), then no more reading: the client gets LINGER_S to read it before
        the socket is closed (an immediate close with unread input resets the connection and loses
        the answer)."""
        if self.transport.is_closing():
            return
        self.refused, self.since = True, self.loop.time()
        self.flow.pause_reading()
        self.flow.held = True
        if self.answering():  # a pipelined request's: the answer in flight goes out, then the close
            self.cycle.keep_alive = False
            return
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()

    def on_message_begin(self) -> None:
        if len(self.pipeline) >= MAX_QUEUED:
            raise _Stop("pipelined too deep")  # the parser stops here: nothing more of this read is parsed
        self.target_bytes = 0
        HttpToolsProtocol.on_message_begin(self)

    def on_url(self, url: bytes) -> None:
        self.target_bytes += len(url)
        if self.target_bytes > MAX_TARGET_BYTES:
            raise _Stop("request target too long", URI_TOO_LONG)
        HttpToolsProtocol.on_url(self, url)

    def on_headers_complete(self) -> None:
        self.header_bytes = self.body_bytes = 0
        self.receiving_body, self.since, self.drain_until = True, self.guard.now, None
        HttpToolsProtocol.on_headers_complete(self)
        if self.cycle is not None and self.cycle.scope is self.scope and self._has_body():
            self.cycle.transport = _LingeringTransport(self)

    def _has_body(self) -> bool:
        for name, value in self.headers:
            if (name == b"content-length" and value.strip() not in (b"", b"0")) or name == b"transfer-encoding":
                return True
        return False

    def close_after_body(self) -> None:
        """The close of an answer given before its request's body arrived: the rest of the body is read
        and dropped first (up to DRAIN_MAX_BYTES more, within the body deadline), then the close."""
        if not self.receiving_body or self.transport.is_closing():
            self.transport.close()
            return
        declared = next((v for n, v in self.headers if n == b"content-length"), b"")
        self.drain_until = self.body_bytes + DRAIN_MAX_BYTES
        if declared.strip().isdigit() and int(declared) > self.drain_until:
            self.transport.close()  # more than is worth reading: the client may see a reset

    def on_message_complete(self) -> None:
        # Also where uvicorn ignores it (the response went out before the body ended): from here
        # on, bytes are the next request's headers again.
        self.receiving_body = False
        HttpToolsProtocol.on_message_complete(self)
        if self.drain_until is not None:  # answered and drained: the close the answer asked for
            self.drain_until = None
            self._close_after_queued()

    def pause_writing(self) -> None:
        self.write_blocked_since = self.loop.time()
        super().pause_writing()
        self.guard.not_reading(self)

    def resume_writing(self) -> None:
        self.write_blocked_since = None
        self.guard.reading(self)
        super().resume_writing()


def protocol_for(guard: Guard) -> type:
    return type("GuardedProtocol", (GuardedProtocol,), {"guard": guard})


class BindError(Exception):
    pass


def bind(address: str, port: int) -> socket.socket:
    """The listening socket, bound after the inputs are checked and before anything is logged or started
    (exporter/__main__.py holds the log until then): a port in use is the only thing said."""
    try:
        # an ASCII address as bytes: a str host loads the IDNA codec (~0.4 MB resident) to say the same
        host = address.encode("ascii") if address.isascii() else address
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BindError(f"--listen-address {address}: {exc.strerror}: give an IP address of this host "
                        f"(0.0.0.0 for all)") from None
    family, kind, proto, _name, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
    except OSError as exc:
        sock.close()
        where = f"{address}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise BindError(f"port {port} on {address} is in use (another exporter?): "
                            f"choose another with --port") from None
        if exc.errno == errno.EACCES:
            raise BindError(f"no permission to listen on {where}: choose a port above 1023 with --port") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise BindError(f"{address} is not an address of this host: fix --listen-address") from None
        raise BindError(f"cannot listen on {where}: {exc.strerror}") from None
    sock.listen(2048)  # uvicorn's backlog: connectable from the moment the log says "serving on"
    sock.set_inheritable(True)
    return sock


def fit_to_file_limit(limits: Limits) -> Limits:
    """Raises the soft limit on open files to what the connection bound needs (up to the hard
    limit); where it cannot, lowers the bound so connections never starve the samplers of files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limits.max_connections + RESERVED_FDS
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        bound = max(2, soft - RESERVED_FDS)
        log.warning("open-file limit %d: serving at most %d connections instead of %d (raise `ulimit -n`)",
                    soft, bound, limits.max_connections)
        limits = dataclasses.replace(limits, max_connections=bound)
    return limits


class _Server(uvicorn.Server):
    """uvicorn's server, except that a stop by SIGTERM or SIGINT (Ctrl-C) is a normal stop: one log
    line, then exit 0 (uvicorn raises the signal again once it has stopped, so the process would die
    by it, with a KeyboardInterrupt traceback for Ctrl-C); and that it wakes once a second, not ten
    times, when nothing happens (a stop wakes it at once)."""

    _stopped: asyncio.Event | None = None
    pending_signals: list = []

    async def main_loop(self) -> None:
        """uvicorn's loop polls for a stop every 0.1 s and refreshes its Date header every tenth poll: idle,
        those wakeups were most of the exporter's own CPU between scrapes (bench/RESULTS.md, "Cost per GPU").
        Here: the Date header each second, as before, and a stop the moment it comes."""
        self._stopped = asyncio.Event()
        for sig in self.pending_signals:  # a SIGTERM that came while uvicorn started (serve() below)
            self.handle_exit(sig, None)
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # on_tick refreshes the Date header when counter % 10 == 0
            try:
                await asyncio.wait_for(self._stopped.wait(), IDLE_TICK_S)
            except asyncio.TimeoutError:
                pass
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit:
            log.info("stopping on %s", signal.Signals(sig).name)
        super().handle_exit(sig, frame)
        getattr(self, "_captured_signals", []).clear()
        if self._stopped is not None:
            self._stopped.set()


def serve(app, sock: socket.socket, limits: Limits) -> None:
    """Serves `app` on the bound socket until SIGINT/SIGTERM."""
    limits = fit_to_file_limit(limits)
    # From here SIGTERM and SIGINT are recorded, not raised: raised inside uvicorn's start they ended whatever
    # ran (its logging setup, with a traceback; the lifespan's task, and the server served on, the stop
    # lost); the loop acts on them at its first tick, once uvicorn's own handlers have taken over.
    pending: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda sig, _frame: pending.append(sig))
    # No proxy headers: nothing in front of the exporter is trusted to name the client, and a
    # scrape skips that middleware. No "server: uvicorn" header to fingerprint.
    config = uvicorn.Config(app, http=protocol_for(Guard(limits)), ws="none", log_level="warning",
                            access_log=False, timeout_keep_alive=limits.idle_timeout, proxy_headers=False,
                            server_header=False,
                            # SIGTERM cancels requests still running after 5 s: an upload being validated
                            # stops at once (its budget) instead of holding the shutdown for a minute.
                            timeout_graceful_shutdown=5)
    # A signal between uvicorn making its serve() coroutine and running it (a stop during the start, seen on
    # a busy machine) leaves that coroutine unawaited: Python would print two lines of RuntimeWarning after
    # the one line "stopped by SIGINT while starting".
    warnings.filterwarnings("ignore", message="coroutine 'Server.serve' was never awaited", category=RuntimeWarning)
    server = _Server(config)
    server.pending_signals = pending
    server.run(sockets=[sock])

