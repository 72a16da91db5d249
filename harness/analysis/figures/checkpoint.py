"""What a variant keeps inside a real pretrained model: accuracy against the evaluation length, one row of panels
per checkpoint (``stage == "pretrained"`` rows of ``attn-bench accuracy --hf-model``), one line per variant (or
layer pattern) and RoPE scaling.

Panels: passkey retrieval (exact match, pooled over the depths: every example counts once, Wilson interval on the
pooled count), each RULER task (string match, mean over examples with the rows' interval) and, where measured,
perplexity. The checkpoint's trained length is the dotted line: lengths past it are extrapolation.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from scipy.stats import binomtest

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
    """(model, panel, label, length) -> value, ci_low, ci_high, n: passkey pooled over depths, the rest as rows say."""
    df = acc[(acc.get("stage") == "pretrained") & (acc["status"] == "ok") & acc["value"].notna()].copy()
    for col in ("press_spec", "matched_ratio"):  # KV presses and their equal-memory variants: the kvpress figure's
        if col in df:
            df = df[df[col].isna()]
    if len(df) == 0:
        raise Skip("no pretrained-checkpoint rows")
    df["label"] = df.apply(label, axis=1)
    keys = ["model", "label", "eval_len"]
    out = []
    pk = df[(df["task"] == "passkey") & (df["metric"] == "exact_match")]
    for key, g in pk.groupby(keys):
        k, n = int(round((g["value"] * g["n"]).sum())), int(g["n"].sum())
        ci = binomtest(k, n).proportion_ci(method="wilson")  # as the rows' own intervals (harness.accuracy.stats)
        out.append(dict(zip(keys, key, strict=True), panel="passkey (all depths)", value=k / n, ci_low=ci.low,
                        ci_high=ci.high, n=n))
    other = df[((df["task"] == "ruler") & (df["metric"] == "string_match"))
               | ((df["task"] == "lm") & (df["metric"] == "perplexity"))]
    for _, r in other.iterrows():
        panel = f"RULER {r['subtask']}" if r["task"] == "ruler" else "perplexity"
        out.append({**{k: r[k] for k in keys}, "panel": panel, "value": r["value"], "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"], "n": r["n"]})
    return pd.DataFrame(out)


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
    order = ["passkey (all depths)", *sorted(p for p in set(pts["panel"]) if p.startswith("RULER")), "perplexity"]
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
                if panel != "perplexity":
                    ax.set_ylim(-0.03, 1.03)
                else:
                    ax.set_yscale("log")
                ax.set_title(f"{model}: {panel}", fontsize="medium")
        n = ", ".join(f"{int(v)}" for v in sorted(set(pts[pts["panel"] != "perplexity"]["n"])))
        finish_figure(fig, "Real checkpoints: what each variant keeps, by length",
                f"examples per point: {n}; bands: Wilson (passkey, pooled over depths) or the rows' interval; dotted: "
                "the checkpoint's trained length", legend_entries([a for a in axes if a.get_visible()]))
    save(fig, out, "checkpoints", formats)
    return fig


__all__ = ["checkpoint_points", "label", "plot_checkpoints"]
