"""The exporter's own memory across context-switch windows (issue 37: on the device it grew 64 -> 71 MiB after
one window on one GPU). Without a GPU: the exporter on an NVML replay with `--workload-ctxsw`, nsys being the
stand-in tests/fixtures/fake-nsys replaying an export (FAKE_NSYS_EXPORT):

    python3 bench/ctxsw_window_memory.py [--export tests/fixtures/h200_ctxsw_10khz.sqlite] [--windows 3]
        [--window 4] [--period 12] [--output-bytes N] [--code DIR ...] [--out F.json]

Each --code tree (default: this one) runs its own exporter, all at once. Its VmRSS, VmHWM and threads come from
/proc every 0.1 s together with what it is doing (which child it waits for: `profile`, `export`, the
`attribution`; else `idle`). Per window: the memory in its last idle second before it (the exporter at rest,
the capture thread waiting), at the end of each step, and one second after the attribution; the exporter's
memory after its first scrape and the last scrape. --output-bytes makes every nsys step print that many bytes
of progress lines first (FAKE_NSYS_OUTPUT_BYTES: what reading a step's output costs the exporter). Prints one
JSON document. Never asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.cost_per_gpu import doing, get, status
from tests.helpers import FIXTURES, free_port

class Run:
    def __init__(self, code: Path, export: Path, window: float, period: float, work: Path, replay: Path,
                 output_bytes: int = 0):
        self.code, self.port = code, free_port()
        (work / "map").mkdir(parents=True, exist_ok=True)
        (work / "map" / "0").write_text("100\n")  # a Slurm job holds GPU 0: the source has a holder to serve
        env = {**os.environ, "PYTHONPATH": str(code), "FAKE_NSYS_EXPORT": str(export),
               "FAKE_NSYS_OUTPUT_BYTES": str(output_bytes)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--port", str(self.port), "--interval", "1", "--nvml-replay",
             str(replay), "--no-mps", "--kubelet-socket", "none", "--hpc-job-mapping-dir", str(work / "map"),
             "--workload-ctxsw", "--nsys-binary", str(FIXTURES / "fake-nsys"), "--ctxsw-window", f"{window:g}",
             "--ctxsw-period", f"{period:g}"], cwd=code, env=env, stdout=subprocess.DEVNULL,
            stderr=open(work / "exporter.log", "w"))
        self.timeline: list[tuple[float, str, dict]] = []
        self.first_scrape: dict | None = None
        self.served_at: float | None = None  # at rest means: serving, no step running

    def sample(self, t: float) -> str:
        step = doing(self.proc.pid)
        self.timeline.append((t, step, status(self.proc.pid)))
        return step

    def windows(self) -> list[dict]:
        """Per window: memory at rest before it, at the end of each step, and a second after."""
        out: list[dict] = []
        previous, current = "idle", None
        for i, (t, step, mem) in enumerate(self.timeline):
            if step == previous:
                continue
            if previous == "idle" and step == "profile":
                rest = [m for (u, s, m) in self.timeline[:i] if s == "idle" and t - u <= 1.0
                        and self.served_at is not None and u >= self.served_at]
                current = {"at_rest_before": rest[0] if rest else None}  # the first window starts with the exporter
                out.append(current)
            if current is not None and previous in ("profile", "export", "attribution"):
                current[f"after_{previous}"] = self.timeline[i - 1][2] if step == "gone" else mem
                if previous == "attribution":
                    later = [m for (u, s, m) in self.timeline[i:] if u - t >= 1.0]
                    current["one_second_later"] = later[0] if later else None
            previous = step
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", type=Path, default=FIXTURES / "h200_ctxsw_10khz.sqlite")
    p.add_argument("--replay", type=Path, default=FIXTURES / "nvml_h100_time_sliced.json")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window", type=float, default=4.0, help="seconds of each capture (fake nsys sleeps them)")
    p.add_argument("--period", type=float, default=12.0)
    p.add_argument("--output-bytes", type=int, default=0, help="bytes every nsys step prints")
    p.add_argument("--code", type=Path, action="append", help="a source tree (several: run side by side)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    codes = [c.resolve() for c in (args.code or [ROOT])]
    work = Path(tempfile.mkdtemp(prefix="ctxsw-window-memory-"))
    runs = [Run(code, args.export.resolve(), args.window, args.period, work / str(i), args.replay.resolve(),
                args.output_bytes) for i, code in enumerate(codes)]
    t0 = time.monotonic()
    deadline = t0 + 60 + args.windows * args.period + 60
    try:
        while time.monotonic() < deadline:
            now = time.monotonic() - t0
            for run in runs:
                run.sample(now)
                if run.first_scrape is None and get(f"http://127.0.0.1:{run.port}/metrics", 2) is not None:
                    run.first_scrape, run.served_at = status(run.proc.pid), now
            if all(len(r.windows()) >= args.windows and r.windows()[-1].get("one_second_later") for r in runs):
                break
            time.sleep(0.1)
        report = {"export": str(args.export), "window_s": args.window, "period_s": args.period,
                  "output_bytes": args.output_bytes, "runs": {}}
        for run in runs:
            get(f"http://127.0.0.1:{run.port}/metrics", 5)
            report["runs"][str(run.code)] = {"after_first_scrape": run.first_scrape, "windows": run.windows(),
                                             "at_the_end": status(run.proc.pid),
                                             "peak_vmrss_mib": max((m.get("vmrss_mib", 0) for _, _, m in run.timeline),
                                                                   default=None)}
    finally:
        for run in runs:
            run.proc.terminate()
            try:
                run.proc.wait(15)
            except subprocess.TimeoutExpired:
                run.proc.kill()
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
