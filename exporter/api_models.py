"""Response models of the JSON API: the OpenAPI schema (/openapi.json, docs/openapi.json) is made from
these. Field names are the ones /api/v1/gpus always had (clients and `gpu-spatial top` read them):
add fields, never rename. Ratios are 0..1, times are wall-clock seconds since the epoch."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model

from exporter import holders
from exporter.vocabulary import (HELD_SHARE_BASES, PROCESS_KINDS, PUBLISHED_STATES, SHARING_MODES, SM_ACTIVE_BASES,
                                 TIME_SHARE_BASES, WORKLOAD_SOURCE_STATES)

Ratio = Optional[float]


class Error(BaseModel):
    error: str = Field(description="what is wrong, in one line, and how to fix it")


class LostGpu(BaseModel):
    gpu: int = Field(description="NVML index")
    uuid: str = Field(description="its UUID, or unknown-pci-<PCI bus id> (unknown-gpu-<index>) when it was lost "
                                  "before the exporter could ask it")
    model: str


class Health(BaseModel):
    status: Literal["ok", "gpu_lost", "no_gpu", "stale"] = Field(
        description="ok: fresh snapshot with GPUs; gpu_lost: fresh, but a GPU does not answer NVML (GPU_IS_LOST; "
                    "HTTP 200: the exporter serves the others, and restarting it brings no GPU back); no_gpu: fresh, "
                    "but no GPU known (HTTP 200 only with --no-nvml, 503 when NVML was asked for); stale: the "
                    "samplers stopped (503)")
    snapshot_age_seconds: float
    gpus: int = Field(description="GPUs in the snapshot (NVML's and those only an export knows), lost ones included")
    reason: Optional[str] = Field(None, description="why the status is not ok")
    lost: Optional[list[LostGpu]] = Field(None, description="the GPUs that do not answer NVML (status gpu_lost)")


class SpatialReading(BaseModel):
    source: str = Field(description="dcgm, gpm or nsys")
    window_start: float
    window_end: float = Field(description="end of the window the values describe (a replay: now)")
    sm_active: Ratio = None
    sm_occupancy: Ratio = None
    graphics_engine_active: Ratio = None
    tensor_active: Ratio = None
    dram_active: Ratio = None
    time_utilization: Ratio = Field(None, description="the source's own busy time over the window (nsys GR Active)")


class SourceStatus(BaseModel):
    source: str
    state: Literal[PUBLISHED_STATES]
    reason: str


class Evidence(BaseModel):
    """What the verdict's rule looked at; absent where the source cannot tell."""

    time_utilization: Ratio = None
    sm_active: Ratio = None
    dram_active: Ratio = None
    sharing_mode: Optional[str] = None
    processes: Optional[int] = None
    mps_server_faults_per_s: Optional[float] = None
    long_gap_idle_share: Ratio = None
    median_kernel_s: Optional[float] = None
    median_grid_blocks: Optional[float] = None
    sm_count: Optional[int] = None
    sm_footprint: Ratio = None
    kernel_trace: Optional[bool] = Field(None, description="True: judged from an export's CUDA trace")
    kernel_busy_share: Ratio = None
    copy_busy_share: Ratio = None
    sm_clock_hertz: Optional[float] = None
    sm_clock_max_hertz: Optional[float] = None
    clock_event_reasons: Optional[list[str]] = Field(None, description="why the clocks are below their maximum now (NVML)")
    throttle_share: Ratio = None


class Diagnosis(BaseModel):
    verdict: str = Field(description="one of nsys_ingest.verdicts.VERDICTS (docs/diagnosis.md)")
    reason: str = Field(description="what the rule saw, in numbers")
    advice: str = Field(description="what to change")
    evidence: Evidence


class PodRef(BaseModel):
    namespace: str
    pod: str
    container: str
    resource: str = Field("", description="the extended resource held (nvidia.com/gpu, nvidia.com/mig-...)")


class ProcessUtilization(BaseModel):
    pid: int
    command: str
    sm: float = Field(description="share of time a kernel of this process ran (NVML)")
    memory: float


class ComputeProcess(BaseModel):
    pid: int
    command: str
    kind: Literal[PROCESS_KINDS]


class MigDevice(BaseModel):
    uuid: str
    gpu_instance: int
    compute_instance: int
    sm_count: Optional[int] = Field(None, description="SMs of the MIG device (NVML device attributes)")
    profile_id: Optional[int] = Field(None, description="its GPU instance's profile ID (nvidia-smi mig -lgip)")
    placement_start: Optional[int] = Field(None, description="its GPU instance's first memory slice")
    placement_size: Optional[int] = Field(None, description="its GPU instance's memory slices")


class LinkThroughput(BaseModel):
    source: str = Field(description="gpm (over its window) or nvml")
    pcie_tx: Optional[float] = Field(None, description="bytes per second")
    pcie_rx: Optional[float] = None
    nvlink_tx: Optional[float] = None
    nvlink_rx: Optional[float] = None


class GpuHealth(BaseModel):
    """docs/metrics.md, GPU: health. None where NVML cannot say on this GPU."""

    driver_version: Optional[str] = None
    sm_clock_max_hertz: Optional[float] = None
    memory_clock_max_hertz: Optional[float] = None
    clock_event_reasons: Optional[int] = Field(None, description="NVML clocks event reasons bitmask")
    memory_temperature_celsius: Optional[float] = None
    energy_joules: Optional[float] = None
    encoder_utilization: Ratio = None
    decoder_utilization: Ratio = None
    throttle_seconds: list[tuple[str, float]] = Field(description="(reason, seconds since the driver loaded)")
    throttle_share: Ratio = Field(None, description="share of the last window held down by power or thermal limits")
    pcie_replays: Optional[int] = None
    ecc_errors: list[tuple[str, str, int]] = Field(description="(corrected|uncorrected, volatile|aggregate, count)")
    remapped_rows: list[tuple[str, int]] = Field(description="(correctable|uncorrectable, rows)")
    row_remap_pending: Optional[bool] = None
    row_remap_failure: Optional[bool] = None
    links: Optional[LinkThroughput] = Field(None, description="NVML's PCIe/NVLink throughput (GPUs without GPM)")


class Telemetry(BaseModel):
    lost: bool = Field(description="the GPU fell off the bus (NVML GPU_IS_LOST)")
    memory_used_bytes: Optional[float] = None
    memory_total_bytes: Optional[float] = None
    power_watts: Optional[float] = None
    sm_clock_hertz: Optional[float] = None
    temperature_celsius: Optional[float] = None
    processes: list[ProcessUtilization]
    compute_processes: Optional[list[ComputeProcess]] = Field(description="None: NVML could not say")
    mig_enabled: Optional[bool] = None
    mig_devices: list[MigDevice]
    mig_sm_count: Optional[int] = Field(None, description="SMs of the whole GPU in MIG mode")
    memory_free_bytes: Optional[float] = None
    memory_reserved_bytes: Optional[float] = None
    memory_clock_hertz: Optional[float] = None
    health: Optional[GpuHealth] = None
    xid_counts: dict[str, int] = Field(default_factory=dict, description="XID -> events since the exporter started")
    last_xid: Optional[int] = None
    errors: list[str]


class Gpu(BaseModel):
    index: int = Field(description="NVML index (the `gpu` label)")
    uuid: str
    minor: Optional[int] = Field(None, description="/dev/nvidia<minor>: DRA drivers name the GPU gpu-<minor>")
    model: str
    time_utilization: Ratio = Field(description="share of time a kernel ran, over time_window")
    time_utilization_source: Optional[str] = Field(
        None, description="nvml, or the spatial source whose own busy time stands in (an export of a GPU NVML "
                          "does not know: nsys GR Active)")
    memory_time_utilization: Ratio = None
    time_window: Optional[tuple[float, float]] = None
    spatial: Optional[SpatialReading] = Field(description="the active source's reading")
    hidden_idle_sm_ratio: Ratio = Field(description="max(0, time utilization - SM active) over the spatial window")
    sharing_mode: Optional[Literal[SHARING_MODES]] = None
    diagnosis: Optional[Diagnosis] = None
    sources: list[SourceStatus] = Field(description="every candidate spatial source, in order of preference")
    pods: Optional[list[PodRef]] = Field(description="holders from the kubelet, at most 256; None: pod attribution off "
                                                     "or failing")
    pods_omitted: int = Field(0, description="holders of this GPU beyond the 256 listed (/metrics folds them into "
                                             "pod=\"other\")")
    telemetry: Optional[Telemetry] = Field(description="None: NVML does not know this GPU")


class CollectorHealth(BaseModel):
    success: bool
    duration_seconds: float
    error: str = ""


class MpsDaemon(BaseModel):
    role: Literal["control", "server"]
    user: str
    pid: int
    start_time: float
    major_faults: int
    minor_faults: int
    cpu_seconds: float
    resident_bytes: Optional[int] = None
    swap_bytes: Optional[int] = None
    major_faults_per_s: Optional[float] = None


class Mps(BaseModel):
    daemons: list[MpsDaemon]
    clients: dict[str, int] = Field(description="MPS clients by server user")
    default_active_thread_percentage: Optional[float] = None
    control_reachable: bool
    control_error: str = ""


class Kubelet(BaseModel):
    error: str
    pods: dict[str, list[PodRef]] = Field(description="GPU UUID -> containers holding it or a share of it (at most 256)")
    pods_omitted: dict[str, int] = Field(default_factory=dict, description="GPU UUID -> holders beyond the 256 listed")
    process_owners: dict[str, PodRef] = Field(description="host pid -> its container")


class Slurm(BaseModel):
    error: str
    jobs: dict[str, list[str]] = Field(description="GPU UUID -> Slurm job IDs holding it (job mapping directory)")
    process_jobs: dict[str, str] = Field(description="host pid -> its Slurm job (cgroup)")


# Every holder label the registered kinds declare (exporter/holders.py KINDS), as "" where it does not apply.
HOLDER_LABELS = holders.labels()
_HOLDER_FIELDS = {label: (str, Field("", description=what)) for label, what in holders.label_meanings().items()}
HolderRef = create_model("HolderRef", __doc__="A holder (exporter.holders.Holder); the labels that do not apply "
                         "are empty.", **_HOLDER_FIELDS)


class GpuRef(BaseModel):
    gpu: int
    uuid: str
    model: str


# A GPU and one of its holders: their labels first, as a workload's series carry them.
GpuHolderRef = create_model("GpuHolderRef", __base__=GpuRef, **_HOLDER_FIELDS)


class HeldShare(HolderRef):
    """A holder of a GPU and what it holds."""

    held_share: Optional[float] = Field(description="GPU-equivalents; None where the scheduler's share cannot be known")
    held_share_basis: Literal[HELD_SHARE_BASES]
    mig: list[str] = Field(default_factory=list, description="UUIDs of the MIG devices it holds whole")


class HolderKind(BaseModel):
    """What one kind of holder (kubelet, slurm, users, ...: exporter/holders.py KINDS) holds now."""

    error: str = Field(description="why the kind holds nothing now (empty when it works)")
    gpus: dict[str, list[HeldShare]] = Field(description="GPU UUID -> its holders of this kind (at most 256)")
    omitted: dict[str, int] = Field(default_factory=dict, description="GPU UUID -> holders beyond the 256 listed")
    process_owners: dict[str, HolderRef] = Field(description="host pid -> the holder running it")


class SpoolStats(BaseModel):
    files: int
    bytes: int
    removed: int = Field(description="uploads removed by retention since start")
    partial_files: int = Field(0, description="uploads still streaming or being validated (counted against the limits)")
    partial_bytes: int = 0


class Gpus(BaseModel):
    snapshot_version: int
    snapshot_time: float
    gpus: list[Gpu]
    collectors: dict[str, CollectorHealth]
    mps: Optional[Mps] = Field(description="None: --no-mps")
    kubelet: Optional[Kubelet] = Field(description="None: pod attribution off")
    spool: Optional[SpoolStats] = Field(description="None: uploads off")
    slurm: Optional[Slurm] = Field(None, description="None: no --hpc-job-mapping-dir")
    holders: dict[str, HolderKind] = Field(default_factory=dict, description="every holder kind running, by name "
                                           "(--holders): what it holds and the processes it owns")


class WorkloadGpuSeconds(BaseModel):
    """The GPU-second counters of one holder (docs/metrics.md, Workloads), since it was first seen."""

    held: float
    busy: float = Field(description="GPU-seconds busy in time, every basis together")
    held_idle: float
    busy_basis: dict[str, float] = Field(default_factory=dict,
                                         description="GPU-seconds busy in time, by the basis integrated (ctxsw, nvml)")
    sm_active: dict[str, float] = Field(description="GPU-seconds SM-active, by basis (exact, ctxsw, time_share)")
    hidden_idle: dict[str, float] = Field(description="GPU-seconds busy while the SMs idled, by basis")
    ledger: dict[str, float] = Field(default_factory=dict, description=(
        "physical view: the holder's GPU-seconds in each cell of its GPU's ledger (sm_active_work, hidden_idle, "
        "busy_unsplit, time_idle; docs/ledger.md). Never add held (the allocation view) to these"))


class Workload(GpuHolderRef):
    """One holder (a Kubernetes container, with its DRA claim where it holds the GPU through one, a Slurm
    job, a Unix user, or any registered kind's) of one GPU: docs/metrics.md, Workloads."""

    held_share: Optional[float] = Field(description="GPU-equivalents allocated by the scheduler; None where it "
                                                    "cannot be known (replicas without GetAllocatableResources)")
    held_share_basis: Literal[HELD_SHARE_BASES] = Field(
        description="why held_share is what it is: a whole GPU, a MIG device's share of the SMs, k of N replicas, "
                    "a DRA claim's consumed capacity over the device's (API server), or an even split among the "
                    "device's allocations, jobs or users (an estimate)")
    processes: Optional[int] = Field(description="the holder's CUDA processes on the GPU; None: NVML could not say")
    pids: list[int]
    time_share: Optional[float] = Field(None, description="GPU-equivalents of kernel time; None under MPS or MIG")
    time_share_reason: str = Field(description="how the time share was obtained, or why there is none")
    time_share_basis: Optional[Literal[TIME_SHARE_BASES]] = Field(
        None, description="ctxsw: resident time from the GPU's context switches; nvml: NVML per-process samples; "
                          "cupti: an MPS client's own kernels (the union of their intervals)")
    ctxsw_window: Optional[list[float]] = Field(
        None, description="[start, end] wall time of the context-switch (or cupti) window behind basis ctxsw "
                          "(cupti) values")
    sm_active: Optional[float] = Field(None, description="GPU-equivalents of SM activity")
    sm_active_basis: Optional[Literal[SM_ACTIVE_BASES]] = None
    sm_estimate: Optional[float] = Field(None, description="basis cupti: its MPS clients' own SM estimate (each "
                                         "kernel's grid against the SMs), before the scaling that keeps the clients' "
                                         "sum within the GPU's SM active")
    idle_seconds: Optional[float] = Field(description="how long the holder has held the GPU without using it")
    held_idle: bool = Field(description="idle_seconds reached --held-idle-after")
    gpu_seconds: WorkloadGpuSeconds
    folded: int = Field(0, description="the holder pod=\"other\": how many holders of the GPU beyond "
                                       "--holder-series-limit it sums (their counters integrate into its own)")
    ledger: dict[str, float] = Field(default_factory=dict, description=(
        "physical view now: the holder's cells of its GPU's ledger at the last update, as shares of the GPU's "
        "wall clock (they add up with the other holders' and the GPU's own cells to 1). held_share and "
        "time_share are the allocation view: never add the two"))


class GpuLedger(BaseModel):
    """One GPU's ledger (docs/ledger.md): every GPU-second in exactly one cell."""

    gpu: int
    uuid: str
    model: str
    cells: dict[str, float] = Field(description="each cell's share of the GPU's wall clock at the last update "
                                                "(they sum to 1)")
    gpu_seconds: dict[str, float] = Field(description="GPU-seconds per cell since the GPU entered the ledger")
    observed_seconds: float = Field(description="wall-clock seconds accounted: the sum of gpu_seconds")


class CtxswGpu(BaseModel):
    """The GPU context-switch source's state for one GPU (--workload-ctxsw)."""

    gpu: int
    uuid: str
    state: Literal[WORKLOAD_SOURCE_STATES]
    reason: str
    window: Optional[list[float]] = Field(None, description="[start, end] wall time of the last window captured")


class CuptiClient(BaseModel):
    """One traced MPS client's own window (exporter.sampler.ProcessShare), unscaled."""

    time: float = Field(description="share of the window its work ran: kernels, device copies and queued work")
    sm: Optional[float] = Field(None, description="its SM-active share of the whole GPU (its own estimate, unscaled)")
    parts: Optional[dict[str, float]] = Field(None, description=(
        "what its busy time is made of, as shares of the window: kernel_busy, sm_copy_busy (device-to-device "
        "copies and memsets, on the SMs), backlog_busy and queue_gap (work queued before the window, turns "
        "between queued kernels), copy_busy (host copies on the copy engines: no SMs, not in time)"))
    record_path: Optional[str] = Field(None, description="how its tracer read CUPTI's records: native, or "
                                                         "cupti-python (slows the job inside its windows)")


class CuptiGpu(CtxswGpu):
    """The cupti source's state for one GPU (--workload-cupti) and, for a GPU with MPS clients and a fresh
    window, how their SM estimates were scaled (exporter.workloads.CuptiGpu)."""

    gpu_sm_active: Optional[float] = Field(None, description="the GPU's SM active over the window (spatial source)")
    estimated: Optional[float] = Field(None, description="the traced clients' unscaled SM estimates, summed")
    scale: Optional[float] = Field(None, description="the factor applied to them (at most 1)")
    unattributed: Optional[float] = Field(None, description="SM active not attributed to a traced client")
    traced: Optional[int] = Field(None, description="MPS clients on the GPU whose window was traced")
    untraced: Optional[int] = Field(None, description="MPS clients on the GPU that do not trace")
    clients: dict[str, CuptiClient] = Field(default_factory=dict, description="per traced client's pid: its own "
                                                                           "window's shares and their parts")


class Workloads(BaseModel):
    snapshot_version: int
    snapshot_time: float
    workloads: list[Workload]
    ctxsw: Optional[list[CtxswGpu]] = Field(None, description="None: --workload-ctxsw is off")
    cupti: Optional[list[CuptiGpu]] = Field(None, description="None: --workload-cupti is off")
    ledgers: list[GpuLedger] = Field(default_factory=list, description="per GPU, its ledger: the physical view")


class Uploaded(BaseModel):
    stored: str = Field(description="the name the server gave the export in its spool")
    bytes: int
    gpus: list[str] = Field(description="UUIDs of the GPUs with metrics in the export")
    schema_: Optional[str] = Field(None, alias="schema", description="gpu_metrics or generic_events")

    model_config = ConfigDict(populate_by_name=True)


class DiagnosedPhase(BaseModel):
    """A phase of the capture: where the activity changes, judged on its own window."""

    model_config = ConfigDict(extra="allow")

    window_s: list[float] = Field(description="[start, end] in seconds from the capture start")
    activity: str = Field(description="the verdict the phase's GPU-metric buckets reach alone")
    verdict: Optional[Diagnosis] = None
    gpu_metrics: Optional[dict[str, float]] = None
    kernels: Optional[int] = Field(None, description="kernels in the phase; null without a kernel trace")


class DiagnosedGpu(BaseModel):
    """One GPU of `nsys-ingest diagnose --json` (its other fields: kernels, processes, GPU metrics)."""

    model_config = ConfigDict(extra="allow")

    gpu: int
    name: str
    uuid: Optional[str] = None
    sm_count: Optional[int] = None
    verdict: Optional[Diagnosis] = None
    phases: list[DiagnosedPhase] = Field([], description="per phase where the activity changes; [] where it does not")


class Coverage(BaseModel):
    capture_s: list[float] = Field(description="[first, last] GPU-metric sample, seconds from the capture start")
    kernel_trace_s: list[float] = Field(description="[first, last] kernel or copy of the trace")


class Diagnosed(BaseModel):
    """The answer of `nsys-ingest diagnose --json` for the uploaded export."""

    model_config = ConfigDict(extra="allow")

    file: str
    window_s: list[Optional[float]]
    coverage: Optional[Coverage] = Field(None, description="what the kernel trace covers of the capture (whole-capture "
                                                           "runs with a trace and GPU metrics; null otherwise)")
    notes: list[str]
    gpus: list[DiagnosedGpu]
