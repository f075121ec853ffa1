"""GPU utilization: time vs spatial. Per GPU, NVML's time utilization next to SM activity."""
from grafanalib.core import Dashboard, GridPos, Repeat, RowPanel, Templating, Time

from dashboards.common import GPU_SELECTOR, INPUTS, host_and_gpu_variables, table, target, timeseries
from exporter.holders import labels as holder_labels

UID = "gpu-time-vs-spatial"
SEL = GPU_SELECTOR
# Why a panel can be empty, in its description and no-data text.
NO_SPATIAL = ("no spatial source serves this GPU: no GPM (before Hopper, or a MIG slice), no dcgm-exporter "
              "(--dcgm-exporter-url, DCGM profiling paused while nsys or ncu run) and no nsys export; "
              "/api/v1/gpus names each source's state and reason.")
NO_HIDDEN_IDLE = ("time utilization or SM active is missing for the GPU over the same window (no NVML, or no "
                  "spatial source: see the panels above).")
NO_HOLDERS = ("no holder is known: outside Kubernetes (no kubelet PodResources socket) and without "
              "--hpc-job-mapping-dir (Slurm) no pod or job is attributed.")
NO_TIME_SHARE = ("under MPS (NVML has no per-client time: MPS charges the server) and on MIG devices no time share "
                 "exists, so no hidden idle per holder.")


def build() -> Dashboard:
    per_gpu = [
        timeseries("GPU $gpu: time vs spatial utilization",
                   [(f"gpu_time_utilization_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}} time (NVML)"),
                    (f"gpu_sm_active_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}} SM active ({{source}})")],
                   (9, 12, 0, 1), repeat=Repeat("h", "gpu"),
                   description="Time utilization is the share of time any kernel ran; SM active is the share "
                               "of SMs that had work. The gap between them is capacity that '100%' hides.",
                   empty=NO_SPATIAL + " Time is absent for an export backfilled with nsys-ingest openmetrics "
                                      "(it carries GR active, gpu_graphics_engine_active_ratio, instead)."),
        timeseries("GPU $gpu: SM occupancy and tensor activity",
                   [(f"gpu_sm_occupancy_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}} SM occupancy ({{source}})"),
                    (f"gpu_tensor_active_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}} tensor active ({{source}})"),
                    (f"gpu_dram_active_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}} DRAM active ({{source}})")],
                   (9, 12, 12, 1), repeat=Repeat("h", "gpu"), empty=NO_SPATIAL),
        table("GPU $gpu: pods sharing it", NO_HOLDERS, repeat=Repeat("h", "gpu"),
              description="Containers holding this GPU or a share of it (time-slicing or MPS replicas, MIG "
                          "devices), from the kubelet's PodResources API, each with its own held share (value); its "
                          "compute processes by kind, how it is shared, and the live verdict (evidence and advice: "
                          "/api/v1/gpus). Each pod's time share and SM activity: dashboard GPU workloads.",
              targets=[target(f"gpu_workload_held_share_ratio{{{SEL}}}", instant=True, table=True),
                       target(f"gpu_compute_processes{{{SEL}}}", ref="B", instant=True, table=True),
                       target(f"gpu_sharing_mode{{{SEL}}} == 1", ref="C", instant=True, table=True),
                       target(f"gpu_diagnosis{{{SEL}}} == 1", ref="D", instant=True, table=True)],
              gridPos=GridPos(h=6, w=12, x=0, y=10),
              transformations=[{"id": "organize", "options": {"excludeByName": {
                  "Time": True, "Value #C": True, "Value #D": True, "__name__": True, "job": True,
                  "model": True, "uuid": True}, "renameByName": {"Value #A": "held share"}}}]),
    ]
    fleet = [
        timeseries("Hidden idle SMs (time utilization - SM active)",
                   [(f"gpu_hidden_idle_sm_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}}"),
                    (f"gpu:hidden_idle_sm_ratio:avg5m{{{SEL}}}", "{{instance}} GPU {{gpu}} 5m average")],
                   (8, 12, 0, 17), empty=NO_HIDDEN_IDLE),
        table("Fleet: GPUs ranked by hidden idle SMs (5m)", NO_HIDDEN_IDLE,
              targets=[target(f"sort_desc(avg_over_time(gpu_hidden_idle_sm_ratio{{{SEL}}}[5m]))", instant=True,
                              table=True)],
              gridPos=GridPos(h=8, w=12, x=12, y=17), unit="percentunit",
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "job": True},
                                                              "renameByName": {"Value": "hidden idle (5m)"}}}]),
        table("Live spatial source per GPU", NO_SPATIAL,
              targets=[target(f'gpu_spatial_source_state{{{SEL}, state="active"}} == 1', instant=True, table=True)],
              gridPos=GridPos(h=7, w=12, x=0, y=25),
              description="Which source (dcgm, gpm, nsys) is live per GPU; /api/v1/gpus says why the others are not.",
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True,
                                                                                "__name__": True, "job": True}}}]),
        timeseries("Spatial sample age", [(f"gpu:spatial_sample_age_seconds{{{SEL}}}", "{{instance}} GPU {{gpu}} ({{source}})")],
                   (7, 6, 12, 25), unit="s", ratio=False,
                   description="Seconds since the window the spatial values describe: replayed or stuck data shows here.",
                   empty=NO_SPATIAL),
        timeseries("Exporter collectors", [('gpu_exporter_collector_success{instance=~"$host"}', "{{instance}} {{collector}}")],
                   (7, 6, 18, 25), unit="none"),
        table("Holders by their own hidden idle SMs (5m)", NO_HOLDERS + " " + NO_TIME_SHARE,
              description="Each holder's own busy-but-SMs-idle GPU-equivalents over 5 minutes (its time share minus "
                          "its SM activity; basis exact or time_share), not its GPU's total: whose jobs to look at first.",
              targets=[target(f"sort_desc(sum by (instance, gpu, {', '.join(holder_labels())}, basis) "
                              f"(rate(gpu_workload_hidden_idle_gpu_seconds_total{{{SEL}}}[5m])))", instant=True, table=True)],
              gridPos=GridPos(h=8, w=24, x=0, y=32), unit="percentunit",
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "job": True, "model": True},
                                                              "renameByName": {"Value": "own hidden idle (5m)"}}}]),
        table("Diagnosis: what limits each GPU, how it is shared",
              "no verdict: a GPU without a spatial source gets one only where time utilization alone decides "
              "(idle, host-bound); a backfilled export has no live verdict.",
              description="The live verdict per GPU (rules: nsys_ingest/verdicts.py; evidence and what to change: "
                          "/api/v1/gpus) beside its sharing mode. For which processes and why, profile with "
                          "nsys --trace=cuda and run nsys-ingest diagnose (or gpu-spatial nsys diagnose).",
              targets=[target(f"gpu_diagnosis{{{SEL}}} == 1", instant=True, table=True),
                       target(f"gpu_sharing_mode{{{SEL}}} == 1", ref="B", instant=True, table=True)],
              gridPos=GridPos(h=7, w=24, x=0, y=40),
              transformations=[{"id": "merge", "options": {}},
                               {"id": "organize", "options": {"excludeByName": {
                                   "Time": True, "Value #A": True, "Value #B": True, "__name__": True, "job": True}}}]),
    ]
    health = [
        timeseries("Clocks held down: share of time, by reason",
                   [(f"rate(gpu_clock_throttle_seconds_total{{{SEL}}}[5m])", "{{instance}} GPU {{gpu}} {{reason}}")],
                   (8, 12, 0, 48),
                   description="Share of time NVML's counters say the clocks were held down, per reason (power, "
                               "thermal, sync boost, board limit, low utilization, reliability). Power or thermal "
                               "while busy: the live verdict reads throttled."),
        timeseries("SM clock against its maximum",
                   [(f"gpu_sm_clock_hertz{{{SEL}}} / gpu_sm_clock_max_hertz{{{SEL}}}", "{{instance}} GPU {{gpu}}"),
                    (f"gpu_clock_event_reason_active{{{SEL}}} == 1", "{{instance}} GPU {{gpu}} reason {{reason}}")],
                   (8, 12, 12, 48),
                   description="The SM clock as a share of its maximum, with the reasons NVML gives now for clocks "
                               "below it (1 while active; gpu_idle is no limit)."),
        timeseries("XID events",
                   [(f"increase(gpu_xid_errors_total{{{SEL}}}[5m])", "{{instance}} GPU {{gpu}} XID {{xid}}")],
                   (8, 8, 0, 56), unit="none", ratio=False,
                   description="XIDs NVML reported, per 5 minutes (counted since the exporter started). "
                               "48, 63, 64, 74, 79, 94 and 95 raise GPUXidNeedsAttention (runbook)."),
        timeseries("Memory errors: ECC and remapped rows",
                   [(f"increase(gpu_ecc_errors_total{{{SEL}}}[1h])", "{{instance}} GPU {{gpu}} ECC {{error}} ({{scope}}) /h"),
                    (f"gpu_remapped_rows_total{{{SEL}}}", "{{instance}} GPU {{gpu}} rows remapped ({{error}})"),
                    (f"gpu_row_remap_pending{{{SEL}}}", "{{instance}} GPU {{gpu}} remap pending (reset)"),
                    (f"gpu_row_remap_failure{{{SEL}}}", "{{instance}} GPU {{gpu}} remap failed (service)")],
                   (8, 8, 8, 56), unit="none", ratio=False,
                   description="ECC errors per hour and the rows remapped over the GPU's life; read every minute."),
        timeseries("PCIe and NVLink throughput",
                   [(f"gpu_pcie_throughput_bytes_per_second{{{SEL}}}", "{{instance}} GPU {{gpu}} PCIe {{direction}} ({{source}})"),
                    (f"gpu_nvlink_throughput_bytes_per_second{{{SEL}}}", "{{instance}} GPU {{gpu}} NVLink {{direction}} ({{source}})")],
                   (8, 8, 16, 56), unit="Bps", ratio=False,
                   description="GPM over its window (Hopper and newer), NVML otherwise. No NVLink series on a GPU "
                               "without NVLink."),
        timeseries("Energy: power from the energy counter",
                   [(f"rate(gpu_energy_joules_total{{{SEL}}}[5m])", "{{instance}} GPU {{gpu}} (energy counter)"),
                    (f"gpu_power_watts{{{SEL}}}", "{{instance}} GPU {{gpu}} (power reading)")],
                   (8, 12, 0, 64), unit="watt", ratio=False,
                   description="Joules per second from the driver's energy counter (exact over any range, whatever "
                               "the scrape gaps) next to the instant power reading; increase(...[1h]) / 3.6e6 is kWh."),
        timeseries("Memory temperature and PCIe replays",
                   [(f"gpu_memory_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{gpu}} memory (C)"),
                    (f"gpu_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{gpu}} GPU (C)"),
                    (f"increase(gpu_pcie_replays_total{{{SEL}}}[1h])", "{{instance}} GPU {{gpu}} PCIe replays /h")],
                   (8, 12, 12, 64), unit="none", ratio=False),
    ]
    return Dashboard(
        title="GPU utilization: time vs spatial", uid=UID, tags=["gpu", "utilization"], refresh="10s",
        time=Time("now-1h", "now"), templating=Templating(host_and_gpu_variables()), inputs=INPUTS,
        panels=[RowPanel(title="Per GPU", gridPos=GridPos(h=1, w=24, x=0, y=0)), *per_gpu,
                RowPanel(title="Fleet", gridPos=GridPos(h=1, w=24, x=0, y=16)), *fleet,
                RowPanel(title="GPU health", gridPos=GridPos(h=1, w=24, x=0, y=47)), *health],
    ).auto_panel_ids()
