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
DEADLINE_EVERY_CHUNKS = 4096  # the deadline is looked at this often while chunks are decoded
STATUS_LINE = re.compile(rb"^HTTP/1\.[01] ([0-9]{3})(?: |$)")


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
    raw = bytearray()
    head_end = length = None
    status, fields = 0, {}
    while True:
        sock.settimeout(left(deadline))
        chunk = sock.recv(READ_BYTES)
        if not chunk:
            break
        raw += chunk
        if head_end is None:
            found = raw.find(b"\r\n\r\n", max(0, len(raw) - len(chunk) - 3))
            if found < 0:
                if len(raw) > MAX_HEAD_BYTES:
                    raise AnswerError(f"headers over {MAX_HEAD_BYTES} bytes", "large")
                continue
            head_end = found + 4
            status, fields = _head(bytes(raw[:found]))
            if "chunked" not in fields.get("transfer-encoding", "").lower() and "content-length" in fields:
                length = _length(fields["content-length"], max_bytes)
        if len(raw) - head_end > max_bytes:
            raise AnswerError(f"answer over {max_bytes} bytes", "large")
        if length is not None and len(raw) - head_end >= length:
            break
    if head_end is None:
        raise AnswerError("the connection closed before the headers ended", "cut")
    del raw[:head_end]  # in place: the body is never copied whole
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return Answer(status, fields, _unchunk(raw, deadline))
    if length is not None:
        if len(raw) < length:
            raise AnswerError(f"the connection closed {length - len(raw)} bytes short of the answer", "cut")
        del raw[length:]
    return Answer(status, fields, raw)


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


def _unchunk(raw: bytearray, deadline: float) -> bytes:
    """The body of a chunked answer; the deadline still holds while many tiny chunks are decoded."""
    pieces, at = [], 0
    for count in range(len(raw) + 1):
        if count % DEADLINE_EVERY_CHUNKS == 0:
            left(deadline)
        line_end = raw.find(b"\r\n", at)
        if line_end < 0:
            break
        size_text = raw[at:line_end].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise AnswerError(f"chunk size {size_text[:20]!r} is no number", "http") from None
        if size == 0:
            return b"".join(pieces)
        pieces.append(raw[line_end + 2:line_end + 2 + size])
        at = line_end + 2 + size + 2
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
