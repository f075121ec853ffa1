"""Opting MPS clients into tracing, as an admin does it (deploy/mps-tracing): the Kubernetes overlay rendered
by kustomize and validated against the Kubernetes schema, the example client pod, and the Slurm TaskProlog and
profile.d snippets run by a real shell, whose environment then makes a Python process load the tracer."""
import os
import subprocess
import sys

import pytest
import yaml

from gpu_trace import native

from tests.helpers import ROOT
from tests.test_kubernetes import KUBERNETES_VERSION, needs

TRACING = ROOT / "deploy" / "mps-tracing"


def valid(doc) -> None:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


@needs("kubectl")
def test_the_overlay_listens_on_the_host_folder_and_copies_the_tracer_there():
    done = subprocess.run(["kubectl", "kustomize", str(TRACING)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [daemonset] = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "DaemonSet"]
    valid(daemonset)
    spec = daemonset["spec"]["template"]["spec"]
    [exporter] = spec["containers"]
    assert exporter["args"][-2:] == ["--workload-cupti", "--cupti-socket=/run/gpu-spatial/cupti.sock"]
    assert {"name": "gpu-spatial-run", "mountPath": "/run/gpu-spatial"} in exporter["volumeMounts"]
    assert {"name": "gpu-spatial-run", "hostPath": {"path": "/run/gpu-spatial", "type": "DirectoryOrCreate"}} \
        in spec["volumes"]
    [copier] = spec["initContainers"]
    assert copier["image"] == exporter["image"] and "/run/gpu-spatial/python/gpu_trace" in copier["command"][-1]


def test_the_copy_command_puts_a_working_tracer_where_the_client_pod_looks(tmp_path):
    """The init container's command, run here against a folder standing in for /run/gpu-spatial."""
    patch = yaml.safe_load((TRACING / "exporter-patch.yaml").read_text())
    [init] = [p["value"] for p in patch if p["path"].endswith("/initContainers")]
    command = init[0]["command"][-1].replace("/run/gpu-spatial", str(tmp_path))
    subprocess.run([sys.executable, "-c", command], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    client = yaml.safe_load((TRACING / "example-client.yaml").read_text())
    valid(client)
    env = {e["name"]: e["value"].replace("/run/gpu-spatial", str(tmp_path)) for e in client["spec"]["containers"][0]["env"]}
    assert (tmp_path / "python" / "gpu_trace" / "autostart" / "sitecustomize.py").is_file()
    # CI builds the native library (pip install -e): copied under the name the pod's variables give
    assert (tmp_path / "libgputrace.so").is_file() == (native.library_path() is not None)
    out = run_python({**env, "PYTHONPATH": env["PYTHONPATH"]}, tmp_path)
    assert out.stdout == "gpu_trace.hook\n"
    if native.library_path() is not None:
        assert env["CUDA_INJECTION64_PATH"] == env["GPU_SPATIAL_TRACE_LIBRARY"] == str(tmp_path / "libgputrace.so")
        assert out.stderr == ""  # the hook holds the library; nothing is said before a window is asked for
    else:
        assert "cupti-python is not installed" in out.stderr


def run_python(env: dict, cwd) -> subprocess.CompletedProcess:
    """A client's Python with only `env` added: which module started the tracer."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", "import sys; print([m for m in sys.modules if m == 'gpu_trace.hook'][0])"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("snippet", ["slurm-taskprolog.sh", "profile.d-gpu-trace.sh"])
def test_the_slurm_and_shared_host_snippets_give_the_environment_that_starts_the_tracer(snippet, tmp_path):
    script = TRACING / snippet
    if snippet.startswith("slurm"):  # a TaskProlog prints "export NAME=VALUE" lines for slurmd to apply
        shell = f"eval \"$(sh {script})\"; env"
    else:  # profile.d is sourced by the login shell
        shell = f". {script}; env"
    done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True,
                          env={"PATH": os.environ["PATH"], "GPU_TRACE_HOME": str(ROOT)})
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert env["GPU_SPATIAL_TRACE"] == "1" and env["GPU_SPATIAL_TRACE_SOCKET"] == "/run/gpu-spatial/cupti.sock"
    assert env["PYTHONPATH"] == f"{ROOT}/gpu_trace/autostart"
    out = run_python({k: env[k] for k in ("GPU_SPATIAL_TRACE", "PYTHONPATH")}, tmp_path)
    assert out.stdout == "gpu_trace.hook\n", out.stderr
