"""What a compressed cache keeps of a model's language modelling: the ``continuation`` task's bits per byte per method
and budget, each against full attention's on the same windows (``attn-bench frontier``, beside the retrieval frontier).

A row holds one bpb per window of real text (``per_example``), each window an independent draw, and every arm of a
setting reads the same windows, so each method is compared with full by the paired per-window difference: its mean
with a Student t interval, the sign-flip test of the differences (:func:`harness.analysis.paired.sign_flip_p`; a
seeded Monte Carlo, since bpb differences share no unit) and Holm's adjustment over the table's comparisons. A method
whose every window reads exactly full's bpb is a tie, not a finding; one whose adjusted p is 0.05 or more, or whose
interval holds 0, is "not resolved". bpb is a loss (lower is better) and not in [0, 1], so none of the frontier's
score intervals apply.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

import numpy as np
from scipy.stats import t as student_t

from harness.analysis.paired import ALPHA, holm, sign_flip_p
from harness.messages import one_line
from harness.schema import subject

TASK, METRIC = "continuation", "bpb"


def _t_interval(x: np.ndarray, floor: float = -np.inf) -> tuple[float, float, float]:
    """(mean, lo, hi): the 95 % Student t interval of a mean over ``x`` (two values at least), its low end at least
    ``floor`` (a bpb is never negative)."""
    m = float(np.mean(x))
    half = float(student_t.ppf(0.975, len(x) - 1)) * float(np.std(x, ddof=1)) / np.sqrt(len(x))
    return m, max(m - half, floor), m + half


Arm = Callable[[dict[str, Any]], "tuple[str, str, str] | None"]  # a row -> (method, kind, budget): frontier.arm


def cells(rows: Iterable[dict[str, Any]], arm: Arm) -> dict[tuple[str, int], dict[tuple[str, str], dict[str, Any]]]:
    """(subject, eval_len) -> (method, budget) -> its continuation row (a resumed run's later row replaces the
    earlier one); methods named by ``arm``, as the frontier names them."""
    out: dict[tuple[str, int], dict[tuple[str, str], dict[str, Any]]] = {}
    for r in rows:
        a = arm(r) if r.get("task") == TASK and r.get("metric") == METRIC else None
        if a is not None:
            out.setdefault((subject(r), int(r["eval_len"])), {})[(a[0], a[2])] = r
    return out


def against_full(arms: dict[tuple[str, str], dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """Each ok arm's bpb and its paired difference from full's on the same windows; Holm over the arms compared."""
    full = arms.get(("full", ""))
    if full is None or full.get("status") != "ok":
        return []
    f = np.asarray(full["per_example"], dtype=float)
    out = []
    for (method, budget), r in arms.items():
        if r.get("status") != "ok" or len(r.get("per_example") or ()) != len(f):
            continue
        x = np.asarray(r["per_example"], dtype=float)
        rec = {"method": method, "budget": budget, "windows": len(x), "kv": float(r["kv_bytes"]) / float(full["kv_bytes"]),
               "bpb": _t_interval(x, 0.0), "full": method == "full"}
        if method != "full":
            d = x - f
            rec.update(diff=_t_interval(d), worse=int((d > 1e-12).sum()), better=int((d < -1e-12).sum()),
                       tie=bool(np.all(np.abs(d) <= 1e-12)), p=sign_flip_p(d, seed)[0])
        out.append(rec)
    tested = [r for r in out if not r["full"] and not r["tie"]]
    for r, p in zip(tested, holm([r["p"] for r in tested]), strict=True):
        r["p_adj"] = p
    return sorted(out, key=lambda r: (not r["full"], -float(Fraction(r["budget"] or "1")), r["bpb"][0]))


def _verdict(r: dict[str, Any]) -> str:
    if r["full"]:
        return "reference"
    if r["tie"]:
        return "tie: full's bpb on every window"
    if r["p_adj"] >= ALPHA or r["diff"][1] <= 0 <= r["diff"][2]:  # the frontier's rule: the test and the interval
        return "not resolved"
    return "worse than full" if r["diff"][0] > 0 else "better than full"


def _p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def lines(rows: Iterable[dict[str, Any]], arm: Arm, head: str = "##", seed: int = 0) -> list[str]:
    """Per model and length, the table of every method's bpb against full's, and the arms that did not run."""
    out: list[str] = []
    for (model, L), arms in sorted(cells(rows, arm).items()):
        recs = against_full(arms, seed)
        n = recs[0]["windows"] if recs else 0
        out += ["", f"{head} {model} at {L} tokens: the text read after a compressed context", "",
                f"Continuation bits per byte (lower is better) of {n} windows of real text, each an independent draw, "
                "read against each method's cache of the context. Against full: the paired per-window difference, its "
                f"95 % t interval, the windows it reads worse / better, the sign-flip test, Holm over the "
                f"{sum(not r['full'] and not r['tie'] for r in recs)} methods compared.", "",
                "| method | budget | KV of full's | bpb [95% CI] | minus full's [95% CI] | windows worse / better | "
                "p (Holm) | verdict |", "|---|---|---|---|---|---|---|---|"]
        for r in recs:
            iv = "{:.3f} [{:.3f}, {:.3f}]".format(*r["bpb"])
            vs = "-" if r["full"] else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*r["diff"])
            ab = "-" if r["full"] else f"{r['worse']} / {r['better']}"
            p = "-" if r["full"] or r["tie"] else f"{_p(r['p'])} ({_p(r['p_adj'])})"
            out.append(f"| {r['method']} | {r['budget'] or '-'} | {r['kv']:.2f} | {iv} | {vs} | {ab} | {p} | "
                       f"{_verdict(r)} |")
        if not recs:
            out.append("| full | - | - | did not run | - | - | - | - |")
        paired = {(r["method"], r["budget"]) for r in recs}
        cut = [f"{m}{' at ' + b if b else ''} ({len(r.get('per_example') or ())} windows)" for (m, b), r in arms.items()
               if r.get("status") == "ok" and (m, b) not in paired]
        out += ["", f"Not paired (not full's {n} windows: a run cut short): {', '.join(cut)}."] if cut and recs else []
        failed = [(k, r) for k, r in arms.items() if r.get("status") != "ok"]
        out += ["", "Did not run:"] + [f"- {m}{' at ' + b if b else ''}: {r.get('status')}: "
                                       f"{one_line(r.get('error') or 'no reason given')}" for (m, b), r in failed] \
            if failed else []
    return out


__all__ = ["against_full", "cells", "lines"]
