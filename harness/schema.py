"""What a results row must hold to be read: the check readers apply to every row before drawing or comparing it."""
from __future__ import annotations

import json
import re
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

# What an accuracy row says of its metric, from its task's declaration (harness.accuracy.tasks.base.Metric), so that
# readers need no task's code: its kind (proportion, mean or loss), its role ("ranked": the memory-quality frontier
# ranks by it; "main": the task's headline; ""), the task it scores as tables name it (RULER's subtask), and whether
# the row compares a variant with full attention instead of scoring a task.
DECLARED = ("metric_kind", "metric_role", "task_label", "versus_full")
# Rows written before rows carried DECLARED (December 2026): what the built-in tasks declared then. A row that says it
# is read as it says; no task is ever added here.
_BEFORE = {
    "proportion": ("accuracy", "exact_match", "digit_accuracy", "string_match", "all_found"),
    "loss": ("loss", "ppl", "perplexity", "nll", "bpb", "bpc", "rel_l2", "error", "mse", "mae", "max_abs"),  # in a name
    "ranked": (("passkey", "exact_match"), ("ruler", "string_match")),
    "main": (("mqar", "accuracy"), ("lm", "bpb"), ("fidelity", "rel_l2_trained"), ("selection", "mass_trained")),
    "versus_full": ("fidelity", "selection"),
    "one_draw": ("passkey",),  # a checkpoint cell's keys shared one haystack before rows said how many draws
}


def declaration(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's DECLARED columns: its own, or for a row written before rows carried them, what its task declared then."""
    if isinstance(row.get("metric_kind"), str):
        return {k: row.get(k) for k in DECLARED}
    task, metric = str(row.get("task")), str(row.get("metric"))
    kind = ("proportion" if metric in _BEFORE["proportion"] else
            "loss" if any(w in metric.lower() for w in _BEFORE["loss"]) else "mean")
    role = "ranked" if (task, metric) in _BEFORE["ranked"] else "main" if (task, metric) in _BEFORE["main"] else ""
    label = row.get("subtask")
    return {"metric_kind": kind, "metric_role": role, "task_label": label if isinstance(label, str) and label else task,
            "versus_full": task in _BEFORE["versus_full"]}


def press_method(row: Mapping[str, Any]) -> str:
    """The press a row measures as tables name it, without its ratio: ``snapkv``; a press wrapping another with the
    one it wraps (``adakv(snapkv)``, from ``press_params.press``), so two wrappings of one press stay two methods."""
    params = row.get("press_params")
    wrapped = params.get("press") if isinstance(params, Mapping) else None
    name = str(row.get("press"))
    return f"{name}({re.sub(r':[^()]*', '', wrapped)})" if isinstance(wrapped, str) and wrapped else name


def subject(row: Mapping[str, Any]) -> str:
    """The model a row measures, with its dtype unless float32: cells of two dtypes are two subjects, never compared
    (a cost row names its model ``hf_config``)."""
    dtype = dtype_of(row)
    return str(row.get("model", row.get("hf_config"))) + ("" if dtype == "float32" else f" ({dtype})")


def dtype_of(row: Mapping[str, Any]) -> str:
    """A row's dtype: rows written before the column existed ran in float32."""
    return row["dtype"] if isinstance(row.get("dtype"), str) and row.get("dtype") else "float32"


def one_draw_a_cell(row: Mapping[str, Any]) -> bool:
    """Whether a row without ``draws`` is one independent draw (its examples shared one context)."""
    return row.get("draws") is None and str(row.get("task")) in _BEFORE["one_draw"]


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


__all__ = ["DECLARED", "NAME_FIELDS", "NUMBER_FIELDS", "PARAM_FIELDS", "declaration", "one_draw_a_cell", "press_method",
           "row_problem", "subject"]
