"""Resident memory and CPU of the exporter with its default sources on a GPU host.

    python3 bench/footprint.py --label after --out footprint_after.json [--source-dir DIR] [-- EXPORTER FLAGS]
    python3 bench/footprint.py --nvml-baseline --out nvml_rss.json   # what NVML itself costs a process

Starts `python -m exporter --interval 1` (from --source-dir, default this checkout), waits --warmup
seconds, then reads RSS, the CPU share of one core over --window seconds with no scrapes, the largest
mappings (smaps) and the modules loaded. Run two checkouts in one session to compare them.
`rss_mb` is VmRSS (the RSS column of `ps`) at the end, in MiB; `memory_mib` splits it (anon, file,
shared; private against shared pages) at --early seconds after start and at the end, and
`api_loaded_mib` after one GET /api/v1/gpus (the JSON API is loaded on first use).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.rss_compare import memory
from bench.soak import cpu_seconds, rss_bytes
from tests.helpers import free_port, http_get, wait_for


def mappings(pid: int, top: int = 12) -> list[tuple[str, int]]:
    """RSS in kB per mapped file ([anon] and [heap] included), largest first."""
    sizes: dict[str, int] = {}
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split()
            name = os.path.basename(parts[5]) if len(parts) > 5 else "[anon]"
        elif line.startswith("Rss:"):
            sizes[name] = sizes.get(name, 0) + int(line.split()[1])
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:top]


NVML_BASELINE = """
import json, pynvml
rss = lambda: int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
steps = {"bare python": rss()}
pynvml.nvmlInit()
steps["after nvmlInit"] = rss()
sample = pynvml.nvmlGpmSampleAlloc()
pynvml.nvmlGpmSampleGet(pynvml.nvmlDeviceGetHandleByIndex(0), sample)
steps["after one GPM sample"] = rss()
print(json.dumps(steps))
"""


def nvml_baseline(out: Path) -> int:
    """RSS (MB) of a bare Python, after nvmlInit, after one GPM sample: the floor under any NVML exporter."""
    done = subprocess.run([sys.executable, "-c", NVML_BASELINE], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"needs NVML and a GPU: {(done.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
        return 2
    out.write_text(done.stdout)
    print(done.stdout.strip())
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label")
    p.add_argument("--nvml-baseline", action="store_true", help="only measure what NVML costs a bare process")
    p.add_argument("--source-dir", type=Path, default=ROOT)
    p.add_argument("--warmup", type=float, default=20)
    p.add_argument("--window", type=float, default=60)
    p.add_argument("--early", type=float, default=8, help="also read memory this many seconds after start")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("exporter_args", nargs="*", help="more exporter flags, after --")
    args = p.parse_args()
    if args.nvml_baseline:
        return nvml_baseline(args.out)
    if not args.label:
        p.error("--label is needed")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{args.source_dir}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--port", str(port), "--interval", "1", *args.exporter_args],
                            cwd=args.source_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz", 1)[0] == 200, 60, 0.2, "exporter up")
        http_get(f"http://127.0.0.1:{port}/metrics")
        time.sleep(max(0.0, started + args.early - time.monotonic()))
        early = memory(proc.pid)
        time.sleep(max(0.0, started + args.warmup - time.monotonic()))
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(args.window)
        cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        report = {"label": args.label, "rss_mb": round(rss_bytes(proc.pid) / 2**20, 1),
                  "cpu_share_of_core": round(cpu, 5), "window_s": args.window,
                  "gpu_series": sum(line.startswith("gpu_") for line in body.decode().splitlines()),
                  "threads": len(os.listdir(f"/proc/{proc.pid}/task")),
                  "largest_mappings_kb": mappings(proc.pid),
                  "memory_mib": {f"{args.early:g}s": early, "end": memory(proc.pid)}}
        http_get(f"http://127.0.0.1:{port}/api/v1/gpus")
        report["api_loaded_mib"] = memory(proc.pid)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    report["log_tail"] = err.strip().splitlines()[-5:]
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({**{k: report[k] for k in ("label", "rss_mb", "cpu_share_of_core", "gpu_series", "threads")},
                      "rss_early_mib": report["memory_mib"][f"{args.early:g}s"]["VmRSS"],
                      "rss_api_loaded_mib": report["api_loaded_mib"]["VmRSS"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
