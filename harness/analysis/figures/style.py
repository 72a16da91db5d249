"""The look shared by every figure: palettes, line styles, figure and axes helpers, the caption, saving.

Lengths double along a sweep, so length axes are log2; every figure carries a caption (device,
torch version, shape: :func:`provenance`) drawn by :func:`finish_figure`.
"""
from __future__ import annotations

import contextlib
import functools
import math
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from harness.analysis import frames as F

FORMATS = ("png", "svg", "pdf")
MODE_ORDER = ("forward", "train", "backward", "decode")
FAIL_MARKER = "x"
_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "*", "X")
# Known backends get a fixed dash, so ``flex`` looks the same in every figure of every run.
_BACKEND_ORDER = ("reference", "sdpa", "flex", "xformers", "blocked", "gathered", "chunked", "recurrent", "fla")


class Skip(ValueError):
    """The data does not support this figure; the message says what is missing."""


# -- look ------------------------------------------------------------------------------------

def order_key(label: str) -> tuple[int, str]:
    base = re.split(r"[(/ ]", label, maxsplit=1)[0]
    return (F.BUILTIN_ORDER.index(base) if base in F.BUILTIN_ORDER else len(F.BUILTIN_ORDER), label)


# Colour families of three shades: a tab10 hue, a darker and a lighter one (all readable on white).
# The built-in variants own the first four hues (blue, orange, green, red: `full` is the same blue in
# every figure of every run); any other name (a plugin, a position method) is hashed onto the others
# (crc32: the same in every process). Grey is kept for notes and failure marks.
_SHADES = 3


def _families() -> list[list[tuple[float, float, float]]]:
    out = []
    for c in sns.color_palette("tab10", 10):
        c = tuple(float(x) for x in c)
        if max(c) - min(c) < 0.05:  # tab10's grey
            continue
        dark = tuple(0.62 * x for x in c)
        light = tuple(x + 0.42 * (1 - x) for x in c)
        out.append([c, dark, light])
    return out


_FAMILY = _families()


def _family_of(name: str) -> int:
    if name in F.BUILTIN_ORDER:
        return F.BUILTIN_ORDER.index(name)
    n = len(F.BUILTIN_ORDER)
    return n + zlib.crc32(name.encode()) % (len(_FAMILY) - n)


def stable_colour(label: str, backend: str | None = None) -> tuple[float, float, float]:
    """The colour of a variant (or position) label, optionally one of its backends, in every figure.

    Hue = the variant's name; shade = its parameters and backend (``full/sdpa`` and ``full/xformers``
    are two blues; ``sliding_window(window=128)`` and ``(window=256)`` two oranges, most of the time:
    the shade is hashed, and line styles tell backends apart anyway)."""
    base, _, rest = label.partition("(")
    colour = _FAMILY[_family_of(base)][(zlib.crc32(rest.encode()) if rest else 0) % _SHADES]
    return colour if backend is None else backend_shade(colour, backend)


# Backends of one variant get different shades of its colour (and their own dash and marker). The
# backends a variant lists side by side differ here: full sdpa/xformers, sliding_window flex/blocked
# (xformers on CUDA shares the darkest shade with the rarely drawn reference), linear chunked/recurrent/fla.
_BACKEND_SHADE = {"reference": 0, "xformers": 0, "fla": 0, "sdpa": 1, "flex": 1, "chunked": 1,
                  "blocked": 2, "gathered": 2, "recurrent": 2}


def backend_shade(colour: tuple[float, float, float], backend: str) -> tuple[float, float, float]:
    """``colour`` (a palette colour) moved within its family by the backend's shade step."""
    for fam in _FAMILY:
        if colour in fam[:_SHADES]:
            step = _BACKEND_SHADE.get(backend, zlib.crc32(backend.encode()))
            return fam[(fam.index(colour) + step) % _SHADES]
    return colour


def palette(keys: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    """One colour per variant (or position) label, from :func:`stable_colour`: the same label has the same
    colour in every figure and report, whatever else is drawn. Two labels that hash onto one colour in
    one figure are told apart by moving the later one to its next shade (then family)."""
    labels = sorted({str(k) for k in keys}, key=order_key)
    out: dict[str, tuple[float, float, float]] = {}  # label -> colour
    used: set[tuple[float, float, float]] = set()
    flat = [c for fam in _FAMILY for c in fam[:_SHADES]]
    for label in labels:
        colour = stable_colour(label)
        i = flat.index(colour)
        while colour in used and len(used) < len(flat):
            i = (i + 1) % len(flat)
            colour = flat[i]
        used.add(colour)
        out[label] = colour
    return out


def palette_for(results: F.Results) -> dict[str, tuple[float, float, float]]:
    """The palette of every label in a set of results: variant labels, then position labels apart.

    Positions get their own colours (a panel colours lines by variant or by position, never
    both), so ten position methods stay as distinct as four variants."""
    variants: set[str] = set()
    positions: set[str] = set()
    if len(results.cost):
        variants |= set(results.cost["variant_label"])
    if len(results.accuracy):
        variants |= set(results.accuracy["variant_label"])
        positions = set(results.accuracy["position_label"])
    return _split_palette(variants, positions)


def _split_palette(variants: set[str], positions: set[str]) -> dict[str, tuple[float, float, float]]:
    return palette(positions - variants) | palette(variants)


def line_styles(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Line style and marker per backend (or position): fixed for known names, then in order."""
    names = sorted(set(names), key=lambda n: (_BACKEND_ORDER.index(n) if n in _BACKEND_ORDER else len(_BACKEND_ORDER), n))
    out = {}
    for i, n in enumerate(names):
        j = _BACKEND_ORDER.index(n) if n in _BACKEND_ORDER else i
        out[n] = {"linestyle": _LINESTYLES[j % len(_LINESTYLES)], "marker": _MARKERS[j % len(_MARKERS)]}
    return out


@contextlib.contextmanager
def figure_style() -> Iterator[None]:
    """Seaborn's look for the figures drawn inside, without touching the caller's global rcParams."""
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        yield


def new_figure(n: int, width: float = 5.2, height: float = 4.0, ncols: int | None = None) -> tuple[Figure, list[Axes]]:
    ncols = ncols or min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols + 2.5, height * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


@contextlib.contextmanager
def one_renderer(fig: Figure) -> Iterator[None]:
    """Text measured inside shares one renderer. A figure without an Agg canvas makes a new full-size one for each
    text measured before it is saved (seaborn's heatmap measures each tick label for overlap), and each label keeps
    its own: ~26 MB apiece, over 6 GB for the tallest passkey figure. Measuring draws nothing, so one serves them all."""
    fig._get_renderer = functools.cache(fig._get_renderer)  # made at the first measurement, if any
    try:
        yield
    finally:
        del fig._get_renderer


@contextlib.contextmanager
def drawing(n: int, width: float = 5.2, height: float = 4.0, ncols: int | None = None) -> Iterator[tuple[Figure, list[Axes]]]:
    """A figure of ``n`` panels (:func:`new_figure`) drawn in the figure style: the one way every figure starts."""
    with figure_style():
        fig, axes = new_figure(n, width, height, ncols)
        with one_renderer(fig):
            yield fig, axes


def length_axis(ax: Axes, lengths: Iterable[float], label: str = "sequence length (tokens)") -> None:
    """log2 x-axis with the measured lengths as ticks (512, 1k, 2k, ...)."""
    ticks = sorted({float(x) for x in lengths if np.isfinite(x) and x > 0})
    ax.set_xscale("log", base=2)
    if ticks:
        step = max(1, math.ceil(len(ticks) / 10))
        ax.set_xticks(ticks[::step], [F.fmt_len(t) for t in ticks[::step]])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)


def finish_figure(fig: Figure, title: str, caption: str, legend: Sequence[tuple[Any, str]] = ()) -> None:
    fig.suptitle(title)
    if legend:
        handles, labels = zip(*legend, strict=True)
        fig.legend(handles, labels, loc="outside right upper", fontsize="small", frameon=False)
    text = fig.supxlabel(caption, fontsize="x-small", color="0.35")
    text.set_gid("caption")


def save(fig: Figure, out: str | Path | None, name: str, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Write ``out/<name>.<fmt>`` for each format; nothing when ``out`` is None."""
    if out is None:
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"unknown figure format {fmt!r}; choose from {', '.join(FORMATS)}")
        path = out / f"{name}.{fmt}"
        with figure_style():
            fig.savefig(path, dpi=150, format=fmt)
        paths.append(path)
    return paths


def publish(fig: Figure, title: str, caption: str, out: str | Path | None, name: str, formats: Sequence[str],
            legend: Sequence[tuple[Any, str]] = ()) -> Figure:
    """Title, caption and legend in the figure style, then ``out/<name>.<format>``: the one way every figure ends."""
    with figure_style():
        finish_figure(fig, title, caption, legend)
    save(fig, out, name, formats)
    return fig


def draw_band(ax: Axes, g: pd.DataFrame, colour: Any, gid: str, x: str = "length") -> None:
    """The rows' confidence interval (``ci_low`` to ``ci_high``) as a shaded band along ``x``."""
    if {"ci_low", "ci_high"} <= set(g.columns):
        b = g["ci_low"].notna() & g["ci_high"].notna()
        if b.any():
            ax.fill_between(g.loc[b, x], g.loc[b, "ci_low"], g.loc[b, "ci_high"], color=colour, alpha=0.2,
                            linewidth=0, gid=gid)


def value_line(ax: Axes, g: pd.DataFrame, colour: Any, label: str, figure: str, key: str | None = None,
               x: str = "length", **style: Any) -> None:
    """A series' ``value`` along ``x`` and its band (gids ``<figure>:<key>``, ``band:<key>``), alike in every figure."""
    key = label if key is None else key
    ax.plot(g[x], g["value"], color=colour, label=label, gid=f"{figure}:{key}", markersize=4, **style)
    draw_band(ax, g, colour, f"band:{key}", x=x)


def legend_entries(axes: Sequence[Axes]) -> list[tuple[Any, str]]:
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if not lab.startswith("_"):
                seen.setdefault(lab, h)
    return [(h, lab) for lab, h in seen.items()]


def facet_order(df: pd.DataFrame) -> list[str]:
    def key(f: str) -> tuple[int, int, str]:
        scope, _, mode = f.partition(" · ")
        return (scope != "op", MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), f)
    return sorted(df["facet"].unique(), key=key)



def frame_palette(df: pd.DataFrame) -> dict[str, tuple[float, float, float]]:
    """Palette of one frame's labels (used when no run-wide palette is passed)."""
    return _split_palette(set(df["variant_label"]) if "variant_label" in df else set(),
                          set(df["position_label"]) if "position_label" in df else set())



def accuracy_rows(acc: pd.DataFrame, fidelity: bool) -> pd.DataFrame:
    """The accuracy rows with a value and a length: fidelity's (``fidelity``) or every task's score rows (Skip if
    none)."""
    if len(acc) == 0:
        raise Skip("no accuracy rows")
    if "length" not in acc:
        acc = F.prepare_accuracy(acc)
    acc = F.declared(acc)
    sel = acc[acc["task"] == "fidelity"] if fidelity else acc[~acc["versus_full"]]
    sel = sel[sel["value"].notna() & sel["length"].notna()]
    if len(sel) == 0:
        raise Skip("no fidelity rows (task 'fidelity')" if fidelity else "no accuracy rows with a value and an eval length")
    return sel


def provenance(cost: pd.DataFrame | None = None, accuracy: pd.DataFrame | None = None) -> str:
    """The provenance line under every figure: device, torch and project version, shape."""
    frames = [f for f in (cost, accuracy) if f is not None and len(f)]
    if not frames:
        return ""
    df = pd.concat(frames, ignore_index=True)

    def one(col: str) -> str | None:
        if col not in df:
            return None
        vals = sorted({F.fmt_value(v) for v in df[col].dropna()})
        return "/".join(vals) if vals else None

    parts = []
    if (d := one("device_key") or one("device_name") or one("device")) is not None:  # the machine label: name + vector units
        parts.append(d)
    if (t := one("torch_version")) is not None:
        parts.append(f"torch {t}")
    if (v := one("project_version")) is not None:
        parts.append(f"attn-bench {v}")
    if cost is not None and len(cost):
        dims = (("B", "batch_size"), ("H", "num_heads"), ("H_kv", "num_kv_heads"), ("D", "head_dim"))
        shape = [one("dtype"), *(f"{k}={x}" for k, c in dims
                                if (x := _int_str(one(c))) is not None)]
        parts.append(" ".join(s for s in shape if s))
    return " · ".join(p for p in parts if p)


def _int_str(s: str | None) -> str | None:
    if s is None:
        return None
    return "/".join(str(int(float(x))) if x.replace(".", "", 1).isdigit() else x for x in s.split("/"))


def mem_unit(max_bytes: float) -> tuple[float, str]:
    """MiB below 2 GiB, GiB above: the axis reads in small numbers."""
    return (2.0**30, "GiB") if max_bytes >= 2.0**31 else (2.0**20, "MiB")

