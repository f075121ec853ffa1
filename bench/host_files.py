"""Hostile files on the host against a real exporter (issue 25, items 8-11): what each costs and what
the exporter publishes meanwhile, for one source tree.

    python3 bench/host_files.py --out bench/results/host_files_after.json
    python3 bench/host_files.py --code /tmp/before --out bench/results/host_files_before.json

- slurm_fifo: a FIFO replaces the Slurm mapping file of a GPU that job 4242 holds; 5 s later: is the
  job still published, the Slurm collector's success, the log lines about it;
- mps_huge_stat: /proc/PID/stat of 300 MB (sparse) under --proc-root with MPS on; the exporter's peak
  RSS after 5 s, against the same exporter with a normal stat;
- watch_link_loop: a symbolic link loop named x.sqlite beside a valid export in the watched directory:
  is the valid one published within 15 s;
- newline_in_path: a mapping file named "0\\nERROR forged ...": log lines that start with "ERROR forged".
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest_bench import write_result
from tests.helpers import FIXTURES, Exporter, http_get, parse_metrics, sample_value
from tests.test_hostile import peak_rss_mb

SETTLE_S = 5.0


def exporter_at(code: Path, *args: str) -> Exporter:
    exporter = Exporter(*args)
    exporter.cwd = code
    return exporter


def slurm_node(work: Path):
    from exporter.nvml_replay import cut

    cut(FIXTURES / "nvml_h100_time_sliced.json", work / "nvml.json", frame=0)
    proc, mapping = work / "proc", work / "map"
    (proc / "417").mkdir(parents=True)
    (proc / "417" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    mapping.mkdir()
    (mapping / "0").write_text("4242\n")
    return proc, mapping, ["--nvml-replay", str(work / "nvml.json"), "--interval", "0.2", "--kubelet-socket", "none",
                           "--proc-root", str(proc), "--hpc-job-mapping-dir", str(mapping)]


def job_published(exporter) -> bool:
    return 'hpc_job="4242"' in exporter.metrics()


def wait(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def slurm_fifo(code: Path, work: Path) -> dict:
    _, mapping, args = slurm_node(work)
    with exporter_at(code, *args, "--no-mps") as exporter:
        held = wait(lambda: job_published(exporter), 15)
        (mapping / "0").unlink()
        os.mkfifo(mapping / "0")
        time.sleep(SETTLE_S)
        metrics = parse_metrics(exporter.metrics())
        log = exporter.log()
        return {"job_published_before": held, "job_published_after_fifo": job_published(exporter),
                "slurm_success_after_fifo": sample_value(metrics, "gpu_exporter_collector_success", collector="slurm"),
                "log_lines_naming_the_fifo": sum("map/0" in line for line in log.splitlines())}


def mps_huge_stat(code: Path, work: Path) -> dict:
    out = {}
    for name, size in (("normal_stat", None), ("stat_of_300_mb", 300 << 20)):
        proc = work / name
        shutil.copytree(FIXTURES / "proc", proc)
        (proc / "9999").mkdir()
        with open(proc / "9999" / "stat", "wb") as f:
            if size:
                f.truncate(size)
            else:
                f.write(b"9999 (python3) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0 0\n")
        with exporter_at(code, "--no-nvml", "--interval", "0.5", "--proc-root", str(proc), "--mps-control-binary",
                         str(FIXTURES / "fake-mps-control")) as exporter:
            time.sleep(SETTLE_S)
            status, _ = http_get(exporter.url + "/metrics")
            out[name] = {"exporter_peak_rss_mb": round(peak_rss_mb(exporter.proc.pid), 1), "metrics_status": status}
    return out


def watch_link_loop(code: Path, work: Path) -> dict:
    watch = work / "watch"
    watch.mkdir()
    (watch / "x.sqlite").symlink_to(watch / "x.sqlite")
    good = watch / "good.sqlite"
    shutil.copyfile(FIXTURES / "hostile" / "wal_mode.sqlite", good)
    os.utime(good, (time.time() - 100, time.time() - 100))
    with exporter_at(code, "--no-nvml", "--no-mps", "--nsys-watch-dir", str(watch), "--interval", "0.5") as exporter:
        published = wait(lambda: "published the last" in exporter.log(), 15)
        log = exporter.log()
    return {"valid_export_published": published,
            "log_lines_naming_the_loop": sum("x.sqlite" in line for line in log.splitlines())}


def newline_in_path(code: Path, work: Path) -> dict:
    _, mapping, args = slurm_node(work)
    (mapping / "7\nERROR forged: the exporter is down").write_text("4242\n")
    with exporter_at(code, *args, "--no-mps") as exporter:
        wait(lambda: "no GPU" in exporter.log(), 15)
        time.sleep(1)
        log = exporter.log()
    return {"forged_lines": sum(line.startswith("ERROR forged") for line in log.splitlines()),
            "longest_log_line_chars": max(map(len, log.splitlines()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--code", type=Path, default=ROOT, help="the source tree to measure (default: this one)")
    args = parser.parse_args()
    code = args.code.resolve()
    result = {"code": str(code)}
    for attack in (slurm_fifo, mps_huge_stat, watch_link_loop, newline_in_path):
        with tempfile.TemporaryDirectory() as work:
            result[attack.__name__] = attack(code, Path(work))
    return write_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
