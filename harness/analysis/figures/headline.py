"""The headline cost figure: latency and peak memory of the four core variants against context length, for a forward
call and for one decoding step (2 x 2 panels), one colour and one marker per variant in every panel.

Which backend draws a variant: in each mode, the one ``auto`` picked in the rows (the backend that ran in the rows
that asked for ``auto``, or gave no request); a variant with no such row in a mode is drawn with the backend measured
at the most lengths, ties going to the faster. Rows that named that backend join the same line, so a sweep's forward
cells asked for by name (``sliding_window:backend=flex`` at 4K and 16K) and another file's ``auto`` cell at 1M are one
line. Drawn: op-scope forward and decode rows of the shape most core rows share (batch, heads, head dim, dtype...);
serving batches, ragged contexts, KV presses, model scope and layer patterns belong to other figures.

Labels are short: the variant, its sizes (a window, a block: its first field when that is a positive integer) and any
parameter away from its registered default, then the backend(s) (``sliding_window w=256 (Flex / blocked)``: forward /
decode). Cells that ran but are noisy or suspect (:func:`harness.analysis.trust.untrusted`) are hollow; cells that
ran out of memory or time get an ``x`` at the top of the panel, at their length.
"""
from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from harness.analysis import frames as F
from harness.analysis import trust as T
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import FAIL_MARKER, Skip, figure_style, provenance, save, stable_colour
from harness.analysis.identity import params_dict, registered_defaults, same_value

MODES = ("forward", "decode")
COLUMN_TITLES = {"forward": "forward: one call over the whole context", "decode": "one decode step at that context"}
METRICS = (("latency_ms", "latency"), ("peak_mem_bytes", "peak memory"))
# one marker per variant, each drawn smaller than the one before, so where lines meet (every bounded variant's
# forward holds the same inputs and output) the markers nest instead of hiding each other
MARKERS = {"full": ("o", 8.0), "sliding_window": ("s", 7.5), "block_sparse": ("^", 6.5), "linear": ("D", 5.0)}
SHORT_PARAM = {"window": "w", "block_size": "block"}
SHORT_BACKEND = {"sdpa": "SDPA", "flex": "Flex"}
# backend_requested values that mean "auto": the variant named no backend (older rows wrote no request at all)
AUTO = ("auto", "", "nan", "None")
# Rows of other experiments that share a variant and a length with the headline's: drawn elsewhere.
APART = ("queries", "ragged", "budget_bytes", "docs", "press_spec")
MIN_LEN, MAX_LEN = 1 << 10, 1 << 20
WIDTH_IN, HEIGHT_IN = 8.0, 6.6  # 1200 x 990 px at save()'s 150 dpi: shown at ~900 px, fonts stay >= ~11 px


# -- which rows, which backend, which label ------------------------------------------------------

def _core_rows(cost: pd.DataFrame) -> pd.DataFrame:
    """The latest op-scope forward/decode cell of each core variant at the most common shape, one variant label each."""
    if len(cost) == 0:
        raise Skip("no cost rows")
    df = F.cells(cost if "series" in cost else F.prepare_cost(cost))
    F.check_single_device(df)
    keep = df["variant"].isin(F.BUILTIN_ORDER) & (df["scope"] == "op") & df["mode"].isin(MODES)
    for col in APART:
        if col in df:
            keep &= df[col].map(lambda v: v is None or (isinstance(v, float) and math.isnan(v)))
    df = df[keep]
    if len(F.ok_rows(df)) == 0:
        raise Skip(f"no ok op-scope forward or decode rows of {', '.join(F.BUILTIN_ORDER)}")
    shape = df[[c for c in F.SHAPE_FIELDS if c in df]].astype(str).agg("|".join, axis=1)
    df = df[shape == shape.value_counts().index[0]]
    top = df.groupby("variant")["variant_label"].agg(lambda s: s.value_counts().index[0])
    df = df[df["variant_label"] == df["variant"].map(top)]
    return df.assign(_untrusted=T.untrusted(df).to_numpy())


def _asked_auto(df: pd.DataFrame) -> pd.Series:
    if "backend_requested" not in df:
        return pd.Series(True, index=df.index)
    return df["backend_requested"].astype(str).isin(AUTO)


def _backend(g: pd.DataFrame) -> tuple[str, bool]:
    """(the backend a variant is drawn with in one mode, whether ``auto`` picked it) -- see the module docstring."""
    ok = g[(g["status"] == "ok") & g["latency_ms"].notna()]
    picked = ok[_asked_auto(ok)]["backend_label"]
    if len(picked):
        return str(picked.value_counts().index[0]), True
    if len(ok) == 0:
        return str(g["backend_label"].value_counts().index[0]), False
    rank = ok.groupby("backend_label").agg(n=("seq_len", "nunique"), ms=("latency_ms", "median"))
    return str(rank.sort_values(["n", "ms"], ascending=[False, True]).index[0]), False


def _series(df: pd.DataFrame) -> tuple[dict[tuple[str, str], pd.DataFrame], dict[tuple[str, str], str], bool]:
    """(variant, mode) -> its cells on one backend (one per length, sorted), -> that backend; whether all were auto's."""
    cells: dict[tuple[str, str], pd.DataFrame] = {}
    backends: dict[tuple[str, str], str] = {}
    all_auto = True
    for (variant, mode), g in df.groupby(["variant", "mode"]):
        backend, auto = _backend(g)
        all_auto &= auto
        g = g[g["backend_label"] == backend].assign(_auto=lambda x: _asked_auto(x).to_numpy())
        # a length measured both by name and by auto: auto's cell, the latest read
        g = g.sort_values(["seq_len", "_auto"], kind="stable").drop_duplicates("seq_len", keep="last")
        cells[(variant, mode)] = g
        backends[(variant, mode)] = backend
    return cells, backends, all_auto


def short_label(variant: str, params: Any, backends: Sequence[str] = ()) -> str:
    """``sliding_window`` + its resolved params + (flex, blocked) -> ``"sliding_window w=256 (Flex / blocked)"``.

    A parameter is shown when it is away from its registered default, or when it is the variant's first field and a
    positive integer (a size: the window, the block); defaults that only switch a feature off never are."""
    defaults = registered_defaults("attention", variant) or {}
    first = next(iter(defaults), None)
    shown = []
    for k, v in params_dict(params).items():
        if k in ("backend", "head_dim", "d_model", "max_seq_len"):  # set by the backbone, the same in every row
            continue
        size = k == first and isinstance(v, int) and not isinstance(v, bool) and v > 0
        if size or k not in defaults or not same_value(v, defaults[k]):
            shown.append(f"{SHORT_PARAM.get(k, k)}={F.fmt_value(v)}")
    names = list(dict.fromkeys(SHORT_BACKEND.get(b, b) for b in backends))
    return " ".join([variant, *shown]) + (f" ({' / '.join(names)})" if names else "")


# -- axes ---------------------------------------------------------------------------------------

def length_tick(n: float) -> str:
    """1024 -> 1K, 1048576 -> 1M (K = 1024), as the README writes lengths."""
    n = int(n)
    for shift, unit in ((20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def time_tick(ms: float, _pos: Any = None) -> str:
    if ms <= 0 or not math.isfinite(ms):
        return ""
    for scale, unit in ((1e3, "s"), (1.0, "ms"), (1e-3, "µs")):
        if ms >= scale:
            return f"{ms / scale:g} {unit}"
    return f"{ms * 1e3:.2g} µs"


def bytes_tick(b: float, _pos: Any = None) -> str:
    if b <= 0 or not math.isfinite(b):
        return ""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if b >= 1 << shift:
            return f"{b / (1 << shift):g} {unit}"
    return f"{b:g} B"


def _length_axis(ax: Axes, lo: float, hi: float, labelled: bool) -> None:
    ax.set_xscale("log", base=2)
    ticks = [1 << p for p in range(int(math.log2(lo)), int(math.log2(hi)) + 1, 2)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: length_tick(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(lo / 1.4, hi * 1.4)
    ax.tick_params(axis="x", labelbottom=labelled)
    if labelled:
        ax.set_xlabel("context length (tokens)")


def _value_axis(ax: Axes, column: str) -> None:
    """Log axis in time or bytes; denser ticks (1-2-5, powers of 2) when the data span too little for two of the
    usual ones (decades, powers of 4)."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    if column == "latency_ms":
        sparse = math.log10(hi / lo) < 1.5
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if sparse else (1.0,)))
        ax.yaxis.set_major_formatter(FuncFormatter(time_tick))
    else:  # 1 MiB, 4 MiB, 16 MiB ...
        ax.yaxis.set_major_locator(LogLocator(base=2 if math.log(hi / lo, 4) < 1.5 else 4))
        ax.yaxis.set_major_formatter(FuncFormatter(bytes_tick))
    ax.yaxis.set_minor_locator(NullLocator())


def _draw_series(ax: Axes, g: pd.DataFrame, column: str, colour: Any, marker: str, size: float, gid: str) -> None:
    """One variant's line (broken at cells that did not run), hollow markers on untrusted cells, an ``x`` at the top
    at each length that ran out of memory or time."""
    ok = ((g["status"] == "ok") & g[column].notna()).to_numpy()
    x = g["seq_len"].to_numpy(dtype=float)
    y = np.where(ok, g[column].to_numpy(dtype=float), np.nan)
    hollow = ok & g["_untrusted"].to_numpy(dtype=bool)
    ax.plot(x, y, color=colour, marker=marker, markersize=size, linewidth=1.8, markevery=list(np.flatnonzero(~hollow)),
            gid=gid, zorder=3)
    if hollow.any():  # see-through, so a variant's marker at the same point still shows inside it
        ax.plot(x[hollow], y[hollow], linestyle="none", marker=marker, markersize=size + 1, markerfacecolor="none",
                markeredgecolor=colour, markeredgewidth=1.3, gid=f"hollow:{gid}", zorder=4)
    failed = g["status"].isin(F.FAILED).to_numpy()
    if failed.any():
        ax.scatter(x[failed], np.full(int(failed.sum()), 0.96), transform=ax.get_xaxis_transform(), marker=FAIL_MARKER,
                   s=60, color=colour, linewidths=2, clip_on=False, zorder=5, gid=f"failed:{gid}")


# -- the figure ---------------------------------------------------------------------------------

@register_figure("headline", "cost",
                 description="Latency and peak memory of full, sliding_window, block_sparse and linear attention "
                             "against context length (log-log), a forward call and one decoding step, each variant "
                             "on the backend auto picks.")
def plot_headline(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """2 x 2 panels (columns: forward, one decode step; rows: latency, peak memory), one line per core variant; written
    to ``out/headline.<format>``. ``palette`` is not used: a variant's colour is its hue in every figure."""
    df = _core_rows(cost)
    cells, backends, all_auto = _series(df)
    variants = [v for v in F.BUILTIN_ORDER if any((v, m) in cells for m in MODES)]
    modes = [m for m in MODES if any((v, m) in cells for v in variants)]
    lengths = df["seq_len"].dropna()
    lo, hi = min(MIN_LEN, float(lengths.min())), max(MAX_LEN, float(lengths.max()))
    drawn = pd.concat(cells.values())
    n_hollow = int(((drawn["status"] == "ok") & drawn["_untrusted"]).sum())
    any_failed = drawn["status"].isin(F.FAILED).any()
    with figure_style():
        fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
        axes = fig.subplots(len(METRICS), len(modes), squeeze=False, sharex=True)
        for j, mode in enumerate(modes):
            for i, (column, what) in enumerate(METRICS):
                ax = axes[i][j]
                for v in variants:
                    if (v, mode) in cells:
                        _draw_series(ax, cells[(v, mode)], column, stable_colour(v), *MARKERS[v],
                                     gid=f"headline:{mode}:{column}:{v}")
                ax.margins(y=0.08)
                _value_axis(ax, column)
                _length_axis(ax, lo, hi, labelled=i == len(METRICS) - 1)
                ax.tick_params(labelsize=9)
                if j == 0:
                    ax.set_ylabel(what, fontsize=10)
                if i == 0:
                    ax.set_title(COLUMN_TITLES[mode], fontsize=10.5)
        labels = [short_label(v, cells[next((v, m) for m in modes if (v, m) in cells)]["variant_params"].iloc[0],
                              [backends[(v, m)] for m in modes if (v, m) in cells]) for v in variants]
        handles = [Line2D([], [], color=stable_colour(v), marker=MARKERS[v][0], markersize=6.5, linewidth=1.8)
                   for v in variants]
        # the title is the legend's: a suptitle and an outside legend overlap under the constrained layout
        fig.legend(handles, labels, loc="outside upper center", ncols=2, fontsize=9.5, frameon=False, handlelength=2.2,
                   columnspacing=1.6, title="Attention cost against context length",
                   title_fontproperties={"size": 12.5, "weight": "bold"})
        notes = [("backend: the one auto picks" if all_auto else "backend: the one auto picks, else the one measured at "
                  "the most lengths") + (", forward / decode" if len(modes) > 1 else "")]
        if "decode" in modes:
            notes.append("decode memory: the cache or state kept")
        if n_hollow:
            notes.append(f"hollow: noisy or suspect cell ({n_hollow})")
        if any_failed:
            notes.append("×: out of memory or time")
        caption = "\n".join(textwrap.wrap(" · ".join(notes), 125) + textwrap.wrap(provenance(df), 125))
        fig.supxlabel(caption, fontsize=8.5, color="0.3").set_gid("caption")
    save(fig, out, "headline", formats)
    return fig


__all__ = ["bytes_tick", "length_tick", "plot_headline", "short_label", "time_tick"]
