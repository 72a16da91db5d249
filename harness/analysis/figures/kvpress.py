"""KV presses beside the attention variants that hold as many tokens (``attn-bench accuracy --press ... --equal-memory``
and ``attn-bench sweep --scope hf --press ...`` rows).

``kvpress``: kvpress's leaderboard plot, extended -- score against the compression ratio (the fraction of the context's
cached tokens removed), one line per press starting from the uncompressed cache (``none``) at 0, and the equal-memory
variants (a window, a window with sinks, block-sparse) at the ratio whose budget they hold. Panels: per checkpoint
and length, each task's headline metric (:func:`harness.analysis.figures.checkpoint.task_panels`: passkey pooled over
its depths, Wilson interval; each RULER task, string match, the rows' interval).

``kvpress_cost``: what a press costs and saves per decoded token -- decode latency and the cache's bytes against the
tokens it keeps, and the prefill (with the press's scoring) against the context length.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.analysis.figures.checkpoint import panel_order, task_panels, without_backend
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, figure_style, finish_figure, legend_entries, new_figure, save
from harness.analysis.figures.style import palette as make_palette
from harness.schema import press_method


def press_points(acc: pd.DataFrame) -> pd.DataFrame:
    """(model, eval_len, panel, label, ratio) -> value, ci_low, ci_high, n, kind ("press" or "variant")."""
    if "press_spec" not in acc and "matched_ratio" not in acc:
        raise Skip("no KV press rows")
    df = acc[(acc["status"] == "ok") & acc["value"].notna()].copy()
    press = df["press_spec"].notna() if "press_spec" in df else pd.Series(False, index=df.index)
    matched = df["matched_ratio"].notna() if "matched_ratio" in df else pd.Series(False, index=df.index)
    df = df[press | matched]
    if len(df) == 0:
        raise Skip("no KV press rows")
    df["kind"] = ["press" if p else "variant" for p in press[df.index]]
    df["label"] = [press_method(r) if r["kind"] == "press" else without_backend(str(r["variant_spec"])).split(":")[0]
                   + (" + sinks" if "sinks=" in str(r["variant_spec"]) else "") for _, r in df.iterrows()]
    df["ratio"] = [r["compression_ratio"] if r["kind"] == "press" else r["matched_ratio"] for _, r in df.iterrows()]
    if "query_aware" in df:
        df.loc[df["query_aware"].eq(True), "label"] += " (query-aware)"
    keys = ["model", "eval_len", "label", "kind", "ratio"]
    pts = task_panels(df, keys)
    if not len(pts):
        raise Skip("no press rows of a task's headline metric (passkey, RULER)")
    # every press line starts from the uncompressed cache: none's point at ratio 0, per panel
    base = pts[pts["label"] == "none"]
    lines = [pts[pts["label"] != "none"]]
    for label in set(pts[(pts["kind"] == "press") & (pts["label"] != "none")]["label"]):
        lines.append(base.assign(label=label))
    return pd.concat([*lines, base.assign(label="none")], ignore_index=True)


@register_figure("kvpress", "accuracy", description="Score against the compression ratio per KV press, with the "
                 "attention variants that hold as many tokens.")
def plot_kvpress(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                 formats: Sequence[str] = ("png",)) -> Figure:
    if len(acc) == 0:
        raise Skip("no accuracy rows")
    pts = press_points(acc)
    order = panel_order(pts)
    loss = set(pts.loc[pts["metric_kind"] == "loss", "panel"])  # bits per byte after the press: no [0, 1] axis
    grid = sorted({(m, n, p) for m, n, p in zip(pts["model"], pts["eval_len"], pts["panel"], strict=True)},
                  key=lambda g: (g[0], g[1], order.index(g[2])))
    pal = make_palette(sorted(set(pts["label"])))
    with figure_style():
        fig, axes = new_figure(len(grid), width=4.2, height=3.3, ncols=min(len(grid), 4))
        for ax, (model, length, panel) in zip(axes, grid, strict=False):
            sub = pts[(pts["model"] == model) & (pts["eval_len"] == length) & (pts["panel"] == panel)]
            for (label, kind), g in sub.groupby(["label", "kind"], sort=True):
                g = g.sort_values("ratio")
                if label == "none":
                    ax.axhline(float(g["value"].iloc[0]), color="0.35", ls="--", lw=1, label="none (uncompressed)")
                    continue
                style = dict(marker="o", ls="-") if kind == "press" else dict(marker="s", ls=":", markersize=7)
                ax.plot(g["ratio"], g["value"], color=pal[label], label=label + ("" if kind == "press" else
                        " (same tokens)"), gid=f"kvpress:{model}:{length}:{panel}:{label}", **style)
                if g["ci_low"].notna().all() and kind == "press":
                    ax.fill_between(g["ratio"], g["ci_low"], g["ci_high"], color=pal[label], alpha=0.08, lw=0)
            ax.set_xlabel("compression ratio (fraction of the context's KV removed)")
            if panel not in loss:
                ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"{Path(str(model)).name} at {int(length)}: {panel}", fontsize="medium")
        for ax in axes[len(grid):]:
            ax.set_visible(False)
        n = ", ".join(str(int(v)) for v in sorted(set(pts["n"])))
        finish_figure(fig, "KV presses against attention with the same KV memory",
                      f"examples per point: {n}; squares: variants whose state holds the press's kept tokens; "
                      "bands: Wilson (passkey, pooled over depths) or the rows' interval",
                      legend_entries([a for a in axes if a.get_visible()]))
    save(fig, out, "kvpress", formats)
    return fig


@register_figure("kvpress_cost", "cost", description="Per decoded token, latency and cache bytes against the tokens "
                 "each press keeps; the prefill with the press against the context length.")
def plot_kvpress_cost(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                      formats: Sequence[str] = ("png",)) -> Figure:
    if "press_spec" not in cost or not cost["press_spec"].notna().any():
        raise Skip("no cost rows with a KV press")
    df = cost[cost["press_spec"].notna() & (cost["status"] == "ok")].copy()
    if len(df) == 0:
        raise Skip("no ok cost rows with a KV press")
    df["label"] = df["press_spec"].str.replace(r":compression_ratio=", " @ ", regex=True)
    pal = make_palette(sorted(set(df["label"])))
    decode, prefill = df[df["mode"] == "decode"], df[df["mode"] == "forward"]
    panels = [(decode, "kv_tokens_mean", "latency_ms", "decode: latency per token (ms)"),
              (decode, "kv_tokens_mean", "kv_cache_bytes", "decode: KV cache (MiB)"),
              (prefill, "seq_len", "latency_ms", "prefill with the press (ms)")]
    panels = [p for p in panels if len(p[0]) and p[2] in p[0]]
    if not panels:
        raise Skip("no decode or forward rows with a KV press")
    with figure_style():
        fig, axes = new_figure(len(panels), width=4.4, height=3.4)
        for ax, (rows, x, y, title) in zip(axes, panels, strict=False):
            for label, g in rows.groupby("label", sort=True):
                g = g.sort_values(x)
                scale = 2**20 if y == "kv_cache_bytes" else 1
                ax.plot(g[x], g[y] / scale, marker="o", color=pal[label], label=label, gid=f"kvpress_cost:{y}:{label}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("cached tokens per layer after compression" if x == "kv_tokens_mean" else "context (tokens)")
            ax.set_title(title, fontsize="medium")
        model = ", ".join(sorted(set(df["hf_config"].astype(str)))) if "hf_config" in df else ""
        finish_figure(fig, "What a KV press costs and saves", f"model: {model}; one point per context length",
                      legend_entries(axes))
    save(fig, out, "kvpress_cost", formats)
    return fig


__all__ = ["plot_kvpress", "plot_kvpress_cost", "press_points"]
