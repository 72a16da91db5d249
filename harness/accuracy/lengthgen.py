"""Length generalisation: train at L, evaluate at L, 2L, 4L, 8L, 16L, for each position method.

The experiment the RoPE family exists for. Each method is evaluated zero-shot with its scaling
``factor = eval_len / L`` (see :mod:`harness.accuracy.build`), and optionally after a short
fine-tune at 2L with ``factor = 2`` (stage ``finetune``; evaluated with factor max(2, eval_len / L)),
the recipe of Position Interpolation (Chen et al. 2023) and YaRN (Peng et al. 2023).
The trained task is ``--base-task`` (``lm``: bits per byte; ``passkey``: retrieval accuracy).
The runner does the work; this module holds the table of the results.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from harness.accuracy.stats import summarize, summarize_best_lr

MAIN_METRIC = {"lm": "bpb", "passkey": "exact_match", "mqar": "accuracy", "ruler": "string_match"}


def table(rows: Iterable[dict[str, Any]], task: str, metric: str | None = None) -> pd.DataFrame:
    """Position method (and stage) x evaluation length: the mean over seeds (and depths, pairs...).

    MQAR: variant (and width, pairs... where they vary) x evaluation length, each seed at its best learning rate."""
    metric = metric or MAIN_METRIC.get(task, "bpb")
    rows = [r for r in rows if r.get("task") == task and r.get("metric") == metric]
    if task == "mqar":
        return _mqar_table(pd.DataFrame(summarize_best_lr(rows)), metric)
    s = pd.DataFrame(summarize(rows))
    if s.empty:
        return s
    s["stage"] = s["stage"].fillna("zero_shot")
    index = ["variant_spec", "position_spec", "stage"] if s["variant_spec"].nunique() > 1 else ["position_spec", "stage"]
    t = s.pivot_table(index=index, columns="eval_len", values="value", aggfunc="mean")
    t.columns.name = f"{task} {metric} at eval length"
    return t


def _mqar_table(s: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows: variant_spec, then d_model, the pairs, the old protocol's gap rule, training length, position and short
    convolution, each only where it takes several values at one evaluation length; columns: evaluation length.

    Under Zoology's protocol the pairs (length / 16) and the training length follow the evaluation length, so the
    header names them instead of the index making a diagonal table."""
    if s.empty:
        return s
    s = s.assign(d_model=[-1 if _missing(v) else int(v) for v in s["d_model"]],  # -1: the preset's width, sorted first
                 **{c: ["" if _missing(v) else str(v) for v in s[c]] for c in ("gap_rule", "position_spec", "short_conv")})
    per_len = s.groupby("eval_len")
    index = ["variant_spec", *[c for c in ("d_model", "num_pairs", "gap_rule", "train_len", "position_spec", "short_conv")
                               if per_len[c].nunique().max() > 1]]
    t = s.pivot_table(index=index, columns="eval_len", values="value", aggfunc="mean")
    if "d_model" in index:
        t = t.rename(index={-1: PRESET_WIDTH}, level="d_model")
    notes = []
    if "num_pairs" not in index:
        notes.append("pairs " + ", ".join(f"{int(n)} at {int(L)}" for L, n in per_len["num_pairs"].first().items()
                                          if not _missing(n)))
    if "train_len" not in index and (s["train_len"] == s["eval_len"]).all():
        notes.append("trained at the length evaluated")
    t.columns.name = f"mqar {metric} at eval length" + (f" ({'; '.join(notes)})" if notes else "")
    return t


PRESET_WIDTH = "preset"  # rows whose d_model is None: the model preset's own width


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


__all__ = ["MAIN_METRIC", "table"]
