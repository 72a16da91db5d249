"""The JSONL results store: one object per measured cell, appended and flushed as it finishes.

A killed run loses at most the cell in flight; a torn last line (killed mid-write) is cut off
when the file is next opened for appending, and ignored by readers, so a file is never left
corrupt. ``--resume`` skips cells whose key is already present.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

COST_FIELDS = (
    "run_id", "variant", "variant_params", "backend", "position", "scope", "mode", "device", "device_name",
    "dtype", "batch_size", "num_heads", "head_dim", "seq_len", "status", "error", "latency_ms",
    "latency_iqr_ms", "tokens_per_s", "peak_mem_bytes", "flops", "achieved_flops_per_s",
    # how far to trust it (harness.noise): the matmul peak timed before and after the cell, the load
    "peak_before_flops_per_s", "peak_after_flops_per_s", "peak_flops_per_s", "peak_fraction", "other_cpu",
    "loadavg_1m", "noisy", "noisy_reason", "attempts",
)
ACCURACY_FIELDS = (
    "run_id", "task", "variant", "variant_params", "position", "position_params", "train_len", "eval_len",
    "metric", "value", "ci_low", "ci_high", "n", "seed",
)
STATUSES = ("ok", "oom", "timeout", "error", "unsupported", "skipped")


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every reader parses the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def cell_key(row: dict[str, Any], key_fields: Sequence[str]) -> str:
    """Canonical identity of a cell: the same configuration always gives the same key."""
    return json.dumps({k: row.get(k) for k in key_fields}, sort_keys=True, default=str)


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete row of one JSONL file; a torn trailing line is skipped."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    with p.open() as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn final write
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


class ResultsStore:
    """Append-only JSONL file of rows; ``keys()`` tells which cells are already measured."""

    def __init__(self, path: str | os.PathLike, key_fields: Sequence[str]):
        self.path = Path(path)
        self.key_fields = tuple(key_fields)

    def keys(self, statuses: Iterable[str] | None = None) -> set[str]:
        keep = None if statuses is None else set(statuses)
        return {
            cell_key(r, self.key_fields)
            for r in read_rows(self.path)
            if keep is None or r.get("status", "ok") in keep
        }

    def _repair(self) -> None:
        """Cut a torn last line left by a killed writer, so appends start on a fresh line."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            f.truncate(data.rfind(b"\n") + 1)

    def append(self, row: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        line = json.dumps(_clean(row), default=str) + "\n"
        with self.path.open("a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


__all__ = ["ACCURACY_FIELDS", "COST_FIELDS", "STATUSES", "ResultsStore", "cell_key", "read_rows"]
