"""One window's records, summarised per GPU: what the exporter needs and nothing else.

Records are kept compactly (array.array, a few bytes each) while the window runs, on CUPTI's buffer
thread; the summary runs once at the window's end, on the tracer's own thread, with numpy (a
dependency of cupti-python): one sweep over the sorted start and end events of each GPU gives

- kernel_busy_s: the time at least one of the process's kernels ran: the UNION of their intervals,
  never their sum (kernels of two streams overlap);
- sm_seconds: the integral of the SMs its running kernels hold (gpu_trace.occupancy), as a share of
  the GPU, capped at the whole GPU at every instant;
- copy_busy_s: the union of its memcpy and memset intervals (copy engines: no SMs counted).

Every interval is clipped to the window first: a kernel straddling an edge counts only its part inside.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

KERNEL, COPY = 0, 1


@dataclass
class Records:
    """A bounded store of one window's intervals (CUPTI timestamps, ns)."""

    capacity: int
    kind: array = field(default_factory=lambda: array("b"))
    device: array = field(default_factory=lambda: array("h"))
    start: array = field(default_factory=lambda: array("q"))
    end: array = field(default_factory=lambda: array("q"))
    sm: array = field(default_factory=lambda: array("f"))  # share of the GPU's SMs (kernels), 0 for copies
    refused: int = 0  # records past the capacity

    def add(self, kind: int, device: int, start: int, end: int, sm: float) -> bool:
        """False once full (the window then ends early, where the records are still complete)."""
        if len(self.start) >= self.capacity:
            self.refused += 1
            return False
        self.kind.append(kind)
        self.device.append(device)
        self.start.append(start)
        self.end.append(end)
        self.sm.append(sm)
        return True

    def __len__(self) -> int:
        return len(self.start)

    @property
    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for a in (self.kind, self.device, self.start, self.end, self.sm))


def sweep(starts, ends, weights, lo: int, hi: int) -> tuple[float, float]:
    """(union of the intervals, integral of min(1, sum of the running weights)), both in ns, over
    [lo, hi]. `starts`, `ends`: int64 arrays; `weights`: float array (None: union only)."""
    import numpy as np

    s = np.clip(np.asarray(starts, dtype=np.int64), lo, hi)
    e = np.clip(np.asarray(ends, dtype=np.int64), lo, hi)
    keep = e > s
    if not keep.any():
        return 0.0, 0.0
    s, e = s[keep], e[keep]
    w = np.zeros(len(s)) if weights is None else np.asarray(weights, dtype=np.float64)[keep]
    times = np.concatenate([s, e])
    order = np.argsort(times, kind="stable")
    times = times[order]
    running = np.cumsum(np.concatenate([np.ones(len(s), np.int64), -np.ones(len(e), np.int64)])[order])
    load = np.cumsum(np.concatenate([w, -w])[order])
    gaps = np.diff(times).astype(np.float64)
    busy = running[:-1] > 0
    load = np.where(busy, np.clip(load[:-1], 0.0, 1.0), 0.0)  # float drift cannot go below 0 or past the GPU
    return float(gaps[busy].sum()), float((gaps * load).sum())


def summarise(records: Records, lo: int, hi: int, devices: dict[int, str]) -> list[dict]:
    """Per GPU the process sees (`devices`: CUDA ordinal -> UUID): its kernel-busy, SM and copy seconds in
    [lo, hi] (CUPTI ns). GPUs it ran nothing on are listed with zeros: the process was traced there."""
    import numpy as np

    kind = np.frombuffer(records.kind, dtype=np.int8) if len(records) else np.zeros(0, np.int8)
    device = np.frombuffer(records.device, dtype=np.int16) if len(records) else np.zeros(0, np.int16)
    start = np.frombuffer(records.start, dtype=np.int64) if len(records) else np.zeros(0, np.int64)
    end = np.frombuffer(records.end, dtype=np.int64) if len(records) else np.zeros(0, np.int64)
    sm = np.frombuffer(records.sm, dtype=np.float32) if len(records) else np.zeros(0, np.float32)
    out = []
    for ordinal, uuid in sorted(devices.items()):
        kernels = (device == ordinal) & (kind == KERNEL)
        copies = (device == ordinal) & (kind == COPY)
        busy, sm_ns = sweep(start[kernels], end[kernels], sm[kernels], lo, hi)
        copy_busy, _ = sweep(start[copies], end[copies], None, lo, hi)
        inside = kernels & (end > lo) & (start < hi)
        out.append({"uuid": uuid, "kernels": int(inside.sum()), "kernel_busy_s": round(busy / 1e9, 9),
                    "sm_seconds": round(sm_ns / 1e9, 9), "copy_busy_s": round(copy_busy / 1e9, 9)})
    return out
