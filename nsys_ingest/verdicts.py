"""From utilization evidence to what to change: one rule set for the live exporter and `diagnose`.

The exporter judges from live metrics (NVML time utilization, the spatial source, NVML's process
lists, MPS daemon faults); `nsys-ingest diagnose` judges from an export's GPU metrics and
CUDA kernel trace, which also tells launch-bound loops from small grids. Rules are tried in the order
of RULES below; the first that matches is the verdict. Pure Python: the exporter imports this
without pandas or numpy.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

# -- named thresholds (ratios of the window unless said otherwise) -----------------------------------
IDLE_BELOW = 0.05  # time utilization under this: nothing runs to speak of
BUSY_TIME = 0.5  # time utilization under this while processes hold the GPU: it waits for its inputs
SATURATED_SM = 0.8  # SM active at or over this: the SMs are full, the GPU is the bottleneck
LOW_SM = 0.5  # SM active under this while busy in time: idle SMs hidden behind the time figure
MEMORY_BOUND_DRAM = 0.6  # DRAM active at or over this while SM active is under SATURATED_SM
LONG_GAP_S = 1e-3  # an idle gap this long is waiting on the host, not launch latency
INPUT_BOUND_LONG_GAPS = 0.5  # share of the idle time in long gaps for input-bound (kernel trace)
LAUNCH_BOUND_KERNEL_S = 20e-6  # median kernel shorter than this: launch overhead dominates
MPS_STALL_FAULTS_PER_S = 1.0  # MPS server major faults per second (as the MPSDaemonMajorPageFaults alert)
CONCURRENT_KERNELS = 1.2  # kernel time / busy time of short kernels at or over this: they run side by side (MPS)
# A kernel switched out at the end of its context's time slice keeps its start and end around the other
# contexts' slices, so long kernels overlap under time slicing too; one shorter than this one cannot
# span a slice, so only short kernels' overlap tells MPS from time slicing.
SHORT_KERNEL_S = 100e-6
MIN_SHORT_KERNELS = 100  # fewer short kernels than this in the window: their overlap proves nothing
THROTTLED_CLOCK = 0.9  # SM clock under this share of its maximum while busy, held by power or thermal: throttled
# NVML clock event reasons (exporter.nvml.CLOCK_EVENT_REASONS) that mean a power or thermal limit, and
# what each asks of the operator.
POWER_THERMAL_REASONS = {
    "sw_power_cap": "the board's power limit (software power cap)",
    "hw_power_brake_slowdown": "an external power brake (the system's power supply asked for less)",
    "hw_slowdown": "a hardware slowdown (power or temperature far over its limit)",
    "sw_thermal_slowdown": "the GPU's temperature limit (software thermal slowdown)",
    "hw_thermal_slowdown": "a hardware thermal slowdown (the GPU or its memory too hot)",
}

# How a GPU is shared (gpu_sharing_mode{mode}, the API's sharing_mode): spelled here, the lowest floor that
# names them (exporter/vocabulary.py takes them from here).
EXCLUSIVE, TIME_SLICED, MPS, MIG, IDLE = "exclusive", "time_sliced", "mps", "mig", "idle"
SHARING_MODES = (EXCLUSIVE, TIME_SLICED, MPS, MIG, IDLE)


def sharing_mode(time_sliced: int, mps_clients: int, mig_enabled: bool | None = None) -> str:
    """How the GPU is shared now. MPS clients share one context (the server's); every other process
    has its own, and two or more contexts take turns in time slices."""
    if mig_enabled:
        return MIG
    contexts = time_sliced + (1 if mps_clients else 0)
    if contexts == 0:
        return IDLE
    if contexts > 1:
        return TIME_SLICED
    return MPS if mps_clients else EXCLUSIVE


@dataclass(frozen=True)
class Evidence:
    """What a rule may look at; None where the source cannot tell."""

    time_utilization: float | None  # share of the window with a kernel running
    sm_active: float | None = None
    dram_active: float | None = None
    sharing_mode: str | None = None
    processes: int | None = None  # workload processes on the GPU (the MPS server not counted)
    mps_server_faults_per_s: float | None = None
    # From a CUDA kernel trace only:
    long_gap_idle_share: float | None = None  # share of the idle time spent in gaps >= LONG_GAP_S
    median_kernel_s: float | None = None
    median_grid_blocks: float | None = None
    sm_count: int | None = None
    sm_footprint: float | None = None  # duration-weighted share of the SMs the kernels' grids can occupy
    kernel_trace: bool | None = None  # True: an export's CUDA trace (the fields above are known where it has kernels)
    kernel_busy_share: float | None = None  # share of the window with a kernel running
    copy_busy_share: float | None = None  # share of the window with a memory copy or memset running
    # Live NVML only:
    sm_clock_hertz: float | None = None
    sm_clock_max_hertz: float | None = None
    clock_event_reasons: tuple[str, ...] | None = None  # why the clocks are below their maximum now
    throttle_share: float | None = None  # share of the last NVML health window held down by power or thermal


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str  # what the rule saw, in numbers
    advice: str

    def to_json(self, evidence: Evidence) -> dict:
        return {**asdict(self), "evidence": {k: v for k, v in asdict(evidence).items() if v is not None}}


def _pct(value: float) -> str:
    return f"{value:.0%}"


def _vs(value: float, op: str, threshold: float) -> str:
    """'49.96% (< 50%)', not '50% (< 50%)': as many decimals as it takes to tell value from threshold."""
    for digits in range(4):
        shown = f"{value:.{digits}%}"
        if value == threshold or shown != f"{threshold:.{digits}%}":
            break
    return f"{shown} ({op} {_pct(threshold)})"


def _mps_server_paging(e: Evidence):
    if e.mps_server_faults_per_s is not None and e.mps_server_faults_per_s >= MPS_STALL_FAULTS_PER_S:
        return (f"the MPS server takes {e.mps_server_faults_per_s:.1f} major page faults/s "
                f"(>= {MPS_STALL_FAULTS_PER_S:g}): every client waits while it is paged in",
                "free host memory or keep the server resident: more RAM, fewer processes, less swap")


def _idle(e: Evidence):
    if e.time_utilization < IDLE_BELOW:
        return (f"time utilization {_vs(e.time_utilization, '<', IDLE_BELOW)}",
                "nothing to fix on the GPU; if jobs hold it, give it back or pack more work onto it")


def _throttled(e: Evidence):
    # Before memory_bound and saturated: whatever limits the work, clocks held down slow all of it,
    # and the fix is in the machine room, not in the code.
    held = [r for r in e.clock_event_reasons or () if r in POWER_THERMAL_REASONS]
    if not held or not e.sm_clock_hertz or not e.sm_clock_max_hertz or e.time_utilization < BUSY_TIME:
        return None
    ratio = e.sm_clock_hertz / e.sm_clock_max_hertz
    if ratio >= THROTTLED_CLOCK:
        return None
    share = "" if e.throttle_share is None else f"; held down {_pct(e.throttle_share)} of the last window"
    fixes = []
    if any(r in ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown") for r in held):
        fixes.append("cooling: inlet air temperature, airflow and fans, failed or blocked heat sinks "
                     "(nvidia-smi -q -d TEMPERATURE,PERFORMANCE)")
    if any(r in ("sw_power_cap", "hw_power_brake_slowdown", "hw_slowdown") for r in held):
        fixes.append("power: the board's limit against its maximum (nvidia-smi -q -d POWER; raise it with "
                     "nvidia-smi -pl where the chassis can supply it), the node's power supply and capping policy")
    return (f"SM clock {e.sm_clock_hertz / 1e6:.0f} MHz of {e.sm_clock_max_hertz / 1e6:.0f} MHz "
            f"({_vs(ratio, '<', THROTTLED_CLOCK)}) while busy {_pct(e.time_utilization)} of the time, held down by "
            f"{'; '.join(POWER_THERMAL_REASONS[r] for r in held)}{share}",
            f"{'; '.join(fixes)}: every kernel runs slower until the clocks come back, whatever the code does")


def _memory_bound(e: Evidence):
    # Before saturated: warps waiting on DRAM keep their SMs "active", so a memory-bound loop reads
    # SM active near 100% (a copy loop on the H100: DRAM active 0.81-0.90, SM active 0.91-1.0).
    if e.dram_active is None or e.dram_active < MEMORY_BOUND_DRAM:
        return None
    sm = "unknown" if e.sm_active is None else _pct(e.sm_active)
    reason = f"DRAM active {_vs(e.dram_active, '>=', MEMORY_BOUND_DRAM)} with SM active {sm}"
    if e.copy_busy_share and e.copy_busy_share >= (e.kernel_busy_share or 0.0):
        return (f"{reason}; memory copies run {_pct(e.copy_busy_share)} of the window, kernels "
                f"{_pct(e.kernel_busy_share or 0.0)}: the GPU's work is moving memory",
                "avoid the copies (views and in-place ops instead of copies, keep data where it is used, "
                "fewer dtype and device conversions) or overlap them with compute; faster kernels will not help")
    return (f"{reason}: the SMs are occupied but their warps wait on memory",
            "memory bandwidth limits it, not compute: fuse kernels (torch.compile), lower precision, reuse data "
            "while it is in cache; more SMs or tensor cores will not help")


def _saturated(e: Evidence):
    if e.sm_active is not None and e.sm_active >= SATURATED_SM:
        dram = "" if e.dram_active is None else f", DRAM active {_vs(e.dram_active, '<', MEMORY_BOUND_DRAM)}"
        return (f"SM active {_vs(e.sm_active, '>=', SATURATED_SM)}{dram}: compute-bound",
                "the GPU is the bottleneck: optimise kernels (tensor cores, precision) or add GPUs")


def _sm_fill(e: Evidence) -> float | None:
    """SM active per unit of busy time: how much of the SMs the kernels fill while they run."""
    if e.sm_active is None or not e.time_utilization:
        return None
    return min(e.sm_active / e.time_utilization, 1.0)


def _host_bound(e: Evidence):
    # Live (no trace): busy little, with the SMs nearly empty even while busy, is tiny kernels with
    # the host in between; only a trace tells launch overhead from a slow input pipeline.
    fill = _sm_fill(e)
    if e.kernel_trace or e.time_utilization >= BUSY_TIME or e.processes == 0 or (fill is not None and fill >= LOW_SM):
        return None
    seen = ("SM activity unknown" if fill is None else
            f"while they run they fill {_pct(fill)} of the SMs (SM active {_pct(e.sm_active)}): small "
            "kernels with the host in between")
    return (f"kernels run {_vs(e.time_utilization, '<', BUSY_TIME)} of the time; {seen}",
            "certain: the GPU waits on the host. Launch overhead (tiny kernels: CUDA graphs, fusion, larger "
            "batches) or the input pipeline (loader workers, pinned memory)? A trace tells: nsys profile "
            "--trace=cuda, then nsys-ingest diagnose (or gpu-spatial nsys diagnose)")


def _input_bound(e: Evidence):
    if e.processes == 0:
        return None
    long_gaps = e.long_gap_idle_share is not None and e.long_gap_idle_share >= INPUT_BOUND_LONG_GAPS
    if e.kernel_trace and not long_gaps:
        return None  # idle in many tiny gaps: launch latency, not input
    idle = 1.0 - e.time_utilization
    hidden = None if e.sm_active is None else max(e.time_utilization - e.sm_active, 0.0)
    if e.time_utilization < BUSY_TIME:
        busy = f"kernels run {_vs(e.time_utilization, '<', BUSY_TIME)} of the time"
    elif long_gaps and hidden is not None and idle > hidden:
        # Busy most of the time, but waiting in long gaps costs more than idle SMs inside kernels.
        busy = f"the GPU idles {_pct(idle)} of the time, more than its SMs idle while kernels run ({_pct(hidden)})"
    else:
        return None
    gaps = f", {_pct(e.long_gap_idle_share)} of the idle time in gaps >= {LONG_GAP_S * 1e3:g} ms" if long_gaps else ""
    fill = _sm_fill(e)
    fills = "" if fill is None or e.kernel_trace else f", kernels fill {_pct(fill)} of the SMs while they run"
    return (f"{busy}{gaps}{fills}: the GPU waits for the host",
            "speed up the input pipeline: more DataLoader workers, pinned memory and prefetching, "
            "preprocessing on the GPU, or fewer host syncs; a service waiting on requests has room for more work")


def _hidden_idle(e: Evidence) -> bool:
    return e.sm_active is not None and e.sm_active < LOW_SM


def _time_sliced(e: Evidence):
    if _hidden_idle(e) and e.sharing_mode == "time_sliced":
        return (f"{e.processes or 'several'} processes take turns on the GPU (time-sliced); time utilization "
                f"{_pct(e.time_utilization)} but SM active {_pct(e.sm_active)}{_footprint(e)}",
                "run them under CUDA MPS so their kernels share the SMs (2.2-4.1x the steps here), "
                "use larger batches, or give each a MIG slice sized to it")


def _mps_shared(e: Evidence):
    # Sharing is already right; what is left is how much of the GPU the clients fill together.
    if e.sm_active is not None and e.sharing_mode == "mps":
        return (f"{e.processes or 'several'} MPS clients run side by side and fill {_vs(e.sm_active, '<', SATURATED_SM)} "
                f"of the SMs{_footprint(e)}",
                "room for more: add clients to this GPU or use larger batches; if SM active stays low, a "
                "smaller MIG slice or GPU fits these jobs")


def _launch_bound(e: Evidence):
    if _hidden_idle(e) and e.median_kernel_s is not None and e.median_kernel_s < LAUNCH_BOUND_KERNEL_S:
        return (f"median kernel {e.median_kernel_s * 1e6:.1f} us (< {LAUNCH_BOUND_KERNEL_S * 1e6:g} us) "
                f"back to back; SM active {_pct(e.sm_active)}",
                "launch overhead dominates: CUDA graphs, kernel fusion (torch.compile), larger batches")


def _small_grid(e: Evidence):
    if _hidden_idle(e) and e.median_grid_blocks is not None and e.sm_count \
            and e.median_grid_blocks < e.sm_count:
        return (f"median grid {e.median_grid_blocks:g} blocks on {e.sm_count} SMs{_footprint(e)}; "
                f"SM active {_pct(e.sm_active)}",
                "the kernels' grids cannot fill the GPU: larger batches or more parallel work per kernel, "
                "or share the GPU with other jobs (MPS, MIG)")


def _underused_sms(e: Evidence):
    # The trace rules out short and narrow kernels: the SMs idle inside kernels that should fill them.
    if _hidden_idle(e) and e.kernel_trace and e.median_kernel_s is not None:
        return (f"time utilization {_pct(e.time_utilization)} but SM active {_vs(e.sm_active, '<', LOW_SM)}, although "
                f"the median kernel runs {e.median_kernel_s * 1e6:.0f} us on {e.median_grid_blocks:g} blocks"
                f"{_footprint(e)}",
                "the SMs idle inside the kernels: look into them with Nsight Compute (ncu: occupancy, tail "
                "effect, stalls); kernels with fewer blocks than SMs cost the rest")


def _small_kernels(e: Evidence):
    if _hidden_idle(e) and not e.kernel_trace:
        return (f"time utilization {_pct(e.time_utilization)} but SM active {_vs(e.sm_active, '<', LOW_SM)}"
                f"{_footprint(e)}",
                "kernels too small for the GPU: larger batches, CUDA graphs or fusion; profile with "
                "nsys --trace=cuda and run nsys-ingest diagnose (or gpu-spatial nsys diagnose) to tell launch-bound "
                "loops from small grids")


def _no_finding(e: Evidence):
    if e.sm_active is not None:
        return (f"time utilization {_pct(e.time_utilization)}, SM active {_pct(e.sm_active)}: no rule matched",
                "nothing obvious to change")


def _footprint(e: Evidence) -> str:
    return "" if e.sm_footprint is None else f", kernels' grids cover {_pct(e.sm_footprint)} of the SMs"


RULES = (("mps_server_paging", _mps_server_paging), ("idle", _idle), ("throttled", _throttled),
         ("memory_bound", _memory_bound),
         ("saturated", _saturated), ("host_bound", _host_bound), ("input_bound", _input_bound),
         ("time_sliced_small_kernels", _time_sliced), ("mps_shared", _mps_shared),
         ("launch_bound", _launch_bound), ("small_grid", _small_grid), ("underused_sms", _underused_sms),
         ("small_kernels", _small_kernels), ("no_finding", _no_finding))
VERDICTS = tuple(name for name, _rule in RULES)


def judge(evidence: Evidence) -> Verdict | None:
    """The first rule that matches, or None when there is too little evidence (no time utilization,
    or a GPU busy in time with no SM activity to compare it to)."""
    if evidence.time_utilization is None:
        return None
    for name, rule in RULES:
        found = rule(evidence)
        if found:
            return Verdict(name, *found)
    return None
