"""nsys_ingest diagnose: four exports recorded on the H100 with a CUDA kernel trace and GPU metrics
(tools/record_diagnosis.sh), synthetic edge cases built from them, and the live verdict over HTTP.
The rules on their own, their thresholds and order, and the newer recordings: tests/test_verdicts.py."""
import json
import subprocess
import sys

import pytest

import tests.synthetic_exports as synth
from nsys_ingest.diagnose import diagnose
from nsys_ingest.kernels import NO_KERNEL_TRACE
from nsys_ingest.reader import Export, IngestError
from exporter.chain import diagnose as diagnose_live
from exporter.samplers.mps import DaemonStats, MpsSnapshot
from exporter.snapshot import ComputeProcess, DeviceTelemetry, GpuIdentity, SpatialReading
from nsys_ingest.verdicts import VERDICTS
from tests.helpers import FIXTURES, Exporter, parse_metrics, sample_value, wait_for

TIME_SLICED = FIXTURES / "h100_diag_time_sliced.sqlite"
MPS = FIXTURES / "h100_diag_mps.sqlite"
MATMUL = FIXTURES / "h100_diag_matmul.sqlite"
INPUT_BOUND = FIXTURES / "h100_diag_input_bound.sqlite"


def run(path, *args, chunk_rows=200_000):
    with Export(path, require_metrics=False) as export:
        return diagnose(export, *args, chunk_rows=chunk_rows)


def only_gpu(result):
    (gpu,) = result["gpus"]
    return gpu


@pytest.mark.parametrize("path, verdict, mode, processes", [
    (TIME_SLICED, "time_sliced_small_kernels", "time_sliced", 6),
    (MPS, "mps_shared", "mps", 6),
    (MATMUL, "saturated", "exclusive", 1),
    (INPUT_BOUND, "input_bound", "exclusive", 1),
])
def test_each_recorded_workload_gets_its_verdict(path, verdict, mode, processes):
    gpu = only_gpu(run(path))
    assert gpu["verdict"]["verdict"] == verdict, gpu["verdict"]
    evidence = gpu["verdict"]["evidence"]
    assert evidence["sharing_mode"] == mode and evidence["processes"] == processes
    assert len(gpu["processes"]) == processes and gpu["sm_count"] == 132
    assert not gpu["sm_active_estimated_from_grids"]


def test_what_the_rules_saw_on_the_recordings():
    sliced, mps = only_gpu(run(TIME_SLICED)), only_gpu(run(MPS))
    # Time-sliced contexts never overlap; MPS clients' kernels do.
    assert sliced["kernels"]["overlap"] == pytest.approx(1.0, abs=0.01)
    assert mps["kernels"]["overlap"] > 1.2
    assert sliced["gpu_metrics"]["gr_active"] > 0.95 and sliced["gpu_metrics"]["sm_active"] < 0.2
    assert sliced["kernels"]["median_us"] < 5  # tiny kernels of small training steps
    matmul, starved = only_gpu(run(MATMUL)), only_gpu(run(INPUT_BOUND))
    assert matmul["kernels"]["median_grid_blocks"] == 132 and matmul["kernels"]["sm_footprint"] == 1.0
    assert starved["kernels"]["busy_share"] < 0.2 and starved["kernels"]["long_gap_idle_share"] > 0.9


def test_chunk_size_and_row_order_change_nothing(tmp_path):
    whole = run(TIME_SLICED)
    assert run(TIME_SLICED, chunk_rows=997)["gpus"] == whole["gpus"]
    shuffled = synth.kernels_out_of_order(TIME_SLICED, tmp_path / "shuffled.sqlite")
    assert run(shuffled)["gpus"] == whole["gpus"]


def test_a_window_narrows_kernels_and_metrics_alike():
    full = only_gpu(run(INPUT_BOUND))
    start = run(INPUT_BOUND)["window_s"][0]
    half = run(INPUT_BOUND, int((start + 0.1) * 1e9), int((start + 0.6) * 1e9))
    assert half["window_s"] == pytest.approx([start + 0.1, start + 0.6])
    assert only_gpu(half)["kernels"]["kernels"] < full["kernels"]["kernels"]
    assert only_gpu(half)["verdict"]["verdict"] == "input_bound"


def test_without_a_kernel_trace_it_says_what_to_add_and_judges_from_metrics(tmp_path):
    result = run(synth.without_kernel_trace(TIME_SLICED, tmp_path / "k.sqlite"))
    assert result["notes"] == [NO_KERNEL_TRACE] and "--trace=cuda" in NO_KERNEL_TRACE
    gpu = only_gpu(result)
    assert gpu["kernels"] is None and gpu["verdict"]["verdict"] == "small_kernels"  # who shares it: unknown


def test_without_gpu_metrics_sm_activity_is_estimated_from_grids(tmp_path):
    result = run(synth.without_gpu_metrics(MATMUL, tmp_path / "m.sqlite"))
    assert "--gpu-metrics-devices=all" in result["notes"][0]
    gpu = only_gpu(result)
    assert gpu["sm_active_estimated_from_grids"] and gpu["verdict"]["verdict"] == "saturated"


def test_one_kernel_and_zero_length_kernels_get_clear_answers(tmp_path):
    one = only_gpu(run(synth.one_kernel(MATMUL, tmp_path / "one.sqlite")))
    assert one["kernels"]["kernels"] == 1 and one["kernels"]["idle_gaps"] == 0
    zero = only_gpu(run(synth.zero_length_kernels(INPUT_BOUND, tmp_path / "zero.sqlite")))
    assert zero["kernels"]["busy_share"] == 0.0 and zero["kernels"]["sm_footprint"] is None
    assert zero["verdict"]["verdict"] == "input_bound"  # the GPU metrics still speak


def test_kernels_on_two_gpus_are_judged_per_gpu(tmp_path):
    result = run(synth.kernels_on_two_gpus(MATMUL, tmp_path / "two.sqlite"))
    assert [g["gpu"] for g in result["gpus"]] == [0, 1]
    assert [len(g["processes"]) for g in result["gpus"]] == [1, 1]
    assert result["gpus"][1]["gpu_metrics"]["sm_active"] == pytest.approx(result["gpus"][0]["gpu_metrics"]["sm_active"] / 2, abs=0.01)


def test_an_empty_window_is_a_clear_error():
    with pytest.raises(IngestError, match="no kernels and no GPU metric samples in this window"):
        run(MATMUL, 10**15, 10**15 + 1)


@pytest.mark.parametrize("args, expect_out, expect_err, code", [
    (["--json"], '"verdict": "saturated"', "", 0),
    ([], "verdict: saturated", "", 0),
    (["--start", "1e6"], "", "error: no kernels and no GPU metric samples in this window", 2),
])
def test_command_line(args, expect_out, expect_err, code):
    done = subprocess.run([sys.executable, "-m", "nsys_ingest", "diagnose", str(MATMUL), *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == code
    assert expect_out in done.stdout and expect_err in done.stderr and "Traceback" not in done.stderr
    if "--json" in args:
        assert json.loads(done.stdout)["gpus"][0]["processes"][0]["kernels"] > 0


def test_command_line_on_a_lone_zero_length_kernel_without_metrics(tmp_path):
    lone = synth.zero_length_kernels(synth.one_kernel(MATMUL, tmp_path / "a.sqlite"), tmp_path / "b.sqlite")
    bare = synth.without_gpu_metrics(lone, tmp_path / "c.sqlite")
    done = subprocess.run([sys.executable, "-m", "nsys_ingest", "diagnose", str(bare)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "kernels: 1 (n/a/s)" in done.stdout and "verdict: none" in done.stdout


def test_command_line_on_a_file_with_neither(tmp_path):
    bare = synth.without_gpu_metrics(synth.without_kernel_trace(MATMUL, tmp_path / "a.sqlite"), tmp_path / "b.sqlite")
    done = subprocess.run([sys.executable, "-m", "nsys_ingest", "diagnose", str(bare)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "no kernels and no GPU metric samples" in done.stderr


# -- live, in the exporter ------------------------------------------------------------------------------
@pytest.mark.parametrize("recording, mode, verdict, kind", [
    ("nvml_h100_time_sliced.json", "time_sliced", "time_sliced_small_kernels", "time_sliced"),
    ("nvml_h100_mps.json", "mps", "mps_shared", "mps"),
])
def test_the_exporter_publishes_sharing_mode_and_verdict(recording, mode, verdict, kind):
    """NVML answers recorded on the H100 with 4 workers on 8 SMs each (tools/record_sharing.sh)."""
    with Exporter("--nvml-replay", str(FIXTURES / recording), "--no-mps", "--interval", "0.2") as e:
        def settled():
            samples = parse_metrics(e.metrics())
            return samples if sample_value(samples, "gpu_diagnosis", verdict=verdict) == 1 else None

        samples = wait_for(settled, 15, 0.2, f"verdict {verdict}")
        assert sample_value(samples, "gpu_sharing_mode", mode=mode) == 1
        assert sum(v for _, v in samples["gpu_sharing_mode"]) == 1  # one mode at a time, every mode listed
        assert len(samples["gpu_diagnosis"]) == len(VERDICTS)
        assert sample_value(samples, "gpu_compute_processes", kind=kind) == 4
        (gpu,) = e.gpus()["gpus"]
        assert gpu["sharing_mode"] == mode and gpu["diagnosis"]["verdict"] == verdict
        assert gpu["diagnosis"]["evidence"]["processes"] == 4 and gpu["diagnosis"]["advice"]


def test_a_paged_in_mps_server_is_the_verdict_whatever_else_holds():
    identity = GpuIdentity(0, "GPU-x", "H100")
    telemetry = DeviceTelemetry(identity, 0.0, compute_processes=(
        ComputeProcess(10, "nvidia-cuda-mps-server", "mps_server"), ComputeProcess(11, "python3", "mps")))
    spatial = SpatialReading("gpm", 0.0, 1.0, sm_active=0.3)
    server = DaemonStats("server", "alice", 10, 0.0, 500, 0, 1.0, None, None, major_faults_per_s=12.0)
    mode, (verdict, evidence) = diagnose_live(telemetry, spatial, 0.99, MpsSnapshot(daemons=(server,)))
    assert mode == "mps" and verdict.verdict == "mps_server_paging" and evidence.mps_server_faults_per_s == 12.0
    calm = DaemonStats("server", "alice", 10, 0.0, 500, 0, 1.0, None, None, major_faults_per_s=0.0)
    assert diagnose_live(telemetry, spatial, 0.99, MpsSnapshot(daemons=(calm,)))[1][0].verdict == "mps_shared"
