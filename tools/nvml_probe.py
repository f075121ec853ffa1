"""Every NVML value dcgm-exporter's default set reads, raw, for GPU 0..N: what the card answers
(value, or the NVML error's name), to check the exporter's series against on the device.

    python3 tools/nvml_probe.py > nvml_probe.json
"""
from __future__ import annotations

import json
import sys
import time

import pynvml as nv


def call(fn, *args):
    try:
        value = fn(*args)
    except nv.NVMLError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - an old binding without the call
        return {"error": f"{type(exc).__name__}: {exc}"}
    return plain(value)


def plain(value):
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "_fields_"):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    return value


def fields(handle, names):
    ids = [(n, getattr(nv, n)) for n in names if hasattr(nv, n)]
    try:
        got = nv.nvmlDeviceGetFieldValues(handle, [i for _, i in ids])
    except nv.NVMLError as exc:
        return {"error": str(exc)}
    out = {}
    for (name, _), v in zip(ids, got):
        if v.nvmlReturn != 0:
            out[name] = {"error": nv.nvmlErrorString(v.nvmlReturn)}
            continue
        kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(v.valueType, "ullVal")
        out[name] = {"value": getattr(v.value, kind), "timestamp_us": v.timestamp}
    return out


FIELDS = ["NVML_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_PCIE_REPLAY_COUNTER", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
          "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
          "NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL", "NVML_FI_DEV_NVLINK_LINK_COUNT",
          "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
          "NVML_FI_DEV_REMAPPED_COR", "NVML_FI_DEV_REMAPPED_UNC", "NVML_FI_DEV_REMAPPED_FAILURE",
          "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
          "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
          "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_SLOWDOWN",
          "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
          "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
          "NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_POWER_AVERAGE"]
POLICIES = ["NVML_PERF_POLICY_POWER", "NVML_PERF_POLICY_THERMAL", "NVML_PERF_POLICY_SYNC_BOOST",
            "NVML_PERF_POLICY_BOARD_LIMIT", "NVML_PERF_POLICY_LOW_UTILIZATION", "NVML_PERF_POLICY_RELIABILITY",
            "NVML_PERF_POLICY_TOTAL_APP_CLOCKS", "NVML_PERF_POLICY_TOTAL_BASE_CLOCKS"]


def device(index: int) -> dict:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    out = {
        "index": index, "uuid": call(nv.nvmlDeviceGetUUID, h), "name": call(nv.nvmlDeviceGetName, h),
        "minor_number": call(nv.nvmlDeviceGetMinorNumber, h),
        "clock_sm_hz_mhz": call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        "clock_mem_mhz": call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
        "max_clock_sm_mhz": call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
        "max_clock_mem_mhz": call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
        "temperature_gpu_c": call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
        "total_energy_mj": call(nv.nvmlDeviceGetTotalEnergyConsumption, h),
        "power_mw": call(nv.nvmlDeviceGetPowerUsage, h),
        "pcie_replay_counter": call(nv.nvmlDeviceGetPcieReplayCounter, h),
        "encoder_utilization": call(nv.nvmlDeviceGetEncoderUtilization, h),
        "decoder_utilization": call(nv.nvmlDeviceGetDecoderUtilization, h),
        "memory_info": call(nv.nvmlDeviceGetMemoryInfo, h),
        "memory_info_v2": call(lambda x: nv.nvmlDeviceGetMemoryInfo(x, version=nv.nvmlMemory_v2), h),
        "remapped_rows": call(nv.nvmlDeviceGetRemappedRows, h),
        "clocks_event_reasons": call(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons",
                                             getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)), h),
        "supported_clocks_event_reasons": call(getattr(nv, "nvmlDeviceGetSupportedClocksEventReasons",
                                                       getattr(nv, "nvmlDeviceGetSupportedClocksThrottleReasons", None)), h),
        "pcie_tx_kbps": call(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES),
        "pcie_rx_kbps": call(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES),
        "ecc_mode": call(nv.nvmlDeviceGetEccMode, h),
        "ecc_corrected_volatile": call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
        "ecc_uncorrected_volatile": call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        "ecc_corrected_aggregate": call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
        "ecc_uncorrected_aggregate": call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
        "violation_status": {p: call(nv.nvmlDeviceGetViolationStatus, h, getattr(nv, p)) for p in POLICIES if hasattr(nv, p)},
        "nvlink_state": [call(nv.nvmlDeviceGetNvLinkState, h, link) for link in range(18)],
        "supported_event_types": call(nv.nvmlDeviceGetSupportedEventTypes, h),
        "field_values": fields(h, FIELDS),
        "gpm_supported": call(lambda x: nv.nvmlGpmQueryDeviceSupport(x).isSupportedDevice, h),
    }
    return out


def main() -> int:
    nv.nvmlInit()
    result = {"taken_at": time.time(), "driver_version": call(nv.nvmlSystemGetDriverVersion),
              "nvml_version": call(nv.nvmlSystemGetNVMLVersion), "cuda_driver_version": call(nv.nvmlSystemGetCudaDriverVersion),
              "devices": [device(i) for i in range(nv.nvmlDeviceGetCount())]}
    json.dump(result, sys.stdout, indent=1, default=str)
    nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
