"""The HTTP server and the command lines as a user or an attacker meets them (issues 25 and 27): the
real exporter as a process on 127.0.0.1, attacked over real sockets (pipelined requests, long query
strings, an upload refused while it is still being sent), stopped by real signals; /docs rendered by
headless Chromium with no network; the command lines' --version, program names, durations and a
reader that leaves. Latency is never asserted as a wall time: scrapes must keep succeeding within a
generous timeout (bench/http_attacks.py measures the real figures, bench/RESULTS.md)."""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path

import pytest

from exporter.config import build_parser, parse_args
from exporter.server import DRAIN_MAX_BYTES, MAX_QUEUED, MAX_TARGET_BYTES
from tests.helpers import FIXTURES, ROOT, http_get, wait_for
from tests.http_load import Scraper, pipelining, query_strings
from tests.test_exposure import MB, SHORT, connect, exporter_under_attack, memory, reset_peak

SCRAPE_TIMEOUT_S = 5.0  # a scrape slower than this on the loaded CI machine is a failure, not a figure
VERSION = metadata.version("gpu-spatial-exporter")


def responses(sock: socket.socket, until: int | None = None, limit: float = 30.0) -> tuple[int, bool]:
    """Reads until the server closes, or `until` responses came (or `limit` s passed): how many HTTP
    responses came, and whether the server closed the connection."""
    sock.settimeout(limit)
    data, closed = b"", False
    try:
        while until is None or data.count(b"HTTP/1.1 200 OK") < until:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            data += chunk
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    return data.count(b"HTTP/1.1 200 OK"), closed


def grown_while(exporter, attack) -> int:
    """Bytes the exporter's peak resident memory grew while `attack()` ran, scrapes going on meanwhile
    (each must succeed within SCRAPE_TIMEOUT_S)."""
    for _ in range(3):
        http_get(exporter.url + "/metrics")
    time.sleep(1)
    before = memory(exporter.proc.pid)
    reset_peak(exporter.proc.pid)
    with Scraper(exporter.port, timeout=SCRAPE_TIMEOUT_S) as scraper:
        attack()
    assert scraper.latencies and not scraper.failures, scraper.failures[:3]
    assert get_status(exporter, "/metrics") == 200
    return memory(exporter.proc.pid, "VmHWM") - before


def get_status(exporter, path: str) -> int:
    return http_get(exporter.url + path, timeout=SCRAPE_TIMEOUT_S)[0]


# --- pipelining (issue 25, 1) ----------------------------------------------------------------------

def test_pipelined_requests_queue_at_most_max_queued_then_the_connection_closes():
    request = b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n"
    with exporter_under_attack(*SHORT) as exporter:
        sock = connect(exporter.port)
        sock.sendall(request * 100)  # one write, one read for the server
        answered, closed = responses(sock)
        sock.close()
        assert (answered, closed) == (1 + MAX_QUEUED, True)  # one answered, MAX_QUEUED queued behind it
        sock = connect(exporter.port)  # at the bound: every request answered, the connection kept
        sock.sendall(request * (1 + MAX_QUEUED))
        assert responses(sock, until=1 + MAX_QUEUED) == (1 + MAX_QUEUED, False)
        sock.sendall(request)
        assert responses(sock, until=1) == (1, False)  # still open: one more is answered
        sock.close()


def test_forty_connections_pipelining_ten_thousand_requests_cost_under_10_mb_and_scrapes_go_on():
    with exporter_under_attack(*SHORT) as exporter:
        grown = grown_while(exporter, lambda: pipelining(exporter.port, connections=40, requests=10_000, seconds=5))
        assert grown < 10 * MB, f"RSS grew by {grown / MB:.1f} MB"


# --- request targets and query strings (issue 25, 2) ----------------------------------------------

def target_of(size: int) -> bytes:
    head = b"/metrics?pad="
    return head + b"p" * (size - len(head))


def test_a_request_target_over_the_cap_is_414_and_one_at_it_is_served():
    with exporter_under_attack(*SHORT) as exporter:
        for size, status in ((MAX_TARGET_BYTES, b"200"), (MAX_TARGET_BYTES + 1, b"414")):
            sock = connect(exporter.port)
            sock.sendall(b"GET " + target_of(size) + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            said = b""
            while chunk := sock.recv(65536):
                said += chunk
            sock.close()
            assert said.startswith(b"HTTP/1.1 " + status), (size, said[:100])


def test_many_clients_with_60_kb_query_strings_get_414_and_scrapes_go_on():
    with exporter_under_attack(*SHORT) as exporter:
        assert get_status(exporter, "/api/v1/gpus") == 200  # FastAPI's one-time load is not the attack's
        seen = {}
        grown = grown_while(exporter, lambda: seen.update(query_strings(exporter.port, 16, 60_000, seconds=5)))
        assert set(seen["answers"]) == {"414"}, seen
        assert grown < 10 * MB, f"RSS grew by {grown / MB:.1f} MB"


def test_the_framework_never_sees_a_query_string_no_endpoint_takes():
    from exporter.app import TAKES_QUERY, LazyApi

    seen = []

    async def framework(scope, receive, send):
        seen.append(scope["query_string"])

    class Engine:  # /api/v1/gpus is never reached: the recorder stands in for FastAPI
        snapshot = interval = None

    lazy = LazyApi(Engine())
    lazy._app = framework
    scope = {"type": "http", "method": "GET", "path": "/api/v1/gpus", "query_string": b"a=1&" * 2000}
    asyncio.run(lazy(scope, None, None))
    assert TAKES_QUERY == frozenset() and seen == [b""]


# --- the JSON API switched off (issue 25, 3) ----------------------------------------------------

def test_no_api_answers_404_with_why_and_never_loads_fastapi():
    with exporter_under_attack(*SHORT, "--no-api") as exporter:
        for path in ("/api/v1/gpus", "/api/v1/workloads", "/docs", "/openapi.json"):
            status, body = http_get(exporter.url + path)
            assert status == 404 and "--no-api" in json.loads(body)["error"] and body.count(b"\n") == 0, path
        assert get_status(exporter, "/metrics") == 200 and get_status(exporter, "/healthz") == 200
        maps = open(f"/proc/{exporter.proc.pid}/maps").read()
        assert "pydantic_core" not in maps  # FastAPI's models were never imported
        assert "JSON API off" in exporter.log()


def test_no_api_with_an_upload_token_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "exporter", "--no-api", "--nsys-upload-token", "t", "--no-nvml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--no-api" in lines[0], done.stderr


# --- an answer before the body (issue 27, 1) ----------------------------------------------------

def uploads(tmp_path):
    return exporter_under_attack(*SHORT, "--nsys-upload-token", "s3cret", "--nsys-spool-dir", str(tmp_path),
                                 "--nsys-upload-max-bytes", "64M")


def test_urllib_posting_a_large_export_with_a_wrong_token_reads_401(tmp_path):
    """urllib sends `Connection: close` and reads only after sending everything: a server that closed
    right after its 401 reset the connection under it (Broken pipe), whatever the timing, at this size."""
    body = (FIXTURES / "h100_diag_mps.sqlite").read_bytes() * 8  # 27 MB, more than the sockets buffer
    assert len(body) < DRAIN_MAX_BYTES
    with uploads(tmp_path) as exporter:
        for endpoint in ("/api/v1/diagnose", "/api/v1/nsys"):
            request = urllib.request.Request(exporter.url + endpoint, data=body, method="POST",
                                             headers={"Authorization": "Bearer wrong"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=60)
            assert refused.value.code == 401 and "bearer token" in json.loads(refused.value.read())["error"]
        assert list(tmp_path.iterdir()) == []


def answer_of(sock: socket.socket) -> bytes:
    said = b""
    while b"\r\n\r\n" not in said:
        said += sock.recv(65536)
    head, _, rest = said.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head


def post_head(declared: int) -> bytes:
    return (f"POST /api/v1/diagnose HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer wrong\r\nConnection: close\r\n"
            f"Content-Length: {declared}\r\n\r\n").encode()


def test_a_refused_body_is_drained_up_to_the_cap_and_cut_past_it(tmp_path):
    with uploads(tmp_path) as exporter:
        sock = connect(exporter.port, timeout=30)
        sock.sendall(post_head(DRAIN_MAX_BYTES))
        assert answer_of(sock).startswith(b"HTTP/1.1 401 ")  # answered before the body came
        sock.sendall(b"x" * DRAIN_MAX_BYTES)  # read and dropped: no reset
        assert sock.recv(1) == b""  # then the close the client asked for
        sock.close()
        sock = connect(exporter.port, timeout=30)
        sock.sendall(post_head(DRAIN_MAX_BYTES + 1))
        assert answer_of(sock).startswith(b"HTTP/1.1 401 ")
        assert sock.recv(1) == b""  # more than is worth reading: closed at once
        sock.close()


# --- ports, signals (issue 27, 2 and 3) ---------------------------------------------------------

def start_exporter(*args: str) -> tuple[subprocess.Popen, str]:
    log = tempfile.NamedTemporaryFile(prefix="exporter-", suffix=".log", delete=False).name
    proc = subprocess.Popen([sys.executable, "-m", "exporter", *SHORT, *args], cwd=ROOT, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    return proc, log


def test_port_0_logs_the_port_bound_and_a_port_over_65535_is_refused():
    proc, log = start_exporter("--port", "0")
    try:
        line = wait_for(lambda: re.search(r"serving on http://127\.0\.0\.1:(\d+)/metrics", open(log).read()), 30,
                        what="the serving line")
        port = int(line.group(1))
        assert port != 0
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 30, what="healthz on that port")
    finally:
        proc.terminate()
        proc.wait(30)
    done = subprocess.run([sys.executable, "-m", "exporter", *SHORT, "--port", "99999"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--port" in lines[0] and "65535" in lines[0], lines


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_exporter_with_one_line_and_exit_0(sig):
    proc, log = start_exporter("--port", "0")
    try:
        line = wait_for(lambda: re.search(r"serving on http://127\.0\.0\.1:(\d+)/metrics", open(log).read()), 60,
                        what="the serving line")
        # The line comes before the server takes the signals over: on a busy machine a signal sent at once
        # lands in the start ("stopped by SIGINT while starting"). Answering means it took them.
        wait_for(lambda: http_get(f"http://127.0.0.1:{line.group(1)}/healthz")[0] == 200, 60, what="serving")
        proc.send_signal(sig)
        assert proc.wait(60) == 0, open(log).read()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = open(log).read()
    assert "Traceback" not in text and text.count(f"stopping on {sig.name}") == 1, text
    assert text.strip().splitlines()[-1].endswith(f"stopping on {sig.name}"), text  # and nothing after it


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_as_the_start_ends_is_one_line_whichever_side_it_lands(sig):
    """Sent the moment the serving line appears: the signal lands in the start (before the server took the
    signals over) or in the server, by the machine's pace; either way exactly one line and exit 0 (before,
    a stop in the start printed two lines of RuntimeWarning about uvicorn's unawaited serve())."""
    proc, log = start_exporter("--port", "0")
    try:
        wait_for(lambda: "serving on" in open(log).read(), 60, 0.001, what="the serving line")
        proc.send_signal(sig)
        assert proc.wait(60) == 0, open(log).read()
    finally:
        if proc.poll() is None:
            proc.kill()
    after = open(log).read().split("serving on", 1)[1].strip().splitlines()[1:]
    assert len(after) == 1 and after[0].endswith((f"stopping on {sig.name}", f"stopped by {sig.name} while starting")), after


# --- the command lines (issue 27, 5 and 6) ------------------------------------------------------

def run(*argv: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "NSYS_INGEST_NO_PROGRESS": "1"})


@pytest.mark.parametrize("argv, name", [
    (("exporter",), "python3 -m exporter"), (("nsys_ingest",), "python3 -m nsys_ingest"),
    (("nsys_ingest", "summary"), "python3 -m nsys_ingest summary"), (("gpu_spatial",), "gpu-spatial"),
    (("gpu_spatial", "exporter"), "gpu-spatial exporter"), (("gpu_spatial", "top"), "gpu-spatial top"),
    (("gpu_spatial", "report"), "gpu-spatial report"), (("gpu_spatial", "nsys"), "gpu-spatial nsys")])
def test_every_command_tells_its_version_under_the_name_typed(argv, name):
    done = run(*argv, "--version")
    assert done.returncode == 0 and done.stdout == f"{name} {VERSION}\n", (done.stdout, done.stderr)


def test_usage_lines_name_the_command_typed():
    assert run("gpu_spatial", "exporter", "--bogus").stderr.startswith("gpu-spatial exporter: error:")
    assert run("exporter", "--bogus").stderr.startswith("python3 -m exporter: error:")
    assert run("gpu_spatial", "nsys", "summary").stderr.startswith("usage: gpu-spatial nsys summary")
    assert run("nsys_ingest", "summary").stderr.startswith("usage: python3 -m nsys_ingest summary")


def test_every_duration_flag_takes_the_same_suffixes_and_help_says_it_once():
    parser = build_parser()
    durations = [a for a in parser._actions if getattr(a.type, "__name__", "") == "_duration"]
    flags = {a.option_strings[0] for a in durations}
    assert {"--interval", "--dcgm-timeout", "--dcgm-window", "--nsys-window", "--mps-timeout", "--kubelet-interval",
            "--held-idle-after", "--http-idle-timeout"} <= flags, flags
    for action in durations:
        assert getattr(parse_args([action.option_strings[0], "1s"]), action.dest) == 1.0, action.option_strings
    assert parse_args(["--interval", "1m"]).interval == 60.0
    text = parser.format_help()
    assert "%%" not in text and "under 1% of" in " ".join(text.split())
    for entry in re.split(r"\n  (?=-)", text):
        assert entry.count("suffixes") <= 1, entry


@pytest.mark.parametrize("argv", [("nsys_ingest", "summary"), ("gpu_spatial", "nsys", "summary")])
def test_a_reader_that_leaves_ends_the_command_quietly_with_0(argv):
    proc = subprocess.Popen([sys.executable, "-m", *argv, str(FIXTURES / "h100_quarter_sms_50hz.sqlite")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": "/usr/bin:/bin", "NSYS_INGEST_NO_PROGRESS": "1"})
    proc.stdout.close()  # `| head -1` gone before the first line
    err = proc.stderr.read()
    assert proc.wait(120) == 0 and err == b"", err


# --- /docs air-gapped (issue 27, 8) ----------------------------------------------------------------

@pytest.mark.skipif(shutil.which("chromium") is None, reason="missing tool: chromium")
def test_docs_render_every_operation_without_network(tmp_path):
    with exporter_under_attack(*SHORT) as exporter:
        status, page = http_get(exporter.url + "/docs")
        assert status == 200 and not re.search(rb"https?://", page), page  # nothing from a CDN
        profile = tmp_path / "profile"
        common = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                  # no network but this host: a name to resolve fails, as on an air-gapped cluster
                  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--virtual-time-budget=30000"]
        dom = subprocess.run([*common, "--dump-dom", exporter.url + "/docs"], capture_output=True, text=True,
                             timeout=120).stdout
        shot = tmp_path / "docs.png"
        subprocess.run([*common, f"--screenshot={shot}", "--window-size=1280,1600", exporter.url + "/docs"],
                       capture_output=True, timeout=120)
    paths = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom))
    schema = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert paths == set(schema["paths"]), paths
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    colours = {tuple(p) for p in (pixels[::5, ::5, :3] * 255).astype(int).reshape(-1, 3).tolist()}
    assert len(colours) > 20, ("a blank or unstyled page", len(colours))  # the operations' coloured bands


def server_side_open(server_port: int, client_port: int) -> bool:
    """Whether the server still holds its end of the connection from `client_port` (the fd count also
    moves with every other connection). Once the server closes it, the kernel may keep it a while as an
    orphan trying to send the rest, with no file of the process behind it (inode 0)."""
    wanted = (f"0100007F:{server_port:04X}", f"0100007F:{client_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == wanted and fields[9] != "0":
            return True
    return False


def test_a_client_that_never_reads_is_let_go_with_what_it_left_unsent():
    """Past the deadline, the server drops the unsent answers: a close that waited for them to be
    sent would keep the socket (and its buffers) until the client chose to leave."""
    with exporter_under_attack(*SHORT, "--http-body-timeout", "1s") as exporter:
        assert get_status(exporter, "/docs") == 200
        sock = connect(exporter.port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /docs/assets/swagger-ui-bundle.js HTTP/1.1\r\nHost: a\r\n\r\n" * (1 + MAX_QUEUED))
        assert sock.recv(12) == b"HTTP/1.1 200"  # accepted and answering; the rest is never read
        client_port = sock.getsockname()[1]
        assert server_side_open(exporter.port, client_port)
        wait_for(lambda: not server_side_open(exporter.port, client_port), 60,
                 what="the server letting go of a client that never reads")
        sock.close()


def never_reading(port: int, request: bytes, clients: int) -> list[socket.socket]:
    """`clients` sockets (receive buffer 4 KB, from another address than the scrapers') that send
    `request` and never read."""
    socks = []
    for _ in range(clients):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.bind(("127.0.0.2", 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        socks.append(sock)
    return socks


def test_clients_that_never_read_the_docs_script_cost_a_bounded_heap():
    """200 clients each pipelining 9 requests for the 1.5 MB Swagger UI script and never reading (issue 42,
    item 10: 400 of them held +41 MB, +101 MB pipelined): the script is one copy every answer shares, and
    the answers waiting on them are bounded in all; scrapes go on."""
    with exporter_under_attack(*SHORT, "--http-body-timeout", "10m") as exporter:
        assert get_status(exporter, "/docs/assets/swagger-ui-bundle.js") == 200
        socks = []
        try:
            request = b"GET /docs/assets/swagger-ui-bundle.js HTTP/1.1\r\nHost: a\r\n\r\n" * (1 + MAX_QUEUED)
            grown = grown_while(exporter, lambda: socks.extend(never_reading(exporter.port, request, 200)))
        finally:
            for sock in socks:
                sock.close()
        assert grown < 10 * MB, f"RSS grew by {grown / MB:.1f} MB"


def test_past_the_unsent_budget_the_clients_waiting_longest_are_closed_at_once(monkeypatch):
    """The guard in the real server (uvicorn, real sockets), answering 6 MB made anew for each request:
    12 clients that never read, each left with 2-6 MB unsent (what the kernel does not take). Past
    MAX_UNSENT_BYTES in all, the longest waiting are closed at once (their deadline is 10 minutes
    away): one to four are left waiting, the newest among them, never none, never all; a client that
    read its answer (waiting on it for a while, as any client of 6 MB does) keeps its connection."""
    import http.client
    import threading

    import uvicorn

    import exporter.server
    from exporter.server import MAX_UNSENT_BYTES, Guard, Limits, protocol_for

    body_bytes = 6 * MB
    assert 4 * MB < body_bytes < MAX_UNSENT_BYTES

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(body_bytes).encode())]})
        await send({"type": "http.response.body", "body": bytes(body_bytes)})

    guard, closed = Guard(Limits(body_timeout=600.0)), []
    close = guard.close  # why each connection was closed (the guard's own count is emptied by its log line)
    guard.close = lambda conn, reason, answer=b"": (closed.append(reason), close(conn, reason, answer))[1]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=protocol_for(guard), ws="none", lifespan="off",
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    socks = []
    try:
        wait_for(lambda: server.started, 30, what="the server up")
        port = sock.getsockname()[1]
        reader = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # kept alive
        reader.request("GET", "/")
        assert len(reader.getresponse().read()) == body_bytes
        socks = never_reading(port, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 12)
        wait_for(lambda: closed.count("not reading, over the unsent budget") + len(guard.blocked) == 12, 60,
                 what="every client answered, closed or waiting")
        waiting = {c.client[1] for c in list(guard.blocked)}
        assert 1 <= len(waiting) <= 4 and len(guard.connections) == len(waiting) + 1, (waiting, len(guard.connections))
        assert socks[-1].getsockname()[1] in waiting and socks[0].getsockname()[1] not in waiting
        unsent = sum(c.transport.get_write_buffer_size() for c in list(guard.blocked))
        assert unsent <= MAX_UNSENT_BYTES
        # the budget at its boundary: exactly what waits is within it, a byte less is not (the oldest goes)
        for budget, closes in ((unsent, 0), (unsent - 1, 1)):
            monkeypatch.setattr(exporter.server, "MAX_UNSENT_BYTES", budget)
            newest, counted = list(guard.blocked)[-1], len(closed)
            done = threading.Event()
            newest.loop.call_soon_threadsafe(lambda: (guard.not_reading(newest), done.set()))
            assert done.wait(30) and len(closed) - counted == closes
        reader.request("GET", "/")  # on the same connection
        assert len(reader.getresponse().read()) == body_bytes and reader.sock is not None
        reader.close()
    finally:
        for client in socks:
            client.close()
        server.should_exit = True
        thread.join(10)


def test_malformed_and_upgrade_requests_are_answered_and_counted_not_logged_one_by_one():
    with exporter_under_attack(*SHORT) as exporter:
        for _ in range(20):
            sock = connect(exporter.port)
            sock.sendall(b"GARBAGE\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 400 "), "malformed"
            sock.close()
            sock = connect(exporter.port)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            assert responses(sock) == (1, True)  # answered as a plain request, then closed
            sock.close()
        wait_for(lambda: "bad request" in exporter.log(), 30, what="the limits' report")
        lines = exporter.log().splitlines()
    assert len([line for line in lines if "request" in line.lower() or "upgrade" in line.lower()]) <= 2, lines
