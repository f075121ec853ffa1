"""The tracing socket under issue 42's attacks, measured from outside: what the exporter's cupti source
(exporter/samplers/cupti.py) keeps, logs and costs when one process floods it with connections, when
many clients send numbers too large for a float beside one good client, and when a host's churn of
pids is refused one by one. Figures: bench/RESULTS.md ("The tracing socket under attack").

    python3 bench/cupti_socket_attacks.py [--flood 1000] [--bad-clients 50] [--out FILE.json]
    # before: the checkout before the fixes, this script copied into it
    git archive e414620 | tar -x -C /tmp/before && cp bench/cupti_socket_attacks.py /tmp/before/bench/
    python3 /tmp/before/bench/cupti_socket_attacks.py --no-refusal-memory

Each attacker is a separate process talking to a real Unix socket; the good client answers a 10 ms
window half busy on GPU 0. Memory is tracemalloc's peak over the source's accept and tick (the
source's own allocations, not the kernel's socket buffers); wall times are reported, never asserted.
"""
from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.samplers import cupti

GPU = "GPU-00000000-0000-0000-0000-000000000000"
NVML = SimpleNamespace(gpus=[SimpleNamespace(uuid=GPU, index=0)])
# One process: `count` connections held (the listener's backlog takes what it takes), each answering the
# exporter's command; `body` is the answer, with WINDOW, PID, START and END filled in.
ATTACKER = r"""
import json, os, selectors, socket, sys, time
path, count, body = sys.argv[1], int(sys.argv[2]), sys.argv[3]
selector = selectors.DefaultSelector()
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.setblocking(False)
    try:
        s.connect(path)
        selector.register(s, selectors.EVENT_READ)
    except OSError:
        s.close()
print(len(selector.get_map()), flush=True)
while selector.get_map():
    for key, _ in selector.select():
        command = key.fileobj.recv(4096)
        if not command:
            selector.unregister(key.fileobj)
            continue
        now = time.time()
        answer = body.replace("WINDOW", str(json.loads(command)["window"])).replace("PID", str(os.getpid()))
        key.fileobj.sendall(answer.replace("START", repr(now)).replace("END", repr(now + 0.01)).encode() + b"\n")
"""
GOOD = ('{"window": WINDOW, "pid": PID, "start": START, "end": END, "devices": [{"uuid": "%s", "kernels": 1, '
        '"kernel_busy_s": 0.005, "sm_seconds": 0.002, "copy_busy_s": 0}]}' % GPU)
ERROR_LINE = '{"window": WINDOW, "pid": PID, "error": "no CUDA in this process yet"}'
TOO_LARGE = GOOD.replace("START", "1" + "0" * 400, 1)


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def attackers(path: str, count: int, connections: int, body: str) -> list[subprocess.Popen]:
    procs = []
    for _ in range(count):
        procs.append(subprocess.Popen([sys.executable, "-c", ATTACKER, path, str(connections), body],
                                      stdout=subprocess.PIPE, text=True))
        procs[-1].held = int(procs[-1].stdout.readline())
    return procs


def measured_tick(source: cupti.CuptiSource, expected: int) -> dict:
    """accept (until `expected` clients, bounded) and one tick, under tracemalloc."""
    tracemalloc.start()
    started = time.perf_counter()
    deadline = time.monotonic() + 30
    source._accept()
    while len(source._clients) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
        source._accept()
    raised = None
    try:
        source.tick()
    except Exception as exc:  # noqa: BLE001 - the checkout before issue 42's fixes: the 401-digit start raised out of the tick
        raised = f"{type(exc).__name__}: {exc}"[:200]
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    window = source.fresh(GPU, source.clock())
    return {"traced_pids": sorted(window.shares) if window else [], "tick_and_accept_s": round(seconds, 3),
            "tracemalloc_peak_kib": round(peak / 1024, 1), "health": source.health.success,
            "refused": dict(source.refused), "connections_kept": len(source._clients), "tick_raised": raised}


def scenario(flood: int, bad_clients: int, kind: str, folder: str) -> dict:
    lines = Lines()
    logging.getLogger(cupti.__name__).addHandler(lines)
    source = cupti.CuptiSource(NVML, f"{folder}/{kind}.sock", window_s=0.0, period_s=60.0)
    source.open()
    procs = []
    try:
        if kind == "flood":  # issue 42 item 3: one process, `flood` connections answering error lines
            procs = attackers(source.path, 1, flood, ERROR_LINE)
            source._accept()
            kept_of_flood = len(source._clients)
            procs += attackers(source.path, 1, 1, GOOD)
            out = {"flood_connections_made": procs[0].held, "flood_connections_kept": kept_of_flood,
                   **measured_tick(source, 2)}
        else:  # issue 42 item 2: `bad_clients` processes send a 401-digit start, one answers well
            procs = attackers(source.path, bad_clients, 1, TOO_LARGE) + attackers(source.path, 1, 1, GOOD)
            out = {"bad_clients": bad_clients, **measured_tick(source, bad_clients + 1)}
        out["good_client_traced"] = procs[-1].pid in out["traced_pids"]
        out["traced_pids"] = len(out["traced_pids"])
        out["log_lines"] = len(lines.lines)
        out["first_log_line"] = lines.lines[0] if lines.lines else None
        return out
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        source.close()
        logging.getLogger(cupti.__name__).removeHandler(lines)


def refusal_memory(distinct: int) -> dict:
    """`distinct` clients refused once each (a host's churn of pids): what the source keeps to say each once."""
    source = cupti.CuptiSource(NVML, "/nonexistent/cupti.sock")
    logging.getLogger(cupti.__name__).setLevel(logging.ERROR)  # the lines themselves are not measured here
    tracemalloc.start()
    for pid in range(distinct):
        source._refuse("bad report", "start is too large for a number", SimpleNamespace(who=f"pid {pid} (uid 1000)"))
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"refused": distinct, "remembered": len(source._said), "kept_kib": round(current / 1024, 1),
            "peak_kib": round(peak / 1024, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=1000)
    parser.add_argument("--bad-clients", type=int, default=50)
    parser.add_argument("--out")
    parser.add_argument("--no-refusal-memory", action="store_true", help="for a checkout before the bounded memory")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        result = {"flood": scenario(args.flood, 0, "flood", folder),
                  "too_large": scenario(0, args.bad_clients, "too_large", folder),
                  "refusal_memory": None if args.no_refusal_memory else refusal_memory(100_000)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
