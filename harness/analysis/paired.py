"""Intervals over paired examples, for scores every arm earns on the same prompts (the frontier's).

Examples are resampled in their *clusters*: the prompts that share all but what is asked answer together (passkey's
keys at one depth sit in one haystack, and a model finds all of them or none), so a resample draws whole clusters and
an interval counts the independent draws the examples really are. Examples with no cluster given are their own
(``clusters`` None). Intervals: Wilson's for 0/1 outcomes, on one draw per cluster (harness.accuracy.stats.wilson's,
which this layer may not import), else a percentile bootstrap; one seed gives every method the same resamples.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import binomtest, norm

Clusters = Sequence[Sequence[int]]  # per task, the sizes of its consecutive clusters of examples


def wilson(k: float, n: float) -> tuple[float, float]:
    """95 % Wilson score interval (scipy's, as harness.accuracy.stats.wilson, for whole ``k`` and ``n``); a fractional
    ``k`` of an effective ``n`` by its formula."""
    if n <= 0:
        return (float("nan"), float("nan"))
    if float(k).is_integer() and float(n).is_integer():
        ci = binomtest(int(k), int(n)).proportion_ci(method="wilson")
        return (float(ci.low), float(ci.high))
    z, p = float(norm.ppf(0.975)), k / n
    mid, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (float((mid - half) / (1 + z * z / n)), float((mid + half) / (1 + z * z / n)))


def singletons(arrays: Sequence[np.ndarray]) -> list[list[int]]:
    return [[1] * len(a) for a in arrays]


def resample_indices(clusters: Clusters, boot: int, seed: int) -> list[np.ndarray]:
    """One (boot, n) example-index resample per task, drawing whole clusters: the same seed gives every method the same
    draws (singletons draw exactly as an example resample). Clusters of unequal sizes are resampled as singletons."""
    rng = np.random.default_rng(seed)
    out = []
    for sizes in clusters:
        sizes = list(sizes) if len(set(sizes)) == 1 else [1] * int(sum(sizes))
        pick = rng.integers(0, len(sizes), size=(boot, len(sizes)))
        out.append((pick[..., None] * sizes[0] + np.arange(sizes[0])).reshape(boot, -1))
    return out


def _resampled(arrays: Sequence[np.ndarray], draws: Sequence[np.ndarray]) -> np.ndarray:
    """Per resample, the mean over tasks (equal weight) of each task's resampled mean."""
    return np.mean([a[i].mean(axis=-1) for a, i in zip(arrays, draws, strict=True)], axis=0)


def percentile_ci(v: np.ndarray) -> tuple[float, float]:
    return tuple(float(q) for q in np.percentile(v, [2.5, 97.5]))  # type: ignore[return-value]


def interval(arrays: Sequence[np.ndarray], boot: int = 2000, seed: int = 0,
             clusters: Clusters | None = None) -> tuple[float, float, float]:
    """(score, lo, hi) of the equal-weight mean over tasks: Wilson for 0/1 outcomes on equal-sized tasks (then the
    pooled proportion is that mean), on as many draws as there are clusters (a cluster counted as one: its examples
    answer together; a perfect score keeps an interval, which a bootstrap would collapse), else a percentile bootstrap
    within each task."""
    arrays = [np.asarray(a, dtype=float) for a in arrays]
    clusters = clusters or singletons(arrays)
    score = float(np.mean([a.mean() for a in arrays]))
    if all(np.isin(a, (0.0, 1.0)).all() for a in arrays) and len({len(a) for a in arrays}) == 1:
        n = sum(len(c) for c in clusters)
        return score, *wilson(score * n if n != sum(len(a) for a in arrays) else int(sum(a.sum() for a in arrays)), n)
    return score, *percentile_ci(_resampled(arrays, resample_indices(clusters, boot, seed)))


def paired_difference(a: np.ndarray | Sequence[np.ndarray], b: np.ndarray | Sequence[np.ndarray], boot: int = 2000,
                      seed: int = 0, clusters: Clusters | None = None) -> tuple[float, float, float]:
    """(mean of a - b, 2.5 %, 97.5 % percentile) over resamples that move both arms together, because both answered
    the same prompts. ``a``, ``b``: one array, or one per task (the mean over tasks, equal weight)."""
    many = not isinstance(a, np.ndarray) and len(a) and not np.isscalar(a[0])
    xs, ys = ([np.asarray(x, dtype=float) for x in (v if many else [v])] for v in (a, b))
    if [len(x) for x in xs] != [len(y) for y in ys]:
        raise ValueError("paired arms must hold the same examples")
    d = [x - y for x, y in zip(xs, ys, strict=True)]
    draws = resample_indices(clusters or singletons(d), boot, seed)
    return float(np.mean([di.mean() for di in d])), *percentile_ci(_resampled(d, draws))


__all__ = ["Clusters", "interval", "paired_difference", "percentile_ci", "resample_indices", "singletons", "wilson"]
