"""The fidelity figure: each variant's output error against full attention, by length (task 'fidelity')."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import (
    accuracy_rows,
    backend_shade,
    drawing,
    frame_palette,
    legend_entries,
    length_axis,
    order_key,
    provenance,
    publish,
    value_line,
)


@register_figure('fidelity', 'accuracy',
                 description="How far each variant's output is from full attention's, per length.")
def plot_fidelity(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Output error of each variant against full attention vs length, one panel per metric."""
    df = accuracy_rows(acc, fidelity=True)
    pts = D.accuracy_points(df, extra=("backend",) if "backend" in df else ())
    backend = pts["backend"] if "backend" in pts else pd.Series("", index=pts.index)
    pts["series"] = [f"{v}/{b}" if b else v for v, b in zip(pts["variant_label"], backend, strict=True)]
    pts["series"] = [f"{s} [{e}]" if e else s for s, e in zip(pts["series"], pts["extra_label"], strict=True)]
    pal = palette or frame_palette(df)
    metrics = sorted(pts["metric"].unique())
    with drawing(len(metrics)) as (fig, axes):
        for ax, metric in zip(axes, metrics, strict=True):
            sub = pts[pts["metric"] == metric]
            for series, g in sorted(sub.groupby("series"), key=lambda kv: order_key(kv[0])):
                g = g.sort_values("length")
                colour = pal[g["variant_label"].iloc[0]]
                if "backend" in g and isinstance(g["backend"].iloc[0], str) and g["backend"].iloc[0]:
                    colour = backend_shade(colour, g["backend"].iloc[0])  # as the cost figures draw this backend
                value_line(ax, g, colour, series, "fidelity", marker="o")
            if F.lower_is_better(sub) and (sub["value"] > 0).all():
                ax.set_yscale("log")
            length_axis(ax, sub["length"])
            ax.set_ylabel(f"{metric} vs full attention")
            ax.set_title(metric)
    return publish(fig, "Fidelity to full attention", provenance(accuracy=df), out, "fidelity", formats, legend_entries(axes))


__all__ = ["plot_fidelity"]
