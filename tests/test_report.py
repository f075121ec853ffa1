"""gpu-spatial report against real stores: Debian's Prometheus loaded with promtool-built blocks (raw
counters and recording-rule rollups) of a scenario whose GPU-hours are known by construction, the same
scenario scraped by a Prometheus that remote-writes it to Debian's VictoriaMetrics, and bad input."""
from __future__ import annotations

import base64
import csv
import io
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from gpu_spatial.report import main as report_main
from gpu_spatial.report.summary import summarize, top_wasters
from tests.helpers import RULES, ROOT, free_port, http_get, wait_for
from tests.workload_scenario import DURATION, SCENARIO, exposition, gpu_hours_by_group, write_openmetrics

BACKFILL_STEP = 10.0  # seconds between samples: rate5m at the kinks of a hold is off by a fraction of a step
needs = lambda *tools: pytest.mark.skipif(
    any(shutil.which(t) is None for t in tools), reason=f"{', '.join(tools)} not installed (see .ci/run)")
GROUP_OF = {"namespace": lambda h: (h.namespace,), "pod": lambda h: (h.namespace, h.pod),
            "hpc_job": lambda h: (h.hpc_job,), "node": lambda h: (h.instance,), "model": lambda h: (h.model,)}


def expected(by: str) -> dict[tuple, dict]:
    """GPU-hours per group by construction: {group: {family: hours, family_unknown: held hours without it}}."""
    return gpu_hours_by_group(SCENARIO, GROUP_OF[by], lambda holder, family: holder.gpu_seconds(family))


def close(got, want, what):
    assert want is not None and got is not None, (what, got, want)
    assert math.isclose(got, want, rel_tol=0.005, abs_tol=1e-4), f"{what}: report {got}, by construction {want}"


def run_report(capsys, *args) -> tuple[int, str, str]:
    code = report_main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def start_prometheus(tmp: Path, config: dict, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    (tmp / "prometheus.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yaml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}", *flags],
                            stdout=open(tmp / "prometheus.log", "a"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_get(url + "/-/ready", timeout=1)[0] == 200, 30, what="prometheus ready")
    return proc, url


def start_victoria_metrics(tmp: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(["victoria-metrics", f"-storageDataPath={tmp / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}",
                             *flags], stdout=open(tmp / "vm.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_get(url + "/health", timeout=1)[0] in (200, 401), 30, what="victoria-metrics up")
    return proc, url


def stop(proc):
    proc.terminate()
    proc.wait(10)


def recording_rules_only(tmp: Path) -> Path:
    groups = [g for g in yaml.safe_load(RULES.read_text())["groups"] if g["name"] == "gpu-workload-recording"]
    path = tmp / "workload-recording.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


@pytest.fixture(scope="module")
def backfilled():
    """Prometheus holding the scenario as blocks: raw counters, then the rollups promtool computed from them."""
    if shutil.which("promtool") is None or shutil.which("prometheus") is None:
        pytest.skip("prometheus/promtool not installed (see .ci/run)")
    tmp = Path(tempfile.mkdtemp(prefix="report-backfill-"))
    t0 = (time.time() // 3600) * 3600 - 3 * 3600  # whole blocks, in the past, inside the retention
    with open(tmp / "scenario.om", "w") as fh:
        write_openmetrics(SCENARIO, t0, DURATION, BACKFILL_STEP, fh)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "scenario.om"),
                    str(tmp / "tsdb")], check=True, capture_output=True)
    proc, url = start_prometheus(tmp, {"global": {"scrape_interval": "15s"}})
    result = subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", f"--start={int(t0 - 600)}",
                             f"--end={int(t0 + DURATION + 600)}", f"--url={url}", f"--output-dir={tmp / 'rules'}",
                             str(recording_rules_only(tmp))], capture_output=True, text=True)
    stop(proc)
    assert result.returncode == 0, result.stderr
    for block in (tmp / "rules").iterdir():
        shutil.move(str(block), tmp / "tsdb" / block.name)
    proc, url = start_prometheus(tmp, {"global": {"scrape_interval": "15s"}})
    # The report covers the scenario from before its first to its last sample (Prometheus extrapolates
    # half a scrape interval past a series' last sample when a range ends later).
    yield {"url": url, "start": str(t0 - 60), "end": str(t0 + DURATION), "t0": t0, "tmp": tmp}
    stop(proc)
    shutil.rmtree(tmp, ignore_errors=True)


def report_json(capsys, store, *args) -> dict:
    code, out, err = run_report(capsys, "--prometheus", store["url"], "--start", store["start"], "--end", store["end"],
                                "--format", "json", *args)
    assert code == 0, err
    return json.loads(out)


def check_groups(document: dict, by: str, coverage: bool = True):
    """Every group's GPU-hours equal the scenario's; with `coverage`, unknowns and shares too."""
    want = expected(by)
    got = {tuple(g["group"][label] for label in document["group_labels"]): g for g in document["groups"]}
    assert set(got) == set(want), (sorted(got), sorted(want))
    for group, row in want.items():
        have = got[group]
        close(have["held"]["gpu_hours"], row["held"], f"{group} held")
        close(have["held_idle"]["gpu_hours"], row["held_idle"], f"{group} held_idle")
        for family in ("busy", "sm_active", "hidden_idle"):
            if family not in row:  # no series at all: unknown, never 0
                assert have[family]["gpu_hours"] is None and have[family]["share"] is None, (group, family, have)
                close(have[family]["unknown_gpu_hours"], row["held"], f"{group} {family} unknown")
                continue
            close(have[family]["gpu_hours"], row[family], f"{group} {family}")
            if coverage:
                unknown = row.get(f"{family}_unknown", 0.0)
                close(have[family]["unknown_gpu_hours"], unknown, f"{group} {family} unknown")
                close(have[family]["share"], row[family] / (row["held"] - unknown), f"{group} {family} share")


@pytest.mark.parametrize("by", ["namespace", "pod", "hpc_job", "node", "model"])
def test_counters_equal_the_scenario_for_every_grouping(backfilled, capsys, by):
    document = report_json(capsys, backfilled, "--by", by, "--source", "counters")
    assert set(document["source"]["hours"]) == {"counters"}
    check_groups(document, by)


def test_bases_are_carried_through(backfilled, capsys):
    groups = {g["name"]: g for g in report_json(capsys, backfilled, "--source", "counters")["groups"]}
    # team-a: exact SM (exclusive GPUs and a MIG slice); the MIG slice has no busy series (3/7 GPU for 21 min)
    close(groups["team-a"]["sm_active"]["basis"]["exact"], (0.6 * 30 + 0.2 * 20 + 0.3 * 21) / 60, "team-a exact")
    assert groups["team-a"]["sm_active"]["basis"]["time_share"] == 0
    close(groups["team-a"]["busy"]["unknown_gpu_hours"], 3 / 7 * 21 / 60, "team-a MIG busy unknown")
    # team-b: time-sliced, SM allocated by time share; its idle replica holder shows as held-idle
    close(groups["team-b"]["sm_active"]["basis"]["time_share"], (0.25 + 0.1) * 20 / 60, "team-b time_share")
    close(groups["team-b"]["held_idle"]["gpu_hours"], 0.25 * 20 / 60, "team-b held idle")
    # team-d: only an MPS client: held and held-idle known, the rest unknown (null), never 0
    assert groups["team-d"]["busy"]["gpu_hours"] is None and groups["team-d"]["sm_active"]["gpu_hours"] is None
    close(groups["team-d"]["held"]["gpu_hours"], 0.25, "team-d held")


def test_rules_give_the_same_gpu_hours_as_the_counters(backfilled, capsys):
    document = report_json(capsys, backfilled, "--by", "namespace")  # auto: the rollups exist
    assert set(document["source"]["hours"]) == {"rules"}, document["source"]
    assert document["source"]["rule_step_seconds"] == 60 and document["source"]["rule_window_seconds"] == 300
    # the rollups keep the basis of busy, SM-active and hidden idle, and the held hours without them
    check_groups(document, "namespace")
    counted = {g["name"]: g for g in report_json(capsys, backfilled, "--by", "namespace", "--source", "counters")["groups"]}
    for group in document["groups"]:
        for quantity in ("sm_active", "hidden_idle"):
            for basis in ("exact", "time_share"):
                want = counted[group["name"]][quantity]["basis"][basis]
                close(group[quantity]["basis"][basis], want, f"{group['name']} {quantity} {basis}")
    for by in ("hpc_job", "node", "model"):
        rolled = report_json(capsys, backfilled, "--by", by)
        assert set(rolled["source"]["hours"]) == {"rules"}, by
        check_groups(rolled, by)
    # --match on a label the rollup keeps stays on the rules; on another label it falls back to the counters
    kept = report_json(capsys, backfilled, "--by", "namespace", "--match", 'namespace=~"team-(a|b)"')
    assert set(kept["source"]["hours"]) == {"rules"} and {g["name"] for g in kept["groups"]} == {"team-a", "team-b"}
    other = report_json(capsys, backfilled, "--by", "namespace", "--match", 'instance="node-b"')
    assert set(other["source"]["hours"]) == {"counters"} and "instance" in other["source"]["notes"][0]
    close(next(g for g in other["groups"] if g["name"] == "team-c")["held"]["gpu_hours"], 0.75, "team-c on node-b")


def test_long_ranges_go_day_by_day_with_progress(backfilled, capsys):
    """Two days cut through the middle of the scenario: the halves add up to the whole, from the counters,
    and from the rollups where they exist (the counters before); --progress prints a line per part on
    stderr, nothing without it."""
    start = str(backfilled["t0"] + 20 * 60 - 86400)
    for source in ("rules", "counters"):
        code, out, err = run_report(capsys, "--prometheus", backfilled["url"], "--start", start,
                                    "--end", backfilled["end"], "--format", "json", "--progress", "--source", source)
        assert code == 0, err
        document = json.loads(out)
        parts = len([s for s in document["source"]["spans"] for _ in
                     range(1 if s["source"] == "rules" else math.ceil((s["end_unix"] - s["start_unix"]) / 86400))])
        assert re.findall(r"part (\d+)/(\d+) read", err) == [(str(i), str(parts)) for i in range(1, parts + 1)], err
        assert err.count("\n") == parts
        if source == "counters":
            assert [s["source"] for s in document["source"]["spans"]] == ["counters"] and parts == 2
        else:  # the rollups were backfilled from 10 minutes before the scenario: the day before from the counters
            sources = [s["source"] for s in document["source"]["spans"]]
            assert sources[0] == "counters" and set(sources[1:]) == {"rules"}, document["source"]
            assert document["source"]["held_gpu_hours"]["counters"] == 0  # nothing held the day before
        check_groups(document, "namespace")
    code, out, err = run_report(capsys, "--prometheus", backfilled["url"], "--start", start, "--end", backfilled["end"])
    assert code == 0 and err == ""  # not a terminal and no --progress: nothing on stderr


def test_a_server_sample_limit_splits_the_windows(backfilled, capsys, tmp_path):
    """A Prometheus with a small --query.max-samples refuses a whole day of counters: the report asks for
    halves until it answers, with the same figures; where even short windows are refused, one line."""
    (tmp_path / "tsdb").mkdir()
    for block in (backfilled["tmp"] / "tsdb").iterdir():
        if block.is_dir() and len(block.name) == 26:  # ULID-named blocks, not the WAL or the lock
            shutil.copytree(block, tmp_path / "tsdb" / block.name)
    for limit, works in (("200", True), ("10", False)):  # Prometheus counts the samples of one series at a time
        proc, url = start_prometheus(tmp_path, {"global": {"scrape_interval": "15s"}}, f"--query.max-samples={limit}")
        try:
            store = dict(backfilled, url=url)
            if works:
                document = report_json(capsys, store, "--source", "counters")
                assert any("split" in note for note in document["source"]["notes"]), document["source"]
                check_groups(document, "namespace")
            else:
                one_line_error(capsys, "--prometheus", url, "--start", store["start"], "--end", store["end"],
                               "--source", "counters", contains="refused to read that many samples")
        finally:
            stop(proc)


HELD, USED = "allocation: held GPU-h", "allocation: used GPU-h"


UNIT_FACTORS = {"GPU-h": 1.0, "GPU-min": 60.0, "GPU-s": 3600.0}  # the text table's unit, from GPU-hours


def parse_cell(text: str):
    return None if text == "unknown" else float(text.rstrip("%").replace(",", ""))


def test_every_format_carries_the_same_numbers(backfilled, capsys, tmp_path):
    want = expected("namespace")
    common = ["--prometheus", backfilled["url"], "--start", backfilled["start"], "--end", backfilled["end"],
              "--source", "counters"]
    code, out, err = run_report(capsys, *common, "--format", "csv")
    assert code == 0, err
    rows = {r["namespace"]: r for r in csv.DictReader(io.StringIO(out))}
    for (namespace,), row in want.items():
        close(float(rows[namespace]["held_gpu_hours"]), row["held"], f"csv {namespace} held")
        for family in ("busy", "sm_active", "hidden_idle", "held_idle"):
            cell = rows[namespace][f"{family}_gpu_hours"]
            if family in row:
                close(float(cell), row[family], f"csv {namespace} {family}")
            else:
                assert cell == "unknown"
    close(float(rows["(all)"]["held_gpu_hours"]), sum(r["held"] for r in want.values()), "csv total")

    for fmt in ("markdown", "text"):
        code, out, err = run_report(capsys, *common, "--format", fmt)
        assert code == 0, err
        if fmt == "markdown":
            lines = [line for line in out.splitlines() if line.startswith("| ")]
            header = [c.strip() for c in lines[0].strip("|").split("|")]
            table = {cells[0]: dict(zip(header, cells)) for cells in
                     ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])}
        else:
            lines = out.splitlines()
            start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("namespace"))
            header = ["namespace", HELD, USED, "allocation: used of held"]  # by position: names have spaces
            table = {cells[0]: dict(zip(header, cells)) for cells in (line.split() for line in lines[start + 1:])
                     if cells and cells[0] in {g[0] or "(none)" for g in want}}
        factor = 1.0 if fmt == "markdown" else UNIT_FACTORS[re.search(r"in (GPU-\w+)\. allocation", out).group(1)]
        for (namespace,), row in want.items():
            shown = table[namespace or "(none)"]
            close(parse_cell(shown[HELD]) / factor, row["held"], f"{fmt} {namespace} held")
            if "busy" in row:
                close(parse_cell(shown[USED]) / factor, row["busy"], f"{fmt} {namespace} busy")
            else:
                assert shown[USED] == "unknown" and shown["allocation: used of held"] == "unknown"
        assert "top wasters" in out.lower() and "source: counters" in out


@needs("chromium")
def test_html_is_self_contained_with_charts_and_renders(backfilled, capsys, tmp_path):
    for source in ("rules", "counters"):  # the waste chart reads either
        page = tmp_path / f"account-{source}.html"
        code, out, err = run_report(capsys, "--prometheus", backfilled["url"], "--start", backfilled["start"],
                                    "--end", backfilled["end"], "--format", "html", "--output", str(page),
                                    "--source", source)
        assert code == 0 and out == "", err
        text = page.read_text()
        assert "http://" not in text.replace(backfilled["url"], "") and "<script" not in text  # nothing fetched
        pngs = [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', text)]
        assert len(pngs) == 2 and all(p.startswith(b"\x89PNG") and len(p) > 10_000 for p in pngs)
    cells = dict(re.findall(r"<tr>\s*<td>([^<]+)</td>\s*<td>([^<]+)</td>", text))
    for (namespace,), row in expected("namespace").items():
        close(float(cells[namespace or "(none)"]), row["held"], f"html {namespace} held")
    shot = tmp_path / "shot.png"
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                        f"--screenshot={shot}", "--window-size=1400,2200", page.as_uri()],
                       capture_output=True, timeout=90, check=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3).tolist()}
    assert pixels.shape[0] >= 2000 and len(colours) > 20, ("a blank or unstyled screenshot", len(colours))
    # the charts were drawn: the stacked waste areas and the bars use matplotlib's default colours
    assert {(31, 119, 180), (76, 114, 176)} & colours or len(colours) > 50


class Scenario(BaseHTTPRequestHandler):
    """/metrics: the scenario's counters, its clock going STEP seconds on at each scrape once the test
    starts it (so its 40 minutes go through a real scrape and remote_write in 40 scrapes, with the same
    GPU-seconds, however slowly the machine scrapes); /huge, /slow, /html: hostile APIs."""
    started = False  # the clock stands at 0 until the test starts it
    elapsed = 0.0
    final_at = None  # when the clock reached the end (time.time())
    STEP = 60.0
    clock = threading.Lock()

    def do_GET(self):
        if self.path.startswith("/metrics"):
            with self.clock:
                if Scenario.started and Scenario.final_at is None:
                    Scenario.elapsed = min(DURATION, Scenario.elapsed + self.STEP)
                    if Scenario.elapsed == DURATION:
                        Scenario.final_at = time.time()
                elapsed = Scenario.elapsed
            self.answer(200, exposition(SCENARIO, elapsed).encode(), "text/plain; version=0.0.4")
        else:
            self.hostile()

    do_POST = do_GET

    def hostile(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # unread, a close would reset the client
        if self.path.startswith("/huge"):
            padding = b" " * (3 << 20)
            self.answer(200, b'{"status":"success","data":{"resultType":"vector","result":[' + padding + b"]}}")
        elif self.path.startswith("/drip"):  # headers at once, then a byte every 0.2 s: never done
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                for _ in range(20):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif self.path.startswith("/matrix-garbage"):  # a range vector of nonsense for every query
            self.answer(200, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
                "x", {"metric": 5, "values": "abc"}, {"values": [[1, 2, 3], ["a", "b"], 7, None]}]}}).encode())
        elif self.path.startswith("/redirect"):  # elsewhere, with the credentials if they were followed
            self.send_response(307)
            self.send_header("Location", "http://attacker.invalid/api/v1/query")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith("/slow"):
            time.sleep(3)
            self.answer(200, b"{}")
        else:
            self.answer(200, b"<html>a login page</html>", "text/html")

    def answer(self, status, body, kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the report gave up first, as it should
            pass

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def scenario_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scenario)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@needs("prometheus", "victoria-metrics")
def test_remote_write_to_victoria_metrics_gives_the_same_report(scenario_server, capsys, tmp_path):
    vm, vm_url = start_victoria_metrics(tmp_path, "-search.disableCache", "-search.latencyOffset=0s",
                                        "-retentionPeriod=1")
    prometheus = None
    try:
        config = {"global": {"scrape_interval": "200ms", "scrape_timeout": "200ms"},
                  "scrape_configs": [{"job_name": "scenario", "honor_labels": True,
                                      "static_configs": [{"targets": [scenario_server]}]}],
                  "remote_write": [{"url": vm_url + "/api/v1/write",
                                    "queue_config": {"batch_send_deadline": "500ms"}}]}
        Scenario.started, Scenario.elapsed, Scenario.final_at = False, 0.0, None
        prometheus, prom_url = start_prometheus(tmp_path, config)
        # Prometheus applies new targets up to 5 s after it starts: the clock starts once the zeros are in
        wait_for(lambda: json.loads(http_get(f"{prom_url}/api/v1/query?query=up")[1])["data"]["result"], 30,
                 interval=0.2, what="the first scrape")
        start = time.time() - 1
        Scenario.started = True

        def newest(url):  # the newest scrape both stores hold, once the scenario's counters are final
            status, body = http_get(f"{url}/api/v1/query?query=max(timestamp(gpu_workload_held_gpu_seconds_total))",
                                    timeout=2)
            result = json.loads(body)["data"]["result"] if status == 200 else []
            done = Scenario.final_at
            return float(result[0]["value"][1]) if result and done and float(result[0]["value"][1]) > done else None

        end = wait_for(lambda: newest(prom_url), 60, interval=0.5, what="Prometheus scraped the whole scenario")
        wait_for(lambda: (newest(vm_url) or 0) >= end, 60, interval=0.5, what="VictoriaMetrics got it by remote_write")
        stores = {}
        for name, url in (("prometheus", prom_url), ("victoria-metrics", vm_url)):
            # --end on a scrape: Prometheus extrapolates nothing past it (VictoriaMetrics never does)
            stores[name] = report_json(capsys, {"url": url, "start": str(start), "end": f"{end:.3f}"},
                                       "--by", "namespace")
            assert set(stores[name]["source"]["hours"]) == {"counters"}  # no rollups recorded here: the fallback
            check_groups(stores[name], "namespace")
        strip = lambda d: json.dumps([d["groups"], d["total"]], sort_keys=True)
        assert strip(stores["prometheus"]) == strip(stores["victoria-metrics"])
    finally:
        if prometheus:
            stop(prometheus)
        stop(vm)


def one_line_error(capsys, *args, contains: str):
    code, out, err = run_report(capsys, *args)
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and contains in err, err
    return err


def test_bad_input_is_one_line_and_exit_2(backfilled, scenario_server, capsys, tmp_path):
    url, start, end = backfilled["url"], backfilled["start"], backfilled["end"]
    closed = f"http://127.0.0.1:{free_port()}"
    one_line_error(capsys, "--prometheus", closed, "--last", "1h", contains="cannot reach")
    one_line_error(capsys, "--prometheus", "prometheus:9090", contains="not an http(s) URL")
    one_line_error(capsys, "--prometheus", url, "--start", end, "--end", start, contains="is after --end")
    one_line_error(capsys, "--prometheus", url, "--start", "yesterday", contains="expected RFC3339")
    one_line_error(capsys, "--prometheus", url, "--last", "7 days", contains="expected a duration")
    one_line_error(capsys, "--prometheus", url, "--last", "1d", "--start", start, contains="not both")
    one_line_error(capsys, "--prometheus", url, "--by", "rack", contains="invalid choice")
    one_line_error(capsys, "--prometheus", url, "--match", "namespace=team-a", contains="--match")
    before = str(backfilled["t0"] - 2 * 86400)
    one_line_error(capsys, "--prometheus", url, "--start", before, "--end", str(float(before) + 3600),
                   contains="no workload series between")
    one_line_error(capsys, "--prometheus", url, "--start", start, "--end", end, "--by", "namespace",
                   "--match", 'namespace="nobody"', "--source", "counters", contains="no workload series matching")
    one_line_error(capsys, "--prometheus", url, "--start", start, "--end", end, "--by", "pod", "--source", "rules",
                   contains="no recording rule groups by pod")
    # hostile servers: a body over the cap, one that never answers in time, one that is not the API
    server = f"http://{scenario_server}"
    one_line_error(capsys, "--prometheus", server + "/huge", "--last", "1h", "--max-response-mib", "1",
                   contains="answered one query with answer over 1048576 bytes")
    one_line_error(capsys, "--prometheus", server + "/slow", "--last", "1h", "--timeout", "0.5",
                   contains="took longer than 0.5 s")  # no headers in time: the whole request's deadline
    one_line_error(capsys, "--prometheus", server + "/drip", "--last", "1h", "--timeout", "1",
                   contains="took longer than 1 s")
    one_line_error(capsys, "--prometheus", server + "/html", "--last", "1h", contains="not the Prometheus JSON API")
    one_line_error(capsys, "--prometheus", server + "/redirect", "--last", "1h", contains="redirects are not followed")
    one_line_error(capsys, "--prometheus", server + "/matrix-garbage", "--last", "1h", contains="not an instant vector")
    # the real CLI entry point: same line, no traceback
    result = subprocess.run([sys.executable, "-m", "gpu_spatial", "report", "--prometheus", closed, "--last", "1h"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.startswith("gpu-spatial report: cannot reach"), result.stderr
    assert result.stderr.count("\n") == 1


@needs("prometheus", "victoria-metrics")
def test_credentials_and_a_store_without_the_exporter(capsys, tmp_path, monkeypatch):
    """VictoriaMetrics with basic auth: a wrong token or password is refused in one line, the right one
    passes; an empty store says it has no series of this exporter."""
    vm, url = start_victoria_metrics(tmp_path, "-httpAuth.username=report", "-httpAuth.password=s3cret")
    try:
        (tmp_path / "token").write_text("not-the-token\n")
        (tmp_path / "wrong").write_text("report:guess\n")
        (tmp_path / "right").write_text("report:s3cret\n")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", "--bearer-token-file", str(tmp_path / "token"),
                       contains="refused the credentials (HTTP 401)")
        monkeypatch.setenv("GPU_SPATIAL_PROMETHEUS_TOKEN", "from-the-environment")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", contains="refused the credentials")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", "--basic-auth-file", str(tmp_path / "wrong"),
                       contains="refused the credentials")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", "--basic-auth-file", str(tmp_path / "missing"),
                       contains="cannot read the basic auth file")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", "--basic-auth-file", str(tmp_path / "right"),
                       contains="has no series of the gpu-spatial exporter")
        monkeypatch.delenv("GPU_SPATIAL_PROMETHEUS_TOKEN")
        monkeypatch.setenv("GPU_SPATIAL_PROMETHEUS_BASIC_AUTH", "report:s3cret")
        one_line_error(capsys, "--prometheus", url, "--last", "1h",
                       contains="has no series of the gpu-spatial exporter")
    finally:
        stop(vm)


def test_label_values_cannot_drive_the_terminal():
    from gpu_spatial.report.summary import group_name

    assert group_name({"namespace": "team\x1b[2J\x1b]0;owned\x07"}, ["namespace"]) == "team?[2J?]0;owned?"


def test_a_gpu_exists_from_its_first_sighting_to_its_last_or_the_end():
    """Range 10000..50000, EDGE 600 s: a GPU seen before the range exists from its start, else from its first
    sighting; to the end where it or its node was seen 600 s from it (not 600.5) or it was listed lost at
    its last sample, else to its last sighting; never less than observed nor more than the range;
    unobserved is what existed less what was observed, never negative."""
    from gpu_spatial.report.account import EDGE, GpuBook, GpuLedgerTotals

    assert EDGE == 600.0
    cases = {  # uuid: (before, first, last, listed lost, observed) -> existed, unobserved
        "at-edges": ((True, 10300.0, 49400.0, False, 30000.0), 40000.0, 10000.0),
        "inside": ((False, 10300.0, 49399.5, False, 39000.0), 39099.5, 99.5),
        "counted-more": ((False, 10300.0, 49399.5, False, 39500.0), 39500.0, 0.0),  # (increase() extrapolates)
        "over-range": ((True, 10000.0, 50000.0, False, 40100.0), 40000.0, 0.0),
        "lost": ((False, 10000.0, 30000.0, True, 10000.0), 40000.0, 30000.0),
        "node-up": ((True, 10000.0, 30000.0, False, 20000.0), 40000.0, 20000.0),
    }
    ledger = GpuLedgerTotals()
    for uuid, ((before, first, last, lost, observed), _e, _u) in cases.items():
        instance = "up-node" if uuid == "node-up" else f"node-{uuid}"
        ledger.books[(instance, uuid)] = GpuBook(instance, uuid, first=first, last=last, listed_lost=lost,
                                                 observed=observed, before=before)
    ledger.close(10000.0, 50000.0, {"up-node": 49400.0, "node-inside": 49399.5})
    for uuid, (_given, existed, unobserved) in cases.items():
        book = next(b for b in ledger.books.values() if b.uuid == uuid)
        assert (book.existed, book.unobserved) == (existed, unobserved), uuid
    assert ledger.existed == 238599.5 and ledger.sums()["unobserved"] == 60099.5


def test_the_unit_keeps_digits_and_the_table_fits():
    """GPU-h from 1 GPU-h up, GPU-min from one minute, GPU-s below (NaN ignored); columns left out lowest
    priority first, a name longer than 24 cut before a column goes, the name cut last (never under 12)."""
    from gpu_spatial.report.terminal import MIN_NAME, Column, fit, unit

    assert unit([1.0, math.nan])[0] == "GPU-h" and unit([0.9999])[0] == "GPU-min"
    assert unit([1 / 60])[0] == "GPU-min" and unit([1 / 60 - 1e-9])[0] == "GPU-s" and unit([])[0] == "GPU-s"
    columns = [Column("namespace", ["team-with-a-very-long-name-indeed", "(all)"], 0),
               Column("held", ["1.000", "2.000"], 9), Column("used", ["0.500", "1.000"], 3),
               Column("waste", [">=0.250", "0.500"], 8)]
    lines, left_out = fit(columns, 2 + 33 + 2 + 5 + 2 + 5 + 2 + 7)  # every column, the name whole
    assert left_out == [] and max(map(len, lines)) <= 58 and "team-with-a-very-long-name-indeed" in lines[1]
    lines, left_out = fit(columns, 46)  # without used, the name cut to 24 fits: used goes first
    assert [c.title for c in left_out] == ["used"] and max(map(len, lines)) <= 46
    lines, left_out = fit(columns, 20)  # the name alone, cut to the room
    assert [c.title for c in left_out] == ["held", "used", "waste"] and lines[1] == "team-with-a-very-lo~"
    lines, _left_out = fit(columns, 8)
    assert lines[1] == "team-with-a~" and len(lines[1]) == MIN_NAME
    short = [Column("job", ["42", "(all)"], 0), Column("held", ["1.000", "2.000"], 9)]
    lines, left_out = fit(short, 12)  # a name shorter than 12 is not padded to 12 (no room for held)
    assert lines == ["job     held", "42     1.000", "(all)  2.000"] and left_out == []


def test_a_groups_work_is_unknown_only_without_any_sm_series():
    """An MPS client (no busy, no SM series): work and hidden idle unknown (NaN), waste a lower bound, the
    cause MPS; a holder measured at SM 0 keeps 0 (known); a GPU without a spatial reading: busy unsplit."""
    from gpu_spatial.report.render import unknown_causes
    from gpu_spatial.report.summary import figures

    mps = figures({("held", "exact"): 2.0, ("busy", "unknown"): 2.0, ("sm_active", "unknown"): 2.0,
                   ("hidden_idle", "unknown"): 2.0, ("ledger", "time_idle"): 0.5})
    assert math.isnan(mps["ledger_sm_active_work_gpu_hours"]) and math.isnan(mps["ledger_hidden_idle_gpu_hours"])
    assert mps["ledger_gpu_hours"] == 0.5 and mps["waste_gpu_hours"] == 0.5 and mps["waste_is_lower_bound"]
    assert [why.split(" (")[0] for _v, why in unknown_causes(mps)] == ["MPS clients without the tracer"]
    idle = figures({("held", "exact"): 1.0, ("busy", "nvml"): 0.0, ("sm_active", "exact"): 0.0,
                    ("hidden_idle", "exact"): 0.0, ("ledger", "time_idle"): 1.0})
    assert idle["ledger_sm_active_work_gpu_hours"] == 0.0 and idle["ledger_hidden_idle_gpu_hours"] == 0.0
    unsplit = figures({("held", "exact"): 1.0, ("busy", "nvml"): 0.6, ("sm_active", "unknown"): 1.0,
                       ("hidden_idle", "unknown"): 1.0, ("ledger", "busy_unsplit"): 0.6, ("ledger", "time_idle"): 0.4})
    assert math.isnan(unsplit["ledger_sm_active_work_gpu_hours"]) and unsplit["ledger_gpu_hours"] == 1.0
    assert [(v, why.split(" (")[0]) for v, why in unknown_causes(unsplit)] == [(1.0, "no spatial reading on its GPU")]


MINUTES = 60.0
# (instance, gpu, first sample, last sample, its exporter down (minutes)): the GPUs of
# test_gpus_that_come_and_go_exist_while_they_do; node "gone" leaves the fleet at minute 60 (its up series
# ends), node "a" stays to the end
COMINGS_AND_GOINGS = (("a", "0", 0, 120, (0, 0)), ("a", "1", 30, 120, (50, 60)), ("gone", "0", 0, 60, (20, 25)),
                      ("a", "2", 0, 80, (0, 0)))


def comings_and_goings(t0: float, millis: bool) -> list[str]:
    """Every GPU's observed clock (from its first sample, from 0 again after its exporter was down) and
    gpu_lost 0, each node's up, every 15 s."""
    lines = []
    for instance, gpu, first, last, (down, back) in COMINGS_AND_GOINGS:
        labels = f'gpu="{gpu}",instance="{instance}",model="H100",uuid="GPU-{instance}-{gpu}"'
        for k in range(int(first * MINUTES // 15), int(last * MINUTES // 15) + 1):
            t = t0 + k * 15.0
            if down * MINUTES < t - t0 < back * MINUTES:
                continue
            since = back if t - t0 >= back * MINUTES > first * MINUTES else first
            stamp = f"{int(t * 1000)}" if millis else f"{t:.3f}"
            lines.append(f"gpu_ledger_observed_seconds_total{{{labels}}} {t - t0 - since * MINUTES:.3f} {stamp}")
            lines.append(f'gpu_ledger_gpu_seconds_total{{cell="unheld",{labels}}} {t - t0 - since * MINUTES:.3f} {stamp}')
            lines.append(f"gpu_lost{{{labels}}} 0 {stamp}")
    for instance, last in (("a", 120), ("gone", 60)):
        for k in range(int(last * MINUTES // 15) + 1):
            t = t0 + k * 15.0
            lines.append(f'up{{instance="{instance}"}} 1 {int(t * 1000) if millis else f"{t:.3f}"}')
    return lines


@pytest.mark.parametrize("engine", ["prometheus", "victoria-metrics"])
def test_gpus_that_come_and_go_exist_while_they_do(engine, tmp_path):
    """Range minutes 10..110: a GPU seen before it exists from its start; one that appears at minute 30
    from then (its first sighting: a subquery on Prometheus, tfirst_over_time on VictoriaMetrics), its
    exporter down 10 minutes; one whose node leaves the fleet at minute 60 to then (its last sighting), its
    exporter down 5 minutes; one its exporter stops listing at minute 80 while its node stays up to the end,
    30 minutes unobserved. Each within a scrape interval (15 s)."""
    t0 = (time.time() // 3600) * 3600 - 4 * 3600
    if engine == "prometheus":
        if shutil.which("promtool") is None:
            pytest.skip("promtool not installed (see .ci/run)")
        lines = comings_and_goings(t0, millis=False)
        families = {line.split("{")[0] for line in lines}
        text = "".join(f"# TYPE {f.removesuffix('_total')} {'counter' if f.endswith('_total') else 'gauge'}\n"
                       + "".join(line + "\n" for line in lines if line.split("{")[0] == f) for f in sorted(families))
        (tmp_path / "h.om").write_text(text + "# EOF\n")
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "h.om"),
                        str(tmp_path / "tsdb")], check=True, capture_output=True)
        proc, url = start_prometheus(tmp_path, {"global": {"scrape_interval": "15s"}})
    else:
        if shutil.which("victoria-metrics") is None:
            pytest.skip("victoria-metrics not installed (see .ci/run)")
        proc, url = start_victoria_metrics(tmp_path, "-search.disableCache", "-search.latencyOffset=0s",
                                           "-retentionPeriod=1")
        body = "\n".join(comings_and_goings(t0, millis=True)) + "\n"
        urllib.request.urlopen(urllib.request.Request(url + "/api/v1/import/prometheus", data=body.encode(),
                                                      method="POST"), timeout=60).close()
        http_get(url + "/internal/force_flush", timeout=30)
        query = urllib.parse.quote("count(count_over_time(up[3h]))")
        wait_for(lambda: b'"2"' in http_get(f"{url}/api/v1/query?query={query}&time={t0 + 3 * 3600}")[1], 30, 0.5,
                 "the import searchable")
    from gpu_spatial.report import account
    from gpu_spatial.report.promapi import PrometheusAPI

    try:
        ledger = account.gpu_ledger(PrometheusAPI(url), account.Plan("gpu"), t0 + 10 * MINUTES, t0 + 110 * MINUTES)
    finally:
        stop(proc)
    got = {(b.instance, b.gpu): (b.existed / MINUTES, b.unobserved / MINUTES) for b in ledger.books.values()}
    want = {("a", "0"): (100, 0), ("a", "1"): (80, 10), ("gone", "0"): (50, 5), ("a", "2"): (100, 30)}
    assert set(got) == set(want)
    for gpu, (existed, unobserved) in want.items():
        assert abs(got[gpu][0] - existed) <= 0.25 and abs(got[gpu][1] - unobserved) <= 0.25, (engine, gpu, got[gpu])


STEP = 10.0


# bcrypt of "s3cret" (Prometheus' web config takes only hashes): python3 crypt.crypt("s3cret", "$2b$10$" + 22 chars)
S3CRET_BCRYPT = "$2b$10$abcdefghijklmnopqrstuu3KWNuWLhBnmgYfnzONPueahDuedC/lu"


def test_waste_is_the_ledgers_hidden_idle_plus_time_idle_never_the_allocation_views():
    """a: the old held-idle (1800 s) and hidden-idle (2700 s) are not waste any more; its ledger cells are:
    hidden idle 900 s + time idle 1800 s. b: busy 3600 s with no SM split: its waste is a lower bound (0)."""
    totals = {("a",): {("held", ""): 7200.0, ("held_idle", ""): 1800.0, ("busy", "nvml"): 3600.0,
                       ("sm_active", "exact"): 900.0, ("hidden_idle", "exact"): 2700.0,
                       ("ledger", "sm_active_work"): 1800.0, ("ledger", "hidden_idle"): 900.0,
                       ("ledger", "time_idle"): 1800.0},
              ("b",): {("held", ""): 3600.0, ("hidden_idle", "time_share"): 3600.0, ("ledger", "busy_unsplit"): 3600.0}}
    table = summarize(totals, ("namespace",)).set_index("namespace")
    assert table.loc["a", "waste_gpu_hours"] == pytest.approx(0.25 + 0.5)
    assert table.loc["a", "ledger_gpu_hours"] == pytest.approx(1.25) and not table.loc["a", "waste_is_lower_bound"]
    assert table.loc["b", "waste_gpu_hours"] == 0.0 and table.loc["b", "waste_is_lower_bound"]
    assert list(top_wasters(table.reset_index(), ["namespace"])["namespace"]) == ["a"]
    assert table.loc["(all)", "waste_gpu_hours"] == pytest.approx(0.75) and table.loc["(all)", "waste_is_lower_bound"]


@needs("prometheus", "promtool")
def test_rollups_evaluated_every_30_s_give_the_scenarios_gpu_hours(capsys):
    tmp = Path(tempfile.mkdtemp(prefix="report-30s-"))
    proc = None
    try:
        t0 = (time.time() // 3600) * 3600 - 3 * 3600
        with open(tmp / "scenario.om", "w") as fh:
            write_openmetrics(SCENARIO, t0, DURATION, STEP, fh)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "scenario.om"),
                        str(tmp / "tsdb")], check=True, capture_output=True)
        rules = recording_rules_only(tmp)
        groups = yaml.safe_load(rules.read_text())
        groups["groups"][0]["interval"] = "30s"
        rules.write_text(yaml.safe_dump(groups))
        proc, url = start_prometheus(tmp, {"global": {"scrape_interval": "15s"}})
        built = subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", f"--start={int(t0 - 600)}",
                                f"--end={int(t0 + DURATION + 600)}", "--eval-interval=30s", f"--url={url}",
                                f"--output-dir={tmp / 'rules'}", str(rules)], capture_output=True, text=True)
        stop(proc)
        proc = None
        assert built.returncode == 0, built.stderr
        for block in (tmp / "rules").iterdir():
            shutil.move(str(block), tmp / "tsdb" / block.name)
        # The report finds the 30 s spacing in the heartbeat's samples, not in the rules file.
        proc, url = start_prometheus(tmp, {"global": {"scrape_interval": "15s"}, "rule_files": [str(rules)]})
        store = {"url": url, "start": str(t0 - 60), "end": str(t0 + DURATION)}
        document = report_json(capsys, store, "--by", "namespace")
        assert document["source"]["rule_step_seconds"] == 30
        assert "rules" in {span["source"] for span in document["source"]["spans"]}
        check_groups(document, "namespace", coverage=False)
    finally:
        if proc is not None:
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@needs("prometheus")
def test_credentials_against_prometheus_with_basic_auth(capsys, tmp_path, monkeypatch):
    (tmp_path / "web.yaml").write_text(yaml.safe_dump({"basic_auth_users": {"report": S3CRET_BCRYPT}}))
    proc, url = None, None
    try:
        proc, url = start_prometheus_with_auth(tmp_path)
        (tmp_path / "token").write_text("not-the-token\n")
        (tmp_path / "wrong").write_text("report:guess\n")
        (tmp_path / "right").write_text("report:s3cret\n")
        for flags in ([], ["--bearer-token-file", str(tmp_path / "token")],
                      ["--basic-auth-file", str(tmp_path / "wrong")]):
            one_line_error(capsys, "--prometheus", url, "--last", "1h", *flags,
                           contains="refused the credentials (HTTP 401)")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", "--basic-auth-file", str(tmp_path / "right"),
                       contains="has no series of the gpu-spatial exporter")
        monkeypatch.setenv("GPU_SPATIAL_PROMETHEUS_BASIC_AUTH", "report:s3cret")
        one_line_error(capsys, "--prometheus", url, "--last", "1h", contains="has no series of the gpu-spatial exporter")
    finally:
        if proc is not None:
            stop(proc)


def start_prometheus_with_auth(tmp: Path):
    """Prometheus behind basic auth: its readiness answers 401 until asked with the password."""
    import base64
    import urllib.request


    port = free_port()
    (tmp / "prometheus.yaml").write_text("global: {}\n")
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yaml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={tmp / 'web.yaml'}"],
                            stdout=open(tmp / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Basic " + base64.b64encode(b"report:s3cret").decode()}

    def ready():
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/-/ready", headers=auth), timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    wait_for(ready, 30, what="prometheus with basic auth ready")
    return proc, url
