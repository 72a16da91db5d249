"""Intervals and tests over paired examples, for scores every arm earns on the same prompts (the frontier's).

Examples are pooled into their independent *draws* first: the prompts that share all but what is asked answer together
(passkey's keys in one haystack: a model finds all of them or none), so a draw is a cluster's mean and every count
below is of draws, never of examples. A score pooled over tasks is the equal-weight mean of each task's mean draw;
its draws then carry unequal weights (1 / (tasks x that task's draws)) and count as Kish's effective number
n_eff = 1 / sum(w^2) (Kish 1965): five passkey haystacks beside twenty RULER prompts are not 25 draws, and not 45.

- Interval of a score (every score here lies in [0, 1]): Wilson's score interval at n_eff. Never of zero width, not
  even at 0 or 1; for a score that is not 0/1 (a share of words found) it is conservative, since the variance of a
  [0, 1] value is at most p (1 - p).
- Interval of a paired difference: Newcombe's hybrid score interval for paired proportions (Newcombe 1998, method 10)
  from the two Wilson intervals and the arms' correlation over the draws, with Newcombe's continuity-corrected
  correlation (max(cov - 1 / (2 n), 0) / sd_a sd_b): two arms that agree on every draw keep an interval around 0.
- Test of a paired difference: the sign-flip permutation test of the weighted draw differences (two-sided). Exact:
  the differences are whole multiples of one unit (scores are shares of a few keys or words, weights 1 / draws), so
  the null distribution of their signed sum is counted exactly; a seeded Monte Carlo of :data:`MC_FLIPS` flips only
  where no such unit exists. On 0/1 draws of equal weight it *is* the exact sign test on the discordant draws
  (McNemar's exact test), computed so.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
from scipy.stats import binomtest, norm

Clusters = Sequence[Sequence[int]]  # per task, the sizes of its consecutive clusters of examples
MAX_UNITS = 200_000  # the longest signed-sum range the exact sign-flip test counts over
MC_FLIPS = 20_000  # where the differences share no unit, seeded random flips
ALPHA = 0.05


def wilson(k: float, n: float) -> tuple[float, float]:
    """95 % Wilson score interval (scipy's for whole ``k`` and ``n``; a fractional ``k`` of an effective ``n`` by its
    formula, clipped to [0, 1])."""
    if n <= 0:
        return (float("nan"), float("nan"))
    if float(k).is_integer() and float(n).is_integer():
        ci = binomtest(int(k), int(n)).proportion_ci(method="wilson")
        return (float(ci.low), float(ci.high))
    z, p = float(norm.ppf(0.975)), min(max(k / n, 0.0), 1.0)
    mid, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (float(max((mid - half) / (1 + z * z / n), 0.0)), float(min((mid + half) / (1 + z * z / n), 1.0)))


def singletons(arrays: Sequence[np.ndarray]) -> list[list[int]]:
    return [[1] * len(a) for a in arrays]


def draws(ex: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """One value per independent draw: the mean of each consecutive cluster of examples."""
    ex = np.asarray(ex, dtype=float)
    if sum(sizes) != len(ex):
        raise ValueError(f"clusters of {sum(sizes)} examples for {len(ex)} examples")
    edges = np.cumsum([0, *sizes])
    return np.array([ex[a:b].mean() for a, b in zip(edges[:-1], edges[1:], strict=True)])


def _weighted(arrays: Sequence[np.ndarray], clusters: Clusters | None) -> tuple[np.ndarray, np.ndarray]:
    """(values, weights) of every draw of every task: weights 1 / (tasks x the task's draws), summing to 1."""
    arrays = [np.asarray(a, dtype=float) for a in arrays]
    ds = [draws(a, c) for a, c in zip(arrays, clusters or singletons(arrays), strict=True)]
    return np.concatenate(ds), np.concatenate([np.full(len(d), 1 / (len(ds) * len(d))) for d in ds])


def _mean(v: np.ndarray, w: np.ndarray) -> float:
    return float(min(max(math.fsum(v * w), 0.0), 1.0))  # correctly rounded: a perfect score is 1.0, not 1 + 2e-16


def effective_n(weights: np.ndarray) -> float:
    """Kish's effective sample size of a weighted mean: (sum w)^2 / sum w^2."""
    return float(round(math.fsum(weights) ** 2 / math.fsum(weights**2), 9))


def interval(arrays: Sequence[np.ndarray], clusters: Clusters | None = None) -> tuple[float, float, float, float]:
    """(score, lo, hi, n_eff) of the equal-weight mean over tasks: Wilson's interval at the effective number of
    independent draws."""
    v, w = _weighted(arrays, clusters)
    p, n = _mean(v, w), effective_n(w)
    return (p, *wilson(p * n, n), n)


def _many(a: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    many = not isinstance(a, np.ndarray) and len(a) and not np.isscalar(a[0])
    return [np.asarray(x, dtype=float) for x in (a if many else [a])]


def _pair(a, b, clusters: Clusters | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs, ys = _many(a), _many(b)
    if [len(x) for x in xs] != [len(y) for y in ys]:
        raise ValueError("paired arms must hold the same examples")
    va, w = _weighted(xs, clusters)
    vb, _ = _weighted(ys, clusters)
    return va, vb, w


def paired_difference(a: np.ndarray | Sequence[np.ndarray], b: np.ndarray | Sequence[np.ndarray],
                      clusters: Clusters | None = None) -> tuple[float, float, float]:
    """(score of a - score of b, lo, hi): Newcombe's paired interval at the effective number of draws. ``a``, ``b``:
    one array, or one per task (the equal-weight mean over tasks)."""
    va, vb, w = _pair(a, b, clusters)
    n = effective_n(w)
    pa, pb = _mean(va, w), _mean(vb, w)
    (la, ua), (lb, ub) = wilson(pa * n, n), wilson(pb * n, n)
    cov = float((w * (va - pa) * (vb - pb)).sum())
    sd = float(np.sqrt((w * (va - pa) ** 2).sum() * (w * (vb - pb) ** 2).sum()))
    phi = max(cov - 1 / (2 * n), 0.0) / sd if sd > 0 and cov > 0 else 0.0
    d = pa - pb
    lo = d - np.sqrt(max((pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2, 0.0))
    hi = d + np.sqrt(max((ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2, 0.0))
    return d, float(max(lo, -1.0)), float(min(hi, 1.0))


def _units(d: np.ndarray) -> np.ndarray | None:
    """``d`` as whole multiples of one unit (a common denominator), or None when none exists within MAX_UNITS."""
    fr = [Fraction(float(x)).limit_denominator(100_000) for x in d]
    if any(abs(float(f) - x) > 1e-9 for f, x in zip(fr, d, strict=True)):
        return None
    den = math.lcm(*(f.denominator for f in fr))
    units = [int(f * den) for f in fr]  # Python ints: a common denominator of many can pass any fixed width
    return np.array(units, dtype=np.int64) if sum(units) <= MAX_UNITS else None


def sign_flip_p(d: np.ndarray, seed: int = 0) -> tuple[float, str]:
    """Two-sided p of the sign-flip test of the (positive-weighted) draw differences ``d`` (zeros carry no sign), and
    how it was computed: 'exact sign test', 'exact sign-flip' (the null distribution counted) or 'Monte Carlo'."""
    d = np.asarray(d, dtype=float)
    d = d[np.abs(d) > 1e-12]
    k = len(d)
    if k == 0:
        return 1.0, "exact sign-flip"
    if np.allclose(np.abs(d), np.abs(d[0])):  # equal magnitudes: the sign test on the discordant draws
        return float(binomtest(int((d > 0).sum()), k).pvalue), "exact sign test"
    units = _units(np.abs(d))
    if units is not None:
        total = int(units.sum())
        dist = np.zeros(2 * total + 1)  # P(signed sum = s - total)
        dist[total] = 1.0
        for u in units:
            dist = 0.5 * (np.roll(dist, int(u)) + np.roll(dist, -int(u)))  # no wrap: |sum| <= total
        observed = abs(int(np.sign(d) @ units))
        s = np.arange(-total, total + 1)
        return float(min(1.0, dist[np.abs(s) >= observed].sum())), "exact sign-flip"
    observed = abs(d.sum()) - 1e-12 * np.abs(d).sum()
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(MC_FLIPS, k))
    return float(((np.abs(signs @ np.abs(d)) >= observed).sum() + 1) / (MC_FLIPS + 1)), "Monte Carlo"


def paired_test(a: np.ndarray | Sequence[np.ndarray], b: np.ndarray | Sequence[np.ndarray],
                clusters: Clusters | None = None, seed: int = 0) -> dict[str, float | int | str]:
    """The paired comparison of two arms on the same draws: their scores, the difference with Newcombe's interval, the
    draws on which each is ahead (the discordant ones), the draws in all, n_eff, and the sign-flip test's p."""
    va, vb, w = _pair(a, b, clusters)
    d, lo, hi = paired_difference(a, b, clusters)
    p, how = sign_flip_p(w * (va - vb), seed)
    return {"a": _mean(va, w), "b": _mean(vb, w), "diff": d, "lo": lo, "hi": hi,
            "a_ahead": int((va > vb + 1e-12).sum()), "b_ahead": int((vb > va + 1e-12).sum()), "draws": len(w),
            "n_eff": effective_n(w), "p": p, "test": how}


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over one table's comparisons)."""
    order, m = np.argsort(ps, kind="stable"), len(ps)
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(ps[i])))
        out[i] = running
    return out


__all__ = ["ALPHA", "Clusters", "MAX_UNITS", "MC_FLIPS", "draws", "effective_n", "holm", "interval",
           "paired_difference", "paired_test", "sign_flip_p", "singletons", "wilson"]
