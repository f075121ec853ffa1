"""MPS collector: the daemons' faults, memory, swap and CPU time, and the server's clients."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

DAEMON_LABELS = ["role", "user"]


class MpsCollector:
    def __init__(self, engine):
        self._engine = engine

    def describe(self):
        """What collect() yields (empty), so the registry refuses a family name registered twice."""
        return list(_families().values())

    def collect(self):
        mps = self._engine.snapshot.mps
        if mps is None:  # collector disabled
            return
        f = _families()
        up = f["up"]
        for role in ("control", "server"):
            up.add_metric([role], 1.0 if mps.up(role) else 0.0)
        yield up
        major, minor, cpu, rss, swap = f["major"], f["minor"], f["cpu"], f["rss"], f["swap"]
        # One series per role and user, never per pid (a pid label breaks rate() at every restart);
        # while an old daemon exits beside its successor, the newer one speaks for the pair.
        newest = {}
        for daemon in mps.daemons:
            key = (daemon.role, daemon.user)
            if key not in newest or daemon.start_time > newest[key].start_time:
                newest[key] = daemon
        for (role, user), d in sorted(newest.items()):
            labels = [role, user]
            major.add_metric(labels, d.major_faults, created=d.start_time)
            minor.add_metric(labels, d.minor_faults, created=d.start_time)
            cpu.add_metric(labels, d.cpu_seconds, created=d.start_time)
            if d.resident_bytes is not None:
                rss.add_metric(labels, d.resident_bytes)
            if d.swap_bytes is not None:
                swap.add_metric(labels, d.swap_bytes)
        yield from (major, minor, cpu, rss, swap)
        for user, count in sorted(mps.clients.items()):
            f["clients"].add_metric([user], count)
        yield f["clients"]
        f["reachable"].add_metric([], 1.0 if mps.control_reachable else 0.0)
        yield f["reachable"]
        if mps.default_active_thread_percentage is not None:
            f["threads"].add_metric([], mps.default_active_thread_percentage / 100.0)
            yield f["threads"]


def _families() -> dict:
    """Every family MpsCollector.collect() yields, empty, in the order it yields them."""
    return {
        "up": GaugeMetricFamily("mps_daemon_up", "1 if nvidia-cuda-mps-control (role=control) or "
                                "nvidia-cuda-mps-server (role=server) is running.", labels=["role"]),
        "major": CounterMetricFamily("mps_daemon_major_page_faults", "Major page faults of the daemon (majflt): "
                                     "a rate above zero means the daemon is being paged in and its clients wait.",
                                     labels=DAEMON_LABELS),
        "minor": CounterMetricFamily("mps_daemon_minor_page_faults", "Minor page faults of the daemon (minflt).",
                                     labels=DAEMON_LABELS),
        "cpu": CounterMetricFamily("mps_daemon_cpu_seconds", "User and system CPU time of the daemon.",
                                   labels=DAEMON_LABELS),
        "rss": GaugeMetricFamily("mps_daemon_resident_memory_bytes", "Resident memory of the daemon (VmRSS).",
                                 labels=DAEMON_LABELS),
        "swap": GaugeMetricFamily("mps_daemon_swap_bytes", "Swapped-out memory of the daemon (VmSwap).",
                                  labels=DAEMON_LABELS),
        "clients": GaugeMetricFamily("mps_server_clients", "Clients attached to the MPS server "
                                     "(nvidia-cuda-mps-control get_client_list).", labels=["user"]),
        "reachable": GaugeMetricFamily("mps_control_reachable", "1 if the MPS control pipe answered the last query."),
        "threads": GaugeMetricFamily("mps_default_active_thread_ratio",
                                     "Default active thread percentage of MPS clients, as a ratio."),
    }
