"""RULER figure (Hsieh et al. 2024, https://arxiv.org/abs/2404.06654): each synthetic task's score against the
evaluation length, one panel per task, one line per variant and position method, like the paper's per-task tables.

The score is RULER's ``string_match_all`` (the fraction of references found in the greedy answer), averaged over
seeds with a t interval clipped to [0, 1] (:func:`harness.analysis.derive.accuracy_points`); the training length
is marked, since the models here are trained on the task mix at one length.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis.figures.accuracy import accuracy_series, train_marks
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import (
    Skip,
    drawing,
    frame_palette,
    legend_entries,
    length_axis,
    provenance,
    publish,
    value_line,
)

METRIC = "string_match"


@register_figure('ruler', 'accuracy', tasks=('ruler',))
def plot_ruler(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
               formats: Sequence[str] = ("png",)) -> Figure:
    """RULER's string-match score vs evaluation length, one panel per task (``subtask``) and the mean over tasks."""
    if len(acc) == 0 or "task" not in acc or not (acc["task"] == "ruler").any():
        raise Skip("no ruler rows")
    if "length" not in acc:
        acc = F.prepare_accuracy(acc)
    df = acc[(acc["task"] == "ruler") & (acc["metric"] == METRIC) & acc["value"].notna()]
    if len(df) == 0:
        raise Skip(f"no ruler rows with a {METRIC} value")
    pts = D.accuracy_points(df).assign(extra_label="")
    mean = (pts.groupby(["task", "metric", "variant_label", "position_label", "train_len", "length"], as_index=False,
                        dropna=False)["value"].mean().assign(subtask="mean over tasks", extra_label=""))
    pal = palette or frame_palette(df)
    tasks = [t for t in dict.fromkeys(df["subtask"]) if isinstance(t, str)]
    panels = [(t, pts[pts["subtask"] == t]) for t in tasks] + [("mean over tasks", mean)]
    with drawing(len(panels), width=4.2, height=3.3, ncols=min(len(panels), 4)) as (fig, axes):
        for ax, (name, sub) in zip(axes, panels, strict=True):
            for label, g, colour, style in accuracy_series(sub, pal):
                value_line(ax, g, colour, label, "ruler", f"{name}:{label}", **style)
            train_marks(ax, sub)
            length_axis(ax, sub["length"], "evaluation length (bytes)")
            ax.set_ylim(-0.03, 1.03)
            ax.set_ylabel(METRIC)
            ax.set_title(name)
    return publish(fig, "RULER synthetic tasks: string match vs evaluation length", provenance(accuracy=df), out, "ruler",
                   formats, legend_entries(axes))


__all__ = ["plot_ruler"]
