"""Results files -> pandas frames: loading, validation, labels, cells (one row per measured cell).

Plots, the report and ``compare`` read results only through here (and :mod:`harness.analysis.derive`
for the numbers computed from the frames), so they agree on what a cell, a label and a failure are.
Nothing here measures anything (STYLE.md: measure, aggregate, plot).
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.identity import apart, cell_identity, params_dict, registered_defaults, same_value
from harness.results import STATUSES, numbered_rows, scan_rows, warn_skipped
from harness.schema import DECLARED, declaration, row_problem

# The least a row needs to be drawn at all; every other column is optional (figures say what they lack).
COST_REQUIRED = ("variant", "backend", "mode", "device", "seq_len", "status", "latency_ms")
ACCURACY_REQUIRED = ("task", "variant", "metric", "value")
# What, besides the label and the length, tells two cost cells apart on one device.
COST_CONTEXT = ("scope", "mode", "dtype", "batch_size", "num_heads", "num_kv_heads", "head_dim", "position", "causal", "layers",
                "docs", "queries", "budget_bytes", "ragged")
SHAPE_FIELDS = ("dtype", "batch_size", "num_heads", "num_kv_heads", "head_dim", "position", "causal", "layers", "docs",
                "queries", "budget_bytes", "ragged")
COST_NUMERIC = (
    "seq_len", "latency_ms", "latency_iqr_ms", "tokens_per_s", "peak_mem_bytes", "flops", "achieved_flops_per_s",
    "peak_flops_per_s", "peak_fraction", "batch_size", "num_heads", "head_dim",
    # trust columns (newer rows): the peak timed either side of the cell, the load while it was timed
    "peak_before_flops_per_s", "peak_after_flops_per_s", "loadavg_1m", "other_cpu", "attempts",
    # the bandwidth roofline (newer rows)
    "bytes", "achieved_bytes_per_s", "bandwidth_peak_bytes_per_s", "bandwidth_fraction", "arithmetic_intensity",
    "roofline_fraction",
)
ACCURACY_NUMERIC = ("train_len", "eval_len", "seq_len", "value", "ci_low", "ci_high", "n", "depth")
# Columns the cost harness may use for the device's memory capacity; the first one present wins.
MEM_LIMIT_COLUMNS = ("mem_limit_bytes", "device_mem_bytes", "device_memory_bytes", "mem_total_bytes", "total_mem_bytes")
FAILED = ("oom", "timeout")  # failures that happen *at a length* and stop a variant growing
# Filled in by the backbone, identical across a sweep: they only lengthen labels.
_LABEL_SKIP = frozenset({"head_dim", "d_model", "max_seq_len"})
BUILTIN_ORDER = ("full", "sliding_window", "block_sparse", "linear")


@dataclass
class Results:
    """All rows of some results files, split by kind; ``sources`` are the files read."""

    cost: pd.DataFrame
    accuracy: pd.DataFrame
    sources: list[str] = field(default_factory=list)

    def combined(self) -> pd.DataFrame:
        """Variant rows of both kinds, for figures that only need variant/params/length."""
        frames = []
        if len(self.cost):
            frames.append(self.cost[["variant", "variant_params", "variant_label", "seq_len"]])
        if len(self.accuracy):
            frames.append(self.accuracy[["variant", "variant_params", "variant_label", "length"]]
                          .rename(columns={"length": "seq_len"}))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# -- labels -----------------------------------------------------------------------------------

def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(fmt_value(x) for x in v) + ")"
    return str(v)


@functools.cache
def preset_width(model: str) -> float:
    """``d_model`` of a model preset (``attn.PRESETS``): the width of rows that set none; NaN if unknown."""
    try:
        import attn

        return float(attn.PRESETS[model]["d_model"])
    except Exception:  # plotting old results must not depend on the models importing
        return math.nan


def spec_label(name: Any, params: Any, kind: str = "attention") -> str:
    """``sliding_window`` + ``{"window": 256}`` -> ``"sliding_window(window=256)"``; names flow into legends.

    Rows carry the variant's resolved config (every field), which would make legends unreadable,
    so a field at its registered default is left out -- except a variant's first field (its
    defining parameter: ``window``, ``block_size``, ``feature_map``), which is always shown. The
    same rule labels cost and accuracy rows, so the two join on it.
    """
    defaults = registered_defaults(kind, str(name)) or {}
    first = next(iter(defaults), None) if kind == "attention" else None
    p = {k: v for k, v in params_dict(params).items()
         if k not in _LABEL_SKIP and k != "backend" and (k == first or k not in defaults or not same_value(v, defaults[k]))}
    inner = ", ".join(f"{k}={fmt_value(v)}" for k, v in p.items())
    return f"{name}({inner})" if inner else str(name)


def variant_labels(df: pd.DataFrame) -> list[str]:
    """Each row's variant label (:func:`spec_label`); a layer pattern's (variant ``layers``) is the pattern as the row
    names it (``qwen3-next``, ``gated_deltanet*3; full``)."""
    from attn.patterns import LAYERS

    specs = df["variant_spec"] if "variant_spec" in df else pd.Series([None] * len(df), index=df.index)
    return [str(spec) if v == LAYERS and isinstance(spec, str) and spec else
            (f"layers({p.get('pattern')})" if v == LAYERS else spec_label(v, p))
            for v, p, spec in zip(df["variant"], df["variant_params"], specs, strict=True)]


def _spec_text_label(spec: Any) -> str | None:
    """``"rope_yarn:beta_fast=16"`` -> ``"rope_yarn(beta_fast=16)"``; None for a missing spec."""
    if not isinstance(spec, str) or not spec:
        return None
    name, _, rest = spec.partition(":")
    return f"{name}({rest.replace(',', ', ')})" if rest else name


def fmt_len(n: float) -> str:
    """Sequence lengths as people write them: 512, 1k, 16k (k = 1024)."""
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def lower_is_better(rows: pd.DataFrame) -> bool:
    """Whether the metric of ``rows`` (one task's, one metric's) is a loss, as its rows declare it (``metric_kind``)."""
    return bool((rows["metric_kind"] == "loss").any())


def declared(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every row's DECLARED columns (:func:`harness.schema.declaration`): its kind of metric, role, task
    label and whether it compares with full attention (fidelity, selection: drawn and tabled on their own)."""
    if len(df) and all(c in df for c in DECLARED) and df["metric_kind"].notna().all():
        return df
    df = df.copy()
    filled = pd.DataFrame([declaration(r) for r in df.to_dict("records")], index=df.index, columns=list(DECLARED))
    for c in DECLARED:
        df[c] = filled[c]
    df["versus_full"] = df["versus_full"].astype(bool)
    return df


# -- loading and validation -------------------------------------------------------------------

def _frame(rows: list[dict[str, Any]], numeric: Sequence[str]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for col in numeric:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df


def _require(df: pd.DataFrame, cols: Sequence[str], kind: str, sources: Iterable[str]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(
            f"{kind} rows in {', '.join(sorted(set(sources)))} lack column(s) {', '.join(missing)}; "
            f"{kind} rows need {', '.join(cols)}"
        )


def backend_labels(df: pd.DataFrame) -> list[str]:
    """The backend a series is drawn under, the same for its ok and its failed cells.

    A failed cell has no backend that ran, only the one requested (often ``auto``); so cells are
    grouped by the request, and a group is named by the backend that actually ran when that is one.
    """
    ran = df["backend"].astype(object).where(df["backend"].notna(), None)
    if "backend_requested" not in df:
        return [str(b) if isinstance(b, str) and b else "?" for b in ran]
    req = df["backend_requested"].astype(object).where(df["backend_requested"].notna(), "auto").astype(str)
    group = [c for c in ("variant_label", "device_key", "scope", "mode", *SHAPE_FIELDS) if c in df]
    keys = ["|".join(map(str, t)) + "|" + r for t, r in zip(df[group].itertuples(index=False), req, strict=True)]
    names: dict[str, set[str]] = {}
    for k, b in zip(keys, ran, strict=True):
        if isinstance(b, str) and b:
            names.setdefault(k, set()).add(b)
    out = []
    for k, r in zip(keys, req, strict=True):
        seen = names.get(k, set())
        out.append(next(iter(seen)) if len(seen) == 1 else r)
    return out


def machine_label(name: Any, device: Any, capability: Any) -> str:
    """The machine as readers see it: its name, and on CPU the vector units torch dispatched to (``AVX2``,
    ``AVX512``, ``AMX`` ...): one name, say "AMD EPYC (2 cores)", covers machines whose matmul peaks differ by 2x,
    so a table or figure is never one machine's when it mixes them."""
    label = str(name) if isinstance(name, str) and name else str(device)
    cpu = not str(device).startswith("cuda")
    return f"{label} {capability}" if cpu and isinstance(capability, str) and capability else label


def prepare_cost(df: pd.DataFrame) -> pd.DataFrame:
    """Add the derived columns (labels, device key, facet, series) to raw cost rows; idempotent."""
    df = df.copy()
    if "variant_params" not in df:
        df["variant_params"] = [{} for _ in range(len(df))]
    df["variant_params"] = [params_dict(p) for p in df["variant_params"]]
    for col in COST_NUMERIC:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    status = df["status"].astype(object).where(df["status"].notna(), None)
    # A row without a status is taken at its word: ok when it has a latency, an error otherwise.
    df["status"] = [s if isinstance(s, str) else ("ok" if pd.notna(lat) else "error")
                    for s, lat in zip(status, df["latency_ms"], strict=True)]
    df["variant_label"] = variant_labels(df)
    if "press_spec" in df:  # a KV press (scope hf): its own series
        df["variant_label"] = [lab if not isinstance(p, str) else f"{lab} + {p}"
                               for lab, p in zip(df["variant_label"], df["press_spec"], strict=True)]
    if "side" in df:  # sweep --base: the ref's and the working tree's variant are two series
        df["variant_label"] = [lab if not isinstance(s, str) else f"{lab} ({s})"
                               for lab, s in zip(df["variant_label"], df["side"], strict=True)]
    name = df["device_name"] if "device_name" in df else pd.Series([None] * len(df), index=df.index)
    cap = df["cpu_capability"] if "cpu_capability" in df else pd.Series(None, index=df.index, dtype=object)
    df["device_key"] = [machine_label(n, d, c) for n, d, c in zip(name, df["device"], cap, strict=True)]
    df["scope"] = df["scope"].fillna("op") if "scope" in df else "op"
    df["facet"] = df["scope"].astype(str) + " · " + df["mode"].astype(str)
    df["backend_label"] = backend_labels(df)
    df["label"] = df["variant_label"] + "/" + df["backend_label"]
    # Shape fields that vary within the frame go into the series name, so two shapes never share a line.
    varying = [c for c in SHAPE_FIELDS if c in df and df[c].astype(str).nunique() > 1]
    short = {"batch_size": "B", "num_heads": "H", "num_kv_heads": "H_kv", "head_dim": "D", "causal": "causal", "layers": "layers",
             "docs": "docs", "queries": "T", "budget_bytes": "budget", "ragged": "ragged"}

    def shown(c: str, v: Any) -> str:  # a budget in GiB, tokens per step as written
        return f"{v / 2**30:g}GiB" if c == "budget_bytes" else fmt_value(v)

    def suffix(row: pd.Series) -> str:
        parts = [f"{short.get(c, '')}{'=' if c in short else ''}{shown(c, row[c])}" for c in varying
                 if row[c] is not None and not (isinstance(row[c], float) and math.isnan(row[c]))]
        return f" [{' '.join(parts)}]" if parts else ""

    df["series"] = df["label"] + (df.apply(suffix, axis=1) if varying and len(df) else "")
    df["cell"] = cell_identity(df)
    return apart(df)


def prepare_accuracy(df: pd.DataFrame) -> pd.DataFrame:
    """Add labels and one ``length`` column (``eval_len``, or ``seq_len`` for fidelity rows)."""
    df = df.copy()
    for col in ACCURACY_NUMERIC:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    for col in ("variant_params", "position_params"):
        if col not in df:
            df[col] = [{} for _ in range(len(df))]
        df[col] = [params_dict(p) for p in df[col]]
    if "position" not in df:
        df["position"] = "none"
    df["position"] = df["position"].fillna("none")
    df["variant_label"] = variant_labels(df)
    if "press_spec" in df:  # a KV press (scope hf): its own series
        df["variant_label"] = [lab if not isinstance(p, str) else f"{lab} + {p}"
                               for lab, p in zip(df["variant_label"], df["press_spec"], strict=True)]
    df["position_label"] = [spec_label(v, p, "position") for v, p in zip(df["position"], df["position_params"], strict=True)]
    if "position_spec" in df:  # the method as asked for: its factor is set per evaluation length, not a new series
        asked = df["position_spec"].map(_spec_text_label)
        df["position_label"] = asked.where(asked.notna(), df["position_label"])
    length = pd.Series(np.nan, index=df.index)
    for col in ("eval_len", "seq_len"):
        if col in df:
            length = length.fillna(df[col])
    df["length"] = length
    df["task"] = df["task"].astype(str)
    df["metric"] = df["metric"].astype(str)
    return declared(df)


def load_results(paths: Sequence[str | os.PathLike]) -> Results:
    """Read JSONL results files; ``ValueError`` with one clear line for anything unusable."""
    if not paths:
        raise ValueError("no results files given")
    cost_rows: list[dict[str, Any]] = []
    acc_rows: list[dict[str, Any]] = []
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise ValueError(f"results file {p} does not exist")
        if not p.is_file():
            raise ValueError(f"results file {p} is not a regular file")
        rows, bad = scan_rows(p)  # ValueError naming the file if it is unreadable or binary
        if not rows:
            first = f" (line {bad[0]} is not a JSON object)" if bad else ""
            raise ValueError(f"results file {p} holds no complete rows{first}")
        warn_skipped(p, bad)  # e.g. a stray `1` or `[1, 2]` line: skipped, but said
        known = 0
        for i, r in enumerate(rows):
            if ("task" in r or "metric" in r) and "variant" not in r and isinstance(r.get("variant_spec"), str):
                r = {**r, "variant": r["variant_spec"].split(":")[0]}  # written before rows named it
            if ("task" in r or "metric" in r or ("seq_len" in r and ("latency_ms" in r or "status" in r))) and (
                    why := row_problem(r)):
                raise ValueError(f"{p} line {numbered_rows(p)[i][0]}: {why}")
            r = {**r, "results_file": str(p)}  # not "source": fidelity rows have a source column of their own
            if "task" in r or "metric" in r:
                acc_rows.append(r)
            elif "seq_len" in r and ("latency_ms" in r or "status" in r):
                cost_rows.append(r)
            else:
                continue
            known += 1
        if not known:
            raise ValueError(
                f"results file {p} holds neither cost rows (with {', '.join(COST_REQUIRED)}) "
                f"nor accuracy rows (with {', '.join(ACCURACY_REQUIRED)})"
            )
    cost, acc = pd.DataFrame(), pd.DataFrame()
    if cost_rows:
        cost = _frame(cost_rows, COST_NUMERIC)
        _require(cost, COST_REQUIRED, "cost", cost["results_file"])
        cost = prepare_cost(cost)
    if acc_rows:
        acc = _frame(acc_rows, ACCURACY_NUMERIC)
        _require(acc, ACCURACY_REQUIRED, "accuracy", acc["results_file"])
        if "eval_len" not in acc and "seq_len" not in acc:
            raise ValueError(f"accuracy rows in {', '.join(sorted(set(acc['results_file'])))} lack column eval_len")
        acc = prepare_accuracy(acc)
    return Results(cost=cost, accuracy=acc, sources=[str(p) for p in paths])


def status_counts(cost: pd.DataFrame) -> str:
    """``"oom: 3, error: 2"``, known statuses first."""
    counts = cost["status"].value_counts()
    order = [s for s in STATUSES if s in counts] + sorted(set(counts.index) - set(STATUSES))
    return ", ".join(f"{s}: {counts[s]}" for s in order)


def ok_rows(cost: pd.DataFrame, column: str = "latency_ms") -> pd.DataFrame:
    """Cells that ran and measured ``column``; nothing else is ever drawn as a value."""
    if len(cost) == 0 or column not in cost:
        return cost.iloc[0:0]
    return cost[(cost["status"] == "ok") & cost[column].notna() & np.isfinite(cost[column].astype(float))]


def require_ok(cost: pd.DataFrame, sources: Iterable[str] = ()) -> None:
    """Refuse a frame with no usable cost rows, saying what the rows were instead."""
    if len(cost) == 0:
        raise ValueError(f"no cost rows in {', '.join(sources) or 'the input'}")
    if len(ok_rows(cost)) == 0:
        first = cost["error"].dropna().astype(str) if "error" in cost else pd.Series(dtype=str)
        hint = f"; first error: {first.iloc[0].splitlines()[0][:160]}" if len(first) else ""
        where = ", ".join(sorted(set(cost["results_file"]))) if "results_file" in cost else "the input"
        raise ValueError(f"no ok cost rows in {where} ({status_counts(cost)}){hint}")


def devices(cost: pd.DataFrame) -> list[str]:
    return sorted(cost["device_key"].unique()) if len(cost) else []


def check_single_device(cost: pd.DataFrame) -> None:
    """Lines from two machines on one axis would mislead: refuse, naming the devices."""
    devs = devices(cost)
    if len(devs) > 1:
        counts = cost["device_key"].value_counts()
        listed = "; ".join(f"{d!r} ({counts[d]} rows)" for d in devs)
        raise ValueError(f"results mix {len(devs)} devices: {listed}; pick one with --device")


def select_device(cost: pd.DataFrame, device: str | None) -> pd.DataFrame:
    """Rows whose device or device name contains ``device`` (case-insensitive)."""
    if device is None or len(cost) == 0:
        return cost
    needle = device.lower()
    hit = cost["device_key"].str.lower().str.contains(needle, regex=False) | \
        cost["device"].astype(str).str.lower().str.contains(needle, regex=False)
    if not hit.any():
        raise ValueError(f"no cost rows on a device matching {device!r}; devices: {', '.join(devices(cost))}")
    return cost[hit]


def latest(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """One row per cell: the last one read (a re-run or ``--resume`` supersedes what came before)."""
    keys = [k for k in keys if k in df]
    if len(df) == 0:
        return df
    return df.loc[df[keys].astype(str).drop_duplicates(keep="last").index]


CELL = ("device_key", "cell")


def cells(cost: pd.DataFrame) -> pd.DataFrame:
    """The latest row of every cost cell (its identity, harness.results.COST_KEY_FIELDS, on one device)."""
    return latest(cost if "cell" in cost else prepare_cost(cost), CELL)


__all__ = [
    "ACCURACY_REQUIRED", "COST_REQUIRED", "Results", "cells", "check_single_device", "devices", "fmt_len", "fmt_value",
    "declared", "latest", "load_results", "lower_is_better", "machine_label", "ok_rows", "prepare_accuracy",
    "prepare_cost", "preset_width",
    "require_ok", "select_device", "spec_label", "status_counts",
]
