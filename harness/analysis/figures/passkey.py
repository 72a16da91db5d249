"""The passkey figure: retrieval accuracy by context length and depth (needle in a haystack)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis.figures.positions import length_heatmap, row_labels
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, accuracy_rows, drawing, provenance, publish


@register_figure('passkey', 'accuracy',
                 description='Passkey retrieval accuracy by context length and depth.')
def plot_passkey(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                 formats: Sequence[str] = ("png",)) -> Figure:
    """Passkey retrieval accuracy by length × depth (needle-in-a-haystack view), one panel per model."""
    df = accuracy_rows(acc, fidelity=False)
    df = df[df["task"].str.contains("passkey")]
    if len(df) == 0 or "depth" not in df or df["depth"].isna().all():
        raise Skip("no passkey rows with a depth column")
    pts = D.accuracy_points(df[df["depth"].notna()], extra=("depth",))
    pts = pts.assign(row=row_labels(pts))
    panels = sorted(pts.groupby(["row", "metric"]).groups)
    height = 0.4 * pts["depth"].nunique() + 2.0
    with drawing(len(panels), width=5.5, height=height, ncols=min(len(panels), 2)) as (fig, axes):
        for ax, (row, metric) in zip(axes, panels, strict=True):
            sub = pts[(pts["row"] == row) & (pts["metric"] == metric)]
            table = sub.pivot_table(index="depth", columns="length", values="value", aggfunc="mean").sort_index()
            higher = not F.lower_is_better(sub)
            length_heatmap(ax, table, metric, not higher, f"passkey:{row}:{metric}", ".2g", vmin=0 if higher else None,
                           vmax=1 if higher and table.max().max() <= 1 else None,
                           yticklabels=[f"{d:g}" for d in table.index])
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("passkey depth (fraction of context)")
            ax.set_title(row)
    return publish(fig, "Passkey retrieval by length and depth", provenance(accuracy=df), out, "passkey", formats)


__all__ = ["plot_passkey"]
