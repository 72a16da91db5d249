"""Claims: every comparison the documents state, made from the frontier's points with its paired test.

A claim is data. For two methods that answered the same prompts, :func:`claim` pools each one's draws over the
ranked tasks (:mod:`harness.analysis.paired`), tests the difference (the sign-flip test; on 0/1 draws the exact sign
test on the discordant ones) and, where a table compares many methods, adjusts the p-values by Holm's step-down rule
over every pair in that table. The verdict is one of: ``above`` (adjusted p < 0.05 and the difference's interval
clear of 0: on scores that are not 0/1 the Wilson-based interval is the more conservative of the two), ``tie at
ceiling`` / ``tie at floor`` (both at 1 or both at 0 on every draw: nothing to test), ``not resolved``.
:meth:`Claim.sentence` writes it; documents quote these sentences and never type their own.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.paired import ALPHA, holm, interval, paired_test


@dataclass(frozen=True)
class Claim:
    """``a`` against ``b`` at one budget, in one model at one length, over ``tasks``."""

    model: str
    eval_len: int
    budget: str
    tasks: tuple[str, ...]
    a: str
    b: str
    a_score: float
    b_score: float
    diff: float
    lo: float
    hi: float
    a_ahead: int  # draws on which a scored higher
    b_ahead: int
    draws: int
    n_eff: float
    p: float
    test: str
    p_adj: float  # Holm-adjusted over the family the claim was made in (= p for a claim made alone)
    family: int  # comparisons in that family
    verdict: str  # above | below | tie at ceiling | tie at floor | not resolved

    def sentence(self) -> str:
        a, b = f"`{self.a}`", f"`{self.b}`"
        nums = f"{self.a_score:.2f} vs {self.b_score:.2f}"
        if self.verdict.startswith("tie"):
            level = "1.00" if self.verdict.endswith("ceiling") else "0.00"
            return f"{a} and {b} tie at the {self.verdict.split()[-1]} (both {level} on all {self.draws} draws: untestable)"
        disc = self.a_ahead + self.b_ahead
        adj = f", Holm over {self.family}: {p_text(self.p_adj)}" if self.family > 1 else ""
        test = f"{self.test} {p_text(self.p)}{adj}"
        ahead = f"{max(self.a_ahead, self.b_ahead)} of {disc} discordant draws"
        iv = f"{self.diff:+.2f} [{self.lo:+.2f}, {self.hi:+.2f}]"
        if self.verdict in ("above", "below"):
            hi, lo = (a, b) if self.verdict == "above" else (b, a)
            nums = nums if self.verdict == "above" else f"{self.b_score:.2f} vs {self.a_score:.2f}"
            return f"{hi} keeps more than {lo} ({nums}, {iv}; ahead on {ahead}; {test})"
        why = "no discordant draw" if disc == 0 else f"{disc} discordant draw{'s' if disc > 1 else ''}"
        return f"{a} vs {b}: not resolved ({nums}, {iv}; {why}; {test})"


def p_text(p: float) -> str:
    return f"p = {p:.3f}" if p >= 0.001 else "p < 0.001"


def _verdict(t: dict[str, Any], p_adj: float, va_all: set[float], vb_all: set[float]) -> str:
    if va_all == vb_all and len(va_all) == 1 and next(iter(va_all)) in (0.0, 1.0):
        return "tie at ceiling" if next(iter(va_all)) == 1.0 else "tie at floor"
    if p_adj < ALPHA and (t["lo"] > 0 or t["hi"] < 0):  # the test and the interval agree
        return "above" if t["diff"] > 0 else "below"
    return "not resolved"


def cells_at(pts: pd.DataFrame, model: str, eval_len: int, at: str) -> tuple[tuple[str, ...], dict[str, dict]]:
    """The ranked tasks of (model, eval_len) and, per method with a score on every one of them at ``at`` (full and
    quantized caches: at every token), its per-task examples and clusters (paired on full's examples)."""
    g = pts[(pts["model"] == model) & (pts["eval_len"] == eval_len) & (pts["status"] == "ok")]
    tasks = tuple(sorted(g[(g["kind"] == "reference") & g["ranked"]]["task"]))
    per = [task_cells(g, model, eval_len, t, at) for t in tasks]
    common = set.intersection(*(set(c) for c in per)) if per else set()
    return tasks, {m: {"kind": per[0][m]["kind"], "ex": [c[m]["ex"][0] for c in per],
                       "clusters": [c[m]["clusters"][0] for c in per]} for m in sorted(common)}


def task_cells(pts: pd.DataFrame, model: str, eval_len: int, task: str, at: str) -> dict[str, dict]:
    """Per method with a score on ``task`` at ``at`` (full and quantized caches: at every token), paired on full's
    examples: its examples and clusters (:func:`cells_at` joins them over the ranked tasks)."""
    g = pts[(pts["model"] == model) & (pts["eval_len"] == eval_len) & (pts["status"] == "ok") & (pts["task"] == task)]
    full = g[g["kind"] == "reference"]
    if len(full) == 0:
        return {}
    ref = full["examples"].iloc[0]
    return {r.method: {"kind": r.kind, "ex": [r.per_example], "clusters": [r.clusters]}
            for r in g[(g["budget"] == at) | (g["budget"] == "")].itertuples() if r.examples == ref}


def family(model: str, eval_len: int, at: str, tasks: tuple[str, ...], cells: dict[str, dict],
           pairs: list[tuple[str, str]], seed: int = 0) -> list[Claim]:
    """The claims ``a`` against ``b`` for each pair (both in ``cells``), Holm over these pairs: the family a
    document's table makes."""
    pairs = [(a, b) for a, b in pairs if a in cells and b in cells]
    raw = [paired_test(cells[a]["ex"], cells[b]["ex"], cells[a]["clusters"], seed) for a, b in pairs]
    adj = holm([float(t["p"]) for t in raw])
    return [claim(model, eval_len, at, tasks, a, b, cells[a], cells[b], seed, len(pairs), q, t)
            for (a, b), t, q in zip(pairs, raw, adj, strict=True)]


def claim(model: str, eval_len: int, at: str, tasks: tuple[str, ...], a: str, b: str, ca: dict, cb: dict, seed: int,
           family: int, p_adj: float | None, t: dict[str, Any] | None = None) -> Claim:
    t = t or paired_test(ca["ex"], cb["ex"], ca["clusters"], seed)
    p_adj = float(t["p"]) if p_adj is None else p_adj
    va = {float(v) for e in ca["ex"] for v in e}
    vb = {float(v) for e in cb["ex"] for v in e}
    return Claim(model, int(eval_len), at, tasks, a, b, float(t["a"]), float(t["b"]), float(t["diff"]), float(t["lo"]),
                 float(t["hi"]), int(t["a_ahead"]), int(t["b_ahead"]), int(t["draws"]), float(t["n_eff"]),
                 float(t["p"]), str(t["test"]), p_adj, family, _verdict(t, p_adj, va, vb))


def pairwise(pts: pd.DataFrame, at: str = "1/8", seed: int = 0) -> list[Claim]:
    """Every pair of methods with a score on every ranked task at ``at``, per (model, eval_len), the higher-scoring
    first; Holm over each (model, eval_len)'s pairs."""
    out: list[Claim] = []
    ok = pts[pts["status"] == "ok"]
    for (model, L), _ in ok.groupby(["model", "eval_len"], sort=True):
        tasks, cells = cells_at(pts, model, L, at)
        score = {m: interval(c["ex"], c["clusters"])[0] for m, c in cells.items()}
        order = sorted(cells, key=lambda m: (-score[m], m))
        out += family(model, L, at, tasks, cells, list(combinations(order, 2)), seed)
    return out


def against_oracle(pts: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Every cell of an arm with a budget (press, variant, retrieval, prefill) against the oracle at that budget on
    the same examples: the difference, its interval and the paired test, Holm over each (model, eval_len)'s cells."""
    ok = pts[pts["status"] == "ok"]
    oracle = ok[ok["kind"] == "oracle"].set_index(["model", "eval_len", "task", "budget"])
    found = []
    for _, r in ok[ok["kind"].isin(["press", "variant", "retrieval", "prefill"])].iterrows():
        key = (r["model"], r["eval_len"], r["task"], r["budget"])
        if key not in oracle.index or oracle.loc[key, "examples"] != r["examples"]:
            continue
        t = paired_test(r["per_example"], oracle.loc[key, "per_example"], [r["clusters"]], seed)
        found.append({"model": key[0], "eval_len": key[1], "task": key[2], "budget": key[3], "method": r["method"],
                      **{k: t[k] for k in ("a", "b", "diff", "lo", "hi", "a_ahead", "b_ahead", "draws", "p", "test")}})
    cols = ["model", "eval_len", "task", "budget", "method", "a", "b", "diff", "lo", "hi", "a_ahead", "b_ahead", "draws",
            "p", "test", "p_adj"]
    df = pd.DataFrame(found, columns=cols[:-1])
    df["p_adj"] = np.nan
    for _, g in df.groupby(["model", "eval_len"]):
        df.loc[g.index, "p_adj"] = holm(list(g["p"]))
    return df[cols]


def claim_lines(pts: pd.DataFrame, rk: pd.DataFrame, model: str, L: int, at: str, seed: int = 0) -> list[str]:
    """The comparisons a reader of the ranking makes at ``at``, each with its test: every method against the one ranked
    just below it, and against full and the oracle; Holm over every pair of the length's methods; then the count."""
    got = {frozenset((c.a, c.b)): c for c in pairwise(pts[(pts["model"] == model) & (pts["eval_len"] == L)], at, seed)}
    if not got:
        return []
    order = [m for m in rk.assign(s=rk["at"].fillna(rk["score"])).sort_values("s", ascending=False)["method"]
             if any(m in k for k in got)]
    shown: list[frozenset] = []
    for i, m in enumerate(order):
        for other in ([order[i + 1]] if i + 1 < len(order) else []) + ["full", "oracle"]:
            k = frozenset((m, other))
            if k in got and k not in shown:
                shown.append(k)
    resolved = sum(c.verdict in ("above", "below") for c in got.values())
    ties = sum(c.verdict.startswith("tie") for c in got.values())
    fam = next(iter(got.values())).family
    return ["", f"Claims at {at} (paired on the same draws; Holm over the {fam} pairs of these {len(order)} methods): "
            f"{resolved} resolved, {ties} tied at a ceiling or floor, {fam - resolved - ties} not resolved.", ""] + [
        f"- {got[k].sentence()}." for k in shown]


__all__ = ["Claim", "against_oracle", "cells_at", "claim", "claim_lines", "family", "p_text", "pairwise", "task_cells"]
