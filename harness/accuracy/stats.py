"""Confidence intervals for accuracy rows, and the across-seed summary.

Per seed, an accuracy over n independent examples gets the Wilson score interval (Wilson 1927): unlike the
normal approximation it stays inside [0, 1] and is not degenerate at 0 % or 100 %, which is where
long-context tasks live. When one example holds several scored answers (MQAR's queries, a passkey's digits)
they are not independent trials: per-answer accuracy gets a cluster-robust interval with the example as the
cluster (:func:`clustered_accuracy`). Across seeds, the mean gets a Student t interval (seeds are few), clipped
to the metric's range for proportions and marked so (``ci_clipped``).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.results import best_lr  # one rule for the summary and the figures
from harness.schema import declaration


@dataclass(frozen=True)
class Measure:
    """One metric of one cell: the value, its interval and how many observations it rests on."""

    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 0
    per_example: tuple[float, ...] | None = None  # each example's score, in the examples' order (paired comparisons)


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (scipy's implementation)."""
    if n <= 0:
        return (math.nan, math.nan)
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def accuracy(successes: int, n: int, confidence: float = 0.95, outcomes: Sequence[bool] | None = None) -> Measure:
    """``outcomes``: each example's success, kept on the row for paired comparisons across arms."""
    lo, hi = wilson(successes, n, confidence)
    kept = tuple(float(o) for o in outcomes) if outcomes is not None else None
    return Measure(successes / n if n else math.nan, lo, hi, n, kept)


def cluster_se(correct: Sequence[int], totals: Sequence[int]) -> float:
    """Cluster-robust standard error of sum(correct) / sum(totals), each example one cluster: the ratio estimator's
    sandwich form sqrt(G/(G-1) sum_i (c_i - p t_i)^2) / sum(t) -- statsmodels' cluster-robust standard error of an
    intercept-only regression (tests/test_accuracy_data.py checks it against statsmodels)."""
    import numpy as np

    c, m = np.asarray(correct, dtype=np.float64), np.asarray(totals, dtype=np.float64)
    G, p = len(m), float(c.sum() / m.sum())
    return math.sqrt(G / (G - 1) * float(((c - p * m) ** 2).sum())) / float(m.sum())


def clustered_accuracy(correct: Sequence[int], totals: Sequence[int], confidence: float = 0.95,
                       keep: bool = False) -> Measure:
    """Accuracy over every scored answer, sum(correct) / sum(totals), when the answers of one example (``correct[i]``
    right of ``totals[i]``) are not independent trials.

    The interval is Wilson's at the *effective* number of answers, sum(totals) / deff, with the design effect
    deff = (cluster-robust variance) / (binomial variance), at least 1 (Kish 1965; a survey statistician's
    Wilson-with-design-effect interval): it stays inside [0, 1] and does not collapse at 0 % or 100 %, where every
    example agrees and the cluster variance is 0 -- there the effective count is the number of examples, as if
    each example were one trial. ``n`` is the number of examples."""
    G, total = len(totals), float(sum(totals))
    if G == 0 or total <= 0:
        return Measure(math.nan, None, None, 0)
    p = sum(correct) / total
    if 0 < p < 1 and G > 1:
        deff = max(1.0, cluster_se(correct, totals) ** 2 / (p * (1 - p) / total))
        n_eff = total / deff
    else:
        n_eff = float(G)
    lo, hi = _wilson_float(p, n_eff, confidence)
    return Measure(p, lo, hi, G, tuple(c / t for c, t in zip(correct, totals, strict=True)) if keep else None)


def _wilson_float(p: float, n: float, confidence: float) -> tuple[float, float]:
    """Wilson's score interval for a proportion p observed over a (possibly fractional) effective count n."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + confidence / 2))
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_ci(values: Sequence[float], confidence: float = 0.95,
            bounds: tuple[float, float] | None = None) -> Measure:
    """Mean with a Student t interval; one value gives no interval (None). ``bounds``: clip the interval to the
    metric's range (a proportion's t interval can otherwise leave [0, 1])."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Measure(math.nan, None, None, 0)
    mean = sum(xs) / n
    if n == 1:
        return Measure(mean, None, None, 1)
    from scipy.stats import t

    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if bounds is not None:
        lo, hi = max(bounds[0], lo), min(bounds[1], hi)
    return Measure(mean, lo, hi, n)


# Columns that identify a measured quantity apart from the seed (and the run id, which holds the seed).
SUMMARY_KEYS = (
    "task", "variant", "variant_params", "position", "position_params", "train_len", "eval_len", "metric",
    "stage", "source", "layer", "subtask", "num_pairs", "gap", "depth", "model", "steps", "variant_spec", "position_spec",
    "gap_rule", "d_model", "lr", "short_conv", "press_spec", "query_aware", "dtype",
)


def summarize(rows: Iterable[dict[str, Any]], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Group per-seed rows by everything but the seed: mean over seeds with a t interval.

    ``n`` is the number of seeds; ``ci_low``/``ci_high`` are None with a single seed; a proportion's interval is
    clipped to [0, 1] and ``ci_clipped`` says whether clipping moved it.
    """
    import json

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("status", "ok") != "ok" or r.get("value") is None:
            continue
        key = json.dumps({k: r.get(k) for k in SUMMARY_KEYS}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(r)
    out = []
    for members in groups.values():
        values = [r["value"] for r in members]
        first = members[0]
        share = declaration(first)["metric_kind"] == "proportion"  # its interval clipped to [0, 1]
        m = mean_ci(values, confidence, (0.0, 1.0) if share else None)
        raw = mean_ci(values, confidence)
        out.append({**{k: first.get(k) for k in SUMMARY_KEYS}, "value": m.value, "ci_low": m.ci_low,
                    "ci_high": m.ci_high, "n": m.n, "seeds": sorted(r.get("seed") for r in members),
                    "ci_clipped": (m.ci_low, m.ci_high) != (raw.ci_low, raw.ci_high)})
    return out


def summarize_best_lr(rows: Iterable[dict[str, Any]], confidence: float = 0.95, higher: bool = True) -> list[dict[str, Any]]:
    """:func:`summarize` after Zoology's learning-rate rule (:func:`harness.results.best_lr`): each seed of a point
    keeps only its best rate (highest value, or lowest with ``higher=False``), then seeds are averaged. The
    summary's ``lr`` is None, since seeds may differ in their best rate."""
    ok = [r for r in rows if r.get("status", "ok") == "ok" and r.get("value") is not None]
    return summarize([{**ok[i], "lr": None} for i in best_lr(ok, SUMMARY_KEYS, higher)], confidence)


__all__ = ["Measure", "SUMMARY_KEYS", "accuracy", "cluster_se", "clustered_accuracy", "mean_ci", "summarize",
           "summarize_best_lr", "wilson"]
