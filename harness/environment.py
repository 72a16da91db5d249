"""Where and with what a row was measured: recorded on every row so results stay comparable."""
from __future__ import annotations

import datetime as dt
import functools
import json
import os
import platform
import socket
from pathlib import Path
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


@functools.cache
def code_commit() -> str | None:
    """The commit of the checkout this code runs from (``-dirty`` if tracked files differ from it), or None outside
    a git checkout: which code produced a row, so a later change to that code marks the row stale
    (harness.analysis.freshness)."""
    return checkout_commit(Path(attn.__file__).resolve().parents[1])


def checkout_commit(root: Path) -> str | None:
    """HEAD of the checkout at ``root``, ``-dirty`` if a tracked file outside ``results/`` differs from it: results are
    data, not code, and a run appending to a committed results file beside this one leaves the code as committed."""
    import subprocess

    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
                               cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


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
        "code_commit": code_commit(),
        "hostname": socket.gethostname(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "seed": seed,
    }


DTYPE_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attn-bench" / "dtype.json"


def faster_dtype() -> str:
    """``float32`` or ``bfloat16``, whichever multiplies a model-sized matmul (2048 tokens x 896 -> 4864, a 0.5B
    model's MLP) faster here: bfloat16 is 3-6x faster on a CPU with AMX and slower on one without avx512_bf16.
    Measured once per machine, thread count and torch version, and cached (``~/.cache/attn-bench/dtype.json``); a
    CUDA device takes bfloat16."""
    if torch.cuda.is_available():
        return "bfloat16"
    from torch.utils.benchmark import Timer

    key = f"{cpu_name()}|{torch.backends.cpu.get_cpu_capability()}|{torch.get_num_threads()}|{torch.__version__}"
    try:
        cached = json.loads(DTYPE_CACHE.read_text())
    except (OSError, ValueError):
        cached = {}
    if key not in cached:
        times = {}
        for name in ("float32", "bfloat16"):
            a = torch.randn(2048, 896, dtype=getattr(torch, name))
            b = torch.randn(896, 4864, dtype=getattr(torch, name))
            times[name] = Timer("a @ b", globals={"a": a, "b": b}).blocked_autorange(min_run_time=0.5).median
        cached[key] = min(times, key=times.get)
        try:
            DTYPE_CACHE.parent.mkdir(parents=True, exist_ok=True)
            DTYPE_CACHE.write_text(json.dumps(cached, indent=1))
        except OSError:  # a read-only home: measured again next time
            pass
    return cached[key]
