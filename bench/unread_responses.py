"""Readers that never read (issue 42, item 10), measured from outside: CONNECTIONS sockets (receive buffer
4 KB) each ask for PATH (PIPELINED times in one write) and never read, held for SECONDS; meanwhile a
scraper scrapes /metrics every 50 ms on its own connection. Reports the exporter's resident memory (before,
peak, after the readers left) and the scraper's latency (p50, p99, max, failures); never asserts.

    python3 bench/unread_responses.py [--path /docs/assets/swagger-ui-bundle.js] [--pipelined 9] [--source-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.http_attacks import ATTACKER, MB, Exporter, RssWatch, Scraper, rss
from tests.helpers import http_get


def readers(port: int, path: str, connections: int, pipelined: int, seconds: float) -> None:
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * pipelined
    socks = []
    for _ in range(connections):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.bind((ATTACKER, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        socks.append(sock)
    time.sleep(seconds)
    for sock in socks:
        sock.close()


def measure(source_dir: Path, path: str, connections: int, pipelined: int, seconds: float) -> dict:
    exporter = Exporter(source_dir)
    try:
        for _ in range(3):
            http_get(f"http://127.0.0.1:{exporter.port}{path}")  # the asset and FastAPI loaded before
        time.sleep(1)
        before = rss(exporter.proc.pid)
        with RssWatch(exporter.proc.pid) as watch, Scraper(exporter.port) as scraper:
            readers(exporter.port, path, connections, pipelined, seconds)
            time.sleep(2)
        after = rss(exporter.proc.pid)
        return {"path": path, "connections": connections, "pipelined": pipelined, "seconds": seconds,
                "rss_before_mb": round(before / MB, 1), "rss_peak_mb": round(watch.peak / MB, 1),
                "rss_grown_mb": round((watch.peak - before) / MB, 1), "rss_after_mb": round(after / MB, 1),
                "tracebacks": exporter.tracebacks(), **scraper.figures()}
    finally:
        exporter.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dir", type=Path, default=ROOT)
    parser.add_argument("--path", default="/docs/assets/swagger-ui-bundle.js")
    parser.add_argument("--connections", type=int, default=400)
    parser.add_argument("--pipelined", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.source_dir, args.path, args.connections, args.pipelined, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
