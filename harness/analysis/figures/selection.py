"""The selection figure: how much of full attention's probability mass each variant's kept keys hold (task
'selection', and its rows from a pretrained checkpoint).

Per source of queries and keys (random, a trained model's, a checkpoint's): mass against length, and mass against the
fraction of visible keys kept -- a selector above the fixed patterns at the same budget is choosing well. Values are
means over layers, heads and seeds.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, drawing, legend_entries, length_axis, order_key, provenance, publish
from harness.analysis.figures.style import palette as make_palette


def selection_points(acc: pd.DataFrame) -> pd.DataFrame:
    """(source, variant_label, eval_len) -> mean mass, mass_tail, kept over layers, heads and seeds."""
    if "task" not in acc or "variant_label" not in acc:
        raise Skip("no selection rows")
    df = acc[acc["task"] == "selection"]
    if len(df) == 0:
        raise Skip("no selection rows")
    df = df[(df["status"] == "ok") & df["value"].notna()].copy()
    if len(df) == 0:
        raise Skip("no selection row was measured")
    df["measure"] = [m.removesuffix(f"_{s}") for m, s in zip(df["metric"], df["source"], strict=True)]
    keys = ["source", "variant_label", "eval_len"]
    wide = df.pivot_table(index=keys, columns="measure", values="value", aggfunc="mean").reset_index()
    return wide


@register_figure("selection", "accuracy", tasks=("selection",),
                 description="Share of full attention's probability mass on each variant's kept keys.")
def plot_selection(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                   formats: Sequence[str] = ("png",)) -> Figure:
    pts = selection_points(acc)
    sources = sorted(pts["source"].unique())
    pal = palette or make_palette(pts["variant_label"])
    with drawing(2 * len(sources), ncols=2) as (fig, axes):
        for i, source in enumerate(sources):
            sub = pts[pts["source"] == source]
            by_len, by_kept = axes[2 * i], axes[2 * i + 1]
            for spec, g in sorted(sub.groupby("variant_label"), key=lambda kv: order_key(kv[0])):
                g = g.sort_values("eval_len")
                colour = pal[spec]
                by_len.plot(g["eval_len"], g["mass"], color=colour, marker="o", markersize=4, label=spec,
                            gid=f"selection:{source}:{spec}")
                if "mass_tail" in g:
                    by_len.plot(g["eval_len"], g["mass_tail"], color=colour, ls=":", marker=".", markersize=3)
                by_kept.plot(g["kept"], g["mass"], color=colour, marker="o", markersize=4, ls="-", alpha=0.8)
            length_axis(by_len, sub["eval_len"])
            by_len.set_ylim(0, 1.02)
            by_len.set_ylabel("mass on kept keys (dotted: last eighth)")
            by_len.set_title(f"{source}: mass by length")
            by_kept.plot([0, 1], [0, 1], color="0.7", lw=0.8, ls="--")  # a selector no better than chance
            by_kept.set_xlim(0, 1.02)
            by_kept.set_ylim(0, 1.02)
            by_kept.set_xlabel("fraction of visible keys kept")
            by_kept.set_ylabel("mass on kept keys")
            by_kept.set_title(f"{source}: mass by budget")
    return publish(fig, "Selector fidelity: full attention's mass on the kept keys", provenance(accuracy=acc), out,
                   "selection", formats, legend_entries(axes))


__all__ = ["plot_selection", "selection_points"]
