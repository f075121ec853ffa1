"""Slurm sampler: which jobs hold each GPU, from the job mapping directory dcgm-exporter reads
(`--hpc-job-mapping-dir`), and which job each GPU process belongs to, from its cgroup.

The mapping directory is written by Slurm prolog/epilog scripts (existing ones work unchanged): one
file per GPU, named by its index ("0") or UUID ("GPU-..." or "MIG-..."), listing the job IDs that hold
it, one per line (a line may go on with more fields, e.g. the user's uid: only the first is read).
A process's job comes from its cgroup path, in slurmstepd's cgroup v1 layout
(`/slurm/uid_1000/job_123/step_0/task_0`) or v2 layout (`/system.slice/slurmstepd.scope/job_123/step_0/...`).
Files are read with a size cap, non-blocking, regular files only (hostio/files.py); a garbage,
unknown, vanished or FIFO file is one log line, never a crash.
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from exporter.holders import EVEN_SPLIT, Held, Holder, HolderSampler, Holdings
from hostio.files import FileTooLarge, read_capped
from exporter.samplers.cgroups import ProcFileOwners, gpu_pids
from exporter.samplers.kubelet import DeviceMap
from exporter.snapshot import CollectorHealth, LogOnce

log = logging.getLogger(__name__)
MAX_FILE_BYTES = 4096  # a GPU's mapping file lists a few job IDs: anything larger is not one
MAX_FILES = 1024
MAX_JOBS_PER_GPU = 64
JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?$")  # 123, array 123_4, het job 123+0
CGROUP_JOB = re.compile(r"/job_(?P<job>[0-9]+)(?:/|$)")


@dataclass(frozen=True)
class SlurmSnapshot:
    jobs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # GPU UUID -> job IDs holding it
    owners: dict[int, str] = field(default_factory=dict)  # host pid -> job ID
    error: str = ""

    def to_json(self) -> dict:
        return {"error": self.error, "jobs": {uuid: list(jobs) for uuid, jobs in self.jobs.items()},
                "process_jobs": {str(pid): job for pid, job in self.owners.items()}}


def cgroup_job(text: str) -> str | None:
    """The Slurm job a /proc/PID/cgroup names, or None for a process outside any job."""
    for line in text.splitlines():
        match = CGROUP_JOB.search(line.split(":", 2)[-1])
        if match:
            return match.group("job")
    return None


def read_mapping(folder: Path, devices: DeviceMap, problems: list[str]) -> dict[str, tuple[str, ...]]:
    """GPU UUID -> job IDs, from one file per GPU. Problems are appended as one line each."""
    jobs: dict[str, set[str]] = {}
    with os.scandir(folder) as entries:
        names = sorted(e.name for e, _ in zip(entries, range(MAX_FILES + 1)))
    if len(names) > MAX_FILES:
        problems.append(f"{folder} holds more than {MAX_FILES} files: only the first {MAX_FILES} are read")
        names = names[:MAX_FILES]
    for name in names:
        if name.startswith("."):
            continue  # editors' and scripts' temporary files
        uuid = devices.resolve(name)
        if uuid is None:
            problems.append(f"{folder / name}: no GPU {name!r} on this node (name a file by GPU index or UUID)")
            continue
        try:
            data = read_capped(folder / name, MAX_FILE_BYTES)
        except FileTooLarge:
            problems.append(f"{folder / name}: larger than {MAX_FILE_BYTES} bytes, not a job mapping: ignored")
            continue
        except OSError as exc:  # vanished between listing and reading (an epilog), a FIFO, unreadable
            if not isinstance(exc, FileNotFoundError):
                problems.append(f"{folder / name}: {exc.strerror or exc}: ignored")
            continue
        ids = [line.split()[0] for line in data.decode("utf-8", "replace").splitlines() if line.split()]
        bad = [i for i in ids if not JOB_ID.match(i)]
        if bad:
            problems.append(f"{folder / name}: {bad[0][:40]!r} is no Slurm job ID (one job ID per line): ignored")
            continue
        jobs.setdefault(uuid, set()).update(ids[:MAX_JOBS_PER_GPU])
    return {uuid: tuple(sorted(ids)) for uuid, ids in jobs.items() if ids}


class SlurmSampler(HolderSampler):
    name = "slurm"

    def __init__(self, mapping_dir: str, nvml, proc_root="/proc", interval: float = 5.0):
        self.mapping_dir = Path(mapping_dir)
        self.nvml = nvml
        self.interval = interval
        self.snapshot = SlurmSnapshot()
        self.holdings = Holdings()
        self.health = CollectorHealth(False, 0.0, "not sampled yet")
        self._jobs = ProcFileOwners(proc_root, cgroup_job)
        self._log = LogOnce(log)

    def _owners(self) -> dict[int, str]:
        return {pid: job for pid, job in self._jobs.lookup(gpu_pids(self.nvml.telemetry)).items() if job is not None}

    def tick(self) -> None:
        started = time.perf_counter()
        problems: list[str] = []
        if not self.nvml.gpus:
            why = "NVML knows no GPU on this node: nothing to attribute jobs to"
            self._fail(why, started)
            return
        try:
            jobs = read_mapping(self.mapping_dir, DeviceMap(self.nvml.gpus, self.nvml.telemetry), problems)
        except OSError as exc:
            self._fail(f"cannot read the job mapping directory {self.mapping_dir}: {exc.strerror or exc} "
                       "(--hpc-job-mapping-dir)", started)
            return
        self._log.clear("slurm")
        owners = self._owners()
        if problems:
            self._log.problem("slurm mapping", "; ".join(problems))
        else:
            self._log.clear("slurm mapping")
        self.snapshot = SlurmSnapshot(jobs=jobs, owners=owners)
        # Jobs listed for one GPU share it evenly: the mapping says who, not how much.
        self.holdings = Holdings(
            gpus={uuid: {Holder(hpc_job=job): Held(round(1.0 / len(ids), 9), EVEN_SPLIT) for job in ids}
                  for uuid, ids in jobs.items()},
            owners={pid: Holder(hpc_job=job) for pid, job in owners.items()})
        self.health = CollectorHealth(not problems, time.perf_counter() - started, "; ".join(problems))

    def _fail(self, why: str, started: float) -> None:
        self._log.problem("slurm", why)
        self.snapshot = SlurmSnapshot(error=why)  # gone, not frozen: jobs that ended are never shown
        self.holdings = Holdings(error=why)
        self.health = CollectorHealth(False, time.perf_counter() - started, why)


SCHEDULER = True  # exporter/holders.py KINDS
LABELS = {"hpc_job": "the batch job (Slurm job ID) holding the GPU"}  # label -> meaning, as dcgm-exporter names it
HOLDER_NOUN = "Slurm job"  # one holder in a sentence (the GPUHeldIdle alert)
PANELS = {"hpc_job": ("Slurm jobs", "Jobs from the job mapping directory (--hpc-job-mapping-dir), processes mapped "
                                   "through their cgroups.",
                     "the exporter runs without --hpc-job-mapping-dir, or no mapping file named a job in the range.")}


def add_arguments(parser) -> None:
    g = parser.add_argument_group("slurm")
    g.add_argument("--hpc-job-mapping-dir", default=None,
                   help="Slurm job mapping directory (as dcgm-exporter's): one file per GPU, named by index or UUID, "
                        "listing the job IDs holding it; processes are mapped to jobs through their cgroup")


def build(args, nvml, explicit: bool = False):
    """The Slurm sampler where --hpc-job-mapping-dir is given, else None (an error under --holders slurm)."""
    if not args.hpc_job_mapping_dir:
        if explicit:
            raise SystemExit("error: --holders slurm needs --hpc-job-mapping-dir (the Slurm job mapping directory)")
        return None
    return SlurmSampler(args.hpc_job_mapping_dir, nvml, proc_root=args.proc_root, interval=max(args.interval, 1.0))
