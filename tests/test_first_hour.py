"""The traps a new user fell into in the first hour (issues 36 and 46), each as that user met it: real
exporter, real Prometheus, the commands as typed. Every test here failed on the code before the fix."""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import Exporter, Prometheus, http_get, needs, wait_for

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
STEADY = FIXTURES / "h100_quarter_sms_steady_50hz.sqlite"
# The README's account step: four time-sliced H100 processes owned by alice, bob and uid 1003.
USERS = ("--nvml-replay", str(FIXTURES / "nvml_h100_time_sliced.json"), "--no-mps",
         "--proc-root", str(FIXTURES / "proc_users"))


def command(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.fixture(scope="module")
def users_stack(tmp_path_factory):
    """The users demo scraped by a Prometheus whose job is named `gpu`, as the user named it (not our
    default job name), with the rollup group evaluated every second."""
    with Exporter(*USERS, "--interval", "0.5") as exporter:
        prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), {"gpu": [f"127.0.0.1:{exporter.port}"]},
                                group_interval="1s")
        try:
            wait_for(lambda: prometheus.query('up{job="gpu"} == 1'), 60, 0.5, "the exporter scraped as job gpu")
            yield exporter, prometheus
        finally:
            prometheus.stop()


def commands(*runs: tuple) -> list[subprocess.CompletedProcess]:
    """Each command line of `runs` (the arguments `command` takes), all at once."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda args: command(*args), runs))


def report(*args: str) -> subprocess.CompletedProcess:
    return command("-m", "gpu_spatial", "report", *args)


# -- 2: the report says what is true about the rollups ---------------------------------------------------------
@needs("prometheus")
def test_trap2_report_says_too_few_evaluations_yet(users_stack):
    _exporter, prometheus = users_stack
    wait_for(lambda: len(prometheus.query("gpu_workload:rollup_window_seconds[1h]")[0]["values"]) >= 2
             if prometheus.query("gpu_workload:rollup_window_seconds") else None, 60, 0.5, "two heartbeats")
    done = report("--prometheus", prometheus.url, "--source", "rules", "--last", "1h", "--by", "user")
    assert done.returncode == 2 and done.stdout == ""
    # every second (the group's interval here) over a 300 s window: 2 x 300 / 1 + 1 evaluations make a run
    assert re.fullmatch(r"gpu-spatial report: too few evaluations of the recording rules yet: \d+, need 601 "
                        r"\(every 1 s; the first and last 300 s of a run come from the counters\); use --source "
                        r"counters \(or auto\)\n", done.stderr), done.stderr


@contextlib.contextmanager
def json_404_server():
    """A gateway in front of a store that answers 404 in JSON to every path (/healthz and /api/v1/query too)."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def answer(self):
            body = b'{"status":"error","errorType":"not_found","error":"no such tenant"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def test_trap4_a_json_404_of_another_server_is_not_called_an_exporter_or_a_prometheus():
    """It keeps its own words in the report, and top does not call it a Prometheus: it retries."""
    with json_404_server() as url:
        done, top = commands(("-m", "gpu_spatial", "report", "--prometheus", url, "--last", "1h"),
                             ("-m", "gpu_spatial", "top", "--once", "--interval", "0.5", "--url", url))
    assert done.returncode == 2
    assert done.stderr.endswith("rejected the query (HTTP 404): no such tenant\n"), done.stderr
    assert top.returncode == 1 and "not answering" in top.stdout and "Prometheus" not in top.stdout + top.stderr


def test_a_report_of_only_none_says_which_by_has_data(users_stack):
    _exporter, prometheus = users_stack
    wait_for(lambda: prometheus.query("count_over_time(gpu_workload_held_gpu_seconds_total[1h]) >= 2"), 60, 0.5,
             "two scrapes of the held counters")
    done = report("--prometheus", prometheus.url, "--source", "counters", "--last", "1h", "--by", "namespace")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())  # the text wraps at the terminal's width
    assert ("note: every group is (none): no workload series of the range carries namespace; --by node (1), "
            "--by gpu (1), --by model (1), --by user (3) have data") in said, done.stdout


@pytest.mark.parametrize("step", [60.0, 15.0, 300.0])
def test_trap2_the_evaluations_said_needed_are_what_the_planner_needs(step):
    """The message's count is the planner's: one evaluation fewer than it says leaves the range to the
    counters, the number it says gives the range a rollup span."""
    from gpu_spatial.report.account import plan_spans, why_no_rollups

    end = 1_000_000.0
    need = int(re.search(r"need (\d+)", why_no_rollups([(end - step, 300.0), (end, 300.0)])).group(1))
    assert need == max(3, int(2 * 300 / step) + 1)
    for count, rules in ((need - 1, False), (need, True)):
        evaluations = [(end - step * i, 300.0) for i in reversed(range(count))]
        assert any(s.source == "rules" for s in plan_spans(evaluations, end - 86400, end)) is rules
        assert why_no_rollups(evaluations).startswith("too few evaluations") is not rules


def test_install_without_the_plots_extra_says_which_extra(tmp_path):
    """`pip install .` leaves matplotlib out: the two commands that draw say so in one line, exit 2."""
    hide = "import sys; sys.modules['matplotlib'] = None; sys.argv[0] = '{0}'; from {1} import main; sys.exit(main())"
    plot = command("-c", hide.format("nsys-ingest", "nsys_ingest.__main__"), "plot", str(STEADY), "-o",
                   str(tmp_path / "t.png"))
    assert (plot.returncode, plot.stderr) == (2, "error: nsys-ingest plot needs matplotlib, which `pip install .` "
                                                 "leaves out: pip install '.[plots]'\n")
    html = command("-c", hide.format("gpu-spatial", "gpu_spatial.cli"), "report", "--prometheus",
                   "http://127.0.0.1:9", "--format", "html")
    assert (html.returncode, html.stderr) == (2, "gpu-spatial report: --format html needs matplotlib, which `pip "
                                                 "install .` leaves out: pip install '.[plots]'\n")


# -- 4: the report pointed at the exporter says so, also at its /metrics URL (issue 46) --------------------------
@pytest.mark.parametrize("api", ["on", "off"])
def test_trap4_report_pointed_at_the_exporter_says_it_is_one(api):
    with Exporter("--no-nvml", "--no-mps", *(["--no-api"] if api == "off" else [])) as exporter:
        pasted = (exporter.url, f"{exporter.url}/metrics")
        done = commands(*(("-m", "gpu_spatial", "report", "--prometheus", url, "--last", "1h") for url in pasted))
    for url, report_done in zip(pasted, done):
        assert report_done.returncode == 2
        assert report_done.stderr == (f"gpu-spatial report: {url} is a gpu-spatial exporter, not a Prometheus query "
                                      f"API: the report reads the Prometheus (or VictoriaMetrics, Thanos, Mimir) that "
                                      f"scrapes it, e.g. --prometheus http://127.0.0.1:9090\n")


# -- 3: top takes the URL people paste, and says when the API is off ---------------------------------------------
def test_trap3_top_accepts_the_metrics_url_and_says_the_api_is_off():
    with Exporter("--no-nvml", "--no-mps", "--replay", str(STEADY)) as exporter:
        wait_for(lambda: "gpu_sm_active_ratio{" in exporter.metrics(), 15, 0.2, "the replay published")
        # the README's curl line names the exporter as 127.0.0.1:9478: top takes that form too (issue 46)
        pasted = (f"{exporter.url}/metrics", f"{exporter.url}/", f"{exporter.url}/api/v1/gpus",
                  f"127.0.0.1:{exporter.port}")
        for done in commands(*(("-m", "gpu_spatial", "top", "--once", "--size", "100x20", "--url", url)
                               for url in pasted)):
            assert done.returncode == 0, done.stdout + done.stderr
            assert "SM[" in done.stdout and "25%" in done.stdout and "not answering" not in done.stdout
    with Exporter("--no-nvml", "--no-mps", "--no-api") as exporter:
        done = command("-m", "gpu_spatial", "top", "--once", "--size", "200x10", "--url", exporter.url + "/metrics")
    assert (done.returncode, done.stdout) == (2, "")  # no retry helps: bad input, one line
    assert done.stderr == (f"gpu-spatial top: the exporter at {exporter.url} answers, but its JSON API is off "
                           f"(--no-api): top --url reads /api/v1/gpus; start it without --no-api, or run gpu-spatial "
                           f"top on that host\n")


# -- 5: plot blames the output's format ---------------------------------------------------------------------------
def test_trap5_plot_to_an_unknown_format_names_the_formats(tmp_path):
    done = command("-m", "nsys_ingest", "plot", str(STEADY), "-o", str(tmp_path / "x.txt"))
    assert done.returncode == 2 and done.stdout == ""
    line = done.stderr
    assert line.startswith(f"error: cannot write {tmp_path / 'x.txt'}: plot writes images, no .txt files; its suffix "
                           "chooses the format, one of ") and line.count("\n") == 1
    assert ".png" in line and ".svg" in line and ".pdf" in line and "(e.g. -o timeline.png)" in line
    assert not (tmp_path / "x.txt").exists()
    assert command("-m", "nsys_ingest", "plot", str(STEADY), "-o", str(tmp_path / "x.svg")).returncode == 0


# -- 6: an ordinary user's exporter names users from /etc/passwd --------------------------------------------------
def test_trap6_users_named_from_etc_passwd_when_init_is_not_readable():
    """As uid 65534 (after the imports: the interpreter lives under /root), /proc/1/root is closed to the
    process while /etc/passwd is readable: the sampler reads the latter and says which file named the users."""
    if os.getuid() != 0:
        pytest.skip("needs root to become an ordinary user")
    probe = textwrap.dedent("""
        import logging, os, sys
        from exporter.samplers.users import UsersSampler
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
        os.setgid(65534); os.setuid(65534)
        own = UsersSampler(None, "/proc")
        print("root is", own._user_names().get(0))
        other = UsersSampler(None, "/proc/self/..")  # this host's /proc by another name is still this host's
        print("again", other._user_names().get(0))
    """)
    done = command("-c", probe)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # the same database, said calmly: root in a container cannot open it either (issue 46)
    assert lines[0] == ("users passwd: user names from /etc/passwd, the same database as /proc/1/root/etc/passwd "
                        "(this host's, seen through its init, which this process may not open: that needs "
                        "CAP_SYS_PTRACE)"), lines[0]
    assert lines[1] == "root is root"
    assert lines[-1] == "again root"


def test_trap6_a_foreign_proc_root_never_falls_back_to_this_hosts_users(tmp_path):
    from exporter.samplers.users import UsersSampler

    (tmp_path / "1").mkdir()
    sampler = UsersSampler(None, str(tmp_path))
    assert sampler._user_names() == {} and sampler.names_from is None
    assert sampler.passwd_files == [tmp_path / "1" / "root" / "etc" / "passwd"]


# -- 7: advice names the installed commands ----------------------------------------------------------------------
def test_trap7_verdict_advice_names_installed_commands():
    from nsys_ingest.commandline import SCRIPTS

    with Exporter("--no-nvml", "--no-mps", "--replay", str(STEADY)) as exporter:
        gpu = wait_for(lambda: (g := exporter.gpus()["gpus"]) and g[0].get("diagnosis", {}).get("advice") and g[0],
                       15, 0.2, "a verdict")
    advice = gpu["diagnosis"]["advice"]
    assert "nsys-ingest diagnose (or gpu-spatial nsys diagnose)" in advice
    named = set(re.findall(r"\b(nsys[-_]ingest|gpu-spatial)\b", advice))
    assert named and named <= set(SCRIPTS), advice


def test_trap7_no_advice_names_a_command_that_is_not_installed():
    """Every verdict's advice (the strings of nsys_ingest/verdicts.py) names diagnose by an installed command."""
    import ast

    from nsys_ingest import verdicts
    from nsys_ingest.commandline import SCRIPTS

    source = Path(verdicts.__file__).read_text()
    strings = " ".join(node.value for node in ast.walk(ast.parse(source))
                       if isinstance(node, ast.Constant) and isinstance(node.value, str))
    named = re.findall(r"([\w-]+) diagnose\b", strings)
    assert named and set(named) <= {*SCRIPTS, "nsys"}, named  # `gpu-spatial nsys diagnose`
    assert strings.count("nsys-ingest diagnose (or gpu-spatial nsys diagnose)") == 2


def test_an_extra_is_named_only_when_its_own_package_is_missing(tmp_path, monkeypatch):
    """A package that is there but lacks one of its own dependencies is not 'left out by pip install .'."""
    from nsys_ingest.commandline import missing_extra

    (tmp_path / "broken_pkg").mkdir()
    (tmp_path / "broken_pkg" / "__init__.py").write_text("import no_such_dependency_of_it\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert missing_extra("cmd", "no_such_pkg_here", "x") == ("cmd needs no_such_pkg_here, which `pip install .` leaves "
                                                            "out: pip install '.[x]'")
    assert missing_extra("cmd", "json", "x") is None
    with pytest.raises(ModuleNotFoundError):
        missing_extra("cmd", "broken_pkg", "x")


# -- 8: the small ones --------------------------------------------------------------------------------------------
def test_trap8_the_root_page_links_what_the_exporter_serves():
    with Exporter("--no-nvml", "--no-mps") as exporter:
        status, body = http_get(exporter.url + "/")
        page = body.decode()
    assert status == 200 and all(f"href='{p}'" in page for p in ("/metrics", "/healthz", "/docs", "/api/v1/gpus"))
    with Exporter("--no-nvml", "--no-mps", "--no-api") as exporter:
        status, body = http_get(exporter.url + "/")
    assert status == 200 and "href='/metrics'" in body.decode() and "/docs" not in body.decode()
    assert "the JSON API is off (--no-api)" in body.decode()


def test_trap8_equal_dates_are_a_day_not_swapped_timestamps():
    done = report("--prometheus", "http://127.0.0.1:9", "--start", "2026-11-20", "--end", "2026-11-20")
    assert done.returncode == 2
    assert done.stderr == ("gpu-spatial report: --start and --end are the same time (2026-11-20 00:00:00 UTC): a date is "
                           "its midnight (UTC), so a whole day is --start 2026-11-20 --end 2026-11-21; or use --last\n")
    done = report("--prometheus", "http://127.0.0.1:9", "--start", "2026-11-21", "--end", "2026-11-20")
    assert done.stderr == ("gpu-spatial report: --start (2026-11-21 00:00:00 UTC) is after --end (2026-11-20 00:00:00 "
                           "UTC): swap them, or use --last\n")


def test_trap8_bare_gpu_spatial_is_a_usage_error():
    done = command("-m", "gpu_spatial")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("usage: gpu-spatial SUBCOMMAND")
    assert command("-m", "gpu_spatial", "--help").returncode == 0


def test_trap8_nsys_help_and_errors_name_the_command_as_typed():
    helped = command("-m", "gpu_spatial", "nsys", "--help")
    assert helped.returncode == 0 and "python -m nsys_ingest" not in helped.stdout
    assert helped.stdout.startswith("usage: gpu-spatial nsys ")
    bogus = command("-m", "gpu_spatial", "nsys", "summary", str(STEADY), "--bogus")
    assert bogus.returncode == 2
    assert bogus.stderr.startswith("usage: gpu-spatial nsys summary ")
    assert bogus.stderr.splitlines()[-1] == "gpu-spatial nsys summary: error: unrecognized arguments: --bogus"


def test_trap8_top_shows_the_users_the_exporter_assigned():
    done = command("-m", "gpu_spatial", "top", "--once", "--size", "100x30", *USERS)
    assert done.returncode == 0, done.stderr
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\s+(41[789]|420) (\S+)", done.stdout, re.M)}
    assert rows == {417: "alice", 418: "alice", 419: "bob", 420: "1003"}, done.stdout


def test_trap8_top_keeps_the_sm_bar_at_30_columns():
    """Narrower, the model goes first, then the hidden-idle figure; both bars stay."""
    from gpu_spatial.top.render import gpu_line
    from gpu_spatial.top.state import Gpu

    done = command("-m", "gpu_spatial", "top", "--once", "--size", "30x10", "--no-nvml", "--no-mps",
                   "--replay", str(STEADY))
    line = done.stdout.splitlines()[1]
    assert len(line) <= 30 and re.search(r"time\[#+\]100% SM\[#~+\] 25%", line), line
    gpu = Gpu(position=0, index=0, uuid="GPU-x", model="NVIDIA H100 80GB HBM3")
    gpu.time_utilization, gpu.sm_active, gpu.hidden_idle = 1.0, 0.25, 0.75
    lines = {width: "".join(text for text, _style in gpu_line(gpu, width, True)) for width in (50, 45, 30)}
    assert lines == {50: "> 0 H100 80GB  time[####]100% SM[#~~~] 25% hid 75%",
                     45: "> 0 time[#######]100% SM[##~~~~~] 25% hid 75%",
                     30: "> 0 time[###]100% SM[#~~] 25%"}


def test_trap8_the_nsys_source_suggests_the_token_file_not_the_flag():
    """docs/exporter.md warns that `ps` shows a flag to every user: the hints name the file."""
    import urllib.request

    with Exporter(*USERS) as exporter:
        gpu = wait_for(lambda: (g := exporter.gpus()["gpus"]) and g[0]["sources"] and g[0], 15, 0.2, "a GPU")
        request = urllib.request.Request(exporter.url + "/api/v1/nsys", data=b"x", method="POST")
        try:
            urllib.request.urlopen(request, timeout=5)
        except urllib.error.HTTPError as refused:
            uploads = refused.read().decode()
    nsys = next(s for s in gpu["sources"] if s["source"] == "nsys")
    for said in (nsys["reason"], uploads):
        assert "--nsys-upload-token-file" in said and not re.search(r"--nsys-upload-token(?!-file)", said), said


# -- issue 46: errors that name the mistake, and what piped output keeps -----------------------------------------
@needs("prometheus", "victoria-metrics")
def test_top_pointed_at_a_prometheus_says_it_is_one(users_stack, tmp_path):
    """Prometheus answers top's path with 404, VictoriaMetrics with 400: both are said to be what they are."""
    from tests.test_report import start_victoria_metrics, stop

    _exporter, prometheus = users_stack
    victoria, victoria_url = start_victoria_metrics(tmp_path)
    try:
        stores = (prometheus.url, victoria_url)
        done = commands(*(("-m", "gpu_spatial", "top", "--once", "--url", url) for url in stores))
    finally:
        stop(victoria)
    for url, top in zip(stores, done):
        assert (top.returncode, top.stdout) == (2, "")
        assert top.stderr == (f"gpu-spatial top: {url} is a Prometheus query API, not a gpu-spatial exporter: top --url "
                              f"reads the exporter's JSON API (e.g. --url http://127.0.0.1:9478); the account from this "
                              f"Prometheus: gpu-spatial report --prometheus {url}\n")


@needs("prometheus", "tmux")
def test_top_in_a_terminal_pointed_at_a_prometheus_says_it_and_exits(users_stack):
    """Not a screen that retries forever: the terminal restored, the one line, exit 2."""
    from tests.test_top import tmux

    _exporter, prometheus = users_stack
    with tmux(["--url", prometheus.url], 160, 20) as terminal:
        text = terminal.wait(lambda t: "TOP-EXITED=" in t, timeout=60, what="top exited")
    assert "TOP-EXITED=2" in text and f"gpu-spatial top: {prometheus.url} is a Prometheus query API" in text, text


@needs("prometheus")
def test_report_on_one_scrape_says_wait_for_the_next(users_stack):
    """A range that holds the first scrape of the counters and no second: the next scrape is what is missing;
    a range before any scrape is still a range without data."""
    _exporter, prometheus = users_stack
    held = "gpu_workload_held_gpu_seconds_total"
    wait_for(lambda: prometheus.query(f"count_over_time({held}[1h]) >= 2"), 60, 0.5, "two scrapes of the counters")
    first = min(float(t) for series in prometheus.query(f"{held}[1h]") for t, _v in series["values"])
    once, before = commands(*(("-m", "gpu_spatial", "report", "--prometheus", prometheus.url, "--by", "user",
                               "--start", f"{start:.3f}", "--end", f"{end:.3f}")
                              for start, end in ((first - 30, first + 0.5), (first - 3600, first - 1800))))
    assert once.returncode == 2 and once.stderr == (
        f"gpu-spatial report: {prometheus.url} has one scrape of the workload counters in the range (a Prometheus "
        f"that has just started?): an account needs two; run the report again after the next scrape, or end the "
        f"range later\n"), once.stderr
    assert before.returncode == 2 and "no workload series between the start and the end" in before.stderr


@needs("prometheus")
def test_report_before_the_first_scrape_says_so(tmp_path):
    """Prometheus has its target and no sample of it yet. The target accepts and never answers, with a 5-minute
    scrape timeout: its first scrape cannot end during the test, so the test does not race it."""
    import yaml

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "5m", "scrape_timeout": "5m"},
            "scrape_configs": [{"job_name": "gpu", "static_configs": [{"targets": [target]}]}]}))
        prometheus = Prometheus.from_config(tmp_path)
        try:
            wait_for(lambda: target.encode() in http_get(prometheus.url + "/api/v1/targets", timeout=5)[1], 60, 0.2,
                     "the target listed")
            done = report("--prometheus", prometheus.url, "--last", "1h")
        finally:
            prometheus.stop()
    assert done.returncode == 2 and done.stderr == (
        f"gpu-spatial report: {prometheus.url} has not scraped http://{target}/metrics yet (it has just started?): "
        f"run the report again after its first scrapes, within a scrape interval\n"), done.stderr


@needs("prometheus")
def test_report_on_a_prometheus_that_lists_no_target_yet(tmp_path):
    """The first seconds after Prometheus starts, before it lists the targets of its scrape configurations: it
    says how young it is (here a discovery that finds no file stands for one not run yet). The same server an
    hour later (the clock moved by hand), and a young one without scrape configurations, get the usual question."""
    from gpu_spatial.report.account import Plan
    from gpu_spatial.report.empty import diagnose_empty
    from gpu_spatial.report.promapi import PrometheusAPI

    said = {}
    for config in ("scrapes", "scrapes nothing"):
        home = tmp_path / config.replace(" ", "-")
        home.mkdir()
        scrape = {"scrape_configs": [{"job_name": "gpu", "file_sd_configs": [{"files": [str(home / "none*.json")]}]}]}
        (home / "prometheus.yaml").write_text(json.dumps({"global": {"scrape_interval": "5m"},
                                                          **(scrape if config == "scrapes" else {})}))
        prometheus = Prometheus.from_config(home)
        try:
            wait_for(lambda: http_get(prometheus.url + "/-/ready", timeout=5)[0] == 200, 60, 0.2, "prometheus ready")
            done = report("--prometheus", prometheus.url, "--last", "1h")
            api, now = PrometheusAPI(prometheus.url), time.time()
            said[config] = (prometheus.url, done, str(diagnose_empty(api, Plan("namespace"), now - 3600, now, now + 3600)))
        finally:
            prometheus.stop()
    url, done, later = said["scrapes"]
    assert done.returncode == 2 and re.fullmatch(
        rf"gpu-spatial report: {url} started \d+ s ago and lists no scrape target yet: run the report "
        rf"again after its first scrapes, in a minute\n", done.stderr), done.stderr
    assert later.startswith(f"{url} has no series of the gpu-spatial exporter"), later
    url, done, _later = said["scrapes nothing"]
    assert done.stderr.startswith(f"gpu-spatial report: {url} has no series of the gpu-spatial exporter"), done.stderr


def test_the_targets_named_are_few_and_printable():
    """What the targets API says is the server's: clipped, no escape sequences, a count past the first three."""
    from gpu_spatial.report.empty import never_scraped

    targets = [{"health": "unknown", "scrapeUrl": f"http://h{i}\x1b[2J/metrics"} for i in range(5)] + \
        [{"health": "up", "scrapeUrl": "http://up/metrics"}, "not a target"]

    assert never_scraped(targets) == ["http://h0?[2J/metrics", "http://h1?[2J/metrics", "http://h2?[2J/metrics",
                                        "2 more targets"]


@pytest.mark.parametrize("recording", ["README.md", "fifo", "tests"])
def test_an_nvml_replay_that_is_no_recording_says_what_one_is(recording, tmp_path):
    if recording == "fifo":  # never opened blocking
        recording = str(tmp_path / "fifo")
        os.mkfifo(recording)
    done = command("-m", "exporter", "--nvml-replay", recording, "--port", "0")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    if recording == "README.md":
        assert done.stderr == ("error: README.md is not an NVML recording (not JSON: Expecting value: line 1 column 1 "
                               "(char 0)): a recording is the JSON that `python3 -m exporter.nvml_replay record "
                               "OUT.json` writes on a GPU host (tests/fixtures/nvml_h100_time_sliced.json is one)\n")
    else:
        assert done.stderr.startswith(f"error: cannot read NVML recording {recording}: a "), done.stderr


def test_the_inputs_are_checked_before_the_port():
    """With the port taken: a missing --replay is the mistake named; a good one leaves the port the one line
    said (what loading the replay logged is dropped with it)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        missing, good = commands(*(("-m", "exporter", "--no-nvml", "--no-mps", "--replay", replay, "--port", port)
                                   for replay in ("nothere.sqlite", str(STEADY))))
    assert (missing.returncode, missing.stderr) == (2, "error: --replay nothere.sqlite: nothere.sqlite: no such file\n")
    assert (good.returncode, good.stderr) == (2, (f"error: port {port} on 127.0.0.1 is in use (another exporter?): "
                                                  f"choose another with --port\n"))


def test_top_once_piped_cuts_no_line():
    """Piped, a line is as long as it is (a pipe has no edge); --size still cuts at its width."""
    piped, sized = commands(("-m", "gpu_spatial", "top", "--once", *USERS),
                            ("-m", "gpu_spatial", "top", "--once", "--size", "100x30", *USERS))
    workloads = [line for line in piped.stdout.splitlines() if line.startswith("workload user")]
    assert len(workloads) == 3 and all(line.endswith("time idle 0.00") for line in workloads), piped.stdout
    assert max(map(len, piped.stdout.splitlines())) > 120  # the default width of a pipe, not cut to
    assert sized.returncode == 0 and max(map(len, sized.stdout.splitlines())) == 100


def test_trace_help_says_what_tracing_needs():
    done = command("-m", "gpu_spatial", "trace", "--help")
    lines = done.stdout.split("needs:\n", 1)[1].splitlines()
    assert done.returncode == 0 and len([line for line in lines if not line.startswith("    ")]) == 2, done.stdout
    process, exporter = (" ".join(lines[:2]), lines[2])
    assert "native library" in process and "pip install ." in process and "cupti-python" in process
    assert "--workload-cupti" in exporter


def test_top_help_replays_the_readmes_recording():
    readme = (ROOT / "README.md").read_text()
    replayed = re.search(r"^gpu-spatial-exporter --no-nvml --replay (\S+)", readme, re.M).group(1)
    done = command("-m", "gpu_spatial", "top", "--help")
    assert f"--replay {replayed} " in done.stdout and "--replay tests/fixtures/" not in done.stdout.replace(replayed, "")


def test_operations_names_every_provisioned_dashboard():
    """docs/operations.md counts and names the dashboards the compose stack provisions: every generated file."""

    titles = sorted(json.loads(path.read_text())["title"] for path in (ROOT / "dashboards" / "generated").glob("*.json"))
    compose = (ROOT / "docs" / "operations.md").read_text().split("## The compose stack", 1)[1].split("\n## ", 1)[0]
    said = re.search(r"Prometheus datasource and (\w+) dashboards provisioned", compose).group(1)
    listed = compose.split("dashboards provisioned", 1)[1].split("\n\n")[0]
    named = sorted(" ".join(title.split()) for title in re.findall(r"\*\*([^*]+)\*\*", listed))
    assert (said, named) == ({2: "two", 3: "three", 4: "four", 5: "five"}[len(titles)], titles)


def test_the_readmes_kubectl_apply_says_the_image_comes_first():
    """The image is in no registry: the README says to build and push it before `kubectl apply -k`."""
    readme = (ROOT / "README.md").read_text()
    before = readme.split("### Kubernetes", 1)[1].split("kubectl apply -k", 1)[0]
    assert "build the image and push it" in before and "docs/kubernetes.md" in before
    guide = (ROOT / "docs" / "kubernetes.md").read_text().split("kubectl apply -k deploy/kubernetes", 1)[0]
    assert "docker build -t REGISTRY/" in guide and "docker push REGISTRY/" in guide and "kustomize edit set image" in guide


# -- 1: a rule that holds whatever the job is called (last: it stops the exporter) -------------------------------
@needs("prometheus")
def test_trap1_exporter_down_holds_for_a_job_name_we_did_not_choose(users_stack):
    exporter, prometheus = users_stack
    target = f"127.0.0.1:{exporter.port}"
    # HiddenIdleSMs firing proves the alert rules ran on the scraped data many times over.
    wait_for(lambda: prometheus.query('ALERTS{alertname="HiddenIdleSMs", alertstate="firing"}'), 120, 0.5,
             "HiddenIdleSMs firing on the users demo")
    assert prometheus.query('ALERTS{alertname="ExporterDown"}') == []
    exporter.__exit__(None, None, None)
    down = wait_for(lambda: prometheus.query('ALERTS{alertname="ExporterDown", alertstate="firing"}'), 60, 0.5,
                    "ExporterDown once the exporter stops")
    assert [(a["metric"]["instance"], a["metric"]["job"]) for a in down] == [(target, "gpu")]
