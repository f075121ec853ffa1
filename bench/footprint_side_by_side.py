"""CPU and memory of two or more exporter trees running at the same time on the same GPUs (issue 30's footprint).

    python3 bench/footprint_side_by_side.py --out F [--seconds 420] [--warmup 30] [--minute 60]
        LABEL=DIR LABEL=DIR ... [-- EXPORTER FLAGS]

Alternated runs on the lent H200 differed by up to 0.16 % of a core between two runs of the same tree,
more than the +0.1 % being checked. Here every tree runs at once, `--interval 1`, default sources, each in
its own cgroup v2 directory (cpu.stat usage_usec: every thread, microseconds; /proc's 10 ms ticks where
no cgroup can be made), and is scraped every 15 s like a Prometheus would. After --warmup, CPU is read
every --minute: each minute gives a pair of shares under the same GPU conditions, and the report gives
each tree's share over the whole window and the paired differences' mean and standard error against the
first tree. VmRSS and VmHWM at the end. Never asserts.

--no-site starts each tree with `python -S` and this Python's site-packages on PYTHONPATH: no .pth file
runs, as where the packages travel on PYTHONPATH (the device's wheels); this machine's .pth files import
modules (tempfile, zipfile) that would hide what the exporter itself loads.
"""
from __future__ import annotations

import argparse
import json
import os
import site
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.cost_per_gpu import status
from bench.soak import cpu_seconds
from tests.helpers import free_port, http_get, wait_for

CGROUP_ROOT = Path("/sys/fs/cgroup")
SCRAPE_EVERY_S = 15.0


class Tree:
    def __init__(self, label: str, source: Path, flags: list[str], no_site: bool = False):
        self.label, self.source, self.port = label, source, free_port()
        path = [str(source), os.environ.get("PYTHONPATH", ""), *(site.getsitepackages() if no_site else [])]
        env = {**os.environ, "PYTHONPATH": ":".join(p for p in path if p)}
        self.proc = subprocess.Popen([sys.executable, *(["-S"] if no_site else []), "-m", "exporter", "--port",
                                      str(self.port), "--interval", "1", *flags], cwd=source, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.cgroup = CGROUP_ROOT / f"footprint-{label}-{self.proc.pid}"
        try:
            self.cgroup.mkdir()
            if not (self.cgroup / "cpu.stat").is_file():  # before anything is written: a plain folder (tmpfs)
                raise OSError("no cgroup v2 here")
            (self.cgroup / "cgroup.procs").write_text(str(self.proc.pid))
        except OSError:
            try:
                self.cgroup.rmdir()
            except OSError:
                pass
            self.cgroup = None

    def cpu(self) -> float:
        """CPU seconds so far: the cgroup's usage (all threads, microseconds), else /proc ticks."""
        if self.cgroup is not None:
            for line in (self.cgroup / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        return cpu_seconds(self.proc.pid)

    def scrape(self) -> str:
        status, body = http_get(f"http://127.0.0.1:{self.port}/metrics")
        return body.decode() if status == 200 else ""

    def stop(self) -> list[str]:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if self.cgroup is not None:
            try:
                self.cgroup.rmdir()
            except OSError:
                pass
        return (err or "").strip().splitlines()[-5:]


def paired(shares: dict[str, list[float]], base: str) -> dict:
    """Per tree: its minute-by-minute difference to `base`, mean and standard error."""
    out = {}
    for label, values in shares.items():
        if label == base:
            continue
        diffs = [v - b for v, b in zip(values, shares[base])]
        entry = {"mean": round(statistics.fmean(diffs), 6)} if diffs else {}
        if len(diffs) > 1:
            entry["stderr"] = round(statistics.stdev(diffs) / len(diffs) ** 0.5, 6)
        out[label] = entry
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=420.0, help="measured window after the warm-up")
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--minute", type=float, default=60.0, help="length of one paired reading")
    p.add_argument("--no-site", action="store_true", help="python -S, site-packages on PYTHONPATH (no .pth runs)")
    p.add_argument("trees", nargs="+", help="LABEL=DIR (DIR holds exporter/ and nsys_ingest/), the first is the base; "
                                            "exporter flags after --")
    given = list(sys.argv[1:] if argv is None else argv)
    flags = given[given.index("--") + 1:] if "--" in given else []
    args = p.parse_args(given[:given.index("--")] if "--" in given else given)
    specs = [t.split("=", 1) for t in args.trees]
    trees = [Tree(label, Path(source).resolve(), flags, args.no_site) for label, source in specs]
    report: dict = {"trees": {t.label: str(t.source) for t in trees}, "flags": flags, "warmup_s": args.warmup,
                    "no_site": args.no_site,
                    "cpu_clock": "cgroup usage_usec" if all(t.cgroup for t in trees) else "/proc ticks"}
    try:
        for tree in trees:
            wait_for(lambda tree=tree: tree.proc.poll() is not None or
                     http_get(f"http://127.0.0.1:{tree.port}/healthz", 1)[0] == 200, 90, 0.2, f"{tree.label} up")
            if tree.proc.poll() is not None:
                raise SystemExit(f"{tree.label} exited {tree.proc.returncode}: {tree.stop()}")
        time.sleep(args.warmup)
        shares: dict[str, list[float]] = {t.label: [] for t in trees}
        before, t_before = [t.cpu() for t in trees], time.monotonic()
        start, next_scrape = t_before, t_before
        while time.monotonic() - start < args.seconds:
            now = time.monotonic()
            if now >= next_scrape:
                for tree in trees:
                    tree.scrape()
                next_scrape += SCRAPE_EVERY_S
            if now - t_before >= args.minute:
                after = [t.cpu() for t in trees]
                for tree, a, b in zip(trees, after, before):
                    shares[tree.label].append((a - b) / (now - t_before))
                before, t_before = after, now
            time.sleep(0.2)
        bodies = {t.label: t.scrape() for t in trees}
        report.update({
            "minutes": len(shares[trees[0].label]),
            "cpu_share_of_core": {k: round(statistics.fmean(v), 6) for k, v in shares.items() if v},
            "cpu_share_by_minute": {k: [round(x, 6) for x in v] for k, v in shares.items()},
            "difference_to_base": paired(shares, trees[0].label),
            "memory": {t.label: status(t.proc.pid) for t in trees},
            "gpu_series": {k: sum(line.startswith("gpu_") for line in v.splitlines()) for k, v in bodies.items()},
            "threads": {t.label: len(os.listdir(f"/proc/{t.proc.pid}/task")) for t in trees},
        })
    finally:
        report["log_tail"] = {t.label: t.stop() for t in trees}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report.get(k) for k in ("cpu_clock", "minutes", "cpu_share_of_core", "difference_to_base",
                                                  "memory", "gpu_series", "threads")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
