"""Builds the spatial sources that run in their own threads (dcgm, nsys) from the flags."""
from __future__ import annotations

import logging

from exporter.snapshot import ERROR, SourceResult

log = logging.getLogger(__name__)


def _dcgm(args, nvml):
    if not (args.dcgm_hostengine or args.dcgm_exporter_url):  # its imports cost memory for nothing
        return None, "not configured: pass --dcgm-exporter-url or --dcgm-hostengine"
    from exporter.samplers.dcgm import DcgmBindingsSource, DcgmExporterSource

    if args.dcgm_hostengine:
        try:
            return DcgmBindingsSource(args.dcgm_hostengine, args.dcgm_window, args.interval, nvml,
                                      args.dcgm_frozen_after), None
        except ImportError:
            if not args.dcgm_exporter_url:
                return None, SourceResult(ERROR, "DCGM's Python bindings (pydcgm) are not importable: install DCGM, "
                                                 "or use --dcgm-exporter-url")
            log.warning("DCGM bindings not importable: reading dcgm-exporter at %s instead", args.dcgm_exporter_url)
        except Exception as exc:  # noqa: BLE001 - the host engine refused: say so, serve the rest
            if not args.dcgm_exporter_url:
                return None, SourceResult(ERROR, f"DCGM host engine {args.dcgm_hostengine}: {exc}")
    return DcgmExporterSource(args.dcgm_exporter_url, args.dcgm_timeout, args.dcgm_window,
                              max(args.interval, 1.0), nvml, args.dcgm_frozen_after), None


def _replaying(args) -> str | None:
    """Why uploads, a watched directory and live captures publish nothing with --replay (None without)."""
    if not args.replay:
        return None
    return (f"this exporter replays {args.replay} (--replay) and publishes no other export: uploads are refused "
            "(409), --nsys-watch-dir and --nsys-live are not read; POST /api/v1/diagnose still answers. "
            "Send exports to an exporter without --replay")


def build_spatial_sources(args, nvml, gpm=None):
    """Returns (sources by name, why each other candidate was not built, upload spool or None): a
    reason string for one not configured, a SourceResult (state error) for one that failed to start."""
    spatial, disabled, upload = {}, {}, None
    order = args.spatial_sources
    if "dcgm" in order:
        source, reason = _dcgm(args, nvml)
        if source is not None:
            spatial["dcgm"] = source
        else:
            disabled["dcgm"] = reason
    if "nsys" in order:  # each import where its flag asks for it: an exporter without nsys pays none of them
        watch_dir = args.nsys_watch_dir
        if args.nsys_upload_token:
            import tempfile

            from exporter.spool import Retention, SpoolRetention
            from exporter.uploads import UploadSpool

            spool = args.nsys_spool_dir or watch_dir or tempfile.mkdtemp(prefix="nsys-spool-")
            retention = SpoolRetention(spool, Retention(args.nsys_spool_max_files, args.nsys_spool_max_bytes,
                                                        args.nsys_spool_max_age))
            upload = UploadSpool(args.nsys_upload_token, spool, args.nsys_upload_max_bytes, retention,
                                 window_s=args.nsys_window, refuse_uploads=_replaying(args))
            watch_dir = watch_dir or spool
        if args.replay and (args.nsys_watch_dir or args.nsys_upload_token or args.nsys_live):
            log.warning("%s", _replaying(args))
        if args.replay or watch_dir or args.nsys_live:
            from exporter.samplers.nsys import NsysSource

            others = {**spatial, **({"gpm": gpm} if gpm is not None else {})}
            nsys = spatial["nsys"] = NsysSource(
                interval=args.interval if args.replay else max(args.interval, 1.0), replay=args.replay,
                watch_dir=watch_dir, live=args.nsys_live, window_s=args.nsys_window, frequency=args.nsys_frequency,
                binary=args.nsys_binary, nvml=nvml, other_sources=others)
            if upload is not None:
                upload.retention.published = nsys.published_path
        else:
            disabled["nsys"] = "not configured: pass --replay, --nsys-watch-dir, --nsys-live or --nsys-upload-token-file"
    return spatial, disabled, upload
