"""On a GPU host: do the minor numbers (and MIG placements) the exporter reads from NVML name the same
devices NVIDIA's DRA driver names? The truth is the driver's own /proc/driver/nvidia/gpus/<bus id>/
information ("Device Minor"), which is also what /dev/nvidia<minor> is made from.

    timeout 120 python3 -m bench.dra_names_check OUT_DIR

Writes OUT_DIR/dra_names.json (per GPU: index, uuid, NVML minor, the driver's minor, the DRA name the
exporter resolves, MIG devices with profile and placement where NVML gives them) and exits 1 when a
minor differs. Changes nothing on the device.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def driver_minors() -> dict[str, int]:
    """PCI bus id (lower case) -> Device Minor, from the kernel driver."""
    out = {}
    for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
        match = re.search(r"Device Minor:\s*(\d+)", info.read_text(errors="replace"))
        if match:
            out[info.parent.name.lower()] = int(match.group(1))
    return out


def main(argv) -> int:
    out_dir = Path(argv[1] if len(argv) > 1 else ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    import pynvml as nv

    from exporter.nvml import Nvml
    from exporter.nvml_answers import to_json
    from exporter.samplers.dra import ApiView, DraDevices, NvidiaDeviceNames
    from exporter.snapshot import DeviceTelemetry, GpuIdentity

    live = Nvml()
    minors = driver_minors()
    rows, bad = [], 0
    gpus, telemetry = [], {}
    for index in range(live.device_count()):
        ident = live.identity(index)
        bus = nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(index)).busId
        bus = (bus.decode() if isinstance(bus, bytes) else bus).lower()
        truth = minors.get(bus[-12:])  # NVML: 00000000:18:00.0, the driver's folder: 0000:18:00.0
        mig = live.mig_devices(index)
        gpu = GpuIdentity(index, ident.uuid, ident.model, ident.minor)
        gpus.append(gpu)
        telemetry[gpu.uuid] = DeviceTelemetry(gpu, 0.0, mig_enabled=mig.enabled, mig_sm_count=mig.sm_count,
                                              mig_devices=mig.devices)
        rows.append({"index": index, "uuid": ident.uuid, "bus_id": bus, "nvml_minor": ident.minor,
                     "driver_minor": truth, "mig": to_json(mig)})
        bad += ident.minor != truth
    devices = DraDevices(gpus, telemetry, ApiView())
    for row in rows:
        name = f"gpu-{row['nvml_minor']}"
        row["dra_name"] = name
        row["resolves_to"] = devices.resolve("local", name)
        for d in row["mig"]["devices"]:
            if d.get("profile_id") is not None:
                d["dra_name_v25_3"] = f"gpu-{row['nvml_minor']}-mig-{d['profile_id']}-{d['placement_start']}-{d['placement_size']}"
                d["resolves_to"] = devices.resolve("local", d["dra_name_v25_3"])
                assert NvidiaDeviceNames.parse(d["dra_name_v25_3"]) is not None
    (out_dir / "dra_names.json").write_text(json.dumps({"gpus": rows, "mismatches": bad}, indent=1, default=str) + "\n")
    print(f"{len(rows)} GPUs, {bad} minor mismatches; {out_dir / 'dra_names.json'}")
    live.shutdown()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
