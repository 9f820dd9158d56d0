"""Which GPUs this machine has: CUDA_VISIBLE_DEVICES if set, else NVML
(``nvidia-ml-py``) when installed, else none."""

from __future__ import annotations

import os


def detect_gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, or no GPU: NVML reports its own error types
        return 0
