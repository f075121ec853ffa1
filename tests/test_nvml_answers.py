"""The NVML wrapper answers typed records (exporter/nvml_answers.py); dicts only at the replay boundary: a
recording of the live wrapper replays the very same records (issue 44, item 5)."""
from exporter import nvml_answers
from exporter.nvml import Nvml, PartialAnswer
from exporter.nvml_replay import RecordingNvml, ReplayNvml
from tests.nvml_library import NvmlLibrary, pci_bus_id

CALLS = {"identity": (0,), "gpm_support": (0,), "utilization_samples": (0, 2.0), "utilization_rates": (0,),
         "memory": (0,), "process_utilization": (0, 5.0), "compute_processes": (0,), "mig_devices": (0,),
         "max_clocks": (0,), "health_counters": (0,), "memory_errors": (0,), "nvml_throughput": (0,),
         "pci_bus_ids": (), "xid_open": ()}


def test_a_recording_of_the_live_wrapper_replays_the_same_typed_answers(tmp_path):
    library = NvmlLibrary(gpus=2, processes={0: 2}, busy=50.0, lost={1})
    with library.installed():
        recorder = RecordingNvml(Nvml(driver_gpus_dir=str(tmp_path / "no-driver-list")))
        live = {method: getattr(recorder, method)(*args) for method, args in CALLS.items()}
    recorder.save(tmp_path / "recording.json")
    replay = ReplayNvml(tmp_path / "recording.json")
    for method, args in CALLS.items():
        replayed = getattr(replay, method)(*args)
        assert replayed == live[method] and type(replayed) is type(live[method]), method
        assert not isinstance(replayed, dict), method  # read by field, never by key
        if isinstance(replayed, PartialAnswer):  # the health reads: their record inside, typed alike
            assert type(replayed.values) is type(live[method].values) and not isinstance(replayed.values, dict)
    assert live["memory"].reserved == 512 << 20 and live["identity"].minor == 0
    assert [p.pid for p in live["compute_processes"].compute] == [1000, 1001] and live["process_utilization"][0].sm == 25.0
    assert live["utilization_samples"].gpu[-1][1] == 50.0 and not live["mig_devices"].enabled
    assert live["max_clocks"].values.sm_hz == 1980e6 and live["memory_errors"].values.remapped_rows.pending is False
    assert live["pci_bus_ids"] == (nvml_answers.PciBusId(0, pci_bus_id(0)), nvml_answers.PciBusId(1, None))
    assert live["xid_open"][0] == nvml_answers.XidRegistration(0) and "lost" in live["xid_open"][1].refused.lower()


def test_a_recording_from_before_a_field_existed_replays_with_it_unknown():
    assert nvml_answers.from_json("memory", {"used": 1, "total": 2}) == nvml_answers.MemoryInfo(1, 2, None, None)
    assert nvml_answers.from_json("identity", {"uuid": "GPU-a", "model": "H100"}).minor is None
    assert nvml_answers.from_json("gpm_metrics", {"window_s": 1.0, "sm_active": 25.0}) == nvml_answers.GpmMetrics(
        1.0, sm_active=25.0)  # a recording from before the interconnect metrics: they are unknown
    # answers per GPU were recorded as a mapping by index before their records
    assert nvml_answers.from_json("pci_bus_ids", {"0": "00000000:19:00.0", "1": None}) == (
        nvml_answers.PciBusId(0, "00000000:19:00.0"), nvml_answers.PciBusId(1, None))
    assert nvml_answers.from_json("xid_open", {"0": None, "1": "Not Supported"}) == (
        nvml_answers.XidRegistration(0), nvml_answers.XidRegistration(1, "Not Supported"))
