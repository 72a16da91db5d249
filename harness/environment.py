"""Where and with what a row was measured: recorded on every row so results stay comparable."""
from __future__ import annotations

import datetime as dt
import functools
import os
import platform
import socket
from typing import Any

import torch

import attn


@functools.cache
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_name()} ({os.cpu_count()} cores)"


def environment(device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """The environment columns carried by every results row (DESIGN.md, Results)."""
    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else ""
    return {
        "device": device,
        "device_name": device_name(device),
        "cpu_capability": cap,
        "num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "project_version": attn.__version__,
        "hostname": socket.gethostname(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "seed": seed,
    }
