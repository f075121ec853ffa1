"""Exact text of the details a new user reads (issue 27 item 15) and the dashboards' missing extra
(item 4): each line as printed, so a regression of the wording fails here."""
from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys

import tests.synthetic_exports as synth
from tests.helpers import FIXTURES, ROOT

QUARTER = FIXTURES / "h100_quarter_sms_50hz.sqlite"
MATMUL = FIXTURES / "h100_diag_matmul.sqlite"
LAUNCH = FIXTURES / "h100_diag_launch.sqlite"


def nsys(*args):
    done = subprocess.run([sys.executable, "-m", "nsys_ingest", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_summary_names_a_negative_start_and_an_unrecorded_rate(tmp_path):
    shifted = tmp_path / "shifted.sqlite"
    shutil.copyfile(QUARTER, shifted)
    con = sqlite3.connect(shifted)
    con.execute("update GPU_METRICS set timestamp = timestamp - 130000000")  # samples before the capture start
    con.execute("delete from META_DATA_CAPTURE where name = 'GPU_METRICS_OPTIONS:SAMPLING_FREQUENCY'")
    con.commit()
    con.close()
    lines = nsys("summary", shifted)
    assert lines[0] == f"{shifted}: schema gpu_metrics, sampling rate not recorded"
    assert lines[1] == "GPU 0 NVIDIA H100 80GB HBM3 (GPU-d0231d62-1fc0-6926-93e4-d1c04181c44b): 481 samples, -0.11 to 9.49 s"
    assert nsys("summary", QUARTER)[0] == f"{QUARTER}: schema gpu_metrics, sampled at 50 Hz"


def test_scrub_says_what_it_kept(tmp_path):
    bare = synth.without_gpu_metrics(MATMUL, tmp_path / "bare.sqlite")
    (line,) = nsys("scrub", bare, "-o", tmp_path / "bare_clean.sqlite")
    assert line.endswith("; kernels and timeline kept (the export has no GPU metrics)"), line
    no_trace = synth.without_kernel_trace(MATMUL, tmp_path / "no_trace.sqlite")
    (line,) = nsys("scrub", no_trace, "-o", tmp_path / "no_trace_clean.sqlite")
    assert line.endswith("; GPU metrics and timeline kept (the export has no kernels)"), line
    (line,) = nsys("scrub", MATMUL, "-o", tmp_path / "clean.sqlite")
    assert line.endswith("; GPU metrics, kernels and timeline kept"), line


def test_diagnose_short_kernel_overlap_only_where_there_are_short_kernels():
    lines = nsys("diagnose", MATMUL)
    assert lines[:2] == [f"{MATMUL}: 7.843 to 9.345 s (1.502 s)",
                         "kernel trace covers 1.502 s of the 1.502 s capture (trace 7.843 to 9.345 s, GPU metrics "
                         "7.843 to 9.345 s): the verdicts below are for the trace's window"]  # one phase: none listed
    (line,) = [x for x in lines if "short kernels" in x]
    assert line == "  kernels running: 97.9% of the window; kernel overlap 1.00x, 0 short kernels (< 100 us)"
    (line,) = [x for x in nsys("diagnose", LAUNCH) if "short kernels" in x]
    assert line.endswith(", 27363 short kernels (< 100 us) overlap 1.00x"), line


def test_dashboards_without_grafanalib_name_the_extra():
    """`pip install .` leaves grafanalib out: one line naming the extra, exit 2, no traceback."""
    hide = ("import runpy, sys; sys.modules['grafanalib'] = None; sys.argv = ['dashboards', '--check']; "
            "runpy.run_module('dashboards', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == ("python3 -m dashboards needs grafanalib, which `pip install .` leaves out: "
                           "pip install '.[dashboards]'\n")
    assert "pip install '.[dashboards]'" in (ROOT / "docs" / "alerts.md").read_text()
