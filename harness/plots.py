"""``attn-bench plot``: the figures of a sweep, drawn from its results files alone.

One function per figure; each takes a frame prepared by :mod:`harness.tables`, returns the
matplotlib Figure and, given ``out``, writes ``out/<name>.<format>``. A figure the data cannot
support raises :class:`Skip` saying why; ``plot`` reports those and draws the rest. Lengths
double along the sweep, so length axes are log2; every figure carries a caption with the device
and torch version. Cells that did not run (oom, timeout, error...) are never drawn as values:
their lines break, and oom/timeout cells are marked with an ``x`` at the length where they failed.
Cells that ran but are not trusted (noisy, or faster than the measured peak: see
:func:`harness.tables.untrusted`) stay on their line with a hollow marker, counted in the caption.
"""
from __future__ import annotations

import contextlib
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from harness import tables as T

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

def _order_key(label: str) -> tuple[int, str]:
    base = re.split(r"[(/ ]", label, maxsplit=1)[0]
    return (T.BUILTIN_ORDER.index(base) if base in T.BUILTIN_ORDER else len(T.BUILTIN_ORDER), label)


def palette(keys: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    """One colour per variant (or position) label, the same in every figure drawn from one palette.

    Built-in variants come first, so ``full`` keeps the first colour whatever else is in a run.
    """
    labels = sorted({str(k) for k in keys}, key=_order_key)
    colours = sns.color_palette("tab10" if len(labels) <= 10 else "husl", max(len(labels), 1))
    return {label: tuple(colours[i]) for i, label in enumerate(labels)}


def palette_for(results: T.Results) -> dict[str, tuple[float, float, float]]:
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


def _styles(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Line style and marker per backend (or position): fixed for known names, then in order."""
    names = sorted(set(names), key=lambda n: (_BACKEND_ORDER.index(n) if n in _BACKEND_ORDER else len(_BACKEND_ORDER), n))
    out = {}
    for i, n in enumerate(names):
        j = _BACKEND_ORDER.index(n) if n in _BACKEND_ORDER else i
        out[n] = {"linestyle": _LINESTYLES[j % len(_LINESTYLES)], "marker": _MARKERS[j % len(_MARKERS)]}
    return out


@contextlib.contextmanager
def _style() -> Iterator[None]:
    """Seaborn's look for the figures drawn inside, without touching the caller's global rcParams."""
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        yield


def _figure(n: int, width: float = 5.2, height: float = 4.0, ncols: int | None = None) -> tuple[Figure, list[Axes]]:
    ncols = ncols or min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols + 2.5, height * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _length_axis(ax: Axes, lengths: Iterable[float], label: str = "sequence length (tokens)") -> None:
    """log2 x-axis with the measured lengths as ticks (512, 1k, 2k, ...)."""
    ticks = sorted({float(x) for x in lengths if np.isfinite(x) and x > 0})
    ax.set_xscale("log", base=2)
    if ticks:
        step = max(1, math.ceil(len(ticks) / 10))
        ax.set_xticks(ticks[::step], [T.fmt_len(t) for t in ticks[::step]])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)


def _finish(fig: Figure, title: str, caption: str, legend: Sequence[tuple[Any, str]] = ()) -> None:
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
        with _style():
            fig.savefig(path, dpi=150, format=fmt)
        paths.append(path)
    return paths


def _legend_entries(axes: Sequence[Axes]) -> list[tuple[Any, str]]:
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if not lab.startswith("_"):
                seen.setdefault(lab, h)
    return [(h, lab) for lab, h in seen.items()]


def _facets(df: pd.DataFrame) -> list[str]:
    def key(f: str) -> tuple[int, int, str]:
        scope, _, mode = f.partition(" · ")
        return (scope != "op", MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), f)
    return sorted(df["facet"].unique(), key=key)


# -- cost figures ------------------------------------------------------------------------------

def _cost_frame(cost: pd.DataFrame, column: str, what: str) -> pd.DataFrame:
    if len(cost) == 0:
        raise Skip("no cost rows")
    if "series" not in cost:
        cost = T.prepare_cost(cost)
    T.check_single_device(cost)
    if column not in cost or len(T.ok_rows(cost, column)) == 0:
        raise Skip(f"no ok cost rows carry {what} ({column})")
    return T.cells(cost)


def _mark_failures(ax: Axes, cells: pd.DataFrame, colour: Any) -> None:
    """An ``x`` at the top edge of the axes, at each length where the series ran out of memory or time."""
    for status in T.FAILED:
        bad = cells[cells["status"] == status]
        if len(bad):
            ax.scatter(bad["seq_len"], np.full(len(bad), 0.97), transform=ax.get_xaxis_transform(), marker=FAIL_MARKER,
                       s=60, color=colour, linewidths=2, clip_on=False, zorder=5,
                       gid=f"{status}:{cells['series'].iloc[0]}")


HOLLOW_LABEL = "hollow = noisy or suspect cell"


def _series_line(ax: Axes, x: Any, y: Any, hollow: np.ndarray, *, colour: Any, style: dict[str, Any], label: str,
                 gid: str) -> int:
    """One series: the line runs through every point (a hollow point is still data); untrusted points get a
    hollow marker of the same edge colour instead of a filled one. Returns how many are hollow."""
    x, y, hollow = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(hollow, dtype=bool)
    extra = {"markevery": ~hollow} if hollow.any() else {}
    ax.plot(x, y, color=colour, label=label, gid=gid, markersize=4, **style, **extra)
    if hollow.any():
        ax.plot(x[hollow], y[hollow], linestyle="none", marker=style.get("marker", "o"), markersize=5,
                markerfacecolor="none", markeredgecolor=colour, markeredgewidth=1.2, color=colour,
                label="_hollow", gid=f"hollow:{gid}", zorder=4)
    return int(hollow.sum())


def _hollow_note(n: int, clipped: int = 0, peak: float = 1.0) -> str:
    """The caption's count of untrusted points (empty when every drawn point is trusted)."""
    if not n:
        return ""
    note = f" · hollow markers: noisy or suspect cells ({n})"
    if clipped:
        note += f"; {clipped} above the measured peak, drawn at {peak:g} with the real value written beside"
    return note


def _cost_lines(cost: pd.DataFrame, column: str, *, name: str, title: str, ylabel: str, scale: float = 1.0,
                band: str | None = None, logy: bool = True, palette: dict | None = None,
                ref_line: tuple[float, str] | None = None, clip_above: float | None = None) -> Figure:
    """One panel per scope/mode, one line per series; non-ok cells break the line.

    Noisy or suspect cells are drawn hollow but kept on the line: dropping them would hide that they
    were measured, and a gap would read as a failure. With ``clip_above`` a value above it (a fraction of
    peak over 1) is drawn at that limit, hollow, with its real value written beside it.
    """
    df = _cost_frame(cost, column, ylabel)
    df = df.assign(_untrusted=T.untrusted(df).to_numpy())
    pal = palette or _frame_palette(df)
    styles = _styles(df["backend_label"])
    facets = _facets(df)
    with _style():
        fig, axes = _figure(len(facets))
        any_fail = False
        n_hollow = n_clipped = 0
        for ax, facet in zip(axes, facets, strict=True):
            sub = df[df["facet"] == facet]
            for series, g in sorted(sub.groupby("series"), key=lambda kv: _order_key(kv[0])):
                g = g.sort_values("seq_len")
                ok = (g["status"] == "ok") & g[column].notna()
                y = np.where(ok, g[column].astype(float) / scale, np.nan)
                colour = pal[g["variant_label"].iloc[0]]
                over = ok.to_numpy() & (y > clip_above) if clip_above is not None else np.zeros(len(g), dtype=bool)
                hollow = (ok & g["_untrusted"]).to_numpy() | over
                n_hollow += _series_line(ax, g["seq_len"], np.where(over, clip_above, y), hollow, colour=colour,
                                         style=styles[g["backend_label"].iloc[0]], label=series, gid=f"{name}:{series}")
                for x, v in zip(g["seq_len"].to_numpy()[over], y[over], strict=True):
                    n_clipped += 1
                    ax.annotate(f"{v:.3g}× peak", xy=(x, clip_above), xytext=(0, 6), textcoords="offset points", ha="center",
                                fontsize="x-small", color=colour, gid=f"over:{series}:{int(x)}")
                if band and band in g:
                    b = ok & g[band].notna()
                    mid, half = g.loc[b, column] / scale, g.loc[b, band] / scale / 2
                    if b.any():
                        ax.fill_between(g.loc[b, "seq_len"], mid - half, mid + half, color=colour, alpha=0.2,
                                        linewidth=0, gid=f"band:{series}")
                if g["status"].isin(T.FAILED).any():
                    any_fail = True
                    _mark_failures(ax, g, colour)
            if logy:
                ax.set_yscale("log")
            if ref_line is not None:
                _reference_line(ax, *ref_line)
            _length_axis(ax, sub["seq_len"])
            ax.set_ylabel(ylabel)
            ax.set_title(facet)
        legend = _legend_entries(axes)
        if any_fail:
            legend.append((Line2D([], [], color="0.2", marker=FAIL_MARKER, linestyle=""), "× = out of memory / timeout"))
        if n_hollow:
            legend.append((Line2D([], [], color="0.2", marker="o", markerfacecolor="none", linestyle=""), HOLLOW_LABEL))
        _finish(fig, title, T.caption(df) + _hollow_note(n_hollow, n_clipped, clip_above or 1.0), legend)
    return fig


def _reference_line(ax: Axes, y: float, label: str, off_scale: float = 100.0) -> None:
    """A horizontal limit line; when it is ``off_scale`` times above the data it would flatten them, so it
    is named in a corner note instead of stretching the axis."""
    finite = [v for ln in ax.lines for v in np.asarray(ln.get_ydata(), dtype=float) if np.isfinite(v)]
    top = max(finite) if finite else None
    if top is not None and top > 0 and y > off_scale * top:
        ax.text(0.99, 0.9, f"{label}: {y / top:.3g}× above the largest value", transform=ax.transAxes, ha="right",
                va="top", fontsize="x-small", color="0.3", gid="reference_note")
        return
    ax.axhline(y, color="0.3", linestyle="--", linewidth=1, label=label, gid="reference")


def _frame_palette(df: pd.DataFrame) -> dict[str, tuple[float, float, float]]:
    """Palette of one frame's labels (used when no run-wide palette is passed)."""
    return _split_palette(set(df["variant_label"]) if "variant_label" in df else set(),
                          set(df["position_label"]) if "position_label" in df else set())


def plot_latency(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                 formats: Sequence[str] = ("png",)) -> Figure:
    """Median latency vs length, one panel per mode; the band spans the timing IQR."""
    fig = _cost_lines(cost, "latency_ms", name="latency", title="Latency", ylabel="latency (ms)",
                      band="latency_iqr_ms", palette=palette)
    save(fig, out, "latency", formats)
    return fig


def plot_throughput(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                    formats: Sequence[str] = ("png",)) -> Figure:
    """Tokens per second vs length."""
    fig = _cost_lines(cost, "tokens_per_s", name="throughput", title="Throughput", ylabel="throughput (tokens/s)",
                      palette=palette)
    save(fig, out, "throughput", formats)
    return fig


def mem_unit(max_bytes: float) -> tuple[float, str]:
    """MiB below 2 GiB, GiB above: the axis reads in small numbers."""
    return (2.0**30, "GiB") if max_bytes >= 2.0**31 else (2.0**20, "MiB")


def plot_memory(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                formats: Sequence[str] = ("png",)) -> Figure:
    """Peak memory vs length; oom/timeout marked where they happened; the device limit when known."""
    df = _cost_frame(cost, "peak_mem_bytes", "peak memory")
    scale, unit = mem_unit(float(T.ok_rows(df, "peak_mem_bytes")["peak_mem_bytes"].max()))
    limit = T.mem_limit(df)
    ref = (limit / scale, f"memory limit ({limit / 2**30:.1f} GiB)") if limit else None
    fig = _cost_lines(df, "peak_mem_bytes", name="memory", title="Peak memory", ylabel=f"peak memory ({unit})",
                      scale=scale, palette=palette, ref_line=ref)
    save(fig, out, "memory", formats)
    return fig


def plot_flops_fraction(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                        formats: Sequence[str] = ("png",)) -> Figure:
    """Achieved FLOP/s as a fraction of the device's measured peak: how close each backend gets to the hardware.

    A fraction above 1 is impossible (a timing bug or a peak taken under other load): it is drawn at 1,
    hollow, with its value written beside it, never as a point above the peak."""
    df = cost if "series" in cost else T.prepare_cost(cost)
    frac = T.peak_fraction(df)
    if not frac.notna().any():
        raise Skip("rows carry no measured device peak (peak_flops_per_s or peak_fraction)")
    df = df.assign(flops_fraction=frac)
    fig = _cost_lines(df, "flops_fraction", name="flops_fraction", title="Achieved FLOP/s / measured peak",
                      ylabel="fraction of peak FLOP/s", palette=palette, ref_line=(1.0, "measured peak"),
                      clip_above=1.0)
    save(fig, out, "flops_fraction", formats)
    return fig


def plot_speedup(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                 formats: Sequence[str] = ("png",)) -> Figure:
    """Speed-up over the fastest ``full`` backend vs length; where each variant starts winning is annotated.

    A ratio is drawn hollow when either its cell or its ``full`` baseline is noisy or suspect; the
    "wins from" note is computed without suspect cells (as in the report)."""
    df = _cost_frame(cost, "latency_ms", "latency")
    if not (df["variant"] == "full").any():
        raise Skip("no 'full' rows to compare against")
    sp = T.speedups(df)
    if len(sp) == 0:
        raise Skip("no variant other than 'full' ran at a length where 'full' ran too")
    # the annotated crossover leaves suspect cells out, as the report's crossover table does
    cross = T.crossovers(T.without_suspect(df)).set_index(["series", "facet"])["crossover_len"]
    pal = palette or _frame_palette(df)
    styles = _styles(df["backend_label"])
    facets = _facets(sp)
    with _style():
        fig, axes = _figure(len(facets))
        n_hollow = 0
        for ax, facet in zip(axes, facets, strict=True):
            sub = sp[sp["facet"] == facet]
            for series, g in sorted(sub.groupby("series"), key=lambda kv: _order_key(kv[0])):
                g = g.sort_values("seq_len")
                colour = pal[g["variant_label"].iloc[0]]
                # a ratio is only as trustworthy as both of its cells
                hollow = (g["untrusted"].astype(bool) | g["full_untrusted"].astype(bool)).to_numpy()
                n_hollow += _series_line(ax, g["seq_len"], g["speedup"], hollow, colour=colour,
                                         style=styles[g["backend_label"].iloc[0]], label=series, gid=f"speedup:{series}")
                at = cross.get((series, facet), math.nan)
                if np.isfinite(at):
                    y = float(g.loc[g["seq_len"] == at, "speedup"].iloc[0])
                    ax.annotate(f"wins from {T.fmt_len(at)}", xy=(at, y), xytext=(-8, 10), textcoords="offset points", ha="right",
                                fontsize="x-small", color=colour, gid=f"crossover:{series}",
                                arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.8})
            full = df[(df["facet"] == facet) & (df["variant"] == "full")]
            failed = full[full["status"].isin(T.FAILED)]["seq_len"]
            ran = set(full[full["status"] == "ok"]["seq_len"])
            failed = sorted(set(failed) - ran)
            if failed:
                ax.axvline(failed[0], color="0.4", linestyle=":", linewidth=1, gid="full_failed")
                ax.text(failed[0], 0.03, f"full fails from {T.fmt_len(failed[0])} ", transform=ax.get_xaxis_transform(),
                        fontsize="x-small", color="0.3", ha="right")
            ax.axhline(1.0, color="0.3", linewidth=1, gid="parity")
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
            _length_axis(ax, df[df["facet"] == facet]["seq_len"])
            ax.set_ylabel("speed-up over full (×)")
            ax.set_title(facet)
        legend = _legend_entries(axes)
        if n_hollow:
            legend.append((Line2D([], [], color="0.2", marker="o", markerfacecolor="none", linestyle=""),
                           HOLLOW_LABEL + " (or its full baseline)"))
        _finish(fig, "Speed-up over full attention", T.caption(df) + _hollow_note(n_hollow), legend)
    save(fig, out, "speedup", formats)
    return fig


# -- accuracy figures --------------------------------------------------------------------------

def _acc_frame(acc: pd.DataFrame, fidelity: bool) -> pd.DataFrame:
    if len(acc) == 0:
        raise Skip("no accuracy rows")
    if "length" not in acc:
        acc = T.prepare_accuracy(acc)
    sel = acc[(acc["task"] == "fidelity") == fidelity]
    sel = sel[sel["value"].notna() & sel["length"].notna()]
    if len(sel) == 0:
        raise Skip("no fidelity rows (task 'fidelity')" if fidelity else "no accuracy rows with a value and an eval length")
    return sel


def _band(ax: Axes, g: pd.DataFrame, colour: Any, gid: str) -> None:
    if {"ci_low", "ci_high"} <= set(g.columns):
        b = g["ci_low"].notna() & g["ci_high"].notna()
        if b.any():
            ax.fill_between(g.loc[b, "length"], g.loc[b, "ci_low"], g.loc[b, "ci_high"], color=colour, alpha=0.2,
                            linewidth=0, gid=gid)


def plot_fidelity(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Output error of each variant against full attention vs length, one panel per metric."""
    df = _acc_frame(acc, fidelity=True)
    pts = T.accuracy_points(df, extra=("backend",) if "backend" in df else ())
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
                ax.plot(g["length"], g["value"], color=colour, marker="o", markersize=4, label=series,
                        gid=f"fidelity:{series}")
                _band(ax, g, colour, f"band:{series}")
            if T.lower_is_better(metric) and (sub["value"] > 0).all():
                ax.set_yscale("log")
            _length_axis(ax, sub["length"])
            ax.set_ylabel(f"{metric} vs full attention")
            ax.set_title(metric)
        _finish(fig, "Fidelity to full attention", T.caption(accuracy=df), _legend_entries(axes))
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
            label += f" (train {T.fmt_len(key[3])})"
        finetuned = "stage" in g and g["stage"].iloc[0] == "finetune"  # same colour, dashed: the same method fine-tuned
        style = pos_styles[position] if several else {"linestyle": "--" if finetuned else "-", "marker": "o"}
        out.append((label, g.sort_values("length"), pal[variant if several else position], style))
    return sorted(out, key=lambda s: _order_key(s[0]))


def _train_marks(ax: Axes, sub: pd.DataFrame) -> None:
    if "train_len" in sub:
        for tl in sorted(sub["train_len"].dropna().unique()):
            ax.axvline(tl, color="0.3", linestyle="--", linewidth=1, gid=f"train_len:{int(tl)}")
            ax.text(tl, 0.02, f" train {T.fmt_len(tl)}", transform=ax.get_xaxis_transform(), fontsize="x-small",
                    color="0.3", gid=f"train_label:{int(tl)}")


def plot_accuracy(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Task metric vs evaluation length, one panel per task and metric; training lengths drawn as dashed lines.

    MQAR has a figure of its own (:func:`plot_mqar`): its pairs x gap grid would crowd one panel."""
    df = _acc_frame(acc, fidelity=False)
    df = df[df["task"] != "mqar"]
    if len(df) == 0:
        raise Skip("no accuracy rows other than mqar (drawn in mqar.png)")
    pts = T.accuracy_points(df)
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
            if T.lower_is_better(metric) and (sub["value"] > 0).all():
                ax.set_yscale("log")
            _length_axis(ax, sub["length"], "evaluation length (tokens)")
            ax.set_ylabel(metric)
            ax.set_title(f"{task} · {metric}")
        _finish(fig, "Accuracy vs evaluation length", T.caption(accuracy=df), _legend_entries(axes))
    save(fig, out, "accuracy", formats)
    return fig


def _gap_order(rule: str) -> tuple[int, float, str]:
    named = {"0": 0, "half": 2, "max": 3}
    return (named.get(rule, 1), float(rule) if rule.isdigit() else 0.0, rule)


def plot_mqar(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
              formats: Sequence[str] = ("png",)) -> Figure:
    """MQAR recall vs length, one line per variant; columns: pairs in the context, rows: the key-query gap rule.

    Where a sliding window breaks shows along the gap axis, where a fixed-size state (linear
    attention) breaks along the pairs axis."""
    df = _acc_frame(acc, fidelity=False)
    df = df[(df["task"] == "mqar") & (df["metric"] == "accuracy")]
    if len(df) == 0:
        raise Skip("no mqar accuracy rows")
    pts = T.accuracy_points(df)
    for c in ("num_pairs", "gap_rule"):
        if c not in pts:
            pts[c] = ""
    pal = palette or _frame_palette(df)
    pairs = sorted(pts["num_pairs"].unique(), key=lambda v: (len(v), v))
    gaps = sorted(pts["gap_rule"].unique(), key=_gap_order)
    positions = pts["position_label"].nunique() > 1
    styles = _styles(pts["position_label"])
    with _style():
        fig, axes = _figure(len(pairs) * len(gaps), width=4.2, height=3.2, ncols=len(pairs))
        for ax, (gap, npairs) in zip(axes, [(g, n) for g in gaps for n in pairs], strict=True):
            sub = pts[(pts["gap_rule"] == gap) & (pts["num_pairs"] == npairs)]
            for (variant, position), g in sorted(sub.groupby(["variant_label", "position_label"]),
                                                 key=lambda kv: _order_key(kv[0][0])):
                g = g.sort_values("length")
                label = f"{variant} · {position}" if positions else variant
                style = styles[position] if positions else {"linestyle": "-", "marker": "o"}
                ax.plot(g["length"], g["value"], color=pal[variant], label=label, markersize=4,
                        gid=f"mqar:{label} [num_pairs={npairs} gap_rule={gap}]", **style)
                _band(ax, g, pal[variant], f"band:{label} [num_pairs={npairs} gap_rule={gap}]")
            _train_marks(ax, sub)
            if len(sub):
                _length_axis(ax, sub["length"], "evaluation length (tokens)")
            ax.set_ylim(-0.03, 1.03)
            ax.set_ylabel("accuracy")
            ax.set_title(f"{npairs or '?'} pairs · gap {gap or '?'}")
        _finish(fig, "MQAR recall by length, pairs and key-query gap", T.caption(accuracy=df), _legend_entries(axes))
    save(fig, out, "mqar", formats)
    return fig


def _heat_rows(pts: pd.DataFrame) -> pd.Series:
    several = pts["variant_label"].nunique() > 1
    label = pts["variant_label"] + " · " + pts["position_label"] if several else pts["position_label"]
    if "extra_label" in pts:
        label = label + pts["extra_label"].map(lambda e: f" [{e}]" if e else "")
    if "train_len" in pts and pts["train_len"].nunique() > 1:
        label = label + " (train " + pts["train_len"].map(lambda x: T.fmt_len(x) if pd.notna(x) else "?") + ")"
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
    pts = T.accuracy_points(_acc_frame(acc, fidelity=False))
    panels = [k for k, g in sorted(pts.groupby(["task", "metric"])) if g["position_label"].nunique() > 1]
    if not panels:
        raise Skip("needs accuracy rows of at least two position methods on one task")
    df = _acc_frame(acc, fidelity=False)
    with _style():
        fig, axes = _figure(len(panels), width=6.0, height=0.5 + 0.45 * pts["position_label"].nunique() + 1.5, ncols=1)
        for ax, (task, metric) in zip(axes, panels, strict=True):
            table = position_table(pts[(pts["task"] == task) & (pts["metric"] == metric)])
            sns.heatmap(table, ax=ax, annot=True, fmt=".3g", cmap="viridis_r" if T.lower_is_better(metric) else "viridis",
                        cbar_kws={"label": metric}, xticklabels=[T.fmt_len(c) for c in table.columns])
            ax.collections[0].set_gid(f"heatmap:{task}:{metric}")
            ax.tick_params(axis="y", labelrotation=0)
            ax.set_xlabel("evaluation length (tokens)")
            ax.set_ylabel("position method")
            ax.set_title(f"{task} · {metric}")
        _finish(fig, "Length generalisation by position method", T.caption(accuracy=df))
    save(fig, out, "position_heatmap", formats)
    return fig


def plot_passkey(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                 formats: Sequence[str] = ("png",)) -> Figure:
    """Passkey retrieval accuracy by length × depth (needle-in-a-haystack view), one panel per model."""
    df = _acc_frame(acc, fidelity=False)
    df = df[df["task"].str.contains("passkey")]
    if len(df) == 0 or "depth" not in df or df["depth"].isna().all():
        raise Skip("no passkey rows with a depth column")
    pts = T.accuracy_points(df[df["depth"].notna()], extra=("depth",))
    pts = pts.assign(row=_heat_rows(pts))
    panels = sorted(pts.groupby(["row", "metric"]).groups)
    with _style():
        fig, axes = _figure(len(panels), width=5.5, height=0.4 * pts["depth"].nunique() + 2.0, ncols=min(len(panels), 2))
        for ax, (row, metric) in zip(axes, panels, strict=True):
            sub = pts[(pts["row"] == row) & (pts["metric"] == metric)]
            table = sub.pivot_table(index="depth", columns="length", values="value", aggfunc="mean").sort_index()
            higher = not T.lower_is_better(metric)
            sns.heatmap(table, ax=ax, annot=True, fmt=".2g", cmap="viridis" if higher else "viridis_r",
                        vmin=0 if higher else None, vmax=1 if higher and table.max().max() <= 1 else None,
                        cbar_kws={"label": metric}, xticklabels=[T.fmt_len(c) for c in table.columns],
                        yticklabels=[f"{d:g}" for d in table.index])
            ax.collections[0].set_gid(f"passkey:{row}:{metric}")
            ax.tick_params(axis="y", labelrotation=0)
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("passkey depth (fraction of context)")
            ax.set_title(row)
        _finish(fig, "Passkey retrieval by length and depth", T.caption(accuracy=df))
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
    acc = acc if "length" in acc else T.prepare_accuracy(acc)
    cost = cost if "series" in cost else T.prepare_cost(cost)
    T.check_single_device(cost)
    acc = acc[(acc["task"] != "fidelity") & acc["value"].notna() & ~acc["metric"].map(T.lower_is_better)]
    ok = T.cells(T.ok_rows(cost, "tokens_per_s"))
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
    score = acc[acc["variant_label"].isin(shared)].groupby(["task", "metric", "variant_label"], as_index=False)["value"].mean()
    pts = score.merge(best[["variant_label", "backend_label", "tokens_per_s", "peak_mem_bytes"]], on="variant_label")
    note = f"throughput and memory at {T.fmt_len(length)} tokens ({mode}, fastest backend); accuracy = mean over rows"
    return pts, note


def plot_tradeoff(cost: pd.DataFrame, acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Quality vs cost: accuracy vs throughput, marker area ∝ peak memory, one point per variant."""
    pts, note = tradeoff_points(cost, acc)
    pal = palette or palette_for(T.Results(cost=pts[["variant_label"]], accuracy=pd.DataFrame()))
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
        _finish(fig, "Quality / cost trade-off", f"{T.caption(cost)} · {note}", legend)
    save(fig, out, "tradeoff", formats)
    return fig


def _default_build(name: str, **params: Any) -> Any:
    import attn

    return attn.build_attention(name, **params)


def plot_block_sparse_layout(df: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                             formats: Sequence[str] = ("png",), build: Callable[..., Any] | None = None,
                             max_blocks: int = 64) -> Figure:
    """The block-sparse layouts that were measured, drawn: which (query block, key block) pairs are computed.

    Built from each row's params with ``build("block_sparse", **params).layout(seq_len)``, at the
    longest measured length whose layout fits ``max_blocks`` blocks a side (else the shortest).
    """
    rows = df[df["variant"] == "block_sparse"] if len(df) and "variant" in df else df.iloc[0:0]
    if len(rows) == 0:
        raise Skip("no block_sparse rows")
    build = build or _default_build
    length_col = "seq_len" if "seq_len" in rows else "length"
    configs: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for params, length in zip(rows["variant_params"], rows[length_col], strict=True):
        p = {k: v for k, v in T.params_dict(params).items() if k != "backend"}
        entry = configs.setdefault(T.spec_label("block_sparse", p), (p, []))
        if pd.notna(length):
            entry[1].append(float(length))
    layouts = []
    for label, (params, lengths) in sorted(configs.items())[:4]:
        try:
            module = build("block_sparse", **params)
            layout_fn = module.layout
        except Exception as e:  # the variant may be absent or older: say so, draw the rest
            raise Skip(f"cannot build the block_sparse layout ({type(e).__name__}: {e})") from e
        candidates = sorted(set(lengths), reverse=True) or [1024.0]
        chosen = None
        for length in candidates:
            grid = np.asarray(layout_fn(int(length)), dtype=bool)
            chosen = (length, grid)
            if max(grid.shape) <= max_blocks:
                break
        layouts.append((label, *chosen))
    with _style():
        fig, axes = _figure(len(layouts), width=4.2, height=4.4)
        for ax, (label, length, grid) in zip(axes, layouts, strict=True):
            ax.imshow(grid, cmap="Greys", vmin=0, vmax=1, interpolation="nearest", gid=f"layout:{label}")
            ax.grid(False)
            ax.set_title(f"{textwrap.fill(label, 44)}\nL={T.fmt_len(length)}: {grid.shape[0]}×{grid.shape[1]} blocks, "
                         f"{grid.mean():.0%} of them computed", fontsize="small")
            ax.set_xlabel("key block")
            ax.set_ylabel("query block")
        _finish(fig, "Block-sparse layouts (black = computed block)", "")
    save(fig, out, "block_sparse_layout", formats)
    return fig


# -- the command ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class FigureSpec:
    name: str
    draw: Callable[..., Figure]
    needs: str  # "cost", "accuracy", "both" or "variants"


FIGURES = (
    FigureSpec("latency", plot_latency, "cost"),
    FigureSpec("throughput", plot_throughput, "cost"),
    FigureSpec("memory", plot_memory, "cost"),
    FigureSpec("flops_fraction", plot_flops_fraction, "cost"),
    FigureSpec("speedup", plot_speedup, "cost"),
    FigureSpec("fidelity", plot_fidelity, "accuracy"),
    FigureSpec("accuracy", plot_accuracy, "accuracy"),
    FigureSpec("mqar", plot_mqar, "accuracy"),
    FigureSpec("position_heatmap", plot_position_heatmap, "accuracy"),
    FigureSpec("passkey", plot_passkey, "accuracy"),
    FigureSpec("tradeoff", plot_tradeoff, "both"),
    FigureSpec("block_sparse_layout", plot_block_sparse_layout, "variants"),
)


def draw(spec: FigureSpec, cost: pd.DataFrame, results: T.Results, out: Path | None, formats: Sequence[str],
         pal: dict) -> Figure:
    """Draw one figure from the right slice of the results (``Skip`` if the data cannot support it)."""
    kw = {"palette": pal, "formats": formats}
    if spec.needs == "cost":
        return spec.draw(cost, out, **kw)
    if spec.needs == "accuracy":
        return spec.draw(results.accuracy, out, **kw)
    if spec.needs == "both":
        return spec.draw(cost, results.accuracy, out, **kw)
    return spec.draw(results.combined(), out, **kw)


def check_plottable(results: T.Results) -> None:
    """Refuse input with nothing drawable: no ok cost rows and no accuracy values."""
    has_acc = len(results.accuracy) and results.accuracy["value"].notna().any()
    if not has_acc:
        T.require_ok(results.cost, results.sources)


def figures(results: T.Results, out: Path | None = None, formats: Sequence[str] = ("png",),
            only: Sequence[str] = (), device: str | None = None) -> Iterator[tuple[str, Figure | Skip, Path | None]]:
    """Every figure the results support, as (name, Figure or Skip, directory written to).

    Cost figures are drawn per device: with several devices they go to ``out/<device>/``.
    """
    check_plottable(results)
    pal = palette_for(results)
    cost = T.select_device(results.cost, device)
    devs = T.devices(cost)
    split = len(devs) > 1
    for spec in FIGURES:
        if only and spec.name not in only:
            continue
        per_device = spec.needs in ("cost", "both") and split
        for dev in devs if per_device else [None]:
            sub = cost[cost["device_key"] == dev] if dev is not None else cost
            where = out / _slug(dev) if (out is not None and dev is not None) else out
            name = f"{spec.name} [{dev}]" if dev is not None else spec.name
            try:
                if spec.needs in ("cost", "both"):
                    if len(sub) == 0:
                        raise Skip("no cost rows")
                    if len(T.ok_rows(sub)) == 0:
                        raise Skip(f"no ok cost rows ({T.status_counts(sub)})")
                yield name, draw(spec, sub, results, where, formats, pal), where
            except Skip as s:
                yield name, s, None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "device"


@click.command("plot")
@click.argument("results", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory for the figures.")
@click.option("--format", "formats", multiple=True, type=click.Choice(FORMATS), default=("png",), show_default=True,
              help="Image format; repeat for several.")
@click.option("--device", default=None, help="Only cost rows whose device (name) contains this text.")
@click.option("--only", multiple=True, type=click.Choice([f.name for f in FIGURES]), help="Draw only these figures.")
def plot_command(results: tuple[str, ...], out: str, formats: tuple[str, ...], device: str | None,
                 only: tuple[str, ...]) -> None:
    """Draw every figure the RESULTS files support into --out; say which were skipped and why."""
    from harness.results import check_writable

    check_writable(out, directory=True, what="figure directory")  # before drawing anything
    data = T.load_results(results)
    if len(T.devices(T.select_device(data.cost, device))) > 1:
        click.echo("results span several devices: cost figures go to one sub-directory per device")
    written = skipped = 0
    for name, fig, where in figures(data, Path(out), formats, only, device):
        if isinstance(fig, Skip):
            skipped += 1
            click.echo(f"skipped {name}: {fig}")
            continue
        written += 1
        base = name.split(" [")[0]
        click.echo(f"wrote {', '.join(str(where / f'{base}.{fmt}') for fmt in formats)}")
    click.echo(f"{written} figure(s) written to {out}, {skipped} skipped")


__all__ = [
    "FIGURES", "Skip", "figures", "mem_unit", "palette", "palette_for", "plot_accuracy", "plot_block_sparse_layout",
    "plot_command", "plot_fidelity", "plot_flops_fraction", "plot_latency", "plot_memory", "plot_mqar", "plot_passkey",
    "plot_position_heatmap", "plot_speedup", "plot_throughput", "plot_tradeoff", "save", "tradeoff_points",
]
