"""The one place that spells the names the exporter publishes for states, bases and quantities.

Series labels, API fields, the report and the rules read these words: a new basis (cupti) or a ledger
cell is one line here, and a misspelling fails at import instead of publishing a new label value.
"""
from __future__ import annotations

# Sharing modes are spelled in nsys_ingest (a lower floor that names them too); re-exported here.
from nsys_ingest.verdicts import EXCLUSIVE, IDLE, MIG as MIG_MODE, MPS, SHARING_MODES, TIME_SLICED  # noqa: F401 - re-exported


def check(word, allowed: tuple, what: str, optional: bool = False) -> None:
    """Refuses a word outside its vocabulary where a record is built, as client_python's Metric refuses a type
    outside METRIC_TYPES: a misspelling fails there, not as a new label value in every view."""
    if word not in allowed and not (optional and word is None):
        raise ValueError(f"{what} {word!r}: none of {', '.join(allowed)} (exporter/vocabulary.py)")


# -- states -----------------------------------------------------------------------------------------
# What a source says about one GPU (gpu_spatial_source_state{state}, gpu_workload_<source>_state{state}).
# A spatial source reports OK or PENDING, which the chain publishes as ACTIVE or STANDBY; a source that
# was not configured (or switched off) is DISABLED.
OK, PENDING = "ok", "pending"
ACTIVE, STANDBY, DISABLED, UNSUPPORTED, ERROR = "active", "standby", "disabled", "unsupported", "error"
PUBLISHED_STATES = (ACTIVE, STANDBY, DISABLED, UNSUPPORTED, ERROR)  # spatial sources, in published order
SOURCE_STATES = (OK, PENDING, UNSUPPORTED, ERROR)  # what a spatial source says (SourceResult)
WORKLOAD_SOURCE_STATES = (ACTIVE, STANDBY, UNSUPPORTED, ERROR, DISABLED)  # workload sources, in published order

# -- process kinds ----------------------------------------------------------------------------------
# A compute process on a GPU (gpu_compute_processes{kind}, the API's compute_processes): an MPS client, a
# process with its own context taking time slices, or the MPS server (infrastructure: never a workload).
MPS_CLIENT, MPS_SERVER = MPS, "mps_server"
PROCESS_KINDS = (MPS_CLIENT, TIME_SLICED, MPS_SERVER)
WORKLOAD_PROCESS_KINDS = (MPS_CLIENT, TIME_SLICED)  # those counted: a workload's processes

# -- bases of per-workload values -------------------------------------------------------------------
EXACT = "exact"            # measured for the holder alone (alone on the GPU, or its own MIG instance)
TIME_SHARE = "time_share"  # the GPU's value split by time shares: an allocation, labelled as such
CTXSW = "ctxsw"            # the GPU's own context switches (exporter/samplers/ctxsw.py)
NVML = "nvml"              # NVML per-process utilization, scaled to the GPU's time utilization
CUPTI = "cupti"            # an MPS client's own kernel records
TIME_SHARE_BASES = (CTXSW, NVML, CUPTI)  # of gpu_workload_time_share_ratio{basis}
SM_ACTIVE_BASES = (EXACT, CTXSW, TIME_SHARE, CUPTI)  # of gpu_workload_sm_active_ratio{basis}

# Why a held share is what it is (gpu_workload_held_share_basis_info, /api/v1/workloads held_share_basis).
WHOLE = "whole"            # a whole GPU
REPLICAS = "replicas"      # k of the N device-plugin replicas offered for the GPU (time-slicing, MPS)
MIG = "mig"                # a MIG device's share of the parent's SMs
CAPACITY = "capacity"      # a DRA claim's consumed capacity over the device's capacity (API server)
EVEN_SPLIT = "even_split"  # split evenly among the allocations, jobs or users of the device
HELD_SHARE_BASES = (WHOLE, MIG, REPLICAS, CAPACITY, EVEN_SPLIT)  # from exact to estimated

# -- quantities -------------------------------------------------------------------------------------
# A workload's GPU-second counters (gpu_workload_<quantity>_gpu_seconds, /api/v1/workloads gpu_seconds).
HELD, BUSY, SM_ACTIVE, HIDDEN_IDLE, HELD_IDLE = "held", "busy", "sm_active", "hidden_idle", "held_idle"
BUSY_BY_BASIS = "busy_basis"  # the busy counter split by the basis of the time share integrated
QUANTITIES = (HELD, BUSY, SM_ACTIVE, HIDDEN_IDLE, HELD_IDLE)
PLAIN_QUANTITIES = (HELD, BUSY, HELD_IDLE)  # one counter each
QUANTITIES_BY_BASIS = (BUSY_BY_BASIS, SM_ACTIVE, HIDDEN_IDLE)  # basis -> counter

# -- ledger cells (issue 35; exporter/ledger.py, docs/ledger.md) ------------------------------------
# Where each GPU-second of a GPU's physical ledger lands: exactly one cell.
SM_ACTIVE_WORK = "sm_active_work"  # a holder's kernels ran and its SMs were active
# HIDDEN_IDLE (above) is also a cell: a holder's kernels ran (or its context was resident), the SMs idled
BUSY_UNSPLIT = "busy_unsplit"      # a holder's kernels ran; no spatial reading splits work from hidden idle
TIME_IDLE = "time_idle"            # no kernel ran: the holders' time, by held share
SWITCH_OVERHEAD = "switch_overhead"  # gaps between time slices (basis ctxsw)
UNHELD = "unheld"                  # no kernel ran on the share nobody held (all of it on a GPU without holders)
UNMEASURED = "unmeasured"          # the GPU's busy time could not be read: busy or idle, nobody can tell
LOST = "lost"                      # the GPU answered GPU_IS_LOST (fell off the bus): it exists, nothing runs on it
# Not an exporter's cell: the report's name for the time a GPU existed while no exporter observed it
# (exporter down, node restarting): existence less observed seconds (docs/ledger.md)
UNOBSERVED = "unobserved"
HOLDER_CELLS = (SM_ACTIVE_WORK, HIDDEN_IDLE, BUSY_UNSPLIT, TIME_IDLE)
# The same physical cells where a basis cannot split them among holders (MPS clients without per-client
# numbers, MIG instances without per-process ones, processes of no holder, held shares unknown)
UNATTRIBUTED_SM_ACTIVE_WORK = "unattributed_sm_active_work"
UNATTRIBUTED_HIDDEN_IDLE = "unattributed_hidden_idle"
UNATTRIBUTED_BUSY_UNSPLIT = "unattributed_busy_unsplit"
UNATTRIBUTED_TIME_IDLE = "unattributed_time_idle"
UNATTRIBUTED_CELLS = (UNATTRIBUTED_SM_ACTIVE_WORK, UNATTRIBUTED_HIDDEN_IDLE, UNATTRIBUTED_BUSY_UNSPLIT,
                      UNATTRIBUTED_TIME_IDLE)
GPU_CELLS = (*HOLDER_CELLS, *UNATTRIBUTED_CELLS, SWITCH_OVERHEAD, UNHELD, UNMEASURED, LOST)
# Physical waste: hidden idle + time idle + switch overhead (unheld is capacity nobody was given, not waste)
WASTE_CELLS = (HIDDEN_IDLE, UNATTRIBUTED_HIDDEN_IDLE, TIME_IDLE, UNATTRIBUTED_TIME_IDLE, SWITCH_OVERHEAD)
# Cells whose split into work and waste is unknown: waste is a lower bound where they are not 0
UNSPLIT_CELLS = (BUSY_UNSPLIT, UNATTRIBUTED_BUSY_UNSPLIT, UNMEASURED)
LEDGER = "ledger"  # the holders' cells among a workload's counters (/api/v1/workloads gpu_seconds.ledger)
