"""A lost GPU (NVML answers GPU_IS_LOST: it fell off the bus) is that GPU's problem (issue 42, item 1):
the others are listed and measured, the lost one is published as lost (gpu_lost, /healthz) under its
last identity, or its index and PCI bus id when it was lost before the exporter started."""
import json
import logging

import pytest

import exporter.samplers.nvml as sampler_module
from exporter.nvml import Nvml
from exporter.samplers.nvml import LOST_RETRY_S, NvmlSampler
from exporter.samplers.xid import XidWatcher
from tests.helpers import (
    FIXTURES,
    Exporter,
    http_get,
    parse_metrics,
    sample_value,
    wait_for,
)
from tests.nvml_library import Clock, NvmlLibrary, driver_gpus_dir, pci_bus_id

LOST = {"error": "GPU is lost", "call": "nvmlDeviceGetHandleByIndex", "gpu_lost": True, "unsupported": False}


def three_gpus_one_lost(tmp_path) -> str:
    """The H200 health recording on three GPUs, GPU 1 lost before the recording started: every call
    naming it answers GPU_IS_LOST, and the driver still names its PCI address."""
    data = json.loads((FIXTURES / "nvml_h200_health.json").read_text())
    calls = data["calls"]
    uuid = calls["identity/0"][0]["value"]["uuid"]
    for key in [k for k in calls if k.endswith("/0")]:
        method = key[:-2]
        calls[f"{method}/2"] = json.loads(json.dumps(calls[key]).replace(uuid, uuid[:-1] + "2"))
        calls[f"{method}/1"] = [LOST]
    calls["device_count"] = [{"value": 3}]
    calls["pci_bus_ids"] = [{"value": {"0": pci_bus_id(0), "1": pci_bus_id(1), "2": pci_bus_id(2)}}]
    calls["xid_open"] = [{"value": {"0": None, "1": "GPU is lost", "2": None}}]
    path = tmp_path / "three_gpus_one_lost.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_an_exporter_started_after_a_loss_serves_the_other_gpus_and_names_the_lost_one(tmp_path):
    with Exporter("--nvml-replay", three_gpus_one_lost(tmp_path), "--no-mps", "--interval", "0.2") as running:
        def gpu_2_measured():
            m = parse_metrics(running.metrics())
            return sample_value(m, "gpu_power_watts", gpu="2") is not None and m

        m = wait_for(gpu_2_measured, 30, 0.2, "GPU 2 measured")
        status, body = http_get(running.url + "/healthz")
        log = running.log()
    lost_uuid = f"unknown-pci-{pci_bus_id(1)}"
    assert sample_value(m, "gpu_power_watts", gpu="0") is not None
    assert sample_value(m, "gpu_lost", gpu="1", uuid=lost_uuid, model="unknown") == 1.0
    assert sample_value(m, "gpu_lost", gpu="0", model="NVIDIA H200") == 0.0
    assert sample_value(m, "gpu_lost", gpu="2") == 0.0
    assert sample_value(m, "gpu_power_watts", gpu="1") is None  # a lost GPU's values are withdrawn
    health = json.loads(body)
    assert status == 200 and health["status"] == "gpu_lost" and health["gpus"] == 3
    assert health["lost"] == [{"gpu": 1, "uuid": lost_uuid, "model": "unknown"}]
    assert f"GPU 1 ({lost_uuid}) is lost" in health["reason"]
    assert "cannot list GPUs" not in log and log.count("GPU lost") == 1  # one line for the problem, not per tick


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(sampler_module, "time", clock)
    return clock


def live(tmp_path, library: NvmlLibrary, driver_gpus: int) -> NvmlSampler:
    """The sampler over the live wrapper over the stand-in NVML library, with a driver list of `driver_gpus`."""
    gpus_dir = driver_gpus_dir(tmp_path / "gpus", driver_gpus) if driver_gpus else str(tmp_path / "absent")
    with library.installed():
        backend = Nvml(driver_gpus_dir=gpus_dir)
    sampler = NvmlSampler(backend, interval=1.0)
    sampler.xid = XidWatcher(backend)  # not started: its thread's waits are no tick's calls
    return sampler


def tick(library, sampler, clock, seconds=1.0):
    with library.installed():
        sampler.tick()
    clock.advance(seconds)


def test_the_live_wrapper_names_a_gpu_lost_at_listing_by_its_pci_bus_id_and_serves_it_once_back(tmp_path, clock,
                                                                                                    caplog):
    library = NvmlLibrary(gpus=3, lost={1}, clock=clock)
    sampler = live(tmp_path, library, driver_gpus=3)
    listed_at = clock.now
    with caplog.at_level(logging.ERROR):
        tick(library, sampler, clock)
    assert [g.index for g in sampler.gpus] == [0, 1, 2]
    lost = sampler.gpus[1]
    assert (lost.uuid, lost.model) == (f"unknown-pci-{pci_bus_id(1)}", "unknown")
    assert sampler.telemetry[lost.uuid].lost and not sampler.health.success
    for gpu in (sampler.gpus[0], sampler.gpus[2]):
        assert not sampler.telemetry[gpu.uuid].lost and sampler.telemetry[gpu.uuid].power_watts == 70.0
    assert sum("GPU lost" in r.message and pci_bus_id(1) in r.message for r in caplog.records) == 1

    library.lost.clear()  # reset: it answers again, but is asked only every LOST_RETRY_S
    clock.now = listed_at + LOST_RETRY_S - 0.01
    tick(library, sampler, clock, 0.0)
    assert sampler.gpus[1] == lost  # 0.01 s before its retry: not asked
    clock.now = listed_at + LOST_RETRY_S
    tick(library, sampler, clock)
    assert sampler.telemetry[lost.uuid].lost  # named now, its values come under its own name from the next tick
    named = sampler.gpus[1]
    assert named.uuid == "GPU-00000000-0000-0000-0000-000000000001" and named.model == "NVIDIA H100 80GB HBM3"
    tick(library, sampler, clock)
    assert set(sampler.telemetry) == {g.uuid for g in sampler.gpus}  # the placeholder's telemetry went
    assert not sampler.telemetry[named.uuid].lost and sampler.telemetry[named.uuid].power_watts == 70.0
    assert sampler.health.success


@pytest.mark.parametrize("gpus, lost, driver_gpus", [
    (3, {0, 2}, 2),  # two GPUs silent, one unclaimed address
    (2, {1}, 3),  # one silent, two unclaimed: a container sees the host's list, NVML only its own GPUs
    (2, {1}, 0),  # the driver's list cannot be read
])
def test_a_lost_gpu_is_named_by_its_index_where_the_driver_list_does_not_add_up(tmp_path, clock, gpus, lost,
                                                                               driver_gpus):
    """No address is guessed."""
    library = NvmlLibrary(gpus=gpus, lost=lost, clock=clock)
    sampler = live(tmp_path, library, driver_gpus)
    tick(library, sampler, clock)
    assert [g.uuid for g in sampler.gpus if g.index in lost] == [f"unknown-gpu-{index}" for index in sorted(lost)]
    assert all(g.uuid.startswith("GPU-") for g in sampler.gpus if g.index not in lost)


def test_two_gpus_lost_at_listing_take_the_unclaimed_addresses_in_pci_order(tmp_path, clock):
    library = NvmlLibrary(gpus=4, lost={0, 2}, clock=clock)
    sampler = live(tmp_path, library, driver_gpus=4)
    tick(library, sampler, clock)
    assert [g.uuid for g in sampler.gpus if g.model == "unknown"] == [f"unknown-pci-{pci_bus_id(0)}",
                                                                      f"unknown-pci-{pci_bus_id(2)}"]


def test_a_known_gpu_lost_mid_run_keeps_its_identity_and_another_answering_in_its_place_is_no_return(tmp_path,
                                                                                                      clock):
    library = NvmlLibrary(gpus=2, clock=clock)
    sampler = live(tmp_path, library, driver_gpus=2)
    tick(library, sampler, clock)
    known = sampler.gpus[1]
    library.lost.add(1)
    tick(library, sampler, clock)
    assert sampler.gpus[1] == known and sampler.telemetry[known.uuid].lost
    library.lost.clear()
    library._fn_nvmlDeviceGetUUID = lambda handle: "GPU-another"  # a different GPU now answers at index 1
    clock.advance(LOST_RETRY_S)
    tick(library, sampler, clock)
    assert sampler.gpus[1] == known and sampler.telemetry[known.uuid].lost
