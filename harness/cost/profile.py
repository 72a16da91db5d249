"""``sweep --profile``: after a cell is timed (never while), a few more calls under ``torch.profiler``, written as a
Chrome trace (open it in Perfetto, ui.perfetto.dev, or chrome://tracing) and a table of the operators by self time
beside it; the row names the trace and carries the top operators. On CPU this shows where a backend spends its time
(a window's masked matmuls, block-sparse gathers, a recurrence's small steps); on CUDA the kernels.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROFILE_S = 0.5  # seconds of calls to profile: one call of a slow cell, several of a fast one
MAX_CALLS = 50
TOP = 15  # operators in the table and in the row


def profile_calls(fn: Callable[[], object], trace: Path, device: str, median_s: float) -> dict[str, Any]:
    """Profile ``fn`` (already warm) for about ``PROFILE_S``; write ``trace`` (Chrome JSON) and ``trace``.txt (the
    operators by self time); return the row's columns: the trace's path, the calls profiled, the top operators (self
    milliseconds per call, calls per call, share of the profiled self time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    calls = max(1, min(MAX_CALLS, math.ceil(PROFILE_S / max(median_s, 1e-9))))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    total = sum(getattr(e, key, 0.0) for e in events) or 1.0
    top = sorted(events, key=lambda e: getattr(e, key, 0.0), reverse=True)[:TOP]
    trace.with_suffix(".txt").write_text(events.table(sort_by=key, row_limit=TOP) + "\n")
    return {"profile_trace": str(trace), "profile_calls": calls,
            "profile_top": [{"op": e.key, "self_ms": getattr(e, key, 0.0) / 1e3 / calls, "calls": e.count / calls,
                             "share": getattr(e, key, 0.0) / total} for e in top]}


def top_table(rows: list[dict[str, Any]]) -> str:
    """The top operators of each profiled row, as the sweep prints them at its end."""
    lines = []
    for r in rows:
        if not r.get("profile_top"):
            continue
        lines.append(f"{r.get('variant_spec') or r['variant']} {r['mode']} L={r['seq_len']}"
                     + (f" [{r['side']}]" if r.get("side") else "") + f": {r['profile_trace']}")
        lines += [f"  {t['self_ms']:10.3f} ms {100 * t['share']:5.1f}%  {t['calls']:7.1f}x  {t['op']}"
                  for t in r["profile_top"][:8]]
    return "\n".join(["top operators by self time, per call (ms, share, calls per call, operator):", *lines]
                     if lines else [])


__all__ = ["MAX_CALLS", "PROFILE_S", "TOP", "profile_calls", "top_table"]
