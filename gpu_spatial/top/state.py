"""The screen state: one plain model built from the exporter's JSON snapshot (`/api/v1/gpus`), whether
that came over HTTP or from an in-process engine, so both paths render the same.

Everything here is read defensively: the JSON may come from another version of the exporter (or
from anything answering on that port), so a missing or ill-typed field reads as n/a with a reason,
never as an exception."""
from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass, field

from hostio.files import read_text_capped
from exporter.holders import holder_name
from exporter.snapshot import as_ratio

NA = "n/a"
SLURM_JOB = re.compile(r"/job_(\d+)(?:/|$)")


def number(value) -> float | None:
    """A number from JSON, or None for missing, NaN, booleans and anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def ratio(value) -> float | None:
    return as_ratio(number(value))


def text(value, default: str = "") -> str:
    return value if isinstance(value, str) else default


def items(value) -> list:
    return value if isinstance(value, list) else []


def mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


@dataclass
class Process:
    pid: int
    command: str
    kind: str = ""  # "mps" (client), "mps_server", "time_sliced", "" (unknown)
    time_share: float | None = None  # NVML per-process utilization: share of the GPU's time
    memory_bytes: float | None = None  # GPU memory; None where the snapshot does not carry it
    user: str | None = None
    holder: str = ""  # pod/container or Slurm job, where known

    @property
    def mark(self) -> str:
        return {"mps": "M", "mps_server": "S"}.get(self.kind, " ")


@dataclass
class Gpu:
    position: int  # place in the list (digits select by it: replays may repeat an index)
    index: int | None
    uuid: str
    model: str
    lost: bool = False
    time_utilization: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    hidden_idle: float | None = None
    source: str | None = None  # the live spatial source
    sources: list[tuple[str, str, str]] = field(default_factory=list)  # (source, state, reason)
    sharing_mode: str | None = None
    verdict: str | None = None
    verdict_reason: str = ""
    advice: str = ""
    mps_server_faults_per_s: float | None = None
    memory_used: float | None = None
    memory_total: float | None = None
    power_watts: float | None = None
    temperature: float | None = None
    processes: list[Process] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)  # pods / jobs holding the GPU
    workloads: list[dict] = field(default_factory=list)  # the exporter's workload records, if it has them
    ledger: dict = field(default_factory=dict)  # the GPU ledger's cells now (cell -> share of the GPU), if any
    errors: list[str] = field(default_factory=list)  # why a value is n/a

    def why(self, name: str) -> str:
        """Why `name` reads n/a: the first reason the snapshot gives."""
        if self.lost:
            return "GPU lost (NVML answers no more; the exporter retries)"
        if name == "time" and self.time_utilization is None:
            return next(iter(self.errors), "NVML has no samples of this GPU")
        if self.source is None:
            return "no spatial source: " + "; ".join(f"{s} {state} ({reason})" for s, state, reason in self.sources)
        return f"the {self.source} source does not give it"


@dataclass
class ScreenState:
    origin: str  # "in-process" or the exporter URL
    version: int | None = None
    created: float | None = None
    gpus: list[Gpu] = field(default_factory=list)
    problem: str = ""  # shown instead of numbers: the exporter is not answering, the snapshot is stale
    refused: bool = False  # the problem is the URL given (not an exporter, its API off): no retry helps
    collector_errors: list[str] = field(default_factory=list)
    mps_paging: list[str] = field(default_factory=list)  # MPS servers taking major faults


def _kinds(snapshot: dict) -> list[dict]:
    """What each holder kind holds (/api/v1/gpus `holders`, in the exporter's kind order); an exporter from
    before it: its kubelet section, whose pods and owners have the same fields."""
    kinds = [mapping(kind) for kind in mapping(snapshot.get("holders")).values()]
    if kinds or not snapshot.get("kubelet"):
        return kinds
    kubelet = mapping(snapshot.get("kubelet"))
    return [{"gpus": kubelet.get("pods"), "process_owners": kubelet.get("process_owners")}]


def _process_owners(snapshot: dict) -> dict[int, str]:
    """pid -> the holder running it, of every kind (the first kind listing a pid keeps it, as the exporter's
    own join)."""
    owners: dict[int, str] = {}
    for kind in _kinds(snapshot):
        for pid, ref in mapping(kind.get("process_owners")).items():
            if str(pid).isdigit():
                owners.setdefault(int(pid), holder_name(mapping(ref)))
    return owners


def _gpu_holders(snapshot: dict, uuid: str) -> list[str]:
    """The holders of one GPU, of every kind."""
    return [name for kind in _kinds(snapshot) for ref in items(mapping(kind.get("gpus")).get(uuid))
            if (name := holder_name(mapping(ref)))]


def _workload_users(workloads: list[dict]) -> dict[int, str]:
    """pid -> the Unix user the exporter made its holder (--holders users), from its workload records."""
    return {pid: text(record.get("user")) for record in workloads if text(record.get("user"))
            for pid in items(record.get("pids")) if isinstance(pid, int)}


def _workloads_for(snapshot: dict, uuid: str) -> list[dict]:
    """The exporter's per-workload records for this GPU, where it has them (newer exporters)."""
    return [mapping(w) for w in items(snapshot.get("workloads"))
            if uuid in (mapping(w).get("uuid"), mapping(w).get("gpu_uuid"))]


def gpu_from_json(position: int, raw: dict, snapshot: dict, local: "LocalProcesses | None") -> Gpu:
    raw = mapping(raw)
    spatial = mapping(raw.get("spatial"))
    tel = mapping(raw.get("telemetry"))
    diagnosis = mapping(raw.get("diagnosis"))
    index = raw.get("index")
    gpu = Gpu(position=position, index=index if isinstance(index, int) else None, uuid=text(raw.get("uuid"), "?"),
              model=text(raw.get("model"), "?"))
    gpu.lost = tel.get("lost") is True
    if not gpu.lost:  # a lost GPU's last values are stale: show none of them
        gpu.time_utilization = ratio(raw.get("time_utilization"))
        gpu.sm_active = ratio(spatial.get("sm_active"))
        gpu.sm_occupancy = ratio(spatial.get("sm_occupancy"))
        gpu.tensor_active = ratio(spatial.get("tensor_active"))
        gpu.dram_active = ratio(spatial.get("dram_active"))
        gpu.hidden_idle = ratio(raw.get("hidden_idle_sm_ratio"))
        gpu.source = text(spatial.get("source")) or None
        gpu.memory_used = number(tel.get("memory_used_bytes"))
        gpu.memory_total = number(tel.get("memory_total_bytes"))
        gpu.power_watts = number(tel.get("power_watts"))
        gpu.temperature = number(tel.get("temperature_celsius"))
    gpu.sources = [(text(s.get("source"), "?"), text(s.get("state"), "?"), text(s.get("reason")))
                   for s in map(mapping, items(raw.get("sources")))]
    gpu.sharing_mode = text(raw.get("sharing_mode")) or None
    gpu.verdict = text(diagnosis.get("verdict")) or None
    gpu.verdict_reason = text(diagnosis.get("reason"))
    gpu.advice = text(diagnosis.get("advice"))
    gpu.mps_server_faults_per_s = number(mapping(diagnosis.get("evidence")).get("mps_server_faults_per_s"))
    gpu.errors = [e for e in items(tel.get("errors")) if isinstance(e, str)]
    if not tel:
        gpu.errors.append("NVML does not know this GPU (only a spatial source does)")
    gpu.holders = _gpu_holders(snapshot, gpu.uuid)
    gpu.workloads = _workloads_for(snapshot, gpu.uuid)
    book = next((mapping(b) for b in items(snapshot.get("ledgers")) if mapping(b).get("uuid") == gpu.uuid), {})
    gpu.ledger = {text(cell): ratio(v) for cell, v in mapping(book.get("cells")).items() if ratio(v) is not None}
    gpu.processes = _processes(tel, _process_owners(snapshot), local, _workload_users(gpu.workloads))
    return gpu


def _processes(tel: dict, owners: dict[int, str], local, users: dict[int, str]) -> list[Process]:
    """NVML's compute contexts (with their MPS/time-sliced kind) joined with its per-process
    utilization (the time share) by pid."""
    by_pid: dict[int, Process] = {}
    for p in map(mapping, items(tel.get("compute_processes"))):
        if isinstance(p.get("pid"), int):
            by_pid[p["pid"]] = Process(p["pid"], text(p.get("command"), "?"), text(p.get("kind")),
                                       memory_bytes=number(p.get("memory_used_bytes", p.get("used_memory_bytes"))))
    for p in map(mapping, items(tel.get("processes"))):
        if not isinstance(p.get("pid"), int):
            continue
        proc = by_pid.setdefault(p["pid"], Process(p["pid"], text(p.get("command"), "?")))
        proc.time_share = ratio(p.get("sm"))
        if proc.memory_bytes is None:
            proc.memory_bytes = number(p.get("memory_used_bytes", p.get("used_memory_bytes")))
    for proc in by_pid.values():
        proc.holder = owners.get(proc.pid, "")
        proc.user = users.get(proc.pid)  # the exporter's own answer (its --proc-root), else this host's /proc
        if local is not None and proc.user is None:
            proc.user = local.user(proc.pid, proc.command)
            proc.holder = proc.holder or local.slurm_job(proc.pid, proc.command)
    return list(by_pid.values())


class LocalProcesses:
    """User and Slurm job of a pid from this host's /proc, only when the pid is the process NVML named
    (same command): a replayed or remote pid may be another process here, or none."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root

    def _read(self, pid: int, name: str) -> str | None:
        try:  # bounded, non-blocking, regular files only: /proc files are small, a hostile mount need not be
            return read_text_capped(os.path.join(self.proc_root, str(pid), name), 65536, truncate=True)
        except OSError:
            return None

    def _same(self, pid: int, command: str) -> bool:
        comm = (self._read(pid, "comm") or "").strip()
        return bool(comm) and os.path.basename(command)[:15] == comm[:15]

    def user(self, pid: int, command: str) -> str | None:
        if not self._same(pid, command):
            return None
        for line in (self._read(pid, "status") or "").splitlines():
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
                try:
                    return pwd.getpwuid(uid).pw_name
                except KeyError:
                    return str(uid)
        return None

    def slurm_job(self, pid: int, command: str) -> str:
        if not self._same(pid, command):
            return ""
        match = SLURM_JOB.search(self._read(pid, "cgroup") or "")
        return f"slurm job {match.group(1)}" if match else ""


def screen_state(snapshot: dict, origin: str, local: LocalProcesses | None = None) -> ScreenState:
    snapshot = mapping(snapshot)
    version = snapshot.get("snapshot_version")
    state = ScreenState(origin=origin, version=version if isinstance(version, int) else None,
                        created=number(snapshot.get("snapshot_time")))
    state.gpus = [gpu_from_json(i, g, snapshot, local) for i, g in enumerate(items(snapshot.get("gpus")))]
    for name, health in mapping(snapshot.get("collectors")).items():
        health = mapping(health)
        if health.get("success") is False:
            state.collector_errors.append(f"{name}: {text(health.get('error'), 'failed')}")
    for daemon in map(mapping, items(mapping(snapshot.get("mps")).get("daemons"))):
        faults = number(daemon.get("major_faults_per_s"))
        if daemon.get("role") == "server" and faults:
            state.mps_paging.append(f"MPS server pid {daemon.get('pid')} ({text(daemon.get('user'), '?')}): "
                                    f"{faults:.1f} major page faults/s")
    return state
