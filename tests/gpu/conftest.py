import pytest


def _gpu_reason() -> str | None:
    """Why there is no GPU to test on; None when there is one. What else a test needs (CuPy, PyTorch,
    nsys, MPS tools) its own skip mark says (tests/gpu/needs.py)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - whatever stops NVML here means no GPU: the tests say why and skip
        return f"no GPU: NVML does not start here ({exc})"
    if count == 0:
        return "no GPU: NVML found none"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason:
        for item in items:
            if "gpu" in item.keywords:
                # First among the test's skip marks: without a GPU that is the one reason given.
                item.add_marker(pytest.mark.skipif(True, reason=reason), append=False)
