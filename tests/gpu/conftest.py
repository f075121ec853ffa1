import pytest


def _gpu_reason() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001
        return f"no NVIDIA GPU here ({exc})"
    if count == 0:
        return "NVML found no GPU"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is needed for the spin workload"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason:
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
