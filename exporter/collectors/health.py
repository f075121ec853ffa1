"""Per-collector health, node_exporter style: did the collector's last tick work, and how long it took."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class HealthCollector:
    def __init__(self, engine):
        self._engine = engine

    def describe(self):
        """What collect() yields (empty), so the registry refuses a family name registered twice."""
        return list(_families().values())

    def collect(self):
        f = _families()
        success, duration = f["success"], f["duration"]
        for name, health in sorted(self._engine.snapshot.health.items()):
            success.add_metric([name], 1.0 if health.success else 0.0)
            duration.add_metric([name], health.duration_seconds)
        yield success
        yield duration
        spool = self._engine.snapshot.spool
        if spool is not None:
            for key, value in (("files", spool.files), ("bytes", spool.bytes), ("removed", spool.removed),
                               ("partial_files", spool.partial_files), ("partial_bytes", spool.partial_bytes)):
                f[key].add_metric([], value)
                yield f[key]


def _families() -> dict:
    """Every family HealthCollector.collect() yields, empty, in the order it yields them."""
    return {
        "success": GaugeMetricFamily("gpu_exporter_collector_success",
                                     "1 if the collector's last tick succeeded (reason: /api/v1/gpus and the log).",
                                     labels=["collector"]),
        "duration": GaugeMetricFamily("gpu_exporter_collector_duration_seconds",
                                      "Duration of the collector's last tick.", labels=["collector"]),
        "files": GaugeMetricFamily("gpu_exporter_nsys_spool_files", "Uploaded exports kept in the spool.", labels=[]),
        "bytes": GaugeMetricFamily("gpu_exporter_nsys_spool_bytes", "Bytes of uploaded exports kept in the spool.",
                                   labels=[]),
        "removed": CounterMetricFamily("gpu_exporter_nsys_spool_removed", "Uploads removed by the spool's retention.",
                                       labels=[]),
        "partial_files": GaugeMetricFamily("gpu_exporter_nsys_spool_partial_files", "Uploads still streaming or being "
                                           "validated (they count against the spool's limits).", labels=[]),
        "partial_bytes": GaugeMetricFamily("gpu_exporter_nsys_spool_partial_bytes", "Bytes of uploads still streaming.",
                                           labels=[]),
    }
