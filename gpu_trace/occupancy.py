"""How many SMs a kernel's grid occupies, from its launch shape and resources.

SM active (what DCGM, GPM and nsys measure) is the share of SMs with at least one warp resident. A
kernel of `blocks` blocks, of which `fit` fit one SM at once (CUDA's occupancy rule: the fewest that
threads, warps, registers, shared memory and the per-SM block limit allow), runs in waves of
`sm_count * fit` blocks; the block scheduler spreads a wave over the SMs first, so a partial wave of r
blocks holds min(r, sm_count) SMs. Averaged over equal waves, the kernel holds

    ((waves - 1) * sm_count + min(last_wave_blocks, sm_count)) / waves      SMs.

It assumes blocks of equal length and ignores clusters and other processes' blocks (under MPS a
client's blocks may wait for SMs another client holds: the exporter scales the clients' sum down to
the GPU's measured SM active). Register and shared-memory allocation granularities are Hopper's and
Ampere's (256 registers per warp, 1 KiB reserved per block, 128-byte shared-memory units).
"""
from __future__ import annotations

from dataclasses import dataclass

REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
RESERVED_SHARED_PER_BLOCK = 1024  # the driver keeps 1 KiB of shared memory per resident block (sm_80+)
SHARED_UNIT = 128


@dataclass(frozen=True)
class DeviceLimits:
    """What one SM holds (CUPTI's device record: cupti.ActivityDevice*)."""

    sm_count: int
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    registers_per_sm: int = 65536
    shared_per_sm: int = 233472  # bytes; 228 KiB on Hopper
    warp_size: int = 32


def blocks_per_sm(limits: DeviceLimits, threads_per_block: int, registers_per_thread: int,
                  shared_per_block: int) -> int:
    """The most blocks of this shape resident on one SM at once (at least 1: a kernel that launched fits)."""
    warps = max(1, -(-threads_per_block // limits.warp_size))
    fit = min(limits.max_blocks_per_sm, limits.max_warps_per_sm // warps)
    if registers_per_thread > 0:
        per_warp = -(-registers_per_thread * limits.warp_size // REGISTER_UNIT) * REGISTER_UNIT
        fit = min(fit, limits.registers_per_sm // (per_warp * warps))
    if shared_per_block > 0:
        per_block = -(-shared_per_block // SHARED_UNIT) * SHARED_UNIT + RESERVED_SHARED_PER_BLOCK
        fit = min(fit, limits.shared_per_sm // per_block)
    return max(1, fit)


def sms_occupied(sm_count: int, blocks: int, fit: int) -> float:
    """SMs the grid holds on average over its waves (the module's formula)."""
    if blocks <= 0 or sm_count <= 0:
        return 0.0
    wave = sm_count * max(1, fit)
    waves = -(-blocks // wave)
    last = blocks - (waves - 1) * wave
    return ((waves - 1) * sm_count + min(last, sm_count)) / waves


def sm_fraction(limits: DeviceLimits, blocks: int, threads_per_block: int, registers_per_thread: int,
                shared_per_block: int) -> float:
    """The share of the GPU's SMs the kernel holds while it runs (0..1)."""
    fit = blocks_per_sm(limits, threads_per_block, registers_per_thread, shared_per_block)
    return sms_occupied(limits.sm_count, blocks, fit) / limits.sm_count if limits.sm_count else 0.0
