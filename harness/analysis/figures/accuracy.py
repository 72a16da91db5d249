"""Accuracy figures: fidelity to full attention, task metric vs length, position heatmap, passkey, trade-off.

Each takes accuracy rows prepared by :mod:`harness.analysis.frames` (the trade-off also cost rows) and
averages seeds through :func:`harness.analysis.derive.accuracy_points`. MQAR's figures are in :mod:`.mqar`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis.figures.style import (
    Skip,
    _band,
    _figure,
    _finish,
    _frame_palette,
    _legend_entries,
    _length_axis,
    _order_key,
    _style,
    _styles,
    backend_shade,
    mem_unit,
    palette_for,
    save,
)

# -- accuracy figures --------------------------------------------------------------------------

def _acc_frame(acc: pd.DataFrame, fidelity: bool) -> pd.DataFrame:
    if len(acc) == 0:
        raise Skip("no accuracy rows")
    if "length" not in acc:
        acc = F.prepare_accuracy(acc)
    sel = acc[(acc["task"] == "fidelity") == fidelity]
    sel = sel[sel["value"].notna() & sel["length"].notna()]
    if len(sel) == 0:
        raise Skip("no fidelity rows (task 'fidelity')" if fidelity else "no accuracy rows with a value and an eval length")
    return sel


def plot_fidelity(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Output error of each variant against full attention vs length, one panel per metric."""
    df = _acc_frame(acc, fidelity=True)
    pts = D.accuracy_points(df, extra=("backend",) if "backend" in df else ())
    backend = pts["backend"] if "backend" in pts else pd.Series("", index=pts.index)
    pts["series"] = [f"{v}/{b}" if b else v for v, b in zip(pts["variant_label"], backend, strict=True)]
    pts["series"] = [f"{s} [{e}]" if e else s for s, e in zip(pts["series"], pts["extra_label"], strict=True)]
    pal = palette or _frame_palette(df)
    metrics = sorted(pts["metric"].unique())
    with _style():
        fig, axes = _figure(len(metrics))
        for ax, metric in zip(axes, metrics, strict=True):
            sub = pts[pts["metric"] == metric]
            for series, g in sorted(sub.groupby("series"), key=lambda kv: _order_key(kv[0])):
                g = g.sort_values("length")
                colour = pal[g["variant_label"].iloc[0]]
                if "backend" in g and isinstance(g["backend"].iloc[0], str) and g["backend"].iloc[0]:
                    colour = backend_shade(colour, g["backend"].iloc[0])  # as the cost figures draw this backend
                ax.plot(g["length"], g["value"], color=colour, marker="o", markersize=4, label=series,
                        gid=f"fidelity:{series}")
                _band(ax, g, colour, f"band:{series}")
            if F.lower_is_better(metric) and (sub["value"] > 0).all():
                ax.set_yscale("log")
            _length_axis(ax, sub["length"])
            ax.set_ylabel(f"{metric} vs full attention")
            ax.set_title(metric)
        _finish(fig, "Fidelity to full attention", F.caption(accuracy=df), _legend_entries(axes))
    save(fig, out, "fidelity", formats)
    return fig


def _acc_series(pts: pd.DataFrame, pal: dict) -> list[tuple[str, pd.DataFrame, Any, dict[str, Any]]]:
    """Lines of one panel: coloured by variant when several variants share it, else by position."""
    several = pts["variant_label"].nunique() > 1
    pos_styles = _styles(pts["position_label"])
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
    return sorted(out, key=lambda s: _order_key(s[0]))


def _train_marks(ax: Axes, sub: pd.DataFrame) -> None:
    if "train_len" in sub:
        for tl in sorted(sub["train_len"].dropna().unique()):
            ax.axvline(tl, color="0.3", linestyle="--", linewidth=1, gid=f"train_len:{int(tl)}")
            ax.text(tl, 0.02, f" train {F.fmt_len(tl)}", transform=ax.get_xaxis_transform(), fontsize="x-small",
                    color="0.3", gid=f"train_label:{int(tl)}")


def plot_accuracy(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Task metric vs evaluation length, one panel per task and metric; training lengths drawn as dashed lines.

    MQAR has figures of its own (:mod:`.mqar`): recall against state size and width, not length; RULER one panel per
    task (:mod:`.ruler`)."""
    df = _acc_frame(acc, fidelity=False)
    df = df[~df["task"].isin(["mqar", "ruler"])]
    if len(df) == 0:
        raise Skip("no accuracy rows other than mqar and ruler (drawn in mqar.png and ruler.png)")
    pts = D.accuracy_points(df)
    pal = palette or _frame_palette(df)
    panels = sorted(pts.groupby(["task", "metric"]).groups)
    with _style():
        fig, axes = _figure(len(panels))
        for ax, (task, metric) in zip(axes, panels, strict=True):
            sub = pts[(pts["task"] == task) & (pts["metric"] == metric)]
            for label, g, colour, style in _acc_series(sub, pal):
                ax.plot(g["length"], g["value"], color=colour, label=label, gid=f"accuracy:{label}", markersize=4, **style)
                _band(ax, g, colour, f"band:{label}")
            _train_marks(ax, sub)
            if F.lower_is_better(metric) and (sub["value"] > 0).all():
                ax.set_yscale("log")
            _length_axis(ax, sub["length"], "evaluation length (tokens)")
            ax.set_ylabel(metric)
            ax.set_title(f"{task} · {metric}")
        _finish(fig, "Accuracy vs evaluation length", F.caption(accuracy=df), _legend_entries(axes))
    save(fig, out, "accuracy", formats)
    return fig


def _heat_rows(pts: pd.DataFrame) -> pd.Series:
    several = pts["variant_label"].nunique() > 1
    label = pts["variant_label"] + " · " + pts["position_label"] if several else pts["position_label"]
    if "extra_label" in pts:
        label = label + pts["extra_label"].map(lambda e: f" [{e}]" if e else "")
    if "train_len" in pts and pts["train_len"].nunique() > 1:
        label = label + " (train " + pts["train_len"].map(lambda x: F.fmt_len(x) if pd.notna(x) else "?") + ")"
    return label


def position_table(pts: pd.DataFrame) -> pd.DataFrame:
    """Rows: position method (and variant/train length if they vary); columns: evaluation length."""
    pts = pts.assign(row=_heat_rows(pts))
    table = pts.pivot_table(index="row", columns="length", values="value", aggfunc="mean")
    table.columns = [int(c) for c in table.columns]
    return table


def plot_position_heatmap(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                          formats: Sequence[str] = ("png",)) -> Figure:
    """Length generalisation at a glance: position method × evaluation length, one panel per task and metric."""
    pts = D.accuracy_points(_acc_frame(acc, fidelity=False))
    panels = [k for k, g in sorted(pts.groupby(["task", "metric"])) if g["position_label"].nunique() > 1]
    if not panels:
        raise Skip("needs accuracy rows of at least two position methods on one task")
    df = _acc_frame(acc, fidelity=False)
    with _style():
        fig, axes = _figure(len(panels), width=6.0, height=0.5 + 0.45 * pts["position_label"].nunique() + 1.5, ncols=1)
        for ax, (task, metric) in zip(axes, panels, strict=True):
            table = position_table(pts[(pts["task"] == task) & (pts["metric"] == metric)])
            sns.heatmap(table, ax=ax, annot=True, fmt=".3g", cmap="viridis_r" if F.lower_is_better(metric) else "viridis",
                        cbar_kws={"label": metric}, xticklabels=[F.fmt_len(c) for c in table.columns])
            ax.collections[0].set_gid(f"heatmap:{task}:{metric}")
            ax.tick_params(axis="y", labelrotation=0)
            ax.set_xlabel("evaluation length (tokens)")
            ax.set_ylabel("position method")
            ax.set_title(f"{task} · {metric}")
        _finish(fig, "Length generalisation by position method", F.caption(accuracy=df))
    save(fig, out, "position_heatmap", formats)
    return fig


def plot_passkey(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                 formats: Sequence[str] = ("png",)) -> Figure:
    """Passkey retrieval accuracy by length × depth (needle-in-a-haystack view), one panel per model."""
    df = _acc_frame(acc, fidelity=False)
    df = df[df["task"].str.contains("passkey")]
    if len(df) == 0 or "depth" not in df or df["depth"].isna().all():
        raise Skip("no passkey rows with a depth column")
    pts = D.accuracy_points(df[df["depth"].notna()], extra=("depth",))
    pts = pts.assign(row=_heat_rows(pts))
    panels = sorted(pts.groupby(["row", "metric"]).groups)
    with _style():
        fig, axes = _figure(len(panels), width=5.5, height=0.4 * pts["depth"].nunique() + 2.0, ncols=min(len(panels), 2))
        for ax, (row, metric) in zip(axes, panels, strict=True):
            sub = pts[(pts["row"] == row) & (pts["metric"] == metric)]
            table = sub.pivot_table(index="depth", columns="length", values="value", aggfunc="mean").sort_index()
            higher = not F.lower_is_better(metric)
            sns.heatmap(table, ax=ax, annot=True, fmt=".2g", cmap="viridis" if higher else "viridis_r",
                        vmin=0 if higher else None, vmax=1 if higher and table.max().max() <= 1 else None,
                        cbar_kws={"label": metric}, xticklabels=[F.fmt_len(c) for c in table.columns],
                        yticklabels=[f"{d:g}" for d in table.index])
            ax.collections[0].set_gid(f"passkey:{row}:{metric}")
            ax.tick_params(axis="y", labelrotation=0)
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("passkey depth (fraction of context)")
            ax.set_title(row)
        _finish(fig, "Passkey retrieval by length and depth", F.caption(accuracy=df))
    save(fig, out, "passkey", formats)
    return fig


# -- joined and structural figures -------------------------------------------------------------

def tradeoff_points(cost: pd.DataFrame, acc: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """One point per variant label: mean accuracy (per task/metric) vs throughput and memory at one length.

    The length is the longest at which every joined variant has an ok forward cell (as in Long Range
    Arena, Tay et al. 2020, Fig. 3, https://arxiv.org/abs/2011.04006); each variant's fastest backend counts.
    """
    if len(cost) == 0 or len(acc) == 0:
        raise Skip("needs both cost rows and accuracy rows")
    acc = acc if "length" in acc else F.prepare_accuracy(acc)
    cost = cost if "series" in cost else F.prepare_cost(cost)
    F.check_single_device(cost)
    acc = acc[(acc["task"] != "fidelity") & acc["value"].notna() & ~acc["metric"].map(F.lower_is_better)]
    ok = F.cells(F.ok_rows(cost, "tokens_per_s"))
    mode = "forward" if (ok["mode"] == "forward").any() else (ok["mode"].iloc[0] if len(ok) else None)
    ok = ok[ok["mode"] == mode]
    shared = sorted(set(acc["variant_label"]) & set(ok["variant_label"]))
    if not shared:
        raise Skip("no variant label appears in both the accuracy rows and the ok cost rows")
    ok = ok[ok["variant_label"].isin(shared)]
    per_len = ok.groupby("seq_len")["variant_label"].nunique()
    common = per_len[per_len == len(shared)]
    if len(common) == 0:
        raise Skip(f"no length at which all of {', '.join(shared)} ran ok")
    length = float(common.index.max())
    best = ok[ok["seq_len"] == length].sort_values("tokens_per_s").groupby("variant_label").tail(1)
    # each seed at its best learning rate, seeds averaged (accuracy_points), then the mean over a variant's points
    points = D.accuracy_points(acc[acc["variant_label"].isin(shared)])
    score = points.groupby(["task", "metric", "variant_label"], as_index=False)["value"].mean()
    pts = score.merge(best[["variant_label", "backend_label", "tokens_per_s", "peak_mem_bytes"]], on="variant_label")
    note = (f"throughput and memory at {F.fmt_len(length)} tokens ({mode}, fastest backend); accuracy = mean over points "
            "(best learning rate per seed, mean over seeds)")
    return pts, note


def plot_tradeoff(cost: pd.DataFrame, acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Quality vs cost: accuracy vs throughput, marker area ∝ peak memory, one point per variant."""
    pts, note = tradeoff_points(cost, acc)
    pal = palette or palette_for(F.Results(cost=pts[["variant_label"]], accuracy=pd.DataFrame()))
    panels = sorted(pts.groupby(["task", "metric"]).groups)
    mem = pts["peak_mem_bytes"].astype(float)
    has_mem = mem.notna().any()
    scale, unit = mem_unit(float(mem.max()) if has_mem else 0.0)
    pts = pts.assign(mem=mem / scale)
    with _style():
        fig, axes = _figure(len(panels), width=5.5, height=4.5)
        for ax, (task, metric) in zip(axes, panels, strict=True):
            sub = pts[(pts["task"] == task) & (pts["metric"] == metric)]
            sizes = {"size": "mem", "sizes": (40, 600), "size_norm": (0, pts["mem"].max())} if has_mem else {}
            sns.scatterplot(data=sub, x="tokens_per_s", y="value", hue="variant_label", palette=pal, alpha=0.8, ax=ax,
                            legend=False, **sizes)
            ax.collections[-1].set_gid(f"tradeoff:{task}:{metric}")
            for _, r in sub.iterrows():
                ax.annotate(r["variant_label"], (r["tokens_per_s"], r["value"]), xytext=(5, 5), textcoords="offset points",
                            fontsize="x-small", gid=f"point:{r['variant_label']}")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("throughput (tokens/s)")
            ax.set_ylabel(metric)
            ax.set_title(f"{task} · {metric}")
        legend = [(Line2D([], [], color=pal[v], marker="o", linestyle=""), v)
                  for v in sorted(pts["variant_label"].unique(), key=_order_key)]
        if has_mem:
            legend.append((Line2D([], [], color="none"), f"marker area ∝ peak memory ({unit}, max {pts['mem'].max():.3g})"))
        _finish(fig, "Quality / cost trade-off", f"{F.caption(cost)} · {note}", legend)
    save(fig, out, "tradeoff", formats)
    return fig



__all__ = ["plot_accuracy", "plot_fidelity", "plot_passkey", "plot_position_heatmap", "plot_tradeoff",
           "position_table", "tradeoff_points"]
