"""gpu-spatial report on a 48-hour history with every case of issue 28 (tests/account_history.py), loaded
once per store: Debian's Prometheus (promtool-built blocks of the counters, then of the rollups from hour
30, skipping the outage, evaluated every minute) and Debian's VictoriaMetrics (the counters through its
import API, the rollups by Debian's vmalert replaying the project's rules every 5 minutes).

Targets: the counters within 0.1% of the hand-computed GPU-hours; every rollups column within 0.5% of the
counters; the MPS clients' unknown GPU-hours the same from both; the spans the header names are the
ones the data allows (exact boundaries from the interval and window the data shows)."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from gpu_spatial.report.summary import UNKNOWN_WITHOUT
from tests import account_history as history
from tests.helpers import RULES, http_get, wait_for
from tests.test_report import run_report, start_prometheus, start_victoria_metrics, stop

VMALERT_INTERVAL = 300.0
REPLAY_POINTS = 50
WINDOW = 300.0
ROLLUP_GROUPINGS = ("namespace", "hpc_job", "node", "model", "user", "claim")  # pod has no rollups
# promtool's blocks (counters and rollups) span 162 h, its largest below this, and the history lies in one:
# promtool 2.42 backfills rules block by block and loses the evaluation on a block's edge when the group's
# offset (a hash of the rules file's path, random here) falls in the interval's last second (1 path in ~60:
# a 2-minute hole at every 2 h edge, 9 runs of rollups instead of 2). One block has no edge inside the
# history, and promtool reads the counters' file twice instead of once per 2 h block (35 s -> 5 s).
BLOCK = 162 * 3600.0
BACKFILL = ("promtool", "tsdb", "create-blocks-from", f"--max-block-duration={BLOCK / 3600:g}h")


def rules_at(tmp: Path, interval: str) -> Path:
    groups = [dict(g, interval=interval) for g in yaml.safe_load(RULES.read_text())["groups"]
              if g["name"] == "gpu-workload-recording"]
    path = tmp / f"workload-recording-{interval}.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def load_prometheus(tmp: Path, t0: float) -> dict:
    with open(tmp / "history.om", "w") as fh:
        history.write_openmetrics(t0, fh)
    subprocess.run([*BACKFILL, "openmetrics", str(tmp / "history.om"), str(tmp / "tsdb")], check=True,
                   capture_output=True)
    (tmp / "history.om").unlink()
    proc, url = start_prometheus(tmp, {"global": {"scrape_interval": "15s"}})
    rules = rules_at(tmp, "1m")
    # rules added at hour 30; Prometheus down from hour 40 to 41 (no rule runs either)
    for number, (a, b) in enumerate(((history.RULES_FROM, history.OUTAGE[0] - 60),
                                     (history.OUTAGE[1], history.LENGTH))):
        result = subprocess.run([*BACKFILL, "rules", f"--start={int(t0 + a)}",
                                 f"--end={int(t0 + b)}", f"--url={url}", f"--output-dir={tmp / f'rules{number}'}",
                                 str(rules)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    stop(proc)
    for number in (0, 1):
        for block in (tmp / f"rules{number}").iterdir():
            shutil.move(str(block), tmp / "tsdb" / block.name)
    proc, url = start_prometheus(tmp, {"global": {"scrape_interval": "15s"}})
    return {"proc": proc, "url": url, "step": 60.0}


def load_victoria_metrics(tmp: Path, t0: float) -> dict:
    proc, url = start_victoria_metrics(tmp, "-search.disableCache", "-search.latencyOffset=0s", "-retentionPeriod=1")
    for body in history.prometheus_text(t0):
        request = urllib.request.Request(url + "/api/v1/import/prometheus", data=body.encode(), method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status in (200, 204)
    http_get(url + "/internal/force_flush", timeout=30)
    held = "count(count_over_time(gpu_workload_held_gpu_seconds_total[50h]))"
    wait_for(lambda: json.loads(http_get(f"{url}/api/v1/query?query={urllib.parse.quote(held)}&time={t0 + history.LENGTH}")[1])
             ["data"]["result"], 60, interval=0.5, what="the import searchable")
    rules = rules_at(tmp, f"{int(VMALERT_INTERVAL)}s")
    for a, b in ((history.RULES_FROM, history.OUTAGE[0] - 60), (history.OUTAGE[1], history.LENGTH)):
        result = subprocess.run(["vmalert", f"-rule={rules}", f"-datasource.url={url}", f"-remoteWrite.url={url}",
                                 f"-replay.timeFrom={rfc3339(t0 + a)}", f"-replay.timeTo={rfc3339(t0 + b)}",
                                 "-replay.rulesDelay=0s", "-replay.disableProgressBar", "-httpListenAddr=127.0.0.1:0",
                                 # range queries of 50 points: vmalert writes each one's last point twice
                                 f"-replay.maxDatapointsPerQuery={REPLAY_POINTS}"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
    http_get(url + "/internal/force_flush", timeout=30)
    beat = "count_over_time(gpu_workload:rollup_window_seconds[50h])"
    expected = 2 + (history.OUTAGE[0] - 60 - history.RULES_FROM) // VMALERT_INTERVAL + \
        (history.LENGTH - history.OUTAGE[1]) // VMALERT_INTERVAL

    def beats():
        status, body = http_get(f"{url}/api/v1/query?query={urllib.parse.quote(beat)}&time={t0 + history.LENGTH}")
        result = json.loads(body)["data"]["result"] if status == 200 else []
        return result and float(result[0]["value"][1]) >= expected - 1
    wait_for(beats, 60, interval=0.5, what="vmalert's rollups searchable")
    return {"proc": proc, "url": url, "step": VMALERT_INTERVAL}


@pytest.fixture(scope="module", params=["prometheus", "victoria-metrics"])
def store(request):
    needed = ("prometheus", "promtool") if request.param == "prometheus" else ("victoria-metrics", "vmalert")
    if any(shutil.which(t) is None for t in needed):
        pytest.skip(f"{', '.join(needed)} not installed (see .ci/run)")
    tmp = Path(tempfile.mkdtemp(prefix=f"account-{request.param}-"))
    t0 = (time.time() - 50 * 3600) // BLOCK * BLOCK  # one whole block, in the past, inside the retention
    loaded = (load_prometheus if request.param == "prometheus" else load_victoria_metrics)(tmp, t0)
    loaded.update(engine=request.param, t0=t0, cache={})
    yield loaded
    stop(loaded["proc"])
    shutil.rmtree(tmp, ignore_errors=True)


def report(capsys, store, by: str, source: str) -> dict:
    key = (by, source)
    if key not in store["cache"]:
        code, out, err = run_report(capsys, "--prometheus", store["url"], "--start", str(store["t0"]),
                                    "--end", str(store["t0"] + history.LENGTH), "--by", by, "--source", source,
                                    "--format", "json")
        assert code == 0, err
        store["cache"][key] = json.loads(out)
    return store["cache"][key]


def by_group(document) -> dict:
    return {tuple(g["group"][label] for label in document["group_labels"]): g for g in document["groups"]}


def within(got, want, rel, what):
    assert got is not None and want is not None, (what, got, want)
    assert math.isclose(got, want, rel_tol=rel, abs_tol=1e-6), f"{what}: {got} vs {want} ({(got - want) / want:+.4%})"


@pytest.mark.parametrize("by", [*ROLLUP_GROUPINGS, "pod"])
def test_counters_equal_the_hand_computed_truth(store, capsys, by):
    """0.1%, and on Prometheus half a scrape (7.5 s) more for each series that ends inside the range: its
    increase() extrapolates that far past a series' last sample (VictoriaMetrics does not)."""
    got, want = by_group(report(capsys, store, by, "counters")), history.truth(by)
    for group, row in want.items():
        have = got[group]
        for family in history.FAMILIES:
            if family in row:
                extrapolated = row[f"{family}_ends"] if store["engine"] == "prometheus" else 0.0
                within(have[family]["gpu_hours"] - extrapolated, row[family], 1e-3,
                       f"{store['engine']} {group} {family}")
            else:
                assert have[family]["gpu_hours"] is None, (group, family)
            if family in ("busy", "sm_active", "hidden_idle"):
                within(have[family]["unknown_gpu_hours"] or 0.0, row.get(f"{family}_unknown", 0.0), 1e-3,
                       f"{store['engine']} {group} {family} unknown")


@pytest.mark.parametrize("by", [*ROLLUP_GROUPINGS, "pod"])
def test_the_holders_ledger_cells_equal_the_hand_computed_truth(store, capsys, by):
    """Each group's ledger cells from the counters within 0.1% of the hand-computed ones (Prometheus: plus its
    extrapolation past the series that end inside the range); waste is its hidden idle + time idle."""
    got, want = by_group(report(capsys, store, by, "counters")), history.ledger_truth(by)
    measured = history.truth(by)
    assert set(got) == set(want), (by, set(got) ^ set(want))
    for group, row in want.items():
        have = got[group]["ledger"]
        for cell in ("sm_active_work", "hidden_idle", "time_idle"):
            if cell in UNKNOWN_WITHOUT and UNKNOWN_WITHOUT[cell] not in measured[group]:
                assert have["cells"][cell] is None, (group, cell)  # MPS clients, MIG: unknown, never 0
                continue
            extrapolated = row.get(f"{cell}_ends", 0.0) if store["engine"] == "prometheus" else 0.0
            within(have["cells"][cell] - extrapolated, row.get(cell, 0.0), 1e-3, f"{store['engine']} {group} {cell}")
        within(have["waste_gpu_hours"], (have["cells"]["hidden_idle"] or 0.0) + have["cells"]["time_idle"], 1e-6, "waste")


@pytest.mark.parametrize("source", ["auto", "counters"])
def test_every_gpus_cells_sum_to_the_gpu_hours_that_existed_and_waste_stays_within_them(store, capsys, source):
    """14 GPUs over 48 h, every one of which exists for the whole range (its node is up at the end): the
    report's GPU ledger equals the hand computation within 0.1%, unobserved (node-a's restart minute, node-e's
    10 minutes down and its restart, its two GPUs the restarted exporter no longer lists) and lost (node-e's
    GPU 0 from hour 30) included; the cells sum to what existed; the fleet's waste
    (hidden idle + time idle + switch overhead, attributed or not) and the groups' rows never exceed them."""
    document = report(capsys, store, "namespace", source)
    ledger, (cells, observed) = document["gpu_ledger"], history.gpu_ledger_truth()
    assert ledger["gpus"] == len(history.GPUS) and ledger["skipped"] is None
    within(ledger["observed_gpu_hours"], observed, 1e-3, "GPU-hours observed")
    within(ledger["existed_gpu_hours"], len(history.GPUS) * history.LENGTH / 3600, 1e-3, "GPU-hours that existed")
    within(ledger["cells_sum_gpu_hours"], ledger["existed_gpu_hours"], 1e-3, "cells sum to the wall clock")
    assert ledger["worst_gpu_relative_error"] < 1e-3
    for cell, hours in cells.items():
        within(ledger["cells"].get(cell, 0.0), hours, 1e-3, f"{store['engine']} GPU ledger {cell}")
    waste = cells["hidden_idle"] + cells["time_idle"] + cells["unattributed_hidden_idle"]
    within(ledger["waste_gpu_hours"], waste, 1e-3, "fleet waste")
    assert ledger["waste_gpu_hours"] <= ledger["existed_gpu_hours"]
    rows = [*document["groups"], document["total"]]
    assert all(g["ledger"]["gpu_hours"] <= ledger["existed_gpu_hours"] * (1 + 1e-3) for g in rows)
    assert document["total"]["waste_gpu_hours"] <= ledger["waste_gpu_hours"] * (1 + 5e-3)


COLUMNS = ("gpu_hours", "unknown_gpu_hours", "share", "exactly_measured_gpu_hours", "estimated_gpu_hours")


@pytest.mark.parametrize("by", ROLLUP_GROUPINGS)
def test_rollups_equal_the_counters_in_every_column(store, capsys, by):
    rolled, counted = report(capsys, store, by, "auto"), report(capsys, store, by, "counters")
    assert {s["source"] for s in rolled["source"]["spans"]} == {"rules", "counters"}
    assert set(by_group(rolled)) == set(by_group(counted))
    for group, have in [*by_group(rolled).items(), (("(all)",), rolled["total"])]:
        want = by_group(counted).get(group, counted["total"])
        what = f"{store['engine']} by {by} {group}"
        within(have["held"]["gpu_hours"], want["held"]["gpu_hours"], 5e-3, f"{what} held")
        within(have["waste_gpu_hours"], want["waste_gpu_hours"], 5e-3, f"{what} waste")
        assert have["waste_is_lower_bound"] == want["waste_is_lower_bound"], what
        for family in history.FAMILIES[1:]:
            for column in COLUMNS:
                if column in want[family]:
                    if want[family][column] is None:
                        assert have[family][column] is None, (what, family, column)
                    else:
                        within(have[family][column], want[family][column], 5e-3, f"{what} {family} {column}")
            for basis, value in want[family].get("basis", {}).items():
                within(have[family]["basis"][basis], value, 5e-3, f"{what} {family} basis {basis}")
        for cell, value in want["ledger"]["cells"].items():
            if value is None:  # unknown from both
                assert have["ledger"]["cells"][cell] is None, (what, cell)
            else:
                within(have["ledger"]["cells"][cell], value, 5e-3, f"{what} ledger {cell}")


def test_mps_clients_are_unknown_alike_from_both(store, capsys):
    for source in ("auto", "counters"):
        team_d = by_group(report(capsys, store, "namespace", source))[("team-d",)]
        held = team_d["held"]["gpu_hours"]
        within(held, history.truth("namespace")[("team-d",)]["held"], 1e-3, f"{source} team-d held")
        for family in ("busy", "sm_active", "hidden_idle"):
            assert team_d[family]["gpu_hours"] is None and team_d[family]["share"] is None
            assert team_d[family]["unknown_gpu_hours"] == held, (source, family, team_d)
        assert team_d["waste_is_lower_bound"]
    team_c = [by_group(report(capsys, store, "namespace", s))[("team-c",)] for s in ("auto", "counters")]
    assert [round(t["busy"]["unknown_gpu_hours"], 3) for t in team_c] == [23.5, 23.5] or \
        math.isclose(team_c[0]["busy"]["unknown_gpu_hours"], team_c[1]["busy"]["unknown_gpu_hours"], rel_tol=5e-3)


def test_spans_are_where_the_data_has_rollups(store, capsys):
    """Rollups from hour 30, gone for the outage (40-41 h), each run's first and last window left to the
    counters, the samples shifted back by (window - interval) / 2; the header says so."""
    document = report(capsys, store, "namespace", "auto")
    step, t0 = store["step"], store["t0"]
    lag = (WINDOW - step) / 2
    # the evaluations as stored (promtool offsets them within the minute, as Prometheus does), cut where the
    # spacing breaks (the outage) and at evaluations stored twice (the edges of vmalert's replay queries)
    query = urllib.parse.quote("gpu_workload:rollup_window_seconds[50h]")
    status, body = http_get(f"{store['url']}/api/v1/query?query={query}&time={t0 + history.LENGTH}")
    times = [float(t) - t0 for t, _v in json.loads(body)["data"]["result"][0]["values"]]
    twice = {t for t in times if times.count(t) > 1}
    chunk_edges = sum(math.ceil((b - a) / VMALERT_INTERVAL / REPLAY_POINTS) - 1
                      for a, b in ((history.RULES_FROM, history.OUTAGE[0] - 60), (history.OUTAGE[1], history.LENGTH)))
    assert len(twice) == (chunk_edges if store["engine"] == "victoria-metrics" else 0) > -1, sorted(twice)
    runs, run = [], []
    for t in sorted(set(times)):  # evaluations stored twice count once, without cutting the run
        if run and t - run[-1] > step * 1.5:
            runs.append(run)
            run = []
        run.append(t)
    runs.append(run)
    assert all(math.isclose(b - a, step) for r in runs for a, b in zip(r, r[1:]))
    assert runs[0][0] - history.RULES_FROM < step and len(runs) == 2
    assert sum(s.get("evaluations_stored_twice", 0) for s in document["source"]["spans"]) == len(twice)
    want, covered_to = [], 0.0
    for r in runs:
        first = r[0] + WINDOW - lag - step  # the first and last window of a run inside the range: counters
        last = r[-1] - WINDOW - lag if r[-1] - lag < history.LENGTH else history.LENGTH
        want += [("counters", covered_to, first), ("rules", first, last)]
        covered_to = last
    if covered_to < history.LENGTH:
        want.append(("counters", covered_to, history.LENGTH))
    got = [(s["source"], s["start_unix"] - t0, s["end_unix"] - t0) for s in document["source"]["spans"]]
    assert [(s, round(a, 3), round(b, 3)) for s, a, b in got] == \
        [(s, round(a, 3), round(b, 3)) for s, a, b in want], (store["engine"], got, want)
    assert document["source"]["rule_step_seconds"] == step and document["source"]["rule_window_seconds"] == WINDOW
    held = sum(s["held_gpu_hours"] for s in document["source"]["spans"])
    within(held, document["total"]["held"]["gpu_hours"], 1e-6, "spans add up")
    code, out, err = run_report(capsys, "--prometheus", store["url"], "--start", str(t0),
                                "--end", str(t0 + history.LENGTH))
    assert code == 0, err
    header = " ".join(out.split("\n\n")[0].split())  # as one line: the text is wrapped to the terminal
    assert f"evaluated every {step:g} s over a 300 s window" in header and header.count(": counters, ") == \
        sum(source == "counters" for source, _a, _b in want)
    assert "measured: SM-active" in header and "ctxsw" in header


def test_spans_from_evaluations_by_hand():
    """plan_spans on evaluations every 60 s at :30 (window 300 s, lag 120 s: sample t accounts for
    (t - 180, t - 120]), range 1000..5000 s: edge samples weighed by the part inside the range, a gap cuts the
    run and each cut run leaves its first and last 300 s to the counters; an evaluation stored twice is
    named in its span (counted once) and cuts nothing."""
    from gpu_spatial.report.account import plan_spans

    evaluations = [(30.0 + 60 * k, 300.0) for k in range(200) if not 2000 <= 30 + 60 * k < 2600]
    spans = plan_spans(evaluations, 1000.0, 5000.0, {4050.0, 9990.0})
    assert [s.twice for s in spans] == [(), (), (), (4050.0,), ()]
    got = [(s.source, s.start, s.end, s.first, s.last, s.weight) for s in spans]
    assert got == [
        ("rules", 1000.0, 1050.0, 1140.0, 1170.0, 50 / 60),   # (990, 1050]: 50 of its 60 s in the range
        ("rules", 1050.0, 1530.0, 1200.0, 1650.0, 1.0),       # up to 1650: the run stops at 1950, less 300
        ("counters", 1530.0, 2730.0, 0.0, 0.0, 1.0),          # the gap 1950..2610, and 300 s either side
        ("rules", 2730.0, 4950.0, 2880.0, 5070.0, 1.0),       # from 2910 (2610 + 300)
        ("rules", 4950.0, 5000.0, 5100.0, 5130.0, 50 / 60)]   # (4950, 5010]: 50 of 60 s in the range


def test_two_evaluators_fall_back_to_the_counters(store, capsys):
    """Two heartbeat series (replicas writing the same rollups) would count every rollup twice: the report
    says so and reads the counters. VictoriaMetrics only: its import API writes them, 10 h before the history."""
    if store["engine"] != "victoria-metrics":
        pytest.skip("the import API is VictoriaMetrics'")
    base = store["t0"] - 10 * 3600
    lines = [f'gpu_workload:rollup_window_seconds{{replica="{r}"}} 300 {int((base + 60 * k) * 1000)}\n'
             for r in "ab" for k in range(60)]
    lines += [f'namespace:gpu_workload_held_gpu_seconds:rate5m{{namespace="team-z",replica="{r}"}} 1 '
              f'{int((base + 60 * k) * 1000)}\n' for r in "ab" for k in range(60)]
    lines += [f'gpu_workload_held_gpu_seconds_total{{namespace="team-z",pod="p",instance="x",gpu="0"}} {30.0 * k} '
              f'{int((base + 30 * k) * 1000)}\n' for k in range(121)]
    request = urllib.request.Request(store["url"] + "/api/v1/import/prometheus", data="".join(lines).encode(),
                                     method="POST")
    urllib.request.urlopen(request, timeout=60).close()
    http_get(store["url"] + "/internal/force_flush", timeout=30)

    def imported():  # every sample searchable: 2 x 60 heartbeats, 2 x 60 rollups, 121 counter samples
        query = urllib.parse.quote('sum(count_over_time({__name__=~"gpu_workload:rollup_window_seconds|'
                                   'namespace:gpu_workload_held_gpu_seconds:rate5m|gpu_workload_held_gpu_seconds_total",'
                                   'namespace=~"team-z|"}[2h]))')
        status, body = http_get(f"{store['url']}/api/v1/query?query={query}&time={base + 3600}")
        result = json.loads(body)["data"]["result"] if status == 200 else []
        return result and float(result[0]["value"][1]) == 361
    wait_for(imported, 30, interval=0.5, what="the imported evaluators searchable")
    code, out, err = run_report(capsys, "--prometheus", store["url"], "--start", str(base), "--end", str(base + 3600),
                                "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert set(document["source"]["hours"]) == {"counters"}, document["source"]
    assert any("2 rule evaluators" in note for note in document["source"]["notes"]), document["source"]["notes"]
    within(document["total"]["held"]["gpu_hours"], 1.0, 1e-6, "team-z held from the counters")


def test_each_gpu_and_node_ledger_sums_to_its_wall_clock(store, capsys):
    """--by gpu: each of the 14 GPUs exists 48 h and its cells (unobserved and lost included) sum to that
    within 0.1%, each cell as computed by hand (node-e's lost GPU: 17.917 GPU-h lost, 0.25 unobserved; its
    two GPUs no longer listed after the restart: 4.167 unobserved each). --by node: the node's ledger is
    its GPUs', and a node's share "of what existed" is of that node."""
    by_gpu = report(capsys, store, "gpu", "counters")["gpu_ledger"]["by_gpu"]
    assert len(by_gpu) == len(history.GPUS)
    for entry in by_gpu:
        gpu = (entry["instance"], entry["gpu"])
        cells, observed = history.gpu_ledger_truth({gpu})
        what = f"{store['engine']} {gpu}"
        within(entry["existed_gpu_hours"], 48.0, 1e-3, f"{what} existed")
        within(entry["cells_sum_gpu_hours"], entry["existed_gpu_hours"], 1e-3, f"{what} cells sum")
        within(entry["observed_gpu_hours"], observed, 1e-3, f"{what} observed")
        for cell, hours in cells.items():  # each cell to 0.1% of the GPU's 48 h
            assert abs(entry["cells"].get(cell, 0.0) - hours) <= 48 * 1e-3, (what, cell, entry["cells"], hours)
    lost = next(e for e in by_gpu if (e["instance"], e["gpu"]) == history.LOST_GPU)
    assert lost["listed_lost"] and math.isclose(lost["lost_gpu_hours"], 18 - 300 / 3600, abs_tol=0.01)
    node_document = report(capsys, store, "node", "counters")
    nodes = {n["instance"]: n for n in node_document["gpu_ledger"]["by_node"]}
    cells, _observed = history.gpu_ledger_truth({gpu for gpu, _m in history.GPUS if gpu[0] == "node-e"})
    within(nodes["node-e"]["existed_gpu_hours"], 3 * 48.0, 1e-3, "node-e existed")
    within(nodes["node-e"]["unobserved_gpu_hours"], cells["unobserved"], 1e-3, "node-e unobserved")
    node_e = by_group(node_document)[("node-e",)]
    within(node_e["ledger"]["of_what_existed"], node_e["ledger"]["gpu_hours"] / nodes["node-e"]["existed_gpu_hours"],
           1e-6, "node-e's share is of node-e")


def test_unknown_is_null_with_its_cause_and_a_lost_gpu_stays_held(store, capsys):
    """Bob's A100 has no spatial reading: his work and hidden idle are unknown (null), his busy time is
    busy unsplit; the MPS clients' are unknown for want of the tracer; job 5151 holds its lost GPU to the end."""
    bob = by_group(report(capsys, store, "user", "counters"))[("bob",)]
    assert bob["ledger"]["cells"]["sm_active_work"] is None and bob["ledger"]["cells"]["hidden_idle"] is None
    assert [c["cause"].split(" (")[0] for c in bob["ledger"]["unknown_because"]] == ["no spatial reading on its GPU"]
    within(bob["ledger"]["cells"]["busy_unsplit"], 0.6 * (44 - 10 / 60), 1e-3, "bob's busy unsplit")
    namespaces = by_group(report(capsys, store, "namespace", "counters"))
    assert [c["cause"].split(" (")[0] for c in namespaces[("team-d",)]["ledger"]["unknown_because"]] == \
        ["MPS clients without the tracer"]
    job = by_group(report(capsys, store, "hpc_job", "counters"))[("5151",)]
    within(job["held"]["gpu_hours"], 48 - 900 / 3600, 1e-3, "job 5151 holds its lost GPU")


@pytest.mark.parametrize("columns", ["80", "100", "piped"])
def test_the_table_fits_the_terminal(store, columns):
    """The text report at COLUMNS=80, 100 and piped (80), in a subprocess: every line within the width, the
    used/held column with its meaning beside it, what is left out named; a two-minute range in GPU-min."""
    import os
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    env.pop("COLUMNS", None)
    if columns != "piped":
        env["COLUMNS"] = columns
    room = 80 if columns == "piped" else int(columns)
    for start, end, unit in ((0, history.LENGTH, "GPU-h"), (3600, 3720, "GPU-min")):
        done = subprocess.run([sys.executable, "-m", "gpu_spatial", "report", "--prometheus", store["url"],
                               "--start", str(store["t0"] + start), "--end", str(store["t0"] + end), "--by", "hpc_job"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert max(map(len, lines)) <= room, [line for line in lines if len(line) > room]
        said = " ".join(done.stdout.split())  # wrapped lines joined
        assert f"in {unit}. allocation" in said and "used/held: share of its held time" in said
        header = next(line for line in lines if line.startswith("hpc_job")).split()
        assert header[:2] == ["hpc_job", "held"] and len(header) >= 5
        assert (len(header) < 10) == (f"left out at {room} columns" in said), done.stdout


# -- gpu_spatial/report/account.py ---------------------------------------------------------------------
def test_rule_runs_and_spans_at_their_edges():
    """Mutants: a spacing exactly 25 % off breaks a run; a spacing of exactly W breaks it; a run of two
    evaluations used; the rollups' lag (W - D) / 2 dropped (the samples used shift by 2 minutes)."""
    from gpu_spatial.report.account import plan_spans, runs

    assert len(runs([(0.0, 300.0), (60.0, 300.0), (135.0, 300.0)])) == 1  # 75 s after 60 s: 25 % off
    assert len(runs([(0.0, 300.0), (60.0, 300.0), (135.1, 300.0)])) == 2
    assert len(runs([(0.0, 60.0), (60.0, 60.0), (120.0, 60.0)])) == 1  # every W: still covered
    # two evaluations spanning the whole range are no run; three are
    assert [s.source for s in plan_spans([(1000.0, 300.0), (1060.0, 300.0)], 830.0, 930.0)] == ["counters"]
    assert "rules" in [s.source for s in plan_spans([(940.0, 300.0), (1000.0, 300.0), (1060.0, 300.0)], 830.0, 930.0)]
    # every 60 s with W = 300 over 0..3600: a sample at t sums the increase over (t - 180, t - 120]
    (span,) = plan_spans([(float(t), 300.0) for t in range(0, 3601, 60)], 600.0, 3000.0)
    assert (span.source, span.start, span.end, span.first, span.last, span.step) == ("rules", 600.0, 3000.0, 750.0,
                                                                                      3120.0, 60.0)


def test_an_evaluation_on_the_edge_of_two_days_is_read_once():
    """Mutant: `chunk_start < t` -> `<=` (a store answering a range's both ends, as a range selector may,
    makes the evaluation at midnight count in both days: "stored more than once")."""
    from gpu_spatial.report.account import DAY, Plan, heartbeat

    class Store:  # the heartbeat every 60 s; a range [at - d, at] answered with both ends
        def query_matrix(self, expr, at):
            d = float(expr.rsplit("[", 1)[1].rstrip("ms]")) / 1000
            return [{"metric": {}, "values": [[t, "300"] for t in range(0, int(2 * DAY) + 1, 60) if at - d <= t <= at]}]

    notes = []
    evaluations, twice = heartbeat(Store(), Plan("namespace"), 0.0, 2 * DAY, notes)
    assert twice == set() and notes == [] and len(evaluations) == 2 * DAY / 60  # (0, 2 days]: once each


def test_report_pieces_that_keep_unknown_and_odd_values_apart():
    """Mutants: a matcher on a label the rollups drop still reads the rollups; the last day runs past the
    range; NaN and Inf kept; busy without a basis label not "nvml"; the unknown held counted in a span's
    held total."""
    from gpu_spatial.report.account import Plan, Totals, _value, chunks

    assert Plan("namespace", [("pod", "=", '"x"')]).rules_unusable() == \
        "--match on pod, which the namespace rollups do not keep"
    assert Plan("namespace", [("namespace", "=~", '"team-.*"')]).rules_unusable() is None
    assert chunks(0.0, 100.0, 60.0) == [(0.0, 60.0), (60.0, 100.0)]
    assert _value({"value": [0, "NaN"]}) == 0.0 and _value({"value": [0, "+Inf"]}) == 0.0
    totals = Totals(("namespace",))
    assert totals.add("busy", False, [{"metric": {"namespace": "a"}, "value": [0, "5"]}]) == 0.0
    assert totals.add("held", True, [{"metric": {"namespace": "a"}, "value": [0, "2"]}]) == 0.0
    assert totals.add("held", False, [{"metric": {"namespace": "a"}, "value": [0, "7"]}]) == 7.0
    assert totals.groups == {("a",): {("busy", "nvml"): 5.0, ("held", "unknown"): 2.0, ("held", "exact"): 7.0}}
