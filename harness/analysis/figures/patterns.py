"""The hybrid figure: what a layer pattern costs and keeps against the fraction of its layers that run full attention
(softmax over every key: ``full`` and ``mla``), the axis of the hybrid studies (arXiv 2507.06457 sweeps linear : full
ratios). Panels: decoding state of all layers and one decoded token's latency at the longest decode context, prefill
latency at the longest forward length (model-scope cost rows), and MQAR recall at each width (accuracy rows).
Points are the rows' variant labels; those of one family (the layers that are not full attention: ``gated_deltanet``
for 0 : 1 ... 1 : 0 of gated_deltanet : full) are joined."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, figure_style, finish_figure, new_figure, provenance, save
from harness.analysis.figures.style import palette as make_palette

FULL_LAYERS = ("full", "mla")  # softmax over every key: the layers whose state grows with the context


def composition(variant: str, params: dict) -> tuple[float, str]:
    """(fraction of full-attention layers, family: the other layers' variants joined, or ``full``) of a row."""
    from attn.patterns import LAYERS, parse_pattern
    from attn.registry import resolve_variant

    if variant != LAYERS:
        return (1.0 if variant in FULL_LAYERS else 0.0), variant
    names = [resolve_variant(s).name for s in parse_pattern(params["pattern"]).unit]
    other = sorted({n for n in names if n not in FULL_LAYERS})
    return sum(n in FULL_LAYERS for n in names) / len(names), "+".join(other) or "full"


def _placed(df: pd.DataFrame) -> pd.DataFrame:
    placed = [composition(v, p) for v, p in zip(df["variant"], df["variant_params"], strict=True)]
    specs = df["variant_spec"] if "variant_spec" in df else df["variant_label"]
    names = [s if isinstance(s, str) and s else lab for s, lab in zip(specs, df["variant_label"], strict=True)]
    return df.assign(full_fraction=[f for f, _ in placed], family=[fam for _, fam in placed], name=names)


def _family_lines(ax, pts: pd.DataFrame, y: str, pal: dict, panel: str) -> None:
    """One point per variant label (gid ``patterns:<panel>:<label>``) and, per family with a hybrid, a line from its
    uniform model through its hybrids to all-full (gid ``patterns:<panel>:family:<family>``)."""
    for label, g in pts.groupby("variant_label"):
        ax.scatter(g["full_fraction"], g[y], color=pal[label], s=28, zorder=3, label=label, gid=f"patterns:{panel}:{label}")
        for x, v, name in zip(g["full_fraction"], g[y], g["name"], strict=True):
            ax.annotate(name, (x, v), fontsize=6, xytext=(3, 3), textcoords="offset points", color="0.3")
    for fam, g in pts.groupby("family"):
        if fam == "full" or not g["full_fraction"].between(0, 1, inclusive="neither").any():
            continue  # a line only through a family's hybrids, from its uniform model (0) to all-full (1)
        g = pd.concat([g, pts[pts["family"] == "full"]]).sort_values("full_fraction")
        ax.plot(g["full_fraction"], g[y], color="0.6", lw=0.8, zorder=1, gid=f"patterns:{panel}:family:{fam}")
    ax.set_xlabel("fraction of full-attention layers")
    ax.set_xlim(-0.05, 1.1)  # the whole axis on every panel, so panels with a few models read alike


@register_figure("patterns", "both", description="Hybrid layer patterns: decode state, latency and MQAR recall against "
                                                 "the fraction of full-attention layers.")
def plot_patterns(cost: pd.DataFrame, acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    model = cost[(cost.get("scope") == "model") & (cost["status"] == "ok")] if len(cost) else cost
    if not len(model) or not (model["variant"] == "layers").any():
        raise Skip("no model-scope rows of a layer pattern (sweep --scope model --pattern ...)")
    model = _placed(model[model["num_kv_heads"].isna()] if "num_kv_heads" in model else model)
    mq = acc[(acc["task"] == "mqar") & (acc["metric"] == "accuracy")] if len(acc) else acc
    mq = _placed(mq) if len(mq) else mq
    pal = palette if palette is not None and set(model["variant_label"]) <= set(palette) else make_palette(
        list(model["variant_label"]) + (list(mq["variant_label"]) if len(mq) else []))
    widths = sorted(mq["d_model"].dropna().unique()) if len(mq) and "d_model" in mq else []
    with figure_style():
        fig, axes = new_figure(3 + len(widths), ncols=min(3 + len(widths), 3))
        for ax, panel, mode, y, what, scale in (
                (axes[0], "state", "decode", "state_bytes", "decoding state, all layers (MiB)", 2**20),
                (axes[1], "decode", "decode", "latency_ms", "one decoded token (ms)", 1),
                (axes[2], "prefill", "forward", "latency_ms", "prefill (ms)", 1)):
            rows = model[model["mode"] == mode]
            if not len(rows) or y not in rows or rows[y].isna().all():
                ax.set_visible(False)
                continue
            L = int(rows["seq_len"].max())
            pts = rows[rows["seq_len"] == L].assign(value=lambda r, y=y, s=scale: r[y] / s)
            _family_lines(ax, pts, "value", pal, panel)
            ax.set_ylabel(what)
            ax.set_title(f"{mode} at {L // 1024}K" if L >= 1024 else f"{mode} at {L}")
            ax.set_yscale("log")
        for ax, d in zip(axes[3:], widths, strict=False):
            sub = mq[mq["d_model"] == d]
            pts = sub.groupby(["variant_label", "name", "family", "full_fraction"], as_index=False)["value"].mean()
            _family_lines(ax, pts, "value", pal, f"mqar{int(d)}")
            ax.set_ylim(0, 1.02)
            ax.set_ylabel("MQAR accuracy (mean over seeds)")
            ax.set_title(f"MQAR, width {int(d)}, length {int(sub['train_len'].max())}")
        finish_figure(fig, "Hybrid layer patterns against the fraction of full-attention layers",
                      provenance(cost=model, accuracy=mq if len(mq) else None))
    save(fig, out, "patterns", formats)
    return fig


__all__ = ["composition", "plot_patterns"]
