"""`gpu-spatial report` against a hostile Prometheus API (issue 39, attack 8), over real HTTP on 127.0.0.1:
each answer that once gave a traceback, a hang past --timeout or gigabytes of memory now gives one line and
exit status 2, within bounds on bytes, parsed values and groups (docs/limits.md). Memory is measured from
outside (the report's own peak, VmHWM, in a child process); time is never asserted (bench/RESULTS.md has it).
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from gpu_spatial.report import account
from tests.helpers import ROOT
from tests.test_report import one_line_error, run_report

NOW = 1_800_000_000.0


def vector(series: list) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": series}}).encode()


def sample(metric: dict, value: str = "3600") -> dict:
    return {"metric": metric, "value": [NOW, value]}


def labelless(count: int) -> bytes:
    """A vector of `count` series without labels (about 36 bytes each)."""
    return (b'{"status":"success","data":{"resultType":"vector","result":['
            + b",".join([b'{"metric":{},"value":[1800000000,"1"]}'] * count) + b"]}}")


def distinct_groups(count: int) -> bytes:
    """`count` namespaces, each its own group, written as bytes (json.dumps of 10^5 dicts is slow)."""
    rows = b",".join(b'{"metric":{"namespace":"ns-%d"},"value":[1800000000,"3600"]}' % i for i in range(count))
    return b'{"status":"success","data":{"resultType":"vector","result":[' + rows + b"]}}"


class HostilePrometheus(BaseHTTPRequestHandler):
    """The first path segment says what is wrong: every query under it gets that answer. The heartbeat's range
    query gets an empty matrix, so the report goes on to the counters (the answers that attack it)."""

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode())
        kind, _, api = self.path.lstrip("/").partition("/")
        kind, _, count = kind.partition("=")  # /groups=N, /labelless=N: N series (bench/report_attacks.py)
        query = form.get("query", [""])[0]
        if api.endswith("query") and account.HEARTBEAT in query:
            return self.answer(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode())
        if kind == "header-drip":  # one byte of the status line every 0.2 s: every read returns, the request never ends
            with contextlib.suppress(OSError):
                for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"y" * 1000:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
            return
        if kind == "nested":
            return self.answer(b'{"status":"success","data":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        if kind == "list-label":
            return self.answer(vector([sample({"namespace": ["team-a"]})]))
        if kind == "labelless":  # the same (empty) label set over and over: Prometheus never answers a series twice
            return self.answer(labelless(int(count or 100_000)))
        if kind.startswith("chunks"):  # /chunksC=N: N label-less series in chunks of C bytes (bench/report_attacks.py)
            return self.chunked(labelless(int(count)), int(kind.removeprefix("chunks")))
        if kind == "values":  # 3 bytes a value: more values than one per 16 bytes of --max-response-mib 1
            return self.answer(b'{"status":"success","data":[' + b",".join([b"{}"] * 70_000) + b"]}")
        if kind == "groups":
            return self.answer(distinct_groups(int(count or account.MAX_GROUPS + 1)))
        if kind == "timeline":  # sane instant answers, a range answer whose values are not numbers
            if api.endswith("query_range"):
                return self.answer(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
                    {"metric": {"namespace": "team-a"}, "values": [[NOW, "3600"], ["soon", "a lot"]]}]}}).encode())
            return self.answer(vector([sample({"namespace": "team-a", "basis": "nvml"})]))
        if kind == "waste":  # not hostile: ten namespaces, ns-i wasting i x 100 GPU-seconds
            if api.endswith("query_range"):
                return self.answer(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
                    {"metric": {"namespace": f"ns-{i}"}, "values": [[NOW, str(i)]]} for i in range(10)]}}).encode())
            # every instant answer carries the ledger's key label too: the wasters are ranked by the ledger's
            # waste cells (exporter/ledger.py), which the report reads split by `cell`
            return self.answer(vector([sample({"namespace": f"ns-{i}", "basis": "exact", "cell": "hidden_idle"},
                                              str(i * 100 + 100)) for i in range(10)]))
        if kind == "echo":  # the label values API answers the names its match[] asked for
            names = parse_qs(self.path.partition("?")[2]).get("match[]", [""])[0]
            return self.answer(json.dumps({"status": "success", "data": names[names.find('"') + 1:-2].split("|")})
                               .encode())
        self.answer(b"{}", 404)

    do_GET = do_POST  # gpu-spatial top --url asks GET /api/v1/gpus

    def answer(self, body: bytes, status: int = 200):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)

    def chunked(self, body: bytes, size: int):
        """`body` in chunks of `size` bytes, framed a MiB of body at a time (1-byte chunks: 6 bytes each)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with contextlib.suppress(OSError):
            for at in range(0, len(body), 2**20):
                block = body[at:at + 2**20]
                if size == 1:  # each byte framed as "1\r\n" byte "\r\n", interleaved at C speed
                    framed = bytearray(6 * len(block))
                    for offset, part in enumerate((b"1", b"\r", b"\n", None, b"\r", b"\n")):
                        framed[offset::6] = block if part is None else part * len(block)
                else:
                    framed = b"".join(b"%x\r\n" % len(block[i:i + size]) + block[i:i + size] + b"\r\n"
                                      for i in range(0, len(block), size))
                self.wfile.write(framed)
            self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hostile():
    server = ThreadingHTTPServer(("127.0.0.1", 0), HostilePrometheus)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("kind, flags, words", [
    ("nested", [], "not the Prometheus JSON API (JSON nested too deeply)"),  # RecursionError escaped
    ("list-label", [], "answered label 'namespace' as a list, not a string"),  # TypeError escaped
    ("labelless", [], "answered one series twice in one answer"),  # 951 MB, 118 s
    ("values", ["--max-response-mib", "1"],
     "answered one query with JSON of more than 65536 values (--max-response-mib 1 allows 1048576 bytes and 65536"),
    ("header-drip", ["--timeout", "1"], "took longer than 1 s to answer one query"),  # ran past 80 s with --timeout 5
    ("timeline", ["--format", "html"], "a range sample that is not a time and a number"),  # ValueError escaped
])
def test_each_hostile_answer_is_one_line_and_exit_2(hostile, capsys, kind, flags, words):
    one_line_error(capsys, "--prometheus", f"{hostile}/{kind}", "--last", "1h", *flags, contains=words)


def test_groups_are_held_up_to_the_cap_and_refused_past_it(hostile, capsys, monkeypatch):
    monkeypatch.setattr(account, "MAX_GROUPS", 3)
    totals = account.Totals(("namespace",))
    three = [sample({"namespace": f"ns-{i}"}) for i in range(3)]
    assert totals.add("held", False, three) == 3 * 3600.0  # exactly the cap
    with pytest.raises(account.ReportError, match="more than 3 groups by namespace: group by a coarser label"):
        totals.add("held", False, [*three, sample({"namespace": "ns-3"})])
    assert len(totals.groups) == 3
    more = account.Totals(("namespace",))  # within the cap on its own, over it once merged
    more.add("held", False, [sample({"namespace": "ns-0"}), sample({"namespace": "ns-9"})])
    with pytest.raises(account.ReportError, match="more than 3 groups"):
        totals.merge(more)


def test_a_series_without_basis_beside_one_with_it_is_two_series_not_a_repeat():
    """Exporters from before the basis label next to newer ones: {namespace="a"} and {namespace="a",
    basis="nvml"} are two series of one answer, both NVML time shares, summed."""
    totals = account.Totals(("namespace",))
    totals.add("busy", False, [sample({"namespace": "a"}, "10"), sample({"namespace": "a", "basis": "nvml"}, "5")])
    assert totals.groups == {("a",): {("busy", "nvml"): 15.0}}


PEAK = """
import re, sys
from gpu_spatial.report import main
code = main(sys.argv[1:])
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) / 1024
print(f"{code} {peak}")
"""


def test_distinct_groups_past_the_cap_cost_a_bounded_heap(hostile):
    """60 MiB of distinct groups took the report to 2.1 GB: now 100,001 groups (6 MB) are refused at the cap,
    and the report's peak (measured: bench/RESULTS.md) stays under a ceiling with a wide margin."""
    done = subprocess.run([sys.executable, "-c", PEAK, "--prometheus", f"{hostile}/groups", "--last", "1h"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    code, peak = done.stdout.split()
    assert code == "2" and f"more than {account.MAX_GROUPS:,} groups by namespace" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and float(peak) < 400, (done.stderr, peak)


def test_the_waste_chart_keeps_the_largest_wasters_and_sums_the_rest():
    class Api:
        def query_range(self, expr, start, end, step):
            return [{"metric": {"namespace": f"ns-{i}"}, "values": [[NOW, str(i)], [NOW + 60, "1"], [NOW + 120, "NaN"],
                                                                   [NOW + 180, "+Inf"]]} for i in range(5)]

    collected = account.Collected({}, [account.Span(NOW - 600, NOW, "counters")], None, None, [], 0)
    frame = account.timeline(Api(), account.Plan("namespace"), collected, ("held_idle",), 60.0, {("ns-4",), ("ns-3",)})
    got = {(row.namespace, row.t): row.gpu_seconds for row in frame.itertuples()}
    assert got == {("ns-4", NOW): 4.0, ("ns-4", NOW + 60): 1.0, ("ns-3", NOW): 3.0, ("ns-3", NOW + 60): 1.0,
                   (account.OTHER, NOW): 0.0 + 1 + 2, (account.OTHER, NOW + 60): 3.0}


def test_the_html_chart_draws_the_largest_wasters_and_sums_the_rest_as_read(hostile, capsys, monkeypatch, tmp_path):
    from gpu_spatial.report import charts

    drawn = []
    monkeypatch.setattr(charts, "waste_over_time", lambda waste, labels, step: drawn.append(waste) or b"")
    code, _out, err = run_report(capsys, "--prometheus", f"{hostile}/waste", "--last", "1h", "--format", "html",
                                 "-o", str(tmp_path / "r.html"))
    assert code == 0, err
    got = drawn[0].groupby("namespace")["gpu_seconds"].sum().to_dict()
    # one range query: the ledger's waste cells in one selector (cell=~...), answered i per step for ns-i
    assert got == {**{f"ns-{i}": 1.0 * i for i in range(2, 10)}, account.OTHER: 1.0 * (0 + 1)}


def test_a_get_carries_its_query_string(hostile):
    from gpu_spatial.report.promapi import PrometheusAPI

    api = PrometheusAPI(f"{hostile}/echo", timeout=5)
    assert api.metric_names(["gpu_a", "gpu_b"], NOW - 60, NOW) == {"gpu_a", "gpu_b"}


class Heartbeats:
    """query_matrix answers: `series` heartbeat series, each with `times` evaluations every 60 s in the day."""

    def __init__(self, series: int, times: int):
        self.series, self.times = series, times

    def query_matrix(self, expr, at):
        return [{"metric": {"replica": f"r{i}"}, "values": [[at - 60 * k, "600"] for k in range(self.times)]}
                for i in range(self.series)]


def test_heartbeat_evaluators_are_named_up_to_the_cap_and_only_counted_beyond():
    notes = []
    assert account.heartbeat(Heartbeats(account.MAX_EVALUATORS + 4, 3), account.Plan("namespace"), NOW - 3600, NOW,
                             notes) == ([], set())
    assert notes[0].startswith(f"more than {account.MAX_EVALUATORS} rule evaluators write")
    assert notes[0].count("replica=") == account.MAX_EVALUATORS and "; and more)" in notes[0]
    notes = []
    account.heartbeat(Heartbeats(account.MAX_EVALUATORS, 3), account.Plan("namespace"), NOW - 3600, NOW, notes)
    assert notes[0].startswith(f"{account.MAX_EVALUATORS} rule evaluators write") and "and more" not in notes[0]


def test_heartbeat_evaluations_are_held_up_to_the_cap(monkeypatch):
    monkeypatch.setattr(account, "MAX_EVALUATIONS", 3)
    found, _twice = account.heartbeat(Heartbeats(1, 3), account.Plan("namespace"), NOW - 3600, NOW, [])
    assert [t for t, _w in found] == [NOW - 120, NOW - 60, NOW]
    with pytest.raises(account.ReportError, match="more than 3 evaluations of gpu_workload:rollup_window_seconds"):
        account.heartbeat(Heartbeats(1, 4), account.Plan("namespace"), NOW - 3600, NOW, [])
    notes = []  # a second evaluator's times are not held: the counters answer
    assert account.heartbeat(Heartbeats(2, 3), account.Plan("namespace"), NOW - 3600, NOW, notes) == ([], set())
    assert notes[0].startswith("2 rule evaluators write")
