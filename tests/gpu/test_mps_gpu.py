"""On a real GPU: the exporter sees an MPS control daemon, its server, a client, and the server's
major page faults growing after the page cache is dropped. Needs root and nvidia-cuda-mps-control."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests.helpers import ROOT, Exporter, wait_for

pytestmark = pytest.mark.gpu


def _server(mps: dict) -> dict | None:
    return next((d for d in mps["daemons"] if d["role"] == "server"), None)


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="nvidia-cuda-mps-control not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="dropping the page cache needs root")
def test_mps_daemons_clients_and_major_faults():
    base = tempfile.mkdtemp(prefix="mps-test-")
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": f"{base}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{base}/log"}
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"]), os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    client = None
    try:
        with Exporter("--interval", "0.5", "--mps-pipe-dir", env["CUDA_MPS_PIPE_DIRECTORY"]) as exporter:
            client = subprocess.Popen([sys.executable, str(ROOT / "bench" / "workloads.py"), "--phases", "16:40"],
                                      env=env, stdout=subprocess.DEVNULL)

            def attached():
                mps = exporter.gpus()["mps"]
                server = _server(mps)
                ok = (any(d["role"] == "control" for d in mps["daemons"]) and server and server["resident_bytes"] > 0
                      and sum(mps["clients"].values()) == 1)
                return mps if ok else None

            mps = wait_for(attached, 30, 0.5, "control, server and one client seen")
            before = _server(mps)["major_faults"]
            # Evict what the page cache holds; the server pages its code and data back in.
            for _ in range(5):
                subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, check=True)
                time.sleep(1)
            # A second client makes the server run code it had not touched since the drop.
            subprocess.run([sys.executable, str(ROOT / "bench" / "workloads.py"), "--phases", "4:1"], env=env,
                           stdout=subprocess.DEVNULL, check=False, timeout=60)
            after = wait_for(lambda: (_server(exporter.gpus()["mps"]) or {}).get("major_faults", 0) > before
                             and _server(exporter.gpus()["mps"])["major_faults"], 15, 0.5, "major faults growing")
            metrics = exporter.metrics()
            record = {"server_major_faults_before": before, "after": after, "clients": mps["clients"],
                      "server_rss_bytes": _server(mps)["resident_bytes"]}
            print(json.dumps(record))
            if os.environ.get("OUT"):
                with open(os.path.join(os.environ["OUT"], "gpu_mps_test.json"), "w") as f:
                    json.dump(record, f)
            assert 'mps_daemon_up{role="server"} 1.0' in metrics
            assert 'mps_daemon_up{role="control"} 1.0' in metrics
            assert "mps_server_clients{user=" in metrics
    finally:
        if client is not None:
            client.kill()
            client.wait()
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, timeout=30)
