"""Numbers derived from prepared frames: trust masks, exponents, speed-ups, crossovers, reach, accuracy points.

Every number the figures, the report and ``compare`` state is computed here, from frames made by
:mod:`harness.analysis.frames`; nothing here reads files or draws.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.frames import (
    FAILED,
    MEM_LIMIT_COLUMNS,
    cells,
    declared,
    fmt_value,
    lower_is_better,
    ok_rows,
)
from harness.analysis.trust import untrusted
from harness.messages import one_line
from harness.results import best_lr

# -- derived numbers ---------------------------------------------------------------------------

MIN_FIT_POINTS = 3  # a line through two points always fits: an exponent needs at least three lengths


def scaling_fit(lengths: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """(slope, R²) of the least-squares line of log(value) on log(length); NaNs under 3 distinct lengths."""
    x, y = np.asarray(lengths, dtype=float), np.asarray(values, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if np.unique(x[keep]).size < MIN_FIT_POINTS:
        return math.nan, math.nan
    lx, ly = np.log(x[keep]), np.log(y[keep])
    slope, intercept = np.polyfit(lx, ly, 1)
    ss_res, ss_tot = float(((ly - (slope * lx + intercept)) ** 2).sum()), float(((ly - ly.mean()) ** 2).sum())
    return float(slope), (1.0 - ss_res / ss_tot) if ss_tot > 0 else 1.0


def scaling_exponent(lengths: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) on log(length): 2 for quadratic attention, 1 for linear (NaN under 3 lengths)."""
    return scaling_fit(lengths, values)[0]


def plausible_exponent(exponent: float, r2: float) -> bool:
    """A latency or memory exponent worth stating: a good fit (R² >= 0.9) between 0 and 3.

    Below 0 (cost falling with length) or with a poor fit, fixed per-call costs or noise dominate the
    range; attention's cost is at most quadratic in length, so above 3 something else is measured.
    """
    return math.isfinite(exponent) and math.isfinite(r2) and r2 >= 0.9 and 0.0 <= exponent <= 3.0


def fit_exponents(cost: pd.DataFrame, column: str = "latency_ms", upper_half: bool = True) -> pd.DataFrame:
    """Scaling exponent of ``column`` per series and facet, with the fit's R² and its number of lengths.

    With ``upper_half`` the fit uses the longer half of the ok lengths (at least 3 points when
    there are), where fixed per-call overheads no longer flatten the curve. Under 3 lengths: NaN.
    """
    out = []
    for (series, facet), g in cells(ok_rows(cost, column)).groupby(["series", "facet"], sort=True):
        g = g.sort_values("seq_len")
        if upper_half and len(g) > 3:
            g = g.iloc[max(0, min(len(g) // 2, len(g) - 3)):]
        exponent, r2 = scaling_fit(g["seq_len"], g[column])
        out.append({"series": series, "facet": facet, "exponent": exponent, "r2": r2,
                    "from_len": g["seq_len"].min(), "to_len": g["seq_len"].max(), "points": g["seq_len"].nunique()})
    return pd.DataFrame(out, columns=["series", "facet", "exponent", "r2", "from_len", "to_len", "points"])


def speedups(cost: pd.DataFrame) -> pd.DataFrame:
    """Every ok non-``full`` cell with the fastest ok ``full`` latency at the same length and context.

    The baseline is the fastest backend of ``full`` that ran (what a user would actually use).
    ``untrusted`` / ``full_untrusted`` say whether the cell or its baseline is noisy or suspect.
    """
    ok = cells(ok_rows(cost))
    context = ["device_key", "facet", "seq_len", *[c for c in ("dtype", "batch_size", "num_heads", "head_dim", "position")
                                                   if c in ok]]
    ok = ok.assign(**{c: ok[c].astype(str) for c in context if c not in ("seq_len",)}, untrusted=untrusted(ok))
    full = ok[ok["variant"] == "full"]
    base = full.loc[full.groupby(context)["latency_ms"].idxmin().to_numpy(), [*context, "latency_ms", "untrusted"]]
    base = base.rename(columns={"latency_ms": "full_latency_ms", "untrusted": "full_untrusted"})
    other = ok[ok["variant"] != "full"]
    merged = other.merge(base, on=context, how="inner")
    merged["speedup"] = merged["full_latency_ms"] / merged["latency_ms"]
    return merged


def crossovers(cost: pd.DataFrame) -> pd.DataFrame:
    """Per series and facet: the shortest measured length from which the variant beats ``full``
    at every longer matched length (NaN if it does not win at the longest one)."""
    sp = speedups(cost)
    out = []
    for (series, facet), g in sp.groupby(["series", "facet"], sort=True):
        g = g.sort_values("seq_len")
        wins = (g["speedup"] > 1).to_numpy()
        cross = math.nan
        if wins[-1]:
            losing = np.flatnonzero(~wins)
            first = losing[-1] + 1 if losing.size else 0
            cross = float(g["seq_len"].iloc[first])
        out.append({"series": series, "facet": facet, "crossover_len": cross,
                    "speedup_at_longest": float(g["speedup"].iloc[-1]), "longest_matched": float(g["seq_len"].iloc[-1]),
                    "matched_lengths": int(g["seq_len"].nunique()), "wins_everywhere": bool(wins.all())})
    return pd.DataFrame(out, columns=["series", "facet", "crossover_len", "speedup_at_longest", "longest_matched",
                                      "matched_lengths", "wins_everywhere"])


def longest_reached(cost: pd.DataFrame) -> pd.DataFrame:
    """Per series and facet: the longest ok length, and the failure (oom, timeout or error) that stopped it,
    if any, with its reason (the row's ``error``, shortened)."""
    out = []
    for (series, facet), g in cells(cost).groupby(["series", "facet"], sort=True):
        ok = g[(g["status"] == "ok") & g["latency_ms"].notna()]
        longest = float(ok["seq_len"].max()) if len(ok) else math.nan
        beyond = g[(g["seq_len"] > longest) if len(ok) else slice(None)]
        failed = beyond[beyond["status"].isin((*FAILED, "error"))].sort_values("seq_len")
        why = failed["error"].iloc[0] if len(failed) and "error" in failed else None
        out.append({
            "series": series, "facet": facet, "longest_ok": longest,
            "stopped_by": failed["status"].iloc[0] if len(failed) else "",
            "stopped_at": float(failed["seq_len"].iloc[0]) if len(failed) else math.nan,
            "why": short_reason(why),
            "tried_up_to": float(g["seq_len"].max()),
        })
    return pd.DataFrame(out, columns=["series", "facet", "longest_ok", "stopped_by", "stopped_at", "why", "tried_up_to"])


def short_reason(text: Any, width: int = 120) -> str:
    """A row's error text on one line, cut to ``width`` characters ("" for none)."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return ""
    return one_line(text, width)


# Task-specific columns that tell measurements apart: each value gets its own line / heatmap row.
# (``d_model`` and ``short_conv``: a model's width and short convolution make it another model, never a seed.)
SERIES_DIMS = ("stage", "source", "layer", "subtask", "num_pairs", "gap_rule", "gap", "model", "steps", "d_model", "short_conv")
AVERAGED_DIMS = ("depth",)  # averaged in per-length views; an axis of its own in the passkey heatmap


def dim_text(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt_value(v)


@functools.cache
def _t_quantiles(confidence: float, dof: int) -> tuple[float, float]:
    """The two Student t quantiles of a ``confidence`` interval: scipy's ``t.interval`` is these times the scale plus
    the mean, so one lookup per degree of freedom gives its numbers without its per-call overhead (~1 ms)."""
    from scipy import stats

    alpha = np.asarray(confidence)
    return float(stats.t.ppf((1.0 - alpha) / 2, dof)), float(stats.t.ppf((1.0 + alpha) / 2, dof))


def _seed_ci(values: np.ndarray, confidence: float = 0.95,
             bounds: tuple[float, float] | None = None) -> tuple[float, float]:
    """Student t interval of the mean over seeds (as the accuracy harness reports it), clipped to ``bounds``
    (a proportion's t interval can leave [0, 1])."""
    sem = np.std(values, axis=0, ddof=1) / len(values) ** 0.5  # scipy.stats.sem
    if not np.isfinite(sem) or sem == 0:
        m = float(np.mean(values))
        return m, m
    q_lo, q_hi = _t_quantiles(confidence, len(values) - 1)
    mean = float(np.mean(values))
    lo, hi = q_lo * sem + mean, q_hi * sem + mean
    if bounds is not None:
        lo, hi = max(bounds[0], lo), min(bounds[1], hi)
    return float(lo), float(hi)


def best_lr_rows(acc: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """The rows of each seed's best learning rate, per point (rows equal on ``keys``): Zoology's rule, as
    :func:`harness.results.best_lr` defines it for the accuracy summary too; best follows the metric's direction."""
    if "lr" not in acc or acc["lr"].nunique() < 2:
        return acc
    keep = np.zeros(len(acc), dtype=bool)
    for _, at in declared(acc).groupby(["task", "metric"], sort=False).indices.items():
        g = acc.iloc[at]
        records = g[[c for c in (*keys, "seed", "lr", "value") if c in g]].to_dict("records")
        keep[at[best_lr(records, keys, higher=not lower_is_better(declared(g)))]] = True
    return acc[keep]


def accuracy_points(acc: pd.DataFrame, extra: Sequence[str] = ()) -> pd.DataFrame:
    """One value per (task, metric, variant, position, train length, eval length, task columns, *extra).

    Where one configuration was trained at several learning rates, each seed keeps only its best rate
    (:func:`best_lr_rows`). Rows that differ only in the seed are then averaged, with a t interval over
    seeds, clipped to [0, 1] for proportions (a single row keeps its own CI). Averaged dimensions (passkey
    ``depth``) not named in ``extra`` are then averaged too, and such points have no CI. ``extra_label``
    names the task columns that vary within a task/metric panel (``"num_pairs=8"``), for legends.
    """
    acc = declared(acc)
    acc = acc[acc["value"].notna() & np.isfinite(acc["value"].astype(float))]
    if "status" in acc:
        acc = acc[acc["status"].fillna("ok") == "ok"]
    acc = acc.reset_index(drop=True)
    acc["train_len"] = acc["train_len"].fillna(-1.0) if "train_len" in acc else -1.0
    dims = [c for c in SERIES_DIMS if c in acc and c not in extra]
    if "gap_rule" in dims:  # MQAR's gap as a rule (0, half, max): its token count grows with the length
        dims = [c for c in dims if c != "gap"]
    for c in dims:
        acc[c] = acc[c].map(dim_text)
    kept = [c for c in extra if c in acc]
    averaged = [c for c in AVERAGED_DIMS if c in acc and c not in kept]
    for c in (*kept, *averaged):
        acc[c] = acc[c].fillna(-1.0) if pd.api.types.is_numeric_dtype(acc[c]) else acc[c].map(dim_text)
    base = ["task", "metric", "metric_kind", "variant_label", "position_label", "train_len", "length", *dims, *kept]
    acc = best_lr_rows(acc, [*base, *averaged])
    value = acc["value"].to_numpy(dtype=float)
    ci_low, ci_high = (acc[c].to_numpy(dtype=float) if c in acc else np.full(len(acc), np.nan) for c in ("ci_low", "ci_high"))
    rows = []
    # each group's row positions, in the groups' sorted order: a frame per group cost more than all the rest
    for key, at in acc.groupby([*base, *averaged], sort=True, dropna=False).indices.items():
        vals = value[at]
        if len(vals) > 1:
            lo, hi = _seed_ci(vals, bounds=(0.0, 1.0) if key[2] == "proportion" else None)
        else:
            lo, hi = float(ci_low[at[0]]), float(ci_high[at[0]])
        rows.append((*key, float(vals.mean()), len(vals), lo, hi))
    pts = pd.DataFrame(rows, columns=[*base, *averaged, "value", "rows", "ci_low", "ci_high"])
    if averaged and len(pts):
        pts = pts.groupby(base, as_index=False, sort=True, dropna=False).agg(
            value=("value", "mean"), rows=("rows", "sum"), points=("value", "size"),
            ci_low=("ci_low", "first"), ci_high=("ci_high", "first"))
        pts.loc[pts["points"] > 1, ["ci_low", "ci_high"]] = np.nan
        pts = pts.drop(columns="points")
    for c in ("train_len", *kept):
        if c in pts and pd.api.types.is_numeric_dtype(pts[c]):
            pts[c] = pts[c].where(pts[c] >= 0)
    labels = pd.Series("", index=pts.index)
    for _, g in pts.groupby(["task", "metric"], sort=False):
        varying = [c for c in dims if g[c].nunique() > 1]
        if varying:
            labels[g.index] = [" ".join(f"{c}={v}" for c, v in zip(varying, vals, strict=True) if v)
                               for vals in g[varying].itertuples(index=False)]
    pts["extra_label"] = labels
    return pts


def best_positions(acc: pd.DataFrame) -> pd.DataFrame:
    """Best position method per task, metric and evaluation length (direction: as the rows declare the metric)."""
    acc = declared(acc) if len(acc) else acc
    pts = accuracy_points(acc[~acc["versus_full"]]) if len(acc) else pd.DataFrame()
    out = []
    if len(pts) == 0:
        return pd.DataFrame(columns=["task", "metric", "variant", "eval_len", "best_position", "value", "runner_up"])
    for (task, metric, variant, extra, length), g in pts.groupby(["task", "metric", "variant_label", "extra_label", "length"],
                                                                  sort=True):
        variant = f"{variant} [{extra}]" if extra else variant
        per = g.groupby("position_label")["value"].mean().sort_values(ascending=lower_is_better(g))
        if len(per) < 2:  # one method: nothing to rank
            continue
        tied = per[np.isclose(per, per.iloc[0], rtol=1e-9, atol=1e-12)]
        rest = per.iloc[len(tied):]
        out.append({"task": task, "metric": metric, "variant": variant, "eval_len": length,
                    "best_position": " = ".join(sorted(tied.index)), "value": float(per.iloc[0]),
                    "runner_up": f"{rest.index[0]} ({rest.iloc[0]:.4g})" if len(rest) else ""})
    return pd.DataFrame(out)


def mem_limit(cost: pd.DataFrame) -> float | None:
    """The device memory capacity in bytes, when the rows carry it."""
    for col in MEM_LIMIT_COLUMNS:
        if col in cost:
            vals = pd.to_numeric(cost[col], errors="coerce").dropna()
            if len(vals):
                return float(vals.max())
    return None


__all__ = [
    "AVERAGED_DIMS", "MIN_FIT_POINTS", "SERIES_DIMS", "accuracy_points", "best_lr_rows", "best_positions",
    "crossovers", "dim_text", "fit_exponents", "longest_reached", "mem_limit", "plausible_exponent",
    "scaling_exponent", "scaling_fit", "short_reason", "speedups",
]
