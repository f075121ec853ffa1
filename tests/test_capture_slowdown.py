"""tests/capture_slowdown.py, the analysis bench/capture_slowdown.py runs: one long run cut into seconds with
and without a capture (issue 26's slowdown)."""
from tests.capture_slowdown import bins, runs, slowdown


def synthetic(windows, rate_off=100.0, rate_on=98.0, busy_after=3.0, end=200.0):
    """Progress every 0.2 s at rate_on inside capture windows and rate_off elsewhere; polls every 0.2 s
    with nsys alive 1 s before each window and busy_after seconds after it (its export)."""
    progress, polls, done, t = [], [], 0.0, 0.0
    while t <= end + 1e-9:
        capturing = any(s <= t <= e for s, e in windows)
        nsys = any(s - 1.0 <= t <= e + busy_after for s, e in windows)
        progress.append((round(t, 1), done))
        polls.append((round(t, 1), capturing, nsys))
        done += 0.2 * (rate_on if capturing else rate_off)
        t += 0.2
    return progress, polls


def test_runs_of_true_polls():
    polls = [(0, False, False), (1, True, True), (2, True, True), (3, False, True), (4, True, True)]
    assert runs(polls, 1) == [(1, 2), (4, 4)]
    assert runs(polls, 2) == [(1, 4)]


def test_exact_slowdown_on_a_synthetic_run():
    progress, polls = synthetic([(50.0, 60.0), (120.0, 130.0)])
    result = slowdown(progress, polls)
    assert [w["slowdown"] for w in result["windows"]] == [0.02, 0.02]
    assert result["slowdown_mean"] == 0.02
    assert all(w["on_rate"] == 98.0 and w["off_rate"] == 100.0 for w in result["windows"])


def test_bins_at_the_capture_edges_and_during_nsys_work_are_left_out():
    progress, polls = synthetic([(50.0, 60.0)], busy_after=3.0)
    states = {a: s for a, s, _ in bins(progress, polls)}
    # on: the capture covers the bin with a poll of margin on both sides
    assert states[51.0] == "on" and states[58.0] == "on"
    assert 50.0 not in states and 59.0 not in states  # edges: within a poll's margin
    # off: no nsys within 2 s; nsys lives 49..63 (start 1 s before, export 3 s after)
    assert states[46.0] == "off" and 47.0 not in states
    assert 64.0 not in states and states[65.0] == "off"


def test_a_window_without_off_seconds_around_it_is_not_compared():
    progress, polls = synthetic([(5.0, 195.0)], end=200.0)
    result = slowdown(progress, polls, neighbourhood_s=1.0)
    assert result["windows"] == [] and "slowdown_mean" not in result
