"""MPS and host memory: the MPS server's page faults next to host swap and GPU time utilization,
so a stall shows as cause (faults, swap) and effect (utilization drops) on one screen."""
from grafanalib.core import Dashboard, Templating, Time

from dashboards.common import INPUTS, host_and_gpu_variables, timeseries, variable

UID = "mps-host-memory"
NO_MPS = ("no MPS daemon on the host (MPS not in use), or the exporter cannot see it: in a container it needs the "
          "host's /proc (--proc-root) and PID namespace; client counts need the control pipe (--mps-pipe-dir).")
NO_NODE = "node-exporter is not scraped with job-independent instance names, or its collector is off."
HOST = 'instance=~"$host"'
NODE = 'instance=~"$node"'


def build() -> Dashboard:
    variables = [*host_and_gpu_variables(),
                 variable("node", "Node exporter", "label_values(node_memory_MemAvailable_bytes, instance)")]
    panels = [
        timeseries("MPS server major page faults / s",
                   [(f'rate(mps_daemon_major_page_faults_total{{{HOST}, role="server"}}[$__rate_interval])',
                     "{{instance}} server of {{user}}")],
                   (8, 12, 0, 0), unit="short", ratio=False,
                   description="What `pidstat -r` shows as majflt/s: above zero, the server is being paged in and "
                               "every MPS client waits.", empty=NO_MPS),
        timeseries("GPU time utilization", [(f'gpu_time_utilization_ratio{{{HOST}, gpu=~"$gpu"}}', "{{instance}} GPU {{gpu}}")],
                   (8, 12, 12, 0)),
        timeseries("Host swap in / out (pages / s)",
                   [(f"rate(node_vmstat_pswpin{{{NODE}}}[$__rate_interval])", "{{instance}} swap in"),
                    (f"rate(node_vmstat_pswpout{{{NODE}}}[$__rate_interval])", "{{instance}} swap out")],
                   (8, 12, 0, 8), unit="short", ratio=False, empty=NO_NODE),
        timeseries("Host memory pressure and available memory",
                   [(f"rate(node_pressure_memory_waiting_seconds_total{{{NODE}}}[$__rate_interval])",
                     "{{instance}} share of time waiting on memory"),
                    (f"node_memory_MemAvailable_bytes{{{NODE}}} / node_memory_MemTotal_bytes{{{NODE}}}",
                     "{{instance}} memory available")],
                   (8, 12, 12, 8), empty="no node-exporter, or a kernel without pressure stall information "
                                         "(PSI: /proc/pressure/memory) for the waiting share."),
        timeseries("MPS daemons: resident and swapped memory",
                   [(f"mps_daemon_resident_memory_bytes{{{HOST}}}", "{{instance}} {{role}} {{user}} RSS"),
                    (f"mps_daemon_swap_bytes{{{HOST}}}", "{{instance}} {{role}} {{user}} swap")],
                   (8, 12, 0, 16), unit="bytes", ratio=False, empty=NO_MPS),
        timeseries("MPS clients and daemons",
                   [(f"mps_server_clients{{{HOST}}}", "{{instance}} clients of {{user}}"),
                    (f"mps_daemon_up{{{HOST}}}", "{{instance}} {{role}} up")],
                   (8, 12, 12, 16), unit="short", ratio=False, empty=NO_MPS),
        timeseries("MPS daemons: minor page faults / s and CPU",
                   [(f"rate(mps_daemon_minor_page_faults_total{{{HOST}}}[$__rate_interval])",
                     "{{instance}} {{role}} {{user}} minor faults"),
                    (f"rate(mps_daemon_cpu_seconds_total{{{HOST}}}[$__rate_interval])", "{{instance}} {{role}} {{user}} CPU (cores)")],
                   (8, 24, 0, 24), unit="short", ratio=False, empty=NO_MPS),
    ]
    return Dashboard(title="MPS and host memory", uid=UID, tags=["gpu", "mps", "memory"], refresh="10s",
                     time=Time("now-1h", "now"), templating=Templating(variables), panels=panels,
                     inputs=INPUTS).auto_panel_ids()
