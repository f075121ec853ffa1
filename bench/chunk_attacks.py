"""A dcgm-exporter answering in 1-byte chunks (issue 42, item 9), measured from outside: the real exporter
(`python -m exporter` from --code, an NVML replay, `--dcgm-exporter-url` at a real HTTP server on
127.0.0.1, `--interval 1`) for SECONDS while a scraper takes /metrics every 50 ms. The server answers
dcgm-exporter's text (tests/fixtures/dcgm_exporter_metrics.txt) repeated to just under the source's
8 MiB cap once framed, in chunks of CHUNK bytes. Reported: the exporter's RSS (before, peak VmHWM), its
CPU seconds over the run, the scraper's p50/p99/max and failures, tracebacks. Never asserts.

    python3 bench/chunk_attacks.py [--chunk 1] [--code DIR] [--seconds 20]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.http_attacks import Scraper
from bench.scrape_bench import cpu_seconds
from exporter.samplers.dcgm import MAX_BODY_BYTES
from tests.helpers import FIXTURES, Exporter


def framed(body: bytes, size: int) -> bytes:
    """`body` as chunks of `size` bytes, with the last chunk."""
    if size == 1:  # "1\r\n" byte "\r\n", interleaved at C speed
        out = bytearray(6 * len(body))
        for offset, part in enumerate((b"1", b"\r", b"\n", None, b"\r", b"\n")):
            out[offset::6] = body if part is None else part * len(body)
        return bytes(out) + b"0\r\n\r\n"
    return b"".join(b"%x\r\n" % len(body[i:i + size]) + body[i:i + size] + b"\r\n"
                    for i in range(0, len(body), size)) + b"0\r\n\r\n"


def serve(answer: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                self.wfile.write(answer)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def status_kb(pid: int, key: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in text.splitlines() if line.startswith(key + ":")).split()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=ROOT)
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    text = (FIXTURES / "dcgm_exporter_metrics.txt").read_bytes()
    overhead = 6 if args.chunk == 1 else 1 + 12 / args.chunk  # framing bytes per body byte
    body = (text * (int(MAX_BODY_BYTES / overhead) // len(text) + 1))[:int(MAX_BODY_BYTES / overhead) - 4096]
    answer = framed(body, args.chunk)
    server = serve(answer)
    code = args.code.resolve()
    exporter = Exporter("--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), "--no-mps", "--interval", "1",
                        "--dcgm-exporter-url", f"http://127.0.0.1:{server.server_address[1]}/metrics")
    exporter.cwd, exporter.env["PYTHONPATH"] = code, str(code)
    try:
        with exporter:
            time.sleep(2)
            before = status_kb(exporter.proc.pid, "VmRSS")
            cpu = cpu_seconds(exporter.proc.pid)
            with Scraper(exporter.port) as scraper:
                time.sleep(args.seconds)
            cpu = cpu_seconds(exporter.proc.pid) - cpu
            peak = status_kb(exporter.proc.pid, "VmHWM")
            log = exporter.log()
    finally:
        server.shutdown()
    lines = [line for line in log.splitlines() if "dcgm" in line.lower()]
    print(json.dumps({"code": str(code), "chunk_bytes": args.chunk, "answer_bytes": len(answer), "seconds": args.seconds,
                      "rss_before_mb": round(before / 1024, 1), "rss_peak_mb": round(peak / 1024, 1),
                      "cpu_s": round(cpu, 2), **scraper.figures(), "tracebacks": log.count("Traceback"),
                      "dcgm_log_line": lines[-1][:200] if lines else ""}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
