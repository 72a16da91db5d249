"""The identity of a cost cell as the analysis reads it: which rows are one measurement, whatever wrote them.

The fields are harness.results.COST_KEY_FIELDS, the sweep's own; here each row's values are normalised so rows
written by older versions, by pandas or by another tool name the same cell the same way. ``compare`` matches runs on
it, and the report and the plots keep the latest row of each cell (harness.analysis.frames.cells).
"""
from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.results import COST_KEY_FIELDS


def params_dict(params: Any) -> dict[str, Any]:
    """A row's params as a dict: JSON text, None and NaN (absent) are accepted."""
    if isinstance(params, dict):
        return params
    if isinstance(params, str) and params.strip():
        try:
            loaded = json.loads(params)
        except json.JSONDecodeError:
            return {}
        return loaded if isinstance(loaded, dict) else {}
    return {}


@functools.cache
def registered_defaults(kind: str, name: str) -> dict[str, Any] | None:
    """Config fields and defaults of a registered variant (``kind="attention"``) or position; None if unknown."""
    try:
        import attn

        specs = attn.list_attention() if kind == "attention" else attn.list_positions()
    except Exception:  # plotting old results must not depend on the models importing
        return None
    return next((dict(s["params"]) for s in specs if s["name"] == name), None)


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return json.dumps(a, default=str) == json.dumps(b, default=str)


# What a row that lacks an optional key column (written before the column existed, or by another tool) meant by it:
# the values the sweep writes by default (harness.cost.Cell). ``backend_requested`` is apart (:func:`cell_values`).
OPTIONAL_DEFAULTS: dict[str, Any] = {
    "variant_params": {}, "position": "none", "position_params": {}, "scope": "op", "causal": True, "layers": None,
    "num_kv_heads": None,  # multi-head: as many key/value heads as query heads
    "docs": None,  # one document per sequence
    "press": None, "press_params": {},  # no KV press (sweep --press)
    "hf_config": None,  # scope op/model: no transformers config
    "queries": None, "budget_bytes": None, "ragged": None,  # one token a step, the grid's batch, equal contexts
}


def absent(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _norm(c: str, v: Any) -> Any:
    """One spelling per value (JSON, pandas and numpy give 2, 2.0 and np.int64(2)), so keys compare equal."""
    if c.endswith("_params"):
        return json.dumps(params_dict(v), sort_keys=True, default=str)
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) else (int(v) if float(v).is_integer() else float(v))
    return v


def _without_defaults(variant: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Parameters that differ from today's defaults: a parameter added since a row was written (its default then
    implied) does not make the row a different measurement."""
    defaults = registered_defaults("attention", variant) if isinstance(variant, str) else None
    if not defaults:
        return params
    return {k: v for k, v in params.items() if not (k in defaults and same_value(defaults[k], v))}


def cell_values(row: Mapping[str, Any]) -> dict[str, Any]:
    """The cell identity fields (harness.results.COST_KEY_FIELDS) of one row, normalised: a missing optional field
    at the value it stands for, parameters at their defaults left out, an older row's backend as requested."""
    vals = {}
    for c in COST_KEY_FIELDS:
        v = row.get(c)
        vals[c] = _norm(c, OPTIONAL_DEFAULTS[c] if absent(v) and c in OPTIONAL_DEFAULTS else v)
    if vals["scope"] == "op":
        vals["layers"] = None  # no backbone, no depth
    raw = row.get("variant_params")
    params = params_dict(OPTIONAL_DEFAULTS["variant_params"] if absent(raw) else raw)
    vals["variant_params"] = _norm("variant_params", _without_defaults(vals["variant"], params))
    if absent(row.get("backend_requested")):  # older rows: only the backend that ran (auto if none did)
        ran = row.get("backend")
        vals["backend_requested"] = ran if isinstance(ran, str) and ran else "auto"
    return vals


def cell_identity(df: pd.DataFrame) -> pd.Series:
    """Each row's cell, as one string: rows with the same string are the same measurement (the later supersedes)."""
    if not len(df):
        return pd.Series(dtype=str, index=df.index)
    return df.apply(lambda row: json.dumps(cell_values(row), sort_keys=True, default=str), axis=1)


def apart(df: pd.DataFrame) -> pd.DataFrame:
    """Series that hold two different cells at one length (two configs, say, or ``backend_requested`` auto and
    flex) gain the identity fields that tell their rows apart, so no figure or table draws them as one point."""
    at = ["device_key", "facet", "series", "seq_len"]
    if not len(df) or not (df.groupby(at, dropna=False)["cell"].nunique() > 1).any():
        return df
    values = pd.DataFrame([cell_values(r) for _, r in df.iterrows()], index=df.index).astype(str)
    series = df["series"].copy()
    for _, g in df.groupby(["device_key", "facet", "series"], dropna=False):
        if not (g.groupby("seq_len")["cell"].nunique() > 1).any():
            continue
        differ = [c for c in COST_KEY_FIELDS if c != "seq_len" and values.loc[g.index, c].nunique() > 1]
        series.loc[g.index] = [f"{s} [{' '.join(f'{c}={values.at[i, c]}' for c in differ)}]"
                               for i, s in zip(g.index, g["series"], strict=True)]
    return df.assign(series=series)


__all__ = [
    "OPTIONAL_DEFAULTS", "absent", "apart", "cell_identity", "cell_values", "params_dict", "registered_defaults", "same_value",
]
