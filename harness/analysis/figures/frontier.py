"""``frontier``: the memory-quality frontier of ``attn-bench accuracy --preset frontier-*`` rows.

Per model and length, one panel per task: score against the KV bytes a decoded token reads (log scale), one line per
press over its budgets with its interval as a band, the oracle (the ceiling of any selector of the budget) in black on
top, the full cache as a dashed line, quantized caches and the sized variants (at 1/8) as markers where their bytes put
them, retrieval (the chunks a retriever keeps for the question) as dotted lines. A task full scores below 0.5 on is
drawn but titled as not ranked. The numbers behind it come from
:mod:`harness.analysis.frontier` (``attn-bench frontier`` tables them), so the figure and the table agree.

One figure per model and length: ``frontier.<fmt>`` holds them all (one band of panels each, what the report shows),
and with several, each is also written alone as ``frontier-<model>-<length>.<fmt>``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure, SubFigure
from matplotlib.ticker import FuncFormatter

from harness.analysis import frontier as FR
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, figure_style, finish_figure, legend_entries, save
from harness.analysis.figures.style import palette as make_palette

MIB = 2.0**20
WIDTH, HEIGHT = 4.2, 3.4  # one panel


def frontier_points(acc: pd.DataFrame) -> pd.DataFrame:
    """The ok points with bytes to place them (:func:`harness.analysis.frontier.points`); Skip when there are none."""
    if len(acc) == 0:
        raise Skip("no accuracy rows")
    try:
        pts = FR.points(acc)
    except ValueError as e:
        raise Skip(str(e)) from None
    pts = pts[(pts["status"] == "ok") & pts["kv_bytes"].notna()]
    if len(pts) == 0:
        raise Skip("no frontier rows that ran with their KV bytes measured")
    return pts


def _task_order(tasks: Sequence[str]) -> list[str]:
    return sorted(tasks, key=lambda t: (t != "passkey", t))


def _panel(ax: Any, sub: pd.DataFrame, pal: dict[str, Any], gid: str) -> None:
    """One task: presses as lines with bands, the oracle on top, full dashed, quantized, variants and dynamic sparse
    prefills (at full's bytes: they keep every key) as markers."""
    full = sub[sub["kind"] == "reference"]
    if len(full):
        ax.axhline(float(full["score"].iloc[0]), color="0.35", ls="--", lw=1.2, label="full (uncompressed)",
                   gid=f"{gid}:full")
    variants = sorted(set(sub[sub["kind"] == "variant"]["method"]))
    prefills = sorted(set(sub[sub["kind"] == "prefill"]["method"]))
    for (method, kind), g in sub[sub["kind"] != "reference"].groupby(["method", "kind"], sort=True):
        g = g.sort_values("kv_bytes")
        x, y = (g["kv_bytes"] / MIB).to_numpy(float), g["score"].to_numpy(float)
        if kind == "variant":  # sized alike, so at one x: spread a little apart to be seen
            x = x * 2.0 ** (0.07 * (variants.index(method) - (len(variants) - 1) / 2))
        if kind == "prefill":  # a dynamic sparse prefill keeps the whole cache: at full's bytes, spread apart
            x = x * 2.0 ** (0.07 * (prefills.index(method) - (len(prefills) - 1) / 2))
        if kind in ("press", "oracle", "retrieval"):  # retrieval: dotted, it reads the question before choosing
            colour = "black" if kind == "oracle" else pal[method]
            ax.plot(x, y, color=colour, marker="v" if kind == "retrieval" else "o", markersize=4,
                    lw=2.8 if kind == "oracle" else 1.4, ls=":" if kind == "retrieval" else "-",
                    zorder=5 if kind == "oracle" else 3, label=method + (" (query-aware)" if kind == "retrieval" else ""),
                    gid=f"{gid}:{method}")
            ax.fill_between(x, g["ci_low"].to_numpy(float), g["ci_high"].to_numpy(float), color=colour, alpha=0.15,
                            lw=0, gid=f"band:{gid}:{method}")
        else:  # quantized at its bytes, a sized variant at its budget: points, not curves
            yerr = [y - g["ci_low"].to_numpy(float), g["ci_high"].to_numpy(float) - y]
            ax.errorbar(x, y, yerr=yerr, color=pal[method], marker={"quantized": "D", "prefill": "^"}.get(kind, "s"),
                        markersize=7, ls="none", capsize=3, zorder=4, label=method + {"variant": " (1/8)", "prefill":
                        " (prefill, whole cache)"}.get(kind, ""), gid=f"{gid}:{method}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 16, not 2^4
    ax.set_xlabel("KV bytes kept (MiB, log scale)")
    ax.set_ylabel("score")
    ax.set_ylim(-0.03, 1.03)


def _draw(where: Figure | SubFigure, g: pd.DataFrame, pal: dict[str, Any]) -> list[Any]:
    """One model at one length, one panel per task; returns the axes."""
    model, length = str(g["model"].iloc[0]), int(g["eval_len"].iloc[0])
    tasks = _task_order(sorted(set(g["task"])))
    axes = where.subplots(1, len(tasks), squeeze=False).ravel().tolist()
    for ax, task in zip(axes, tasks, strict=True):
        sub = g[g["task"] == task]
        _panel(ax, sub, pal, f"frontier:{model}:{length}:{task}")
        marked = bool(sub["below_half"].iloc[0])
        ax.set_title(task + (" (full < 0.5: not ranked)" if marked else ""), fontsize="medium")
    if isinstance(where, SubFigure):  # a figure of its own says it in its title
        where.suptitle(_name(g), fontsize="medium")
    return axes


def _name(g: pd.DataFrame) -> str:
    return f"{Path(str(g['model'].iloc[0])).name} at {int(g['eval_len'].iloc[0])} tokens"


def _caption(pts: pd.DataFrame) -> str:
    n = ", ".join(str(int(v)) for v in sorted(set(pts["n"])))
    return (f"examples per point: {n} (passkey: its depths pooled); bands and bars: 95 % intervals (Wilson for 0/1 "
            "outcomes, else bootstrap); black: the oracle, per head the budget's keys of highest true attention weight; "
            "squares: variants sized to 1/8, spread a little along x; dotted: retrieval, which reads the question")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", Path(text).name).strip("-").lower() or "model"


@register_figure("frontier", "accuracy", description="Memory-quality frontier: score against the KV bytes kept, per "
                 "press over its budgets, the oracle on top, full, quantized caches and the variants sized to 1/8.")
def plot_frontier(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    pts = frontier_points(acc)
    groups = [g for _, g in pts.groupby(["model", "eval_len"], sort=True)]
    pal = make_palette(sorted(set(pts["method"])))
    ncols = max(len(set(g["task"])) for g in groups)
    title, caption = "Memory-quality frontier: score against the KV memory kept", _caption(pts)
    one_title = "Memory-quality frontier: {}"
    with figure_style():
        fig = Figure(figsize=(WIDTH * ncols + 2.5, (HEIGHT + 0.4) * len(groups) + 0.6), layout="constrained")
        subs = [fig] if len(groups) == 1 else list(fig.subfigures(len(groups), 1, squeeze=False).ravel())
        axes = [ax for sub, g in zip(subs, groups, strict=True) for ax in _draw(sub, g, pal)]
        finish_figure(fig, title if len(groups) > 1 else one_title.format(_name(groups[0])), caption,
                      legend_entries(axes))
        if len(groups) > 1 and out is not None:
            for g in groups:
                one = Figure(figsize=(WIDTH * len(set(g["task"])) + 2.5, HEIGHT + 1.0), layout="constrained")
                finish_figure(one, one_title.format(_name(g)), caption, legend_entries(_draw(one, g, pal)))
                save(one, out, f"frontier-{_slug(str(g['model'].iloc[0]))}-{int(g['eval_len'].iloc[0])}", formats)
    save(fig, out, "frontier", formats)
    return fig


__all__ = ["frontier_points", "plot_frontier"]
