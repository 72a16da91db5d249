"""``frontier-curves``: beside the forest (:mod:`harness.analysis.figures.frontier`), score against the share of
full's KV bytes kept (log) for a few methods per model: full, the oracle, the two best presses at the budget, the best
retrieval and the 4-bit cache, pooled over the panel's ranked tasks (:func:`harness.analysis.frontier.ranking` at each
budget); the quoted budget ringed."""
from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from harness.analysis import frontier as FR
from harness.analysis.figures.frontier import AT, FAMILY, WIDTH, Panel, forest, frontier_points
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, figure_style, save

CURVE_STYLE = {  # role -> (colour, dash, marker)
    "full": ("0.45", (0, (4, 2)), ""),
    "oracle": ("black", "-", "o"),
    "press 1": (FAMILY["press"][1], "-", "o"),
    "press 2": ("#7fb1d9", "-", "s"),  # the press hue, lighter
    "retrieval": (FAMILY["retrieval"][1], ":", "v"),
    "quantized": (FAMILY["quantized"][1], "none", "D"),
}


def curve_methods(panel: Panel) -> dict[str, str]:
    """role -> method drawn in the curves: full, the oracle, the two best presses at the budget over every ranked
    task, the best retrieval, the 4-bit cache (those present)."""
    complete = next((b.rows for b in panel.blocks if b.complete), pd.DataFrame(columns=["method", "kind"]))
    presses = list(complete[complete["kind"] == "press"]["method"])
    retrieval = list(complete[complete["kind"] == "retrieval"]["method"])
    quant = [m for m in complete[complete["kind"] == "quantized"]["method"] if "4-bit" in m]
    out = {"full": "full", "oracle": "oracle"}
    out |= {f"press {i + 1}": m for i, m in enumerate(presses[:2])}
    out |= {"retrieval": retrieval[0]} if retrieval else {}
    return out | ({"quantized": quant[0]} if quant else {})


def curves(pts: pd.DataFrame, panel: Panel) -> pd.DataFrame:
    """The chosen methods' pooled score over the panel's ranked tasks at each budget run there, with the share of
    full's KV bytes it keeps: role, method, budget, kv_fraction, score (:func:`harness.analysis.frontier.ranking`)."""
    here = pts[(pts["model"] == panel.model) & (pts["eval_len"] == panel.eval_len) & pts["task"].isin(panel.tasks)]
    roles = curve_methods(panel)
    budgets = sorted({b for b in here[(here["status"] == "ok")]["budget"] if b}, key=lambda b: float(Fraction(b)))
    out = []
    for b in budgets:
        rk = FR.ranking(here, at=b).set_index("method")
        for role, method in roles.items():
            if method not in rk.index:
                continue
            r = rk.loc[method]
            col = "score" if role == "quantized" else "at"
            if role in ("full", "quantized") and out and any(o["role"] == role for o in out):
                continue  # no budget: one point
            if pd.notna(r[col]):
                out.append({"role": role, "method": method, "budget": "" if role in ("full", "quantized") else b,
                            "kv_fraction": 1.0 if role == "full" else float(r["kv_fraction"]), "score": float(r[col])})
    return pd.DataFrame(out, columns=["role", "method", "budget", "kv_fraction", "score"])


def save_curves(pts: pd.DataFrame, panels: list[Panel], out: str | Path | None, formats: Sequence[str],
                 at: str) -> Figure:
    """One panel per model: the methods of :func:`curve_methods`, each panel's legend below it (at most six)."""
    data = [curves(pts, p) for p in panels]
    low = min([float(c["kv_fraction"].min()) for c in data if len(c)] + [1 / 16])
    with figure_style():
        fig = Figure(figsize=(WIDTH, 3.5), layout="constrained")
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False).ravel().tolist()
        for ax, panel, c in zip(axes, panels, data, strict=True):
            gid = f"curves:{panel.name}"
            ax.set_gid(gid)
            for role, g in c.groupby("role", sort=False):
                colour, dash, marker = CURVE_STYLE[role]
                g = g.sort_values("kv_fraction")
                label = str(g["method"].iloc[0])
                if role == "full":
                    ax.axhline(float(g["score"].iloc[0]), color=colour, ls=dash, lw=1.2, label=label, gid=f"{gid}:full",
                               zorder=1)
                    continue
                ax.plot(g["kv_fraction"], g["score"], color=colour, ls=dash, marker=marker, markersize=3.5,
                        lw=2.4 if role == "oracle" else 1.3, zorder=2 if role == "oracle" else 3, label=label,
                        gid=f"{gid}:{label}")  # the oracle under the others: a method on it stays seen
                ring = g[g["budget"] == at]
                ax.plot(ring["kv_fraction"], ring["score"], ls="none", marker="o", markersize=7, markerfacecolor="none",
                        markeredgecolor=colour, markeredgewidth=1.0, zorder=4, gid=f"ring:{gid}:{label}")
            ax.set_xscale("log", base=2)
            ax.set_xlim(low / 1.35, 1.35)
            ticks = [t for t in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1) if t >= low / 1.35]
            ax.set_xticks(ticks, [str(Fraction(t).limit_denominator()) for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.tick_params(labelsize=7)
            ax.set_ylim(-0.03, 1.05)
            ax.set_title(f"{panel.name}\n{panel.eval_len} tokens", fontsize=8)
            ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False, handlelength=2.0,
                      borderaxespad=0, labelspacing=0.2)
        axes[0].set_ylabel("score (mean over ranked tasks)", fontsize=7.5)
        fig.suptitle(f"Score against the KV bytes kept (share of full's, log); ringed: the {at} budget", fontsize=9)
    save(fig, out, "frontier-curves", formats)
    return fig



@register_figure("frontier-curves", "accuracy", description="Beside the frontier's forest: score against the KV "
                 "bytes kept for full, the oracle, the two best presses, the best retrieval and the 4-bit cache.")
def plot_frontier_curves(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                         formats: Sequence[str] = ("png",)) -> Figure:
    """``frontier-curves.<fmt>``, per model at the forest's length. ``palette`` is not used: each role has its colour."""
    pts = frontier_points(acc)
    panels = forest(pts, AT)
    if not panels:
        raise Skip(f"no model has a ranked task (full >= 0.5) with a method run at {AT}")
    return save_curves(pts, panels, out, formats, AT)


__all__ = ["CURVE_STYLE", "curve_methods", "curves", "plot_frontier_curves", "save_curves"]
