"""Confidence intervals for accuracy rows, and the across-seed summary.

Per seed, an accuracy over n examples gets the Wilson score interval (Wilson 1927): unlike the
normal approximation it stays inside [0, 1] and is not degenerate at 0 % or 100 %, which is where
long-context tasks live. Across seeds, the mean gets a Student t interval (seeds are few).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measure:
    """One metric of one cell: the value, its interval and how many observations it rests on."""

    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 0


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (scipy's implementation)."""
    if n <= 0:
        return (math.nan, math.nan)
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def accuracy(successes: int, n: int, confidence: float = 0.95) -> Measure:
    lo, hi = wilson(successes, n, confidence)
    return Measure(successes / n if n else math.nan, lo, hi, n)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Measure:
    """Mean with a Student t interval; one value gives no interval (None)."""
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
    return Measure(mean, mean - half, mean + half, n)


# Columns that identify a measured quantity apart from the seed (and the run id, which holds the seed).
SUMMARY_KEYS = (
    "task", "variant", "variant_params", "position", "position_params", "train_len", "eval_len", "metric",
    "stage", "source", "layer", "num_pairs", "gap", "depth", "model", "steps", "variant_spec", "position_spec",
    "gap_rule",
)


def summarize(rows: Iterable[dict[str, Any]], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Group per-seed rows by everything but the seed: mean over seeds with a t interval.

    ``n`` is the number of seeds; ``ci_low``/``ci_high`` are None with a single seed.
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
        m = mean_ci([r["value"] for r in members], confidence)
        first = members[0]
        out.append({**{k: first.get(k) for k in SUMMARY_KEYS}, "value": m.value, "ci_low": m.ci_low,
                    "ci_high": m.ci_high, "n": m.n, "seeds": sorted(r.get("seed") for r in members)})
    return out


__all__ = ["Measure", "SUMMARY_KEYS", "accuracy", "mean_ci", "summarize", "wilson"]
