"""The position heatmap: each position method's score per evaluation length, one panel per task and metric."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, accuracy_rows, drawing, provenance, publish


def row_labels(pts: pd.DataFrame) -> pd.Series:
    several = pts["variant_label"].nunique() > 1
    label = pts["variant_label"] + " · " + pts["position_label"] if several else pts["position_label"]
    if "extra_label" in pts:
        label = label + pts["extra_label"].map(lambda e: f" [{e}]" if e else "")
    if "train_len" in pts and pts["train_len"].nunique() > 1:
        label = label + " (train " + pts["train_len"].map(lambda x: F.fmt_len(x) if pd.notna(x) else "?") + ")"
    return label


def position_table(pts: pd.DataFrame) -> pd.DataFrame:
    """Rows: position method (and variant/train length if they vary); columns: evaluation length."""
    pts = pts.assign(row=row_labels(pts))
    table = pts.pivot_table(index="row", columns="length", values="value", aggfunc="mean")
    table.columns = [int(c) for c in table.columns]
    return table


def length_heatmap(ax: Axes, table: pd.DataFrame, metric: str, lower: bool, gid: str, fmt: str, **kw: Any) -> None:
    """A score table (columns: lengths) as the annotated heatmap both heatmap figures draw alike (``lower``: lower
    scores are better); ``kw`` to seaborn."""
    sns.heatmap(table, ax=ax, annot=True, fmt=fmt, cmap="viridis_r" if lower else "viridis",
                cbar_kws={"label": metric}, xticklabels=[F.fmt_len(c) for c in table.columns], **kw)
    ax.collections[0].set_gid(gid)
    ax.tick_params(axis="y", labelrotation=0)


@register_figure('position_heatmap', 'accuracy',
                 description="Each position method's score per evaluation length.")
def plot_position_heatmap(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                          formats: Sequence[str] = ("png",)) -> Figure:
    """Length generalisation at a glance: position method × evaluation length, one panel per task and metric."""
    pts = D.accuracy_points(accuracy_rows(acc, fidelity=False))
    panels = [k for k, g in sorted(pts.groupby(["task", "metric"])) if g["position_label"].nunique() > 1]
    if not panels:
        raise Skip("needs accuracy rows of at least two position methods on one task")
    df = accuracy_rows(acc, fidelity=False)
    height = 0.5 + 0.45 * pts["position_label"].nunique() + 1.5
    with drawing(len(panels), width=6.0, height=height, ncols=1) as (fig, axes):
        for ax, (task, metric) in zip(axes, panels, strict=True):
            sub = pts[(pts["task"] == task) & (pts["metric"] == metric)]
            length_heatmap(ax, position_table(sub), metric, F.lower_is_better(sub), f"heatmap:{task}:{metric}", ".3g")
            ax.set_xlabel("evaluation length (tokens)")
            ax.set_ylabel("position method")
            ax.set_title(f"{task} · {metric}")
    return publish(fig, "Length generalisation by position method", provenance(accuracy=df), out, "position_heatmap",
                   formats)


__all__ = ["length_heatmap", "plot_position_heatmap", "position_table", "row_labels"]
