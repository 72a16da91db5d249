"""The per-length accuracy figure: each task's metric vs evaluation length (the figure of every task without one of
its own), and the series and training-length marks other accuracy figures draw the same way.

Takes accuracy rows prepared by :mod:`harness.analysis.frames` and averages seeds through
:func:`harness.analysis.derive.accuracy_points`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis.figures.registry import own_figures, register_figure
from harness.analysis.figures.style import (
    Skip,
    accuracy_rows,
    drawing,
    frame_palette,
    legend_entries,
    length_axis,
    line_styles,
    order_key,
    provenance,
    publish,
    value_line,
)


def accuracy_series(pts: pd.DataFrame, pal: dict) -> list[tuple[str, pd.DataFrame, Any, dict[str, Any]]]:
    """Lines of one panel: coloured by variant when several variants share it, else by position."""
    several = pts["variant_label"].nunique() > 1
    pos_styles = line_styles(pts["position_label"])
    train_varies = "train_len" in pts and pts.groupby(["variant_label", "position_label"])["train_len"].nunique().max() > 1
    keys = ["variant_label", "position_label", "extra_label"] + (["train_len"] if train_varies else [])
    out = []
    for key, g in pts.groupby(keys, dropna=False):
        variant, position, extra = key[0], key[1], key[2]
        label = f"{variant} · {position}" if several else position
        if extra:
            label += f" [{extra}]"
        if train_varies and pd.notna(key[3]):
            label += f" (train {F.fmt_len(key[3])})"
        finetuned = "stage" in g and g["stage"].iloc[0] == "finetune"  # same colour, dashed: the same method fine-tuned
        style = pos_styles[position] if several else {"linestyle": "--" if finetuned else "-", "marker": "o"}
        out.append((label, g.sort_values("length"), pal[variant if several else position], style))
    return sorted(out, key=lambda s: order_key(s[0]))


def train_marks(ax: Axes, sub: pd.DataFrame) -> None:
    if "train_len" in sub:
        for tl in sorted(sub["train_len"].dropna().unique()):
            ax.axvline(tl, color="0.3", linestyle="--", linewidth=1, gid=f"train_len:{int(tl)}")
            ax.text(tl, 0.02, f" train {F.fmt_len(tl)}", transform=ax.get_xaxis_transform(), fontsize="x-small",
                    color="0.3", gid=f"train_label:{int(tl)}")


@register_figure('accuracy', 'accuracy',
                 description='Task accuracy (or bits per byte) per evaluation length and position method.')
def plot_accuracy(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Task metric vs evaluation length, one panel per task and metric; training lengths drawn as dashed lines.

    Tasks with a figure of their own (registered with ``tasks=``) are left out: MQAR (:mod:`.mqar`: recall against
    state size and width, not length), RULER (:mod:`.ruler`: one panel per subtask)."""
    df = accuracy_rows(acc, fidelity=False)
    own = own_figures()  # tasks drawn by figures of their own (MQAR against state size, RULER per subtask...)
    df = df[~df["task"].isin(list(own))]
    if len(df) == 0:
        raise Skip(f"no accuracy rows other than {' and '.join(own)} "
                   f"(drawn in {' and '.join(f'{f}.png' for f in own.values())})")
    pts = D.accuracy_points(df)
    pal = palette or frame_palette(df)
    panels = sorted(pts.groupby(["task", "metric"]).groups)
    with drawing(len(panels)) as (fig, axes):
        for ax, (task, metric) in zip(axes, panels, strict=True):
            sub = pts[(pts["task"] == task) & (pts["metric"] == metric)]
            for label, g, colour, style in accuracy_series(sub, pal):
                value_line(ax, g, colour, label, "accuracy", **style)
            train_marks(ax, sub)
            if F.lower_is_better(sub) and (sub["value"] > 0).all():
                ax.set_yscale("log")
            length_axis(ax, sub["length"], "evaluation length (tokens)")
            ax.set_ylabel(metric)
            ax.set_title(f"{task} · {metric}")
    return publish(fig, "Accuracy vs evaluation length", provenance(accuracy=df), out, "accuracy", formats,
                   legend_entries(axes))


__all__ = ["accuracy_series", "plot_accuracy", "train_marks"]
