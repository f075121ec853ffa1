"""One vocabulary: the names of states, bases, quantities and the ledger's cells, spelled once."""
from __future__ import annotations

# --- The ledger's cells (exporter/ledger.py, docs/ledger.md): every GPU-second of a GPU in exactly one ---------
SM_ACTIVE_WORK = "sm_active_work"  # a holder's kernels ran and its SMs were active
HIDDEN_IDLE = "hidden_idle"        # a holder's kernels ran, the SMs idled
BUSY_UNSPLIT = "busy_unsplit"      # a holder's kernels ran; no spatial reading splits work from hidden idle
TIME_IDLE = "time_idle"            # no kernel ran: the holders' time, by held share
SWITCH_OVERHEAD = "switch_overhead"  # gaps between time slices (basis ctxsw)
UNHELD = "unheld"                  # no kernel ran on the share nobody held (all of it on a GPU without holders)
UNMEASURED = "unmeasured"          # the GPU's busy time could not be read: busy or idle, nobody can tell
HOLDER_CELLS = (SM_ACTIVE_WORK, HIDDEN_IDLE, BUSY_UNSPLIT, TIME_IDLE)
# The same physical cells where a basis cannot split them among holders (MPS clients without per-client
# numbers, MIG instances without per-process ones, processes of no holder, held shares unknown)
UNATTRIBUTED_SM_ACTIVE_WORK = "unattributed_sm_active_work"
UNATTRIBUTED_HIDDEN_IDLE = "unattributed_hidden_idle"
UNATTRIBUTED_BUSY_UNSPLIT = "unattributed_busy_unsplit"
UNATTRIBUTED_TIME_IDLE = "unattributed_time_idle"
UNATTRIBUTED_CELLS = (UNATTRIBUTED_SM_ACTIVE_WORK, UNATTRIBUTED_HIDDEN_IDLE, UNATTRIBUTED_BUSY_UNSPLIT,
                      UNATTRIBUTED_TIME_IDLE)
GPU_CELLS = (*HOLDER_CELLS, *UNATTRIBUTED_CELLS, SWITCH_OVERHEAD, UNHELD, UNMEASURED)
# Physical waste: hidden idle + time idle + switch overhead (unheld is capacity nobody was given, not waste)
WASTE_CELLS = (HIDDEN_IDLE, UNATTRIBUTED_HIDDEN_IDLE, TIME_IDLE, UNATTRIBUTED_TIME_IDLE, SWITCH_OVERHEAD)
# Cells whose split into work and waste is unknown: waste is a lower bound where they are not 0
UNSPLIT_CELLS = (BUSY_UNSPLIT, UNATTRIBUTED_BUSY_UNSPLIT, UNMEASURED)
