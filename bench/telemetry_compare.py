"""Each new NVML series of issue 30 next to nvidia-smi's figure of the same moment, and the footprint
side by side, from a folder bench/telemetry_check.sh wrote (runs anywhere: it only reads files).

    python3 bench/telemetry_compare.py OUTDIR

Truths: `nvidia-smi -q` (the same NVML, read by NVIDIA's own tool within a second of the scrape) and
`nvidia-smi dmon -s pucvmet` (five 1-second samples starting then); energy against the recording's
own power readings (joules gained over the recording against the mean power times its duration).
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def smi_q(path: Path) -> dict[str, str]:
    """nvidia-smi -q as {"Section/Sub/Key": value} (first GPU only), by indentation."""
    flat: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    gpus = 0
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("GPU "):
            gpus += 1
            stack = []
            continue
        if gpus > 1 or not line.strip():
            continue  # the first GPU, and the lines before it (driver version)
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path_key = "/".join([s for _, s in stack] + [key.strip()])
        if sep and value.strip():
            flat[path_key] = value.strip()
        else:
            stack.append((indent, key.strip()))
    return flat


def dmon(path: Path) -> dict[str, float]:
    """Mean per column of GPU 0's rows of `nvidia-smi dmon` ("-" columns skipped)."""
    header, rows = None, []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("# gpu"):
            header = line[1:].split()
        elif header and not line.startswith("#") and line.split() and line.split()[0] == "0":
            rows.append(dict(zip(header, line.split())))
    means = {}
    for column in header or ():
        values = [float(r[column]) for r in rows if re.fullmatch(r"-?[0-9.]+", r.get(column, "-"))]
        if values:
            means[column] = round(statistics.mean(values), 3)
    return means


def metrics(path: Path) -> dict[str, list[tuple[dict, float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            if sample.labels.get("gpu", "0") == "0":
                out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def first(found, name, **labels):
    for got, value in found.get(name, ()):
        if all(got.get(k) == v for k, v in labels.items()):
            return value
    return None


def smi(flat: dict, *suffixes: str):
    for suffix in suffixes:
        for key, value in flat.items():
            if key == suffix or key.endswith("/" + suffix):  # "Clocks/SM" is not "Max Clocks/SM"
                return value
    return None


def number(text):
    match = re.search(r"-?[0-9.]+", text or "")
    return float(match.group()) if match else None


def energy_check(recording: Path) -> str:
    data = json.loads(recording.read_text())
    calls = data["calls"]
    health = [a["value"] for a in calls.get("health_counters/0", []) if "value" in a]
    power = [a["value"] for a in calls.get("power_watts/0", []) if "value" in a]
    energy = [h.get("energy_joules") for h in health if h.get("energy_joules") is not None]
    if len(energy) < 2 or not power:
        return "energy: not enough answers in the recording"
    ticks = len(energy) - 1
    return (f"energy: {energy[-1] - energy[0]:.1f} J gained over {ticks} ticks of the recording; mean power "
            f"{statistics.mean(power):.1f} W (x the ticks' duration = the joules NVML should report)")


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    found = metrics(out / "metrics.prom") if (out / "metrics.prom").exists() else {}
    flat = smi_q(out / "nvidia-smi-q.txt") if (out / "nvidia-smi-q.txt").exists() else {}
    mon = dmon(out / "dmon.txt") if (out / "dmon.txt").exists() else {}
    mib, mhz = 2**20, 1e6
    rows = [
        ("memory clock (MHz)", first(found, "gpu_memory_clock_hertz"), mhz, smi(flat, "Clocks/Memory"), mon.get("mclk")),
        ("SM clock (MHz)", first(found, "gpu_sm_clock_hertz"), mhz, smi(flat, "Clocks/SM"), mon.get("pclk")),
        ("max SM clock (MHz)", first(found, "gpu_sm_clock_max_hertz"), mhz, smi(flat, "Max Clocks/SM"), None),
        ("max memory clock (MHz)", first(found, "gpu_memory_clock_max_hertz"), mhz, smi(flat, "Max Clocks/Memory"), None),
        ("memory temperature (C)", first(found, "gpu_memory_temperature_celsius"), 1,
         smi(flat, "Memory Current Temp"), mon.get("mtemp")),
        ("encoder (%)", first(found, "gpu_encoder_utilization_ratio"), 0.01, smi(flat, "Utilization/Encoder"), mon.get("enc")),
        ("decoder (%)", first(found, "gpu_decoder_utilization_ratio"), 0.01, smi(flat, "Utilization/Decoder"), mon.get("dec")),
        ("FB free (MiB)", first(found, "gpu_memory_free_bytes"), mib, smi(flat, "FB Memory Usage/Free"), None),
        ("FB reserved (MiB)", first(found, "gpu_memory_reserved_bytes"), mib, smi(flat, "FB Memory Usage/Reserved"), None),
        ("FB used incl. reserved (MiB)", first(found, "gpu_memory_used_bytes"), mib, smi(flat, "FB Memory Usage/Used"),
         mon.get("fb")),
        ("PCIe replays", first(found, "gpu_pcie_replays_total"), 1, smi(flat, "Replays Since Reset"), None),
        ("PCIe TX (MB/s)", first(found, "gpu_pcie_throughput_bytes_per_second", direction="tx"), 1e6,
         smi(flat, "Tx Throughput"), mon.get("txpci")),
        ("PCIe RX (MB/s)", first(found, "gpu_pcie_throughput_bytes_per_second", direction="rx"), 1e6,
         smi(flat, "Rx Throughput"), mon.get("rxpci")),
        ("NVLink TX (MB/s)", first(found, "gpu_nvlink_throughput_bytes_per_second", direction="tx"), 1e6, None, None),
        ("NVLink RX (MB/s)", first(found, "gpu_nvlink_throughput_bytes_per_second", direction="rx"), 1e6, None, None),
        ("remapped rows, correctable", first(found, "gpu_remapped_rows_total", error="correctable"), 1,
         smi(flat, "Remapped Rows/Correctable Error"), None),
        ("remapped rows, uncorrectable", first(found, "gpu_remapped_rows_total", error="uncorrectable"), 1,
         smi(flat, "Remapped Rows/Uncorrectable Error"), None),
        ("row remap pending", first(found, "gpu_row_remap_pending"), 1, smi(flat, "Remapped Rows/Pending"), None),
        ("row remap failure", first(found, "gpu_row_remap_failure"), 1,
         smi(flat, "Remapped Rows/Remapping Failure Occurred"), None),
        ("ECC volatile uncorrected", first(found, "gpu_ecc_errors_total", error="uncorrected", scope="volatile"), 1,
         smi(flat, "Volatile/DRAM Uncorrectable"), mon.get("dbecc")),
        ("ECC volatile corrected", first(found, "gpu_ecc_errors_total", error="corrected", scope="volatile"), 1,
         smi(flat, "Volatile/DRAM Correctable"), mon.get("sbecc")),
        ("power violation (s; dmon pviol: % of its interval)", first(found, "gpu_clock_throttle_seconds_total",
                                                                    reason="power"), 1, None, mon.get("pviol")),
        ("thermal violation (s; dmon tviol)", first(found, "gpu_clock_throttle_seconds_total", reason="thermal"), 1, None,
         mon.get("tviol")),
        ("power (W)", first(found, "gpu_power_watts"), 1, smi(flat, "Power Readings/Power Draw", "Power Draw"),
         mon.get("pwr")),
    ]
    print(f"{'quantity':52} {'exporter':>14} {'nvidia-smi -q':>18} {'dmon mean':>10}")
    for name, value, unit, q, d in rows:
        shown = "absent" if value is None else f"{value / unit:.3f}"
        print(f"{name:52} {shown:>14} {str(q):>18} {str(d if d is not None else '-'):>10}")
    driver = [labels.get("driver_version") for labels, _ in found.get("gpu_driver_info", [])]
    print(f"driver: exporter {driver} nvidia-smi {smi(flat, 'Driver Version')}")
    reasons = {labels["reason"]: value for labels, value in found.get("gpu_clock_event_reason_active", [])}
    smi_reasons = {k.rsplit("/", 1)[-1]: v for k, v in flat.items() if "Clocks Event Reasons/" in k
                   or "Clocks Throttle Reasons/" in k}
    print(f"clock event reasons: exporter {reasons}\n  nvidia-smi {smi_reasons}")
    print("XIDs:", found.get("gpu_xid_errors_total", "none"), found.get("gpu_xid_last_code", ""))
    if (out / "nvml_h200_health.json").exists():
        print(energy_check(out / "nvml_h200_health.json"))
    costs_path = out / "nvml_call_cost.json"
    if costs_path.exists():
        costs = json.loads(costs_path.read_text())
        print(f"\n{'NVML call (mean of 50)':40} {'CPU ms':>8} {'wall ms':>8}")
        for name, cost in costs.items():
            shown = (f"{cost['cpu_ms']:>8.3f} {cost['wall_ms']:>8.3f}" if isinstance(cost, dict) else str(cost))
            print(f"{name:40} {shown}")
        # The new calls at the sampler's cadences (exporter/samplers/nvml.py), at --interval 1.
        per_second = {"memory_clock_hz": 1.0, "clock_event_reasons": 1.0, "health_counters": 0.1,
                      "memory_errors": 1 / 60}
        known = {k: costs[k]["cpu_ms"] * n for k, n in per_second.items() if isinstance(costs.get(k), dict)}
        print(f"new calls at their cadences: {sum(known.values()):.3f} ms of CPU per second = "
              f"{sum(known.values()) / 10:.4f} % of a core ({', '.join(f'{k} {v:.3f}' for k, v in known.items())})")
    footprints = sorted(out.glob("footprint_*_*.json"))
    if footprints:
        print(f"\n{'run':14} {'CPU (share of a core)':>22} {'VmRSS MiB':>10} {'series':>7} {'threads':>8}")
        by = {}
        for path in footprints:
            report = json.loads(path.read_text())
            by.setdefault(report["label"], []).append(report)
            print(f"{path.stem:14} {report['cpu_share_of_core']:>22.5f} {report['rss_mb']:>10.1f} "
                  f"{report['gpu_series']:>7} {report['threads']:>8}")
        if {"base", "new"} <= set(by):
            cpu = {k: statistics.mean(r["cpu_share_of_core"] for r in v) for k, v in by.items()}
            rss = {k: statistics.mean(r["rss_mb"] for r in v) for k, v in by.items()}
            print(f"new - base: CPU {100 * (cpu['new'] - cpu['base']):+.3f} % of a core (target <= +0.1), "
                  f"RSS {rss['new'] - rss['base']:+.2f} MiB (target <= +2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
