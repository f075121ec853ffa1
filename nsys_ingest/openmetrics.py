"""OpenMetrics text of an export, for `promtool tsdb create-blocks-from openmetrics` (backfill).

Every family's samples must stand together and every series must move forward in time, so samples
are read in time order and each family is spooled to its own temporary file, then concatenated.
"""
from __future__ import annotations

import shutil
import tempfile

import numpy as np

from nsys_ingest.analysis import wide_samples
from nsys_ingest.reader import DEFAULT_CHUNK_ROWS, Export

FAMILIES = (  # (quantity column, metric name, help)
    ("sm_active", "gpu_sm_active_ratio", "Share of SMs with at least one warp resident (nsys SMs Active)."),
    ("sm_occupancy", "gpu_sm_occupancy_ratio", "Resident warps over the SM maximum (nsys Compute Warps in Flight)."),
    ("gr_active", "gpu_graphics_engine_active_ratio", "Share of time the graphics/compute engine was busy (nsys GR Active)."),
    ("tensor_active", "gpu_tensor_active_ratio", "Share of cycles the tensor pipes were busy (nsys Tensor Active)."),
    ("dram_active", "gpu_dram_active_ratio", "Share of peak DRAM bandwidth used (nsys DRAM read + write)."),
    ("hidden_idle", "gpu_hidden_idle_sm_ratio", "max(0, GR active - SM active) in the same sample."),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_openmetrics(export: Export, output, start_ns=None, end_ns=None, chunk_rows=DEFAULT_CHUNK_ROWS,
                      progress=None) -> int:
    if export.start_ns is None:
        from nsys_ingest.reader import IngestError

        raise IngestError("this export has no session start time (TARGET_INFO_SESSION_START_TIME): "
                          "its samples cannot be placed in wall-clock time")
    spool = tempfile.mkdtemp(prefix="nsys-om-")
    files = {name: open(f"{spool}/{name}", "w") for _, name, _ in FAMILIES}
    labels = {}
    for index, info in export.gpus.items():
        labels[index] = (f'gpu="{index}",uuid="{_escape(info.label_uuid)}",model="{_escape(info.name)}",'
                         'source="nsys"')
    written = 0
    try:
        quantities = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_read", "dram_write")
        chunks = wide_samples(export, quantities, start_ns, end_ns, chunk_rows, progress, ordered=True)
        for wide in chunks:
            wide = wide.sort_values(["gpu", "timestamp"])
            if "gr_active" in wide and "sm_active" in wide:
                wide["hidden_idle"] = np.maximum(0.0, wide["gr_active"] - wide["sm_active"])
            stamps = export.wall_seconds(wide["timestamp"].to_numpy())
            gpus = wide["gpu"].to_numpy()
            for column, name, _ in FAMILIES:
                if column not in wide:
                    continue
                values = wide[column].to_numpy()
                keep = ~np.isnan(values)
                out = files[name]
                for gpu, value, stamp in zip(gpus[keep], values[keep], stamps[keep]):
                    out.write(f"{name}{{{labels[int(gpu)]}}} {value:.6g} {stamp:.6f}\n")
                written += int(keep.sum())
        for f in files.values():
            f.close()
        with open(output, "w") as out:
            for _, name, help_text in FAMILIES:
                out.write(f"# TYPE {name} gauge\n# HELP {name} {help_text}\n")
                with open(f"{spool}/{name}") as part:
                    shutil.copyfileobj(part, out)
            out.write("# EOF\n")
    finally:
        for f in files.values():
            f.close()
        shutil.rmtree(spool, ignore_errors=True)
    return written
