"""The quality / cost trade-off: accuracy against throughput at one length, one point per variant."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import (
    Skip,
    figure_style,
    finish_figure,
    mem_unit,
    new_figure,
    order_key,
    palette_for,
    provenance,
    save,
)


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
    acc = F.declared(acc)
    acc = acc[~acc["versus_full"] & acc["value"].notna() & (acc["metric_kind"] != "loss")]
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


@register_figure('tradeoff', 'both',
                 description='Accuracy against throughput: each point one variant.')
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
    with figure_style():
        fig, axes = new_figure(len(panels), width=5.5, height=4.5)
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
                  for v in sorted(pts["variant_label"].unique(), key=order_key)]
        if has_mem:
            legend.append((Line2D([], [], color="none"), f"marker area ∝ peak memory ({unit}, max {pts['mem'].max():.3g})"))
        finish_figure(fig, "Quality / cost trade-off", f"{provenance(cost)} · {note}", legend)
    save(fig, out, "tradeoff", formats)
    return fig


__all__ = ["plot_tradeoff", "tradeoff_points"]
