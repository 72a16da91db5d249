"""Effective length: the longest length at which a method keeps at least ``keep`` (85 %) of full's score there.

Two readings of one question. :func:`effective_length`, per budget, is where the mean scores cross the line -- a point
estimate, whatever the intervals. :func:`kept_tests` tests it at the frontier's tabled budget: on every draw, the
method's score minus ``keep`` x full's on the same prompt, and the sign-flip test of those differences
(:mod:`harness.analysis.paired`), Holm-adjusted over every (method, length) of a model's table. *Keeps* is resolved
where the adjusted p < 0.05 and the difference's interval is clear of 0 above, *below* where it is clear below, else
*not resolved*; the tested effective length is the longest length it keeps. Unlike two methods tied at 1.0, keeping
85 % of a ceiling is testable: each draw where both answer is +0.15.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from harness.analysis.paired import ALPHA, holm, paired_test


def _common(pts: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, set[str]]]:
    """The rows that ran, full's ranked ones, and per model the tasks ranked at every length of it."""
    ok = pts[pts["status"] == "ok"]
    refs = ok[ok["ranked"] & (ok["kind"] == "reference")]
    common = {m: set.intersection(*(set(t) for _, t in g.groupby("eval_len")["task"])) for m, g in refs.groupby("model")}
    return ok, refs, common


def effective_length(pts: pd.DataFrame, keep: float = 0.85) -> pd.DataFrame:
    """Per (model, method, budget) the longest eval_len whose mean score over the tasks ranked at every length of the
    model is >= keep x full's there (None: at none of the lengths where it answered every one of those tasks). A
    method that answered them all at no length (a run stopped partway through its tasks) has no row: a mean over some
    of the tasks is not comparable with full's over all of them, and missing is not below."""
    (ok, refs, common), out = _common(pts), []
    for (model, method, budget), g in ok[ok["kind"] != "reference"].groupby(["model", "method", "budget"], sort=True):
        if not common.get(model):  # no task ranked at every length (a run stopped in its first cell): nothing to say
            continue
        answered, passed = [], []
        for L in sorted(set(ok[ok["model"] == model]["eval_len"])):
            ranked = refs[(refs["model"] == model) & (refs["eval_len"] == L) & refs["task"].isin(common.get(model, ()))]
            mine = g[(g["eval_len"] == L) & g["task"].isin(ranked["task"])]
            if not len(ranked) or len(mine) != len(ranked):
                continue
            answered.append(int(L))
            if mine["score"].mean() >= keep * ranked["score"].mean():
                passed.append(int(L))
        if not answered:
            continue
        out.append({"model": model, "method": method, "budget": budget, "effective_len": max(passed) if passed else None,
                    "shortest": answered[0], "fraction": -float(Fraction(budget)) if budget else 0.0})
    df = pd.DataFrame(out, columns=["model", "method", "budget", "effective_len", "shortest", "fraction"])
    return df.sort_values(["model", "method", "fraction"], ignore_index=True).drop(columns="fraction")


KEPT_COLUMNS = ["model", "method", "eval_len", "score", "full", "diff", "lo", "hi", "draws", "p", "test", "p_adj",
                "verdict"]


def kept_tests(pts: pd.DataFrame, keep: float = 0.85, at: str = "1/8", seed: int = 0) -> pd.DataFrame:
    """Per (model, method, eval_len): at budget ``at`` (a quantized cache: its one setting), over the tasks ranked at
    every length of the model, the method's score, full's, and the paired test of score - keep x full's (module
    docstring); ``verdict`` keeps | below | not resolved."""
    ok, refs, common = _common(pts)
    recs = []
    for model, g in ok.groupby("model", sort=True):
        tasks = sorted(common.get(model, ()))
        mine = g[g["task"].isin(tasks) & (g["kind"] != "reference") & g["budget"].isin([at, ""])]
        for (method, L), m in mine.groupby(["method", "eval_len"], sort=True):
            full = refs[(refs["model"] == model) & (refs["eval_len"] == L)].set_index("task")
            m = m.set_index("task")
            if not tasks or not set(tasks) <= set(m.index) or any(m.at[t, "examples"] != full.at[t, "examples"]
                                                                  for t in tasks):
                continue  # a task it did not answer, or not on full's prompts: no paired test
            own = [np.asarray(m.at[t, "per_example"]) for t in tasks]
            line = [keep * np.asarray(full.at[t, "per_example"]) for t in tasks]
            t = paired_test(own, line, [full.at[t, "clusters"] for t in tasks], seed)
            recs.append({"model": model, "method": method, "eval_len": int(L), "score": t["a"],
                         "full": t["b"] / keep, **{k: t[k] for k in ("diff", "lo", "hi", "draws", "p", "test")}})
    df = pd.DataFrame(recs, columns=KEPT_COLUMNS[:-2])
    df["p_adj"] = np.concatenate([holm(list(g["p"])) for _, g in df.groupby("model", sort=False)]) if len(df) else []
    resolved = df["p_adj"] < ALPHA
    df["verdict"] = np.where(resolved & (df["lo"] > 0), "keeps", np.where(resolved & (df["hi"] < 0), "below",
                                                                          "not resolved"))
    return df[KEPT_COLUMNS]


def _p(p: float) -> str:
    return f"p = {p:.3f}" if p >= 0.001 else "p < 0.001"


def effective_lines(model: str, e: pd.DataFrame, kept: pd.DataFrame, keep: float, at: str, head: str) -> list[str]:
    """The point estimates (one row per method, one column per budget: widest first; a quantized cache's under "all
    tokens"), then the tested table at ``at`` (one column per length)."""
    cols = sorted({b for b in e["budget"] if b}, key=lambda b: -float(Fraction(b)) if "/" in b else int(b) - 1e9)
    cols += ["all tokens"] if any(not b for b in e["budget"]) else []
    out = ["", f"{head} {model}: effective length (mean score over the tasks ranked at every length >= {keep:.2f} x full's)",
           "", "Point estimates: a length here is where the means cross the line, whatever their intervals (the tested "
           "table below says where a test resolves it).", "",
           "| method | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for method, g in e.groupby("method", sort=False):
        cell = {r["budget"] or "all tokens": str(int(r["effective_len"])) if pd.notna(r["effective_len"])
                else f"< {r['shortest']}" for _, r in g.iterrows()}
        out.append(f"| {method} | " + " | ".join(cell.get(b, "") for b in cols) + " |")
    if not len(kept):
        return out
    lens = sorted(set(kept["eval_len"]))
    out += ["", f"Tested at {at} (a quantized cache: its one setting): per length, the score and full's, the score minus "
            f"{keep:.2f} x full's with Newcombe's interval, and the sign-flip test of each draw's difference, Holm over the "
            f"{len(kept)} tests of this table; *keeps* or *below* where the test resolves it and the interval is clear "
            "of 0. Effective length: the longest length where *keeps* is resolved.", "",
            "| method | effective length | " + " | ".join(map(str, lens)) + " |", "|---" * (len(lens) + 2) + "|"]
    for method, g in kept.groupby("method", sort=True):
        by = {int(r["eval_len"]): r for _, r in g.iterrows()}
        kept_at = [L for L in lens if L in by and by[L]["verdict"] == "keeps"]
        cells = [f"{r['score']:.2f} of {r['full']:.2f}, {r['diff']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}]: {r['verdict']} "
                 f"({_p(r['p_adj'])})" if (r := by.get(L)) is not None else "" for L in lens]
        out.append(f"| {method} | {max(kept_at) if kept_at else 'none'} | " + " | ".join(cells) + " |")
    return out


__all__ = ["KEPT_COLUMNS", "effective_length", "effective_lines", "kept_tests"]
