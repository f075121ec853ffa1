"""A capture's slowdown of a workload, from one long run cut into one-second bins with and without a capture
(the method: bench/capture_slowdown.py's docstring); read by tests/test_capture_slowdown.py and the benches
(bench/capture_slowdown.py, bench/ctxsw_live_cost.py)."""
from __future__ import annotations

import bisect
import json
import statistics
from pathlib import Path

POLL_MARGIN_S = 0.3  # a poll every 0.2 s: the capture's edges are known to this
QUIET_MARGIN_S = 2.0  # nsys' own start and finish: "off" only this far from any nsys process


def read_progress(path: Path) -> list[tuple[float, float]]:
    """(wall time, cumulative work) in time order, torn last lines skipped."""
    points = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                points.append((float(parts[0]), float(parts[1])))
            except ValueError:
                continue
    return sorted(points)


def read_timeline(path: Path) -> list[tuple[float, bool, bool]]:
    """(wall time, capturing, any nsys alive) polls."""
    polls = []
    for line in path.read_text().splitlines():
        try:
            poll = json.loads(line)
            polls.append((float(poll["t"]), bool(poll["capturing"]), bool(poll["nsys"])))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(polls)


def runs(polls, index: int) -> list[tuple[float, float]]:
    """[(first poll, last poll)] of the maximal runs of polls where field `index` is true."""
    out, start, last = [], None, None
    for poll in polls:
        if poll[index]:
            start = poll[0] if start is None else start
            last = poll[0]
        elif start is not None:
            out.append((start, last))
            start = None
    if start is not None:
        out.append((start, last))
    return out


def work_at(progress, t: float, times: list[float] | None = None) -> float | None:
    """Cumulative work at t, linear between progress points; None outside them. `times`: the points'
    times, when the caller looks up many t."""
    times = times if times is not None else [p[0] for p in progress]
    i = bisect.bisect_left(times, t)
    if i < len(times) and times[i] == t:
        return progress[i][1]
    if i == 0 or i == len(times):
        return None
    (t0, w0), (t1, w1) = progress[i - 1], progress[i]
    return w0 + (w1 - w0) * (t - t0) / (t1 - t0)


def bins(progress, polls, bin_s: float = 1.0) -> list[tuple[float, str, float]]:
    """(bin start, "on" | "off", rate) for every classified bin inside the progress log."""
    if len(progress) < 2 or not polls:
        return []
    captures, busy = runs(polls, 1), runs(polls, 2)
    times = [p[0] for p in progress]
    out = []
    t = progress[0][0]
    while t + bin_s <= min(progress[-1][0], polls[-1][0]):
        a, b = t, t + bin_s
        t = b
        if a < polls[0][0]:
            continue
        if any(s <= a - POLL_MARGIN_S and b + POLL_MARGIN_S <= e for s, e in captures):
            state = "on"
        elif not any(s - QUIET_MARGIN_S < b and a < e + QUIET_MARGIN_S for s, e in busy):
            state = "off"
        else:
            continue
        w0, w1 = work_at(progress, a, times), work_at(progress, b, times)
        if w0 is not None and w1 is not None:
            out.append((a, state, (w1 - w0) / bin_s))
    return out


def slowdown(progress, polls, neighbourhood_s: float = 30.0) -> dict:
    """Per capture window: its on bins' mean rate against the off bins' within the neighbourhood."""
    classified = bins(progress, polls)
    windows = []
    for start, end in runs(polls, 1):
        on = [r for a, s, r in classified if s == "on" and start <= a <= end]
        off = [r for a, s, r in classified if s == "off" and start - neighbourhood_s <= a <= end + neighbourhood_s]
        if on and off:
            on_rate, off_rate = statistics.fmean(on), statistics.fmean(off)
            windows.append({"start": round(start, 2), "on_seconds": len(on), "off_seconds": len(off),
                            "on_rate": round(on_rate, 4), "off_rate": round(off_rate, 4),
                            "slowdown": round(1 - on_rate / off_rate, 5) if off_rate else None})
    per_window = [w["slowdown"] for w in windows if w["slowdown"] is not None]
    result = {"windows": windows, "bins": {"on": sum(s == "on" for _, s, _ in classified),
                                           "off": sum(s == "off" for _, s, _ in classified)}}
    if per_window:
        result["slowdown_mean"] = round(statistics.fmean(per_window), 5)
        result["slowdown_median"] = round(statistics.median(per_window), 5)
        if len(per_window) > 1:
            result["slowdown_stderr"] = round(statistics.stdev(per_window) / len(per_window) ** 0.5, 5)
    return result
