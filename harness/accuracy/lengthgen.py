"""Length generalisation: train at L, evaluate at L, 2L, 4L, 8L, 16L, for each position method.

The experiment the RoPE family exists for. Each method is evaluated zero-shot with its scaling
``factor = eval_len / L`` (see :mod:`harness.accuracy.build`), and optionally after a short
fine-tune at 2L with ``factor = 2`` (stage ``finetune``; evaluated with factor max(2, eval_len / L)),
the recipe of Position Interpolation (Chen et al. 2023) and YaRN (Peng et al. 2023).
The trained task is ``--base-task`` (``lm``: bits per byte; ``passkey``: retrieval accuracy).
The runner does the work; this module holds the table of the results.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from harness.accuracy.stats import summarize

MAIN_METRIC = {"lm": "bpb", "passkey": "exact_match", "mqar": "accuracy"}


def table(rows: Iterable[dict[str, Any]], task: str, metric: str | None = None) -> pd.DataFrame:
    """Position method (and stage) x evaluation length: the mean over seeds (and depths, pairs...)."""
    metric = metric or MAIN_METRIC.get(task, "bpb")
    rows = [r for r in rows if r.get("task") == task and r.get("metric") == metric]
    s = pd.DataFrame(summarize(rows))
    if s.empty:
        return s
    s["stage"] = s["stage"].fillna("zero_shot")
    index = ["variant_spec", "position_spec", "stage"] if s["variant_spec"].nunique() > 1 else ["position_spec", "stage"]
    if task == "mqar":  # where recall breaks: by pairs and by gap (named by its rule, as lengths differ)
        index = ["variant_spec", "num_pairs", "gap_rule"] + (["position_spec"] if s["position_spec"].nunique() > 1 else [])
    t = s.pivot_table(index=index, columns="eval_len", values="value", aggfunc="mean")
    t.columns.name = f"{task} {metric} at eval length"
    return t


__all__ = ["MAIN_METRIC", "table"]
