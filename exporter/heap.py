"""glibc's heap, where the exporter runs on glibc (a no-op elsewhere): fewer arenas, and free pages given back.

Every sampler ticks in a thread of its own, and glibc gives each thread that allocates an arena: two arenas
hold the same data in less resident memory (bench/RESULTS.md, footprint). What a burst frees (a context-switch
window: a step's output, the child's answer, the workload views it brings) stays resident in the heap as free
chunks until something reuses it; malloc_trim(0) hands those pages back (bench/RESULTS.md, "The exporter's
memory after a context-switch window")."""
from __future__ import annotations

import ctypes
import functools

M_ARENA_MAX = -8


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def limit_arenas(arenas: int = 2) -> None:
    """Must run before the threads start."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_ARENA_MAX, arenas)


def give_back() -> bool:
    """The heap's free pages back to the system; False where there is no malloc_trim (not glibc)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True
