"""One bounded HTTP request for answers from outside (the Kubernetes API server, the Prometheus API behind
`gpu-spatial report`, another exporter's JSON behind `gpu-spatial top --url`): the whole request (connect,
TLS handshake, request, headers, body) ends by one deadline, not a timeout per read, so a server
dripping one byte at a time, in its headers, its body or 1-byte chunks, costs no more than the
deadline; the answer is capped in bytes (chunk framing included), and its JSON in values before it is
parsed, so a small answer cannot parse into a large heap.

Each socket call is given what is left of the deadline: a read returns as soon as some bytes arrive,
and CPython's TLS calls keep one deadline over their retries, so no call outlives the deadline.
"""
from __future__ import annotations

import json
import re
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024  # status line and headers
READ_BYTES = 65536
# A cap of parsed values from a cap of bytes, for callers without their own: a JSON value per 16 bytes (a
# value parses into at most ~72 bytes of Python objects: an empty dict or list and its slot).
BYTES_PER_VALUE = 16
STATUS_LINE = re.compile(rb"^HTTP/1\.[01] ([0-9]{3})(?: |$)")
CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")  # no sign, no 0x: int(, 16) takes both
MAX_CHUNK_LINE_BYTES = 1024  # a chunk's size and its extensions
# Chunks past the first FREE_CHUNKS must average this many bytes: real servers send kilobytes a chunk
# (Go's net/http 2-4 KB), and each chunk costs the decoder a step whatever its size.
FREE_CHUNKS = 1024
MIN_MEAN_CHUNK_BYTES = 64


class AnswerError(Exception):
    """Why an answer was not read; `kind` names the problem for one log line per kind."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes | bytearray


def left(deadline: float) -> float:
    """Seconds to the deadline; AnswerError once it has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise AnswerError("slower than its deadline", "slow")
    return remaining


def get(host: str, port: int, path: str, deadline: float, max_bytes: int, headers: dict[str, str] | None = None,
        tls: ssl.SSLContext | None = None) -> Answer:
    """GET `path` of host:port over HTTP/1.1 (TLS with `tls`), done by `deadline` (time.monotonic()),
    the body at most `max_bytes`. Raises AnswerError, or OSError (ssl.SSLError included) from the socket."""
    return request("GET", host, port, path, deadline, max_bytes, headers, tls)


def fetch(url: str, deadline: float, max_bytes: int, method: str = "GET", body: bytes = b"",
          headers: dict[str, str] | None = None) -> Answer:
    """`method` on an http(s) URL (its path and query kept; https verified with the system's CAs), as
    request(). Redirects are answers like any other: never followed."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AnswerError(f"{url[:100]!r} is not an http(s) URL", "http")
    https = parts.scheme == "https"
    try:
        port = parts.port or (443 if https else 80)
    except ValueError:
        raise AnswerError(f"{url[:100]!r} has no valid port", "http") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return request(method, parts.hostname, port, path, deadline, max_bytes, headers,
                   ssl.create_default_context() if https else None, body)


def request(method: str, host: str, port: int, path: str, deadline: float, max_bytes: int,
            headers: dict[str, str] | None = None, tls: ssl.SSLContext | None = None, body: bytes = b"") -> Answer:
    """As get(), any method, with `body` (sent with its Content-Length)."""
    sock = socket.create_connection((host, port), timeout=left(deadline))
    try:
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
            sock.settimeout(left(deadline))
            sock.do_handshake()
        name = f"[{host}]" if ":" in host else host
        lines = [f"{method} {path} HTTP/1.1", f"Host: {name}:{port}", "Connection: close",
                 *([f"Content-Length: {len(body)}"] if body or method != "GET" else []),
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        sock.settimeout(left(deadline))
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        return _answer(sock, deadline, max_bytes)
    except TimeoutError:
        raise AnswerError("slower than its deadline", "slow") from None
    finally:
        sock.close()


def _answer(sock, deadline: float, max_bytes: int) -> Answer:
    """The answer on `sock`: its head read whole, its body decoded as it arrives (a chunked one without
    keeping its framing or an object per chunk), at most `max_bytes` of body bytes on the wire."""
    raw = bytearray()
    while True:
        chunk = _recv(sock, deadline)
        if not chunk:
            raise AnswerError("the connection closed before the headers ended", "cut")
        raw += chunk
        found = raw.find(b"\r\n\r\n", max(0, len(raw) - len(chunk) - 3))
        if (len(raw) if found < 0 else found) > MAX_HEAD_BYTES:
            raise AnswerError(f"headers over {MAX_HEAD_BYTES} bytes", "large")
        if found >= 0:
            break
    status, fields = _head(bytes(raw[:found]))
    del raw[:found + 4]  # in place: what came of the body
    if "chunked" in fields.get("transfer-encoding", "").lower():
        body = Unchunked(max_bytes)
    else:
        body = Plain(max_bytes, _length(fields["content-length"], max_bytes) if "content-length" in fields else None)
    chunk = raw
    while not body.feed(chunk):
        chunk = _recv(sock, deadline)
        if not chunk:
            body.ended()
            break
    return Answer(status, fields, body.body)


def _recv(sock, deadline: float) -> bytes:
    sock.settimeout(left(deadline))
    return sock.recv(READ_BYTES)


def _head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = head.split(b"\r\n")
    match = STATUS_LINE.match(status_line)
    if not match:
        raise AnswerError(f"not an HTTP/1 status line: {status_line[:60]!r}", "http")
    fields = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if sep:
            fields[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return int(match.group(1)), fields


def _length(text: str, max_bytes: int) -> int:
    if not text.isdigit() or len(text) > 18:
        raise AnswerError(f"Content-Length {text[:30]!r} is no length", "http")
    if int(text) > max_bytes:
        raise AnswerError(f"answer over {max_bytes} bytes (Content-Length {text})", "large")
    return int(text)


class Plain:
    """A body of `length` bytes (None: up to the connection's end), kept as it arrives."""

    def __init__(self, max_bytes: int, length: int | None):
        self.max_bytes, self.length = max_bytes, length
        self.body = bytearray()

    def feed(self, data) -> bool:
        """Takes the next bytes; true once the body is whole (bytes past its length are dropped)."""
        self.body += data
        if self.length is not None and len(self.body) >= self.length:
            del self.body[self.length:]
            return True
        if len(self.body) > self.max_bytes:
            raise AnswerError(f"answer over {self.max_bytes} bytes", "large")
        return False

    def ended(self) -> None:
        if self.length is not None:
            raise AnswerError(f"the connection closed {self.length - len(self.body)} bytes short of the answer", "cut")


class Unchunked:
    """A chunked body decoded as its bytes arrive: the body and at most one unfinished size line are
    kept, never the framing or an object per chunk. `max_bytes` caps the bytes on the wire, framing
    included; past the first FREE_CHUNKS chunks, chunks that average less than MIN_MEAN_CHUNK_BYTES are
    refused, so the work per byte is bounded whatever the chunking (a Prometheus answering 60 MiB in
    1-byte chunks took `gpu-spatial report` to 1.8 GB)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.body = bytearray()
        self.line = bytearray()  # an unfinished size line, or the end of a chunk's data (its CRLF)
        self.left = 0  # data bytes of the current chunk still to come
        self.after_data = False  # the next line is the empty one closing a chunk's data
        self.done = False  # the last chunk came
        self.chunks = self.declared = self.wire = 0

    def feed(self, data) -> bool:
        """Takes the next bytes; true once the last chunk came (trailers are not read)."""
        self.wire += len(data)
        if self.wire > self.max_bytes:
            raise AnswerError(f"answer over {self.max_bytes} bytes", "large")
        view, at = memoryview(data), 0
        while at < len(data) and not self.done:
            if self.left:
                taken = min(self.left, len(data) - at)
                self.body += view[at:at + taken]
                at += taken
                self.left -= taken
                self.after_data = not self.left
                continue
            end = data.find(b"\r\n", at) if not self.line else -1
            if end < 0:  # the line goes on past these bytes, or started in the last ones
                at = self._line_across(data, at)
                continue
            self._line(view[at:end])  # at most MAX_CHUNK_LINE_BYTES: _line says so
            at = end + 2
        return self.done

    def _line_across(self, data, at: int) -> int:
        """Adds bytes to an unfinished line; where it ends, acts on it. Returns where the line's bytes end."""
        start = len(self.line)
        self.line += data[at:at + MAX_CHUNK_LINE_BYTES + 2]
        end = self.line.find(b"\r\n", max(0, start - 1))
        if end < 0:
            if len(self.line) > MAX_CHUNK_LINE_BYTES + 1:  # over the cap even with the CR that may end it
                raise AnswerError(f"a chunk size line over {MAX_CHUNK_LINE_BYTES} bytes", "http")
            return at + len(self.line) - start
        line, used = bytes(self.line[:end]), end + 2 - start
        self.line.clear()
        self._line(line)
        return at + used

    def _line(self, line) -> None:
        """Acts on one line of framing: the end of a chunk's data, or the size of the next."""
        if len(line) > MAX_CHUNK_LINE_BYTES:
            raise AnswerError(f"a chunk size line over {MAX_CHUNK_LINE_BYTES} bytes", "http")
        if self.after_data:
            if len(line):
                raise AnswerError("a chunk longer than its size", "http")
            self.after_data = False
            return
        size_text = bytes(line).split(b";", 1)[0].strip()
        if not CHUNK_SIZE.fullmatch(size_text):
            raise AnswerError(f"chunk size {size_text[:20]!r} is no number", "http")
        size = int(size_text, 16)
        if size == 0:
            self.done = True
            return
        self.chunks += 1
        self.declared += size
        if len(self.body) + size > self.max_bytes:
            raise AnswerError(f"answer over {self.max_bytes} bytes (a chunk of {size})", "large")
        if self.chunks > FREE_CHUNKS and self.declared < self.chunks * MIN_MEAN_CHUNK_BYTES:
            raise AnswerError(f"{self.chunks} chunks of {self.declared} bytes: chunked finer than "
                              f"{MIN_MEAN_CHUNK_BYTES} bytes a chunk", "http")  # no HTTP server's way
        self.left = size

    def ended(self) -> None:
        raise AnswerError("the connection closed inside a chunked answer", "cut")


def values_at_most(body: bytes | bytearray) -> int:
    """An upper bound of the Python objects a JSON text parses into: every value and every key but the
    first follows a comma, a colon or an opening bracket or brace (those inside strings only make the
    bound looser)."""
    return body.count(b",") + body.count(b":") + body.count(b"[") + body.count(b"{") + 1


def parse_json(body: bytes | bytearray, max_values: int):
    """The JSON of an answer, refused before parsing when it could hold more than `max_values` values
    (each a Python object), and when it nests deeper than the interpreter recurses."""
    if values_at_most(body) > max_values:
        raise AnswerError(f"JSON of more than {max_values} values", "large")
    try:
        return json.loads(body)
    except RecursionError:
        raise AnswerError("JSON nested too deeply", "json") from None
    except ValueError:  # UnicodeDecodeError included
        raise AnswerError("not JSON", "json") from None
