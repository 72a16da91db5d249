"""The findings of a report: the few sentences that matter, ranked, from the derived tables
(:mod:`harness.analysis.derive`) of the cost and accuracy rows."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis import trust as T

MAX_FINDINGS = 12


def findings(cost: pd.DataFrame, acc: pd.DataFrame, limit: int = MAX_FINDINGS) -> list[str]:
    """The few sentences that matter, ranked: what failed outright, who beats full and by how much
    (largest first), where variants stopped, then the scaling exponents worth stating.

    Exponents need 3 lengths, R² >= 0.9 and a value in [0, 3]; crossovers need 2 matched lengths.
    Suspect cells (peak_fraction > 1) are left out of both, and a sentence says how many. The tables
    below hold everything; a last sentence says how many findings were cut."""
    ranked: list[tuple[int, float, str]] = []  # (rank, -weight, sentence)
    if len(cost) and len(F.ok_rows(cost)):
        trusted = T.without_suspect(cost)
        for _, r in D.longest_reached(cost).iterrows():
            where = f"({r['facet']})"
            if not math.isfinite(r["longest_ok"]) and r["stopped_by"]:
                ranked.append((0, 0.0, f"{r['series']} {where} ran at no length: {r['stopped_by']} at "
                                        f"{F.fmt_len(r['stopped_at'])}" + (f" ({r['why']})." if r["why"] else ".")))
            elif r["stopped_by"]:
                ranked.append((2, -r["longest_ok"], f"{r['series']} {where} reached {F.fmt_len(r['longest_ok'])} before "
                                                    f"{r['stopped_by']} at {F.fmt_len(r['stopped_at'])}."))
        for _, r in D.crossovers(trusted).iterrows():
            if r["matched_lengths"] < 2:
                continue  # one shared length says nothing about where a curve crosses
            at = f"{r['speedup_at_longest']:.2f}× at {F.fmt_len(r['longest_matched'])}"
            if r["wins_everywhere"]:
                text = f"faster than full at every length measured ({at})"
            elif math.isfinite(r["crossover_len"]):
                text = f"beats full from {F.fmt_len(r['crossover_len'])} tokens ({at})"
            else:
                text = f"does not beat full within the sweep ({at})"
            ranked.append((1, -r["speedup_at_longest"], f"{r['series']} ({r['facet']}) {text}."))
        fits = D.fit_exponents(trusted)
        fits = fits[np.isfinite(fits["exponent"].astype(float))]
        shaky = 0
        for _, r in fits.iterrows():
            if not D.plausible_exponent(r["exponent"], r["r2"]):
                shaky += 1
                continue
            ranked.append((3, -r["to_len"], f"{r['series']} ({r['facet']}): latency grows as L^{r['exponent']:.2f} "
                                            f"(R² {r['r2']:.2f}, {int(r['points'])} lengths, "
                                            f"{F.fmt_len(r['from_len'])}–{F.fmt_len(r['to_len'])})."))
        if shaky:
            ranked.append((4, 0.0, f"{shaky} latency fit(s) are not stated: negative, above 3 or R² below 0.9, where "
                                   "fixed per-call costs or noise dominate (see the scaling table)."))
    lines = [text for _, _, text in sorted(ranked, key=lambda t: (t[0], t[1]))]
    if len(cost) and (n := len(T.suspect_rows(cost))):
        lines.insert(0, f"{n} suspect cell(s) (achieved FLOP/s above the measured matmul peak, or bytes/s above the "
                        "memory bandwidth) are left out of the exponents and crossovers; see Suspect and noisy cells.")
    if len(acc):
        for _, r in D.best_positions(acc).iterrows():
            best = r["best_position"]
            who = f"tie between {best.replace(' = ', ', ')}" if " = " in best else f"best position method {best}"
            lines.append(f"{r['task']} {r['metric']} at {F.fmt_len(r['eval_len'])} ({r['variant']}): {who} ({r['value']:.4g}).")
    if len(lines) > limit:
        cut = len(lines) - (limit - 1)
        lines = [*lines[: limit - 1], f"{cut} more finding(s) in the tables below."]
    return lines


__all__ = ["MAX_FINDINGS", "findings"]
