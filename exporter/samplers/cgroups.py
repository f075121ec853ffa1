"""Which workload a GPU process belongs to, from a file of its /proc/PID: its cgroup for the kubelet
sampler (container IDs) and the Slurm sampler (job IDs), its status for the users sampler (uids). Each
process's file is read once in its life."""
from __future__ import annotations

from pathlib import Path

from hostio.files import read_text_capped

MAX_CGROUP_BYTES = 65536  # a cgroup file lists a few hierarchies: more is not one


def gpu_pids(telemetry) -> set[int]:
    """Every pid NVML names on any GPU: per-process samples and compute/MPS-client lists."""
    return {p.pid for tel in telemetry.values() for p in (*tel.processes, *(tel.compute_processes or ()))}


class ProcFileOwners:
    """pid -> what `parse` makes of its /proc/PID/`file` (None: no workload), kept while the pid is on a GPU."""

    def __init__(self, proc_root, parse, file: str = "cgroup", cap: int = MAX_CGROUP_BYTES):
        self._proc_root = Path(proc_root)
        self._parse = parse
        self._file, self._cap = file, cap
        self._known: dict[int, object] = {}

    def lookup(self, pids: set[int]) -> dict[int, object]:
        """The parsed file of each pid still readable; pids gone from the GPUs are forgotten."""
        self._known = {pid: owner for pid, owner in self._known.items() if pid in pids}
        for pid in pids - self._known.keys():
            try:
                text = read_text_capped(self._proc_root / str(pid) / self._file, self._cap, truncate=True)
            except (OSError, ValueError):  # gone, another PID namespace, or not a regular file (a FIFO): unattributed
                continue
            self._known[pid] = self._parse(text)
        return dict(self._known)
