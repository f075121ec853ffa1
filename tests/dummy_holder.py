"""A holder kind the exporter has never heard of (issue 38: a new kind is one module): LSF jobs, from a
file of "pid job" lines. `python -m tests.dummy_holder FLAGS` registers it and runs the exporter, as a
site would add its own kind; tests/test_sampler_contract.py reads it back from /metrics and the API."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from exporter.holders import EVEN_SPLIT, Held, Holder, HolderSampler, Holdings
from exporter.snapshot import CollectorHealth


class LsfJobs(HolderSampler):
    name = "lsf"

    def __init__(self, nvml, job_file: str, interval: float):
        self.nvml, self.job_file, self.interval = nvml, Path(job_file), interval

    def tick(self) -> None:
        started = time.perf_counter()
        owners = {int(pid): self.holder(*fields) for pid, *fields in
                  (line.split() for line in self.job_file.read_text().splitlines() if line.strip())}
        gpus = {}
        for uuid, tel in self.nvml.telemetry.items():
            holders = {owners[p.pid] for p in tel.compute_processes or () if p.pid in owners}
            if holders:
                gpus[uuid] = {holder: Held(round(1.0 / len(holders), 9), EVEN_SPLIT) for holder in holders}
        self.holdings = Holdings(gpus=gpus, owners=owners)
        self.health = CollectorHealth(True, time.perf_counter() - started)

    def holder(self, job: str) -> Holder:
        """The holder a line of the file names after its pid."""
        return Holder(hpc_job=f"lsf-{job}")


SCHEDULER = True  # LSF allocates GPUs to jobs, as Slurm does
LABELS = {"hpc_job": "the batch job holding the GPU"}  # a batch job, as a Slurm job is (the first kind's meaning wins)


def add_arguments(parser) -> None:
    parser.add_argument_group("lsf").add_argument("--lsf-job-file", default=None, help="lines of 'pid job'")


def build(args, nvml, explicit: bool = False):
    return LsfJobs(nvml, args.lsf_job_file, args.interval) if args.lsf_job_file else None


if __name__ == "__main__":
    from exporter import holders

    holders.KINDS["lsf"] = "tests.dummy_holder"  # its one registration line
    from exporter.__main__ import main

    sys.exit(main(sys.argv[1:]))
