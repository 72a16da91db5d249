"""What a results row must hold to be read: the check readers apply to every row before drawing or comparing it."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.results import STATUSES

# Columns a reader computes with: a row must hold a JSON number (or null) there, never text that looks like one.
NUMBER_FIELDS = {
    "cost": ("seq_len", "batch_size", "num_heads", "num_kv_heads", "head_dim", "latency_ms", "latency_iqr_ms",
             "tokens_per_s", "peak_mem_bytes", "flops", "achieved_flops_per_s"),
    "accuracy": ("value", "ci_low", "ci_high", "n", "eval_len", "train_len", "seed"),
}
NAME_FIELDS = {"cost": ("variant", "mode", "device"), "accuracy": ("task", "variant", "metric")}
PARAM_FIELDS = ("variant_params", "position_params", "press_params")


def row_problem(row: Mapping[str, Any]) -> str | None:
    """Why ``row`` cannot be read as a results row (one clause naming the field), or None.

    Strict as the command line: a name that is not text, a status that is not one of ``STATUSES``, a number written
    as text or as a boolean, parameters that are not an object. Readers (``plot``, ``report``, ``compare``) refuse
    such a file by its line instead of drawing or comparing what it would mean."""
    kind = "accuracy" if "task" in row or "metric" in row else "cost"
    for k in NAME_FIELDS[kind]:
        v = row.get(k)
        if not isinstance(v, str) or not v.strip():
            return f"{k} is {_show(v)}, not a name"
    status = row.get("status")
    if status is not None and status not in STATUSES:
        return f"status is {_show(status)}, not one of {', '.join(STATUSES)}"
    for k in NUMBER_FIELDS[kind]:
        v = row.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"{k} is {_show(v)}, not a number"
    for k in PARAM_FIELDS:
        v = row.get(k)
        if v is not None and not isinstance(v, dict):
            return f"{k} is {_show(v)}, not an object of parameters"
    return None


def _show(v: Any) -> str:
    text = repr(v) if isinstance(v, str) else json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["NAME_FIELDS", "NUMBER_FIELDS", "PARAM_FIELDS", "row_problem"]
