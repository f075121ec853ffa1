"""Safe to expose (issue 17): the exporter as a real process, attacked over real sockets on
127.0.0.1 (clients from other loopback addresses where the attack's source matters); the
compose stack closed by default; the flags that keep secrets off the command line."""
import contextlib
import gzip
import http.client
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from exporter.config import build_parser
from tests.helpers import FIXTURES, ROOT, Exporter, free_port, wait_for

MB = 1024 * 1024
SHORT = ["--no-nvml", "--no-mps"]


@contextlib.contextmanager
def exporter_under_attack(*args, env=None):
    """The exporter as a process; whatever was thrown at it, its log holds no traceback."""
    with Exporter(*args, env=env) as exporter:
        yield exporter
    assert "Traceback" not in exporter.log(), exporter.log()


def memory(pid: int, field: str = "VmRSS") -> int:
    """Bytes of a /proc/PID/status field: VmRSS now, VmHWM the peak since `reset_peak`."""
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1)) * 1024


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # the peak resident size starts again from the current one


def connect(port: int, source: str = "127.0.0.1", timeout: float = 5.0) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def closed_after(sock: socket.socket, limit: float, trickle: bytes = b"") -> tuple[float, bytes]:
    """Seconds until the server closes `sock` (at most `limit`), sending `trickle` one byte a second
    meanwhile; and what the server said before closing."""
    sock.settimeout(0.2)
    start = time.monotonic()
    said, next_byte = b"", 0
    while time.monotonic() - start < limit:
        if trickle and next_byte < len(trickle) and time.monotonic() - start >= next_byte:
            try:
                sock.send(trickle[next_byte:next_byte + 1])
            except OSError:
                return time.monotonic() - start, said
            next_byte += 1
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - start, said
        if not chunk:
            return time.monotonic() - start, said
        said += chunk
    return limit, said


def get(port: int, path: str = "/metrics", method: str = "GET", headers=None, source: str = "127.0.0.1"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def request_of_size(size: int) -> bytes:
    """A GET /metrics whose request line and headers are exactly `size` bytes."""
    head, tail = b"GET /metrics HTTP/1.1\r\nHost: a\r\nX-Pad: ", b"\r\n\r\n"
    return head + b"p" * (size - len(head) - len(tail)) + tail


# --- header cap -----------------------------------------------------------------------------------

def test_a_100_mb_header_is_refused_without_the_process_growing():
    with exporter_under_attack(*SHORT) as exporter:
        time.sleep(1)
        before = memory(exporter.proc.pid)
        reset_peak(exporter.proc.pid)
        sock = connect(exporter.port, timeout=2)
        sent = 0
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: a\r\nX-Big: ")
            chunk = b"x" * (64 * 1024)
            while sent < 100 * MB:  # the server stops reading: sendall times out once the buffers are full
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # socket.timeout included
            pass
        _, said = closed_after(sock, 5)
        sock.close()
        grown = memory(exporter.proc.pid, "VmHWM") - before  # the peak: freed memory was still taken
        assert grown < 10 * MB, f"RSS grew by {grown / MB:.1f} MB"
        assert sent < 50 * MB, f"{sent} bytes were taken in"
        assert said.startswith(b"HTTP/1.1 431 "), said[:200]
        assert get(exporter.port)[0] == 200


def test_the_header_cap_holds_at_its_boundary():
    with exporter_under_attack(*SHORT, "--http-max-header-bytes", "8K") as exporter:
        for size, expected in ((8191, b"HTTP/1.1 200 "), (8192, b"HTTP/1.1 200 "), (8193, b"HTTP/1.1 431 ")):
            sock = connect(exporter.port)
            sock.sendall(request_of_size(size))
            said = sock.recv(64)
            sock.close()
            assert said.startswith(expected), (size, said)


def test_a_body_in_the_same_packet_as_the_headers_is_not_counted_as_header():
    """64 KB of body behind 7 KB of headers, with an 8 KB header cap: the body is a body."""
    with exporter_under_attack(*SHORT, "--http-max-header-bytes", "8K") as exporter:
        sock = connect(exporter.port)
        body = b"b" * (64 * 1024)
        head = request_of_size(7 * 1024).replace(b"GET ", b"POST ").replace(
            b"Host: a\r\n", b"Host: a\r\nContent-Length: %d\r\n" % len(body))
        sock.sendall(head + body)
        said = sock.recv(256)
        sock.close()
        assert said.startswith(b"HTTP/1.1 405 "), said


def test_the_header_cap_holds_for_the_next_request_after_an_early_answer():
    """A body answered before it ended (405 on POST /metrics), then an oversized next request on
    the same connection: its header bytes are counted as headers, not as the old body."""
    with exporter_under_attack(*SHORT, "--http-max-header-bytes", "8K") as exporter:
        sock = connect(exporter.port)
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n")
        answer = b""
        for _ in range(10):  # the 405 may come in more than one segment
            answer += sock.recv(1000)
            if answer.endswith(b"GET and HEAD\n"):
                break
        assert answer.startswith(b"HTTP/1.1 405 ")
        sock.sendall(b"0123456789")
        time.sleep(0.2)
        sock.sendall(request_of_size(8193))
        _, said = closed_after(sock, 5)
        sock.close()
        assert said.startswith(b"HTTP/1.1 431 "), said
        # In the same packet as the body's end: that one read is parsed as it comes, the reads
        # after it are counted again.
        sock = connect(exporter.port)
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0123456789"
                     + request_of_size(MB))
        _, said = closed_after(sock, 5)
        sock.close()
        assert said.startswith(b"HTTP/1.1 405 ") and said.count(b"HTTP/1.1") == 1, said  # answered, then closed


# --- timeouts -------------------------------------------------------------------------------------

TIMEOUTS = [*SHORT, "--http-header-timeout", "3", "--http-idle-timeout", "2", "--http-body-timeout", "3",
            "--http-body-min-rate", "1K"]


def test_slowloris_headers_are_closed_at_the_header_timeout():
    with exporter_under_attack(*TIMEOUTS) as exporter:
        sock = connect(exporter.port)
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        took, said = closed_after(sock, 15, trickle=b"X-Slow: " + b"s" * 60)
        sock.close()
        # header timeout 3 s from the first byte: not before; after it, well under the 10 s default (a busy
        # machine's sweep may be late), and the 408 and the log line say which deadline closed it
        assert 2.5 <= took <= 8.0, took
        assert said.startswith(b"HTTP/1.1 408 "), said
        wait_for(lambda: "HTTP limits: closed 1 slow headers" in exporter.log(), 5, what="one log line")


def test_headers_that_arrive_within_the_timeout_are_served():
    with exporter_under_attack(*TIMEOUTS) as exporter:
        sock = connect(exporter.port)
        for part in (b"GET /metrics HTTP/1.1\r\n", b"Host: a\r\n", b"\r\n"):  # 2 s of a 3 s budget
            sock.sendall(part)
            time.sleep(1)
        assert sock.recv(64).startswith(b"HTTP/1.1 200 ")
        sock.close()


def test_idle_connections_are_closed_at_the_idle_timeout():
    with exporter_under_attack(*TIMEOUTS) as exporter:
        fresh = connect(exporter.port)
        took, said = closed_after(fresh, 10)
        assert 1.5 <= took <= 4.0 and said == b"", (took, said)  # never sent a byte: idle 2 s
        kept = connect(exporter.port)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        took, said = closed_after(kept, 10)
        assert said.startswith(b"HTTP/1.1 200 ") and 1.5 <= took <= 4.0, (took, said[:100])  # kept alive 2 s
        fresh.close()
        kept.close()


def test_a_slow_body_is_closed_and_a_steady_one_is_not():
    """Body timeout 3 s plus one second per KB: 1 byte a second is cut after ~3 s, 2 KB a second
    runs past it."""
    with exporter_under_attack(*TIMEOUTS) as exporter:
        head = b"POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n"
        slow = connect(exporter.port)
        slow.sendall(head)
        took, said = closed_after(slow, 15, trickle=b"b" * 60)
        slow.close()
        assert 2.5 <= took <= 8.0, took  # body timeout 3 s (+ 1 s per KB), well under the 30 s default
        assert said.startswith(b"HTTP/1.1 405 ")  # answered early; the body is still read (and dropped)
        steady = connect(exporter.port)
        steady.sendall(head.replace(b"1000000", b"12288"))
        for _ in range(12):  # 6 s at 2 KB/s
            steady.sendall(b"b" * 1024)
            time.sleep(0.5)
        steady.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")  # the same connection, still open
        said, deadline = b"", time.monotonic() + 30
        while said.count(b"HTTP/1.1 ") < 2 and time.monotonic() < deadline:
            chunk = steady.recv(65536)
            assert chunk, said
            said += chunk
        assert said.startswith(b"HTTP/1.1 405 ") and b"HTTP/1.1 200 " in said, said
        steady.close()


# --- connection bound -----------------------------------------------------------------------------

@pytest.mark.parametrize("attacker", ["127.0.0.2", "127.0.0.1"])
def test_scrapes_and_probes_get_in_while_an_attacker_holds_every_connection(attacker):
    """The exporter may open 150 files and serve 60 connections; an attacker holds 300 idle or
    slowloris connections (from another address, or from the scraper's own) while another
    address keeps opening more. Without the bound the files run out and scrapes are reset; with
    it every scrape and probe answers within a second."""
    with exporter_under_attack(*SHORT, "--http-max-connections", "60", "--http-idle-timeout", "60",
                               "--http-header-timeout", "60") as exporter:
        resource.prlimit(exporter.proc.pid, resource.RLIMIT_NOFILE, (150, 150))
        held, stop = [], threading.Event()
        for i in range(300):
            sock = connect(exporter.port, source=attacker)
            if i % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            held.append(sock)

        def keep_opening():
            for _ in range(2000):
                if stop.is_set():
                    return
                try:
                    held.append(connect(exporter.port, source="127.0.0.3", timeout=1))
                except OSError:
                    time.sleep(0.01)

        attacker = threading.Thread(target=keep_opening, daemon=True)
        attacker.start()
        try:
            for i in range(10):
                path = "/metrics" if i % 2 else "/healthz"
                t0 = time.monotonic()
                status, _, _ = get(exporter.port, path)
                assert status == 200 and time.monotonic() - t0 < 1.0, (path, status, time.monotonic() - t0)
        finally:
            stop.set()
            attacker.join(10)
            for sock in held:
                sock.close()
        assert "Too many open files" not in exporter.log()


def test_the_bound_fits_under_the_open_file_limit(tmp_path):
    """Hard limit 200 files: the 512 connections asked for would starve the samplers, so the
    bound drops to 200 - 128 = 72, said in one warning."""
    log = tmp_path / "log"
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", *SHORT, "--port", str(port)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200)))
    try:
        wait_for(lambda: "at most" in log.read_text(), 20, what="the warning")
        assert "open-file limit 200: serving at most 72 connections instead of 512" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(10)


def test_over_the_bound_the_address_holding_the_most_connections_gives_one_up():
    """Bound 2: a scraper's kept-alive connection (the oldest, idle) stays while another address
    opens five: that address's own oldest connections make room."""
    with exporter_under_attack(*SHORT, "--http-max-connections", "2", "--http-idle-timeout", "60") as exporter:
        first = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)
        first.request("GET", "/healthz")
        assert first.getresponse().read()
        others = [connect(exporter.port, source="127.0.0.2") for _ in range(5)]
        time.sleep(0.5)
        first.request("GET", "/healthz")  # idle, but its address holds one connection against five
        assert first.getresponse().status == 200
        for sock in others:
            sock.close()
        first.close()


# --- /metrics niceties ----------------------------------------------------------------------------

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                     "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def test_openmetrics_gzip_head_and_wrong_methods():
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    with exporter_under_attack("--no-mps", "--nvml-replay", str(FIXTURES / "nvml_h100_phases.json")) as exporter:
        wait_for(lambda: b"gpu_power_watts" in get(exporter.port)[2], 10, what="NVML values")
        status, headers, body = get(exporter.port, headers={"Accept": PROMETHEUS_ACCEPT})
        assert status == 200 and headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert body.endswith(b"# EOF\n") and body.count(b"# EOF") == 1
        om_names = {f.name for f in parse_om(body.decode())}
        assert "gpu_power_watts" in om_names and "process_resident_memory_bytes" in om_names

        status, headers, plain = get(exporter.port, headers={"Accept": "application/openmetrics-text;q=0, text/plain"})
        assert headers["content-type"].startswith("text/plain") and b"# EOF" not in plain
        text_names = {f.name for f in parse_text(plain.decode())}
        assert "gpu_power_watts" in text_names

        status, headers, packed = get(exporter.port, headers={"Accept-Encoding": "gzip"})
        assert status == 200 and headers["content-encoding"] == "gzip"
        assert {f.name for f in parse_text(gzip.decompress(packed).decode())} == text_names
        status, headers, packed = get(exporter.port, headers={"Accept": PROMETHEUS_ACCEPT,
                                                              "Accept-Encoding": "deflate, gzip;q=0.5"})
        assert headers["content-encoding"] == "gzip" and gzip.decompress(packed).endswith(b"# EOF\n")
        status, headers, _ = get(exporter.port, headers={"Accept-Encoding": "gzip;q=0"})
        assert "content-encoding" not in headers

        status, headers, body = get(exporter.port, method="HEAD")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 1000
        for method in ("POST", "PUT", "DELETE", "OPTIONS"):
            status, headers, _ = get(exporter.port, method=method)
            assert status == 405 and headers["allow"] == "GET, HEAD", method


def test_each_format_and_encoding_is_rendered_once_per_snapshot():
    from exporter.app import build_registry
    from exporter.engine import Engine
    from exporter.fastpath import MetricsCache
    from exporter.nvml_replay import ReplayNvml
    from exporter.samplers.nvml import NvmlSampler

    engine = Engine(NvmlSampler(ReplayNvml(FIXTURES / "nvml_h100_quarter_sms_frame.json"), interval=0.5),
                    interval=0.5)
    engine.tick_devices()
    engine.publish()
    cache = MetricsCache(engine, build_registry(engine))
    bodies = {(om, gz): cache.render(om, gz) for om in (False, True) for gz in (False, True)}
    for (om, gz), body in bodies.items():
        assert cache.render(om, gz) is body  # same snapshot: the same bytes
    assert gzip.decompress(bodies[False, True]) == bodies[False, False]
    assert gzip.decompress(bodies[True, True]) == bodies[True, False]
    engine.publish()
    assert cache.render(True, True) is not bodies[True, True]


# --- flags, secrets and exit codes ----------------------------------------------------------------

def run_exporter(*args, env=None, timeout=30):
    return subprocess.run([sys.executable, "-m", "exporter", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_the_upload_token_is_read_from_a_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("  s3cret-from-file\n")
    with exporter_under_attack(*SHORT, "--nsys-upload-token-file", str(token), "--nsys-spool-dir", str(tmp_path)) as exporter:
        assert "s3cret-from-file" not in open(f"/proc/{exporter.proc.pid}/cmdline").read()
        assert get(exporter.port, "/api/v1/nsys", "POST", {"Authorization": "Bearer wrong"})[0] == 401
        status, _, _ = get(exporter.port, "/api/v1/nsys", "POST", {"Authorization": "Bearer s3cret-from-file"})
        assert status not in (401, 403, 404, 405), status  # past the token: the (empty) export is judged


def test_the_upload_token_is_read_from_the_environment(tmp_path):
    with exporter_under_attack(*SHORT, "--nsys-spool-dir", str(tmp_path),
                               env={"GPU_EXPORTER_NSYS_UPLOAD_TOKEN": "s3cret-from-env"}) as exporter:
        assert get(exporter.port, "/api/v1/nsys", "POST", {"Authorization": "Bearer wrong"})[0] == 401
        status, _, _ = get(exporter.port, "/api/v1/nsys", "POST", {"Authorization": "Bearer s3cret-from-env"})
        assert status not in (401, 403, 404, 405), status


@pytest.mark.parametrize("content", [b"", b" \n\t", None])
def test_an_empty_or_unreadable_token_file_is_one_line_and_exit_2(tmp_path, content):
    path = tmp_path / "token"
    if content is not None:
        path.write_bytes(content)
    done = run_exporter(*SHORT, "--port", str(free_port()), "--nsys-upload-token-file", str(path))
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert "--nsys-upload-token-file" in lines[0] and str(path) in lines[0]


def test_a_fifo_or_a_directory_as_token_file_is_one_line_not_a_hang(tmp_path):
    """open() on a FIFO with no writer blocks forever: the exporter would never start."""
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    for path, what in ((fifo, "FIFO"), (tmp_path, "directory")):
        done = run_exporter(*SHORT, "--port", str(free_port()), "--nsys-upload-token-file", str(path))
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
        assert str(path) in lines[0] and what.lower() in lines[0].lower(), lines[0]


def test_the_token_file_also_comes_from_the_environment(tmp_path):
    path = tmp_path / "token"
    path.write_text("")
    done = run_exporter(*SHORT, "--port", str(free_port()), env={"GPU_EXPORTER_NSYS_UPLOAD_TOKEN_FILE": str(path)})
    assert done.returncode == 2 and "empty" in done.stderr


def test_a_port_in_use_is_said_first_in_one_line_with_the_flag_to_change_it():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = run_exporter(*SHORT, "--port", str(port))
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert "in use" in lines[0] and "--port" in lines[0]


def test_bad_input_exits_2_with_one_line(tmp_path):
    token = tmp_path / "token"
    token.write_text("t")
    for args in (["--nvml-replay", str(tmp_path / "missing.json")], ["--http-idle-timeout", "0"],
                 ["--http-max-header-bytes", "1x"], ["--http-max-connections", "many"],
                 ["--nsys-upload-token", "t", "--nsys-upload-token-file", str(token)]):
        done = run_exporter("--no-mps", "--port", str(free_port()), *args)
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (args, done.stdout + done.stderr)


def test_help_shows_defaults_as_they_are_typed():
    text = " ".join(build_parser().format_help().split())
    for shown in ("default: dcgm,gpm,nsys", "default: 10G", "default: 7d", "default: 512M", "default: 64K",
                  "default: 30s", "suffixes K, M, G", "suffixes s, m, h, d"):
        assert shown in text, shown
    for raw in ("('dcgm'", "10737418240", "604800", "536870912", "default: None"):
        assert raw not in text, raw
    kubelet = text[text.rindex("--kubelet-socket"):text.rindex("--kubelet-interval")]
    assert kubelet.count("default") == 1, kubelet


# --- the compose stack ----------------------------------------------------------------------------

needs_compose = pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")


def compose_config(env: dict) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    return subprocess.run(["docker-compose", "-f", "docker-compose.yaml", "config"], cwd=ROOT, capture_output=True,
                          text=True, env={**environ, **env}, timeout=60)


@needs_compose
def test_compose_publishes_only_on_loopback_and_keeps_grafana_closed():
    done = compose_config({"GRAFANA_ADMIN_PASSWORD": "not-admin"})
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    published = [(name, port) for name, s in services.items() for port in s.get("ports", [])]
    assert {name for name, _ in published} >= {"prometheus", "alertmanager", "grafana", "gpu-spatial-exporter"}
    for name, port in published:
        host_ip = port.get("host_ip") if isinstance(port, dict) else port.split(":")[0]
        assert host_ip == "127.0.0.1", (name, port)
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == "not-admin"
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    exporter = services["gpu-spatial-exporter"]
    assert not any("token" in arg for arg in exporter["command"])  # never on the command line


@needs_compose
def test_compose_without_the_grafana_password_refuses_naming_the_variable():
    done = compose_config({})
    assert done.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in done.stderr


# -- exporter/server.py --------------------------------------------------------------------------------
def test_a_silent_connection_closes_at_the_idle_timeout_not_the_header_timeout():
    """--http-idle-timeout 1s with --http-header-timeout 120s: a connection that never sends a byte is
    closed well before 60 s. Mutation: the idle deadline computed from the header timeout."""
    with Exporter("--no-nvml", "--no-mps", "--http-idle-timeout", "1", "--http-header-timeout", "120") as exporter:
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=60) as conn:
            assert conn.recv(1) == b""  # closed by the server (a timeout here raises)


def test_a_kept_alive_connection_lives_for_the_idle_timeout_not_uvicorns_default():
    """--http-idle-timeout 120s: a kept-alive connection still answers a second request 8 s after the
    first (uvicorn's own keep-alive timer defaults to 5 s). Mutation: uvicorn's timeout_keep_alive not
    set from --http-idle-timeout."""
    with Exporter("--no-nvml", "--no-mps", "--http-idle-timeout", "120") as exporter:
        conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)
        try:
            conn.request("GET", "/healthz")
            first = conn.getresponse()
            first.read()
            local = conn.sock.getsockname()
            time.sleep(8)  # longer than uvicorn's default, far shorter than the idle timeout asked for
            conn.request("GET", "/healthz")
            second = conn.getresponse()
            second.read()
            assert second.status == first.status == 200 and conn.sock.getsockname() == local  # the same connection
        finally:
            conn.close()
