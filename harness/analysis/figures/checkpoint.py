"""What a variant keeps inside a real pretrained model: accuracy against the evaluation length, one row of panels
per checkpoint (``stage == "pretrained"`` rows of ``attn-bench accuracy --hf-model``), one line per variant (or
layer pattern) and RoPE scaling.

Panels: each task's headline metric as its rows declare it (:func:`task_panels`): passkey retrieval (exact match,
pooled over the depths: every example counts once, Wilson interval on the pooled count), each RULER task (string
match, mean over examples with the rows' interval) and, where measured, bits per byte. The checkpoint's trained
length is the dotted line: lengths past it are extrapolation.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from scipy.stats import binomtest

from harness.analysis import frames as F
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, figure_style, finish_figure, legend_entries, length_axis, new_figure, save
from harness.analysis.figures.style import palette as make_palette


def without_backend(spec: str) -> str:
    return re.sub(r"[:,]backend=\w+", "", spec).replace(":,", ":")


def label(row: pd.Series) -> str:
    """The legend text of a row: its variant spec without the backend (which changes no number; a layer spec that is
    the model's own pattern says so), and the RoPE scaling when it is not the checkpoint's own."""
    layers = row.get("layer_specs")
    own = row.get("layer_pattern") == "own" or (  # rows written before layer_pattern: no window given = the model's
        isinstance(layers, dict) and all(without_backend(s) == ("sliding_window" if t == "sliding_attention" else "full")
                                         for t, s in layers.items()))
    if own:
        spec = "own pattern"
    else:
        spec = without_backend(str(row["variant_spec"]))
    return spec if row["position_spec"] == "checkpoint" else f"{spec} + {row['position_spec']}"


def checkpoint_points(acc: pd.DataFrame) -> pd.DataFrame:
    """(model, panel, label, length) -> value, ci_low, ci_high, n (:func:`task_panels`)."""
    df = acc[(acc.get("stage") == "pretrained") & (acc["status"] == "ok") & acc["value"].notna()].copy()
    for col in ("press_spec", "matched_ratio"):  # KV presses and their equal-memory variants: the kvpress figure's
        if col in df:
            df = df[df[col].isna()]
    if len(df) == 0:
        raise Skip("no pretrained-checkpoint rows")
    df["label"] = df.apply(label, axis=1)
    return task_panels(df, ["model", "label", "eval_len"])


def task_panels(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One point per ``keys`` and panel, from the rows of each task's headline metric (``metric_role`` ranked or
    main, as the rows declare it). A panel is a task as its rows name it (``task_label``: RULER's subtasks are panels
    of their own); rows of one point at other cells (passkey's depths) pool: a proportion's counts, with a Wilson
    interval on the pooled count (as the rows' own intervals, harness.accuracy.stats), another metric's mean."""
    df = F.declared(df)
    df = df[df["metric_role"].isin(["ranked", "main"]) & ~df["versus_full"]]
    out = []
    for key, g in df.groupby([*keys, "task", "task_label", "metric", "metric_kind"], sort=False):
        *at, task, name, metric, kind = key
        panel = f"{task} ({metric})" if name == task else f"{task} {name}"
        point = dict(zip(keys, at, strict=True), panel=panel, whole=name == task, metric_kind=kind)
        if len(g) == 1:
            r = g.iloc[0]
            out.append({**point, "value": r["value"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "n": r["n"]})
        elif kind == "proportion":
            k, n = int(round((g["value"] * g["n"]).sum())), int(g["n"].sum())
            ci = binomtest(k, n).proportion_ci(method="wilson")
            out.append({**point, "value": k / n, "ci_low": ci.low, "ci_high": ci.high, "n": n})
        else:
            out.append({**point, "value": g["value"].mean(), "ci_low": None, "ci_high": None, "n": int(g["n"].sum())})
    cols = [*keys, "panel", "whole", "metric_kind", "value", "ci_low", "ci_high", "n"]
    return pd.DataFrame(out, columns=cols)


def panel_order(pts: pd.DataFrame) -> list[str]:
    """Panels in the order figures show them: tasks scored whole, then subtasks, each by name; losses last."""
    first = pts.drop_duplicates("panel")
    return [p for _, p in sorted(((r.metric_kind == "loss", not r.whole, r.panel), r.panel) for r in first.itertuples())]


@register_figure('checkpoints', 'accuracy')
def plot_checkpoints(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                     formats: Sequence[str] = ("png",)) -> Figure:
    """Accuracy by length per variant and scaling, one row of panels per checkpoint (its own colours: labels here are
    specs the other figures do not share)."""
    if len(acc) == 0 or "stage" not in acc:
        raise Skip("no pretrained-checkpoint rows")
    pts = checkpoint_points(acc)
    train = acc[acc["stage"] == "pretrained"].groupby("model")["train_len"].first()
    models = list(dict.fromkeys(pts["model"]))
    order = panel_order(pts)
    loss = set(pts.loc[pts["metric_kind"] == "loss", "panel"])
    grid = [(m, p) for m in models for p in order if ((pts["model"] == m) & (pts["panel"] == p)).any()]
    pal = make_palette(dict.fromkeys(pts["label"]))
    ncols = max(sum(1 for m, _ in grid if m == model) for model in models)
    with figure_style():
        fig, axes = new_figure(len(models) * ncols, width=4.0, height=3.2, ncols=ncols)
        for ax in axes:
            ax.set_visible(False)
        for i, model in enumerate(models):
            for j, (_, panel) in enumerate([g for g in grid if g[0] == model]):
                ax = axes[i * ncols + j]
                ax.set_visible(True)
                sub = pts[(pts["model"] == model) & (pts["panel"] == panel)]
                for name, g in sub.groupby("label", sort=False):
                    g = g.sort_values("eval_len")
                    ax.plot(g["eval_len"], g["value"], marker="o", markersize=4, color=pal[name], label=name,
                            gid=f"checkpoint:{model}:{panel}:{name}")
                    if g["ci_low"].notna().all():
                        ax.fill_between(g["eval_len"], g["ci_low"], g["ci_high"], color=pal[name], alpha=0.12, lw=0)
                if model in train.index:
                    ax.axvline(train[model], color="0.5", ls=":", lw=1)
                length_axis(ax, pts[pts["model"] == model]["eval_len"], "evaluation length (tokens)")
                if panel not in loss:
                    ax.set_ylim(-0.03, 1.03)
                ax.set_title(f"{model}: {panel}", fontsize="medium")
        n = ", ".join(f"{int(v)}" for v in sorted(set(pts[pts["metric_kind"] != "loss"]["n"])))
        finish_figure(fig, "Real checkpoints: what each variant keeps, by length",
                f"examples per point: {n}; bands: Wilson (cells pooled, as passkey's depths) or the rows' interval; dotted: "
                "the checkpoint's trained length", legend_entries([a for a in axes if a.get_visible()]))
    save(fig, out, "checkpoints", formats)
    return fig


__all__ = ["checkpoint_points", "label", "panel_order", "plot_checkpoints", "task_panels"]
