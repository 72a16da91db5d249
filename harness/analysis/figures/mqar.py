"""MQAR figures after Zoology (Arora et al. 2023, https://arxiv.org/abs/2312.04927, Fig. 2): recall against the
decoding state one layer carries, and recall against width.

A fixed-size state (a window, a linear-attention memory) can hold only so many key-value bindings, so recall
is read against the state size rather than the sequence length. The points are
:func:`mqar_points`: per-query accuracy at the length trained, each seed at its best
learning rate, then the mean over seeds with a t interval clipped to [0, 1]. Every panel shows the in-context
baseline (answer a random value of the context: 1 / pairs) dashed and chance (1 / values) dotted.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import (
    Skip,
    drawing,
    frame_palette,
    legend_entries,
    order_key,
    provenance,
    publish,
    value_line,
)
from harness.analysis.figures.style import palette as stable_palette

REFERENCES = (  # column, line style, legend label
    ("baseline", "--", "in-context baseline (a random value of the context)"),
    ("chance", ":", "chance (1 / number of values)"),
)


# What tells MQAR points apart beyond the variant label: the family (``variant``), the width and the state size.
MQAR_POINT = ("variant", "d_model", "state_numbers")


def mqar_points(acc: pd.DataFrame, metric: str = "accuracy") -> tuple[pd.DataFrame, dict[str, int]]:
    """Zoology's MQAR points (Arora et al. 2023, Fig. 2): one per variant label, width and state size at each
    training length, evaluated at that length; each seed at its best learning rate, then the mean over seeds
    with a t interval clipped to [0, 1] (:func:`accuracy_points`).

    Columns: ``panel`` (``"train_len=64"``, plus ``num_pairs`` where pairs vary at one training length),
    ``family`` (the variant name), ``suffix`` (position, and the series columns that vary, for labels),
    ``width`` (``d_model``, the preset's own where the row has None), ``state_numbers``, ``value``,
    ``ci_low``/``ci_high``, ``rows``, and the panel's ``baseline`` and ``chance`` (means of its rows').
    Also returns how many rows were left out, by reason: the old protocol (rows with a ``gap_rule``: a fixed
    key-query gap, no state size) and extrapolation (evaluated at another length than trained)."""
    df = acc[(acc["task"] == "mqar") & (acc["metric"] == metric) & acc["value"].notna()]
    old = df["gap_rule"].map(D.dim_text) != "" if "gap_rule" in df else pd.Series(False, index=df.index)
    extrapolation = ~old & (df["length"] != df["train_len"])
    left_out = {"old protocol (gap_rule, no state size)": int(old.sum()),
                "extrapolation (eval_len != train_len)": int(extrapolation.sum())}
    df = df[~old & ~extrapolation].copy()
    for c in ("d_model", "state_numbers", "baseline", "chance", "num_pairs"):
        df[c] = pd.to_numeric(df[c], errors="coerce") if c in df else np.nan
    pts = D.accuracy_points(df, extra=MQAR_POINT) if len(df) else pd.DataFrame()
    if len(pts) == 0:
        return pts, left_out
    df["pairs"] = df["num_pairs"].map(D.dim_text)
    several_pairs = set(df.groupby("train_len")["pairs"].nunique().loc[lambda n: n > 1].index)
    df["panel"] = [_panel(t, n, t in several_pairs) for t, n in zip(df["train_len"], df["pairs"], strict=True)]
    pts["panel"] = [_panel(t, n, t in several_pairs) for t, n in zip(pts["train_len"], pts["num_pairs"], strict=True)]
    refs = df.groupby("panel")[["baseline", "chance"]].mean()
    pts = pts.join(refs, on="panel")
    several_positions = pts["position_label"].nunique() > 1
    varying = [c for c in D.SERIES_DIMS if c in pts and c not in ("d_model", "num_pairs") and pts[c].nunique() > 1]
    extras = [" ".join(f"{c}={r[c]}" for c in varying if r[c]) for _, r in pts.iterrows()]
    pts["suffix"] = [(f" · {pos}" if several_positions else "") + (f" [{e}]" if e else "")
                     for pos, e in zip(pts["position_label"], extras, strict=True)]
    pts["family"] = pts["variant"]
    models = pts["model"] if "model" in pts else pd.Series("", index=pts.index)
    pts["width"] = [d if pd.notna(d) else F.preset_width(m) for d, m in zip(pts["d_model"], models, strict=True)]
    return pts, left_out


def _panel(train_len: float, pairs: str, with_pairs: bool) -> str:
    return f"train_len={int(train_len)}" + (f" num_pairs={pairs}" if with_pairs else "")


def _points(acc: pd.DataFrame) -> tuple[pd.DataFrame, list[str], pd.DataFrame]:
    """The MQAR points, what was left out (as caption notes), and the rows they come from."""
    if len(acc) == 0:
        raise Skip("no accuracy rows")
    if "length" not in acc:
        acc = F.prepare_accuracy(acc)
    df = acc[(acc["task"] == "mqar") & (acc["metric"] == "accuracy")]
    if len(df) == 0:
        raise Skip("no mqar accuracy rows")
    pts, left_out = mqar_points(df)
    notes = [f"{n} rows left out: {why}" for why, n in left_out.items() if n]
    if len(pts) == 0:
        raise Skip("no mqar rows trained and evaluated at one length with the current protocol"
                   + (f" ({'; '.join(notes)}): re-run the mqar job" if notes else ""))
    return pts, notes, df


def _known(pts: pd.DataFrame, notes: list[str], column: str, none: str, some: str) -> tuple[pd.DataFrame, list[str]]:
    """The points with a ``column`` value and the notes plus how many were left out (``some``); Skip(``none``) if none."""
    unknown = pts[column].isna()
    if unknown.all():
        raise Skip(none)
    return pts[~unknown], notes + ([f"{int(unknown.sum())} {some}"] if unknown.any() else [])


def _references(ax: Axes, sub: pd.DataFrame, panel: str) -> None:
    for col, style, label in REFERENCES:
        values = sub[col].dropna() if col in sub else pd.Series(dtype=float)
        if len(values):
            ax.axhline(float(values.iloc[0]), color="0.35", linestyle=style, linewidth=1, label=label,
                       gid=f"{col} [{panel}]")


def _draw(pts: pd.DataFrame, x: str, curve: pd.Series, colour_of: dict, name: str, title: str, xlabel: str,
          notes: list[str], df: pd.DataFrame, out: str | Path | None, formats: Sequence[str]) -> Figure:
    """One panel per training length; one line per ``curve`` label through its points sorted by ``x`` (log2)."""
    pts = pts.assign(curve=curve)
    panels = [p for _, p in sorted({(t, p) for t, p in zip(pts["train_len"], pts["panel"], strict=True)})]
    with drawing(len(panels), width=4.6, height=3.6) as (fig, axes):
        for ax, panel in zip(axes, panels, strict=True):
            sub = pts[pts["panel"] == panel]
            for label, g in sorted(sub.groupby("curve"), key=lambda kv: order_key(kv[0])):
                g = g.sort_values(x)
                value_line(ax, g, colour_of[g["colour_key"].iloc[0]], label, name, f"{label} [{panel}]", x=x, marker="o")
            _references(ax, sub, panel)
            ax.set_xscale("log", base=2)
            ticks = sorted(set(sub[x]))
            if len(ticks) <= 8:  # the measured sizes as ticks; more would collide
                ax.set_xticks(ticks, [f"{t:,.0f}" for t in ticks], rotation=30)
                ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel(xlabel)
            ax.set_ylim(-0.03, 1.03)
            ax.set_ylabel("accuracy (per query)")
            ax.set_title(panel.replace("train_len=", "trained and evaluated at ").replace(" num_pairs=", " · pairs "))
    caption = " · ".join(s for s in [provenance(accuracy=df), "best learning rate per seed, mean over seeds, 95% t "
                                     "interval", *notes] if s)
    return publish(fig, title, caption, out, name, formats, legend_entries(axes))


@register_figure('mqar', 'accuracy', tasks=('mqar',),
                 description="Multi-query associative recall (Zoology's protocol) against the decoding state "
                             "one layer carries, one line per variant family; each seed at its best learning "
                             "rate, mean over seeds. Dashed: the in-context baseline (a random value of the "
                             "context); dotted: chance.")
def plot_mqar(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
              formats: Sequence[str] = ("png",)) -> Figure:
    """MQAR accuracy vs decoding state per layer (numbers), one line per variant family (its widths, windows, blocks:
    whatever changes its state), one panel per training length. Points of models that cannot decode (no state)
    are left out and counted in the caption."""
    pts, notes, df = _points(acc)
    pts, notes = _known(pts, notes, "state_numbers", "no mqar rows with a decoding state size (state_numbers): rows "
                        "written before it cannot be placed", "points without a decoding state left out")
    pts = pts.assign(colour_key=lambda p: p["family"])
    return _draw(pts, "state_numbers", pts["family"] + pts["suffix"], _family_palette(pts["family"], palette), "mqar",
                 "MQAR recall vs state size (Zoology)", "decoding state per layer (numbers)", notes, df, out, formats)


@register_figure('mqar-width', 'accuracy', tasks=('mqar',),
                 description="Multi-query associative recall against model width, one line per variant; same "
                             "points and reference lines as the state-size figure.")
def plot_mqar_width(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                    formats: Sequence[str] = ("png",)) -> Figure:
    """MQAR accuracy vs model width (``d_model``; the preset's own where a row has none), one line per variant
    spec, one panel per training length."""
    pts, notes, df = _points(acc)
    pts, notes = _known(pts, notes, "width", "no mqar rows with a known width (d_model, or a model preset attn knows)",
                        "points of an unknown model preset left out")
    pts = pts.assign(colour_key=lambda p: p["variant_label"])
    pal = palette if palette is not None and set(pts["variant_label"]) <= set(palette) else frame_palette(pts)
    return _draw(pts, "width", pts["variant_label"] + pts["suffix"], pal, "mqar-width", "MQAR recall vs width",
                 "model width (d_model)", notes, df, out, formats)


def _family_palette(families: pd.Series, given: dict | None) -> dict:
    """One colour per variant family: the run-wide palette's where it names the family (``full``), else the stable
    colour of the name."""
    own = stable_palette(families.unique())
    return own | {f: c for f, c in (given or {}).items() if f in own}


__all__ = ["MQAR_POINT", "REFERENCES", "mqar_points", "plot_mqar", "plot_mqar_width"]
