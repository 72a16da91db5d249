"""Cost figures: latency, throughput, peak memory, fraction of peak FLOP/s, speed-up over full attention.

One panel per scope/mode, one line per series. Cells that did not run (oom, timeout, error...) are
never drawn as values: their lines break, and oom/timeout cells are marked with an ``x`` at the length
where they failed. Cells that ran but are not trusted (noisy, or faster than the measured peak: see
:func:`harness.analysis.trust.untrusted`) stay on their line with a hollow marker, counted in the caption.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from harness.analysis import derive as D
from harness.analysis import frames as F
from harness.analysis import trust as T
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import (
    FAIL_MARKER,
    Skip,
    backend_shade,
    drawing,
    facet_order,
    frame_palette,
    legend_entries,
    length_axis,
    line_styles,
    mem_unit,
    order_key,
    provenance,
    publish,
)

# -- cost figures ------------------------------------------------------------------------------

def _cost_frame(cost: pd.DataFrame, column: str, what: str) -> pd.DataFrame:
    if len(cost) == 0:
        raise Skip("no cost rows")
    if "series" not in cost:
        cost = F.prepare_cost(cost)
    F.check_single_device(cost)
    if column not in cost or len(F.ok_rows(cost, column)) == 0:
        raise Skip(f"no ok cost rows carry {what} ({column})")
    return F.cells(cost)


def _mark_failures(ax: Axes, cells: pd.DataFrame, colour: Any) -> None:
    """An ``x`` at the top edge of the axes, at each length where the series ran out of memory or time."""
    for status in F.FAILED:
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
                ref_line: tuple[float, str] | None = None, clip_above: float | None = None,
                out: str | Path | None = None, formats: Sequence[str] = ("png",)) -> Figure:
    """One panel per scope/mode, one line per series; non-ok cells break the line. Written to ``out/<name>.<format>``.

    Noisy or suspect cells are drawn hollow but kept on the line: dropping them would hide that they
    were measured, and a gap would read as a failure. With ``clip_above`` a value above it (a fraction of
    peak over 1) is drawn at that limit, hollow, with its real value written beside it.
    """
    df = _cost_frame(cost, column, ylabel)
    df = df.assign(_untrusted=T.untrusted(df).to_numpy())
    pal = palette or frame_palette(df)
    styles = line_styles(df["backend_label"])
    facets = facet_order(df)
    with drawing(len(facets)) as (fig, axes):
        any_fail = False
        n_hollow = n_clipped = 0
        for ax, facet in zip(axes, facets, strict=True):
            sub = df[df["facet"] == facet]
            for series, g in sorted(sub.groupby("series"), key=lambda kv: order_key(kv[0])):
                g = g.sort_values("seq_len")
                ok = (g["status"] == "ok") & g[column].notna()
                y = np.where(ok, g[column].astype(float) / scale, np.nan)
                colour = backend_shade(pal[g["variant_label"].iloc[0]], g["backend_label"].iloc[0])
                over = ok.to_numpy() & (y > clip_above) if clip_above is not None else np.zeros(len(g), dtype=bool)
                hollow = (ok & g["_untrusted"]).to_numpy() | over
                n_hollow += _series_line(ax, g["seq_len"], np.where(over, clip_above, y), hollow, colour=colour,
                                         style=styles[g["backend_label"].iloc[0]], label=series, gid=f"{name}:{series}")
                for x, v in zip(g["seq_len"].to_numpy()[over], y[over], strict=True):
                    n_clipped += 1
                    ax.annotate(f"{v:.3g}× peak", xy=(x, clip_above), xytext=(0, 6), textcoords="offset points", ha="center",
                                fontsize="x-small", color=colour, gid=f"over:{series}:{int(x)}")
                if band and band in g:
                    # a spread wider than the value (a noisy cell) would stretch a log axis over decades
                    # and swamp the panel: such points get no band (they are drawn hollow when flagged)
                    b = ok & g[band].notna() & (g[band] / 2 < g[column])
                    mid, half = g.loc[b, column] / scale, g.loc[b, band] / scale / 2
                    if b.any():
                        ax.fill_between(g.loc[b, "seq_len"], mid - half, mid + half, color=colour, alpha=0.2,
                                        linewidth=0, gid=f"band:{series}")
                if g["status"].isin(F.FAILED).any():
                    any_fail = True
                    _mark_failures(ax, g, colour)
            if logy:
                ax.set_yscale("log")
            if ref_line is not None:
                _reference_line(ax, *ref_line)
            length_axis(ax, sub["seq_len"])
            ax.set_ylabel(ylabel)
            ax.set_title(facet)
        legend = legend_entries(axes)
        if any_fail:
            legend.append((Line2D([], [], color="0.2", marker=FAIL_MARKER, linestyle=""), "× = out of memory / timeout"))
        if n_hollow:
            legend.append((Line2D([], [], color="0.2", marker="o", markerfacecolor="none", linestyle=""), HOLLOW_LABEL))
    return publish(fig, title, provenance(df) + _hollow_note(n_hollow, n_clipped, clip_above or 1.0), out, name, formats,
                   legend)


def _reference_line(ax: Axes, y: float, label: str, off_scale: float = 100.0) -> None:
    """A horizontal limit line; when it is ``off_scale`` times above the data it would flatten them, so it
    is named in the legend instead of stretching the axis."""
    finite = [v for ln in ax.lines for v in np.asarray(ln.get_ydata(), dtype=float) if np.isfinite(v)]
    top = max(finite) if finite else None
    if top is not None and top > 0 and y > off_scale * top:
        # named in the legend, not written over the panel, where it ran into the curves
        ax.plot([], [], color="0.3", linestyle="--", linewidth=1, label=f"{label}: {y / top:.3g}× above the largest value",
                gid="reference_note")
        return
    ax.axhline(y, color="0.3", linestyle="--", linewidth=1, label=label, gid="reference")



@register_figure('latency', 'cost',
                 description="Median time per call against sequence length (log-log); band = interquartile "
                             "range. One panel per scope · mode: op = the attention call alone, model = the "
                             "whole backbone; train = forward + backward.")
def plot_latency(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                 formats: Sequence[str] = ("png",)) -> Figure:
    """Median latency vs length, one panel per mode; the band spans the timing IQR."""
    return _cost_lines(cost, "latency_ms", name="latency", title="Latency", ylabel="latency (ms)",
                       band="latency_iqr_ms", palette=palette, out=out, formats=formats)


@register_figure('throughput', 'cost',
                 description='Tokens per second against sequence length (log-log), per scope · mode.')
def plot_throughput(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                    formats: Sequence[str] = ("png",)) -> Figure:
    """Tokens per second vs length."""
    return _cost_lines(cost, "tokens_per_s", name="throughput", title="Throughput", ylabel="throughput (tokens/s)",
                       palette=palette, out=out, formats=formats)



@register_figure('memory', 'cost',
                 description="Peak memory above the baseline against sequence length (log-log); decode rows: "
                             "the state that is kept.")
def plot_memory(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                formats: Sequence[str] = ("png",)) -> Figure:
    """Peak memory vs length; oom/timeout marked where they happened; the device limit when known."""
    df = _cost_frame(cost, "peak_mem_bytes", "peak memory")
    scale, unit = mem_unit(float(F.ok_rows(df, "peak_mem_bytes")["peak_mem_bytes"].max()))
    limit = D.mem_limit(df)
    ref = (limit / scale, f"memory limit ({limit / 2**30:.1f} GiB)") if limit else None
    return _cost_lines(df, "peak_mem_bytes", name="memory", title="Peak memory", ylabel=f"peak memory ({unit})",
                       scale=scale, palette=palette, ref_line=ref, out=out, formats=formats)


@register_figure('flops_fraction', 'cost',
                 description="Useful FLOP/s as a fraction of the matmul peak timed next to each cell (1 = the "
                             "machine's matmul speed).")
def plot_flops_fraction(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                        formats: Sequence[str] = ("png",)) -> Figure:
    """Achieved FLOP/s as a fraction of the device's measured peak: how close each backend gets to the hardware.

    A fraction above 1 is impossible (a timing bug or a peak taken under other load): it is drawn at 1,
    hollow, with its value written beside it, never as a point above the peak."""
    df = cost if "series" in cost else F.prepare_cost(cost)
    frac = T.peak_fraction(df)
    if not frac.notna().any():
        raise Skip("rows carry no measured device peak (peak_flops_per_s or peak_fraction)")
    df = df.assign(flops_fraction=frac)
    return _cost_lines(df, "flops_fraction", name="flops_fraction", title="Achieved FLOP/s / measured peak",
                       ylabel="fraction of peak FLOP/s", palette=palette, ref_line=(1.0, "measured peak"),
                       clip_above=1.0, out=out, formats=formats)


@register_figure('roofline', 'cost',
                 description="Each cell against the roof its mode is bound by: decoding against the memory bandwidth "
                             "(bytes moved / s over a STREAM triad timed next to it), forward and train against the "
                             "matmul peak.")
def plot_roofline(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """Decode rows as a fraction of the measured memory bandwidth, the others of the matmul peak (a decode step's
    FLOP fraction is near zero whatever its kernel does). Above 1 is drawn at 1, hollow, with its value beside it: a
    step whose state stays in the caches between timed repeats can beat the memory's bandwidth."""
    df = cost if "series" in cost else F.prepare_cost(cost)
    frac = T.roof_fraction(df)
    if not frac.notna().any():
        raise Skip("rows carry no measured roof (bandwidth_fraction for decode, peak_fraction otherwise)")
    df = df.assign(roof_fraction=frac)
    return _cost_lines(df, "roof_fraction", name="roofline", title="Achieved / roof (decode: memory bandwidth; "
                       "forward, train: matmul peak)", ylabel="fraction of the roof", palette=palette,
                       ref_line=(1.0, "measured roof"), clip_above=1.0, out=out, formats=formats)


@register_figure('speedup', 'cost',
                 description='Speed-up over full attention at the same length and shape (log2 axis; 1× = parity).')
def plot_speedup(cost: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                 formats: Sequence[str] = ("png",)) -> Figure:
    """Speed-up over the fastest ``full`` backend vs length; where each variant starts winning is annotated.

    A ratio is drawn hollow when either its cell or its ``full`` baseline is noisy or suspect; the
    "wins from" note is computed without suspect cells (as in the report)."""
    df = _cost_frame(cost, "latency_ms", "latency")
    if not (df["variant"] == "full").any():
        raise Skip("no 'full' rows to compare against")
    sp = D.speedups(df)
    if len(sp) == 0:
        raise Skip("no variant other than 'full' ran at a length where 'full' ran too")
    # the annotated crossover leaves suspect cells out, as the report's crossover table does
    cross = D.crossovers(T.without_suspect(df)).set_index(["series", "facet"])["crossover_len"]
    pal = palette or frame_palette(df)
    styles = line_styles(df["backend_label"])
    facets = facet_order(sp)
    with drawing(len(facets)) as (fig, axes):
        n_hollow = 0
        for ax, facet in zip(axes, facets, strict=True):
            sub = sp[sp["facet"] == facet]
            for series, g in sorted(sub.groupby("series"), key=lambda kv: order_key(kv[0])):
                g = g.sort_values("seq_len")
                colour = backend_shade(pal[g["variant_label"].iloc[0]], g["backend_label"].iloc[0])
                # a ratio is only as trustworthy as both of its cells
                hollow = (g["untrusted"].astype(bool) | g["full_untrusted"].astype(bool)).to_numpy()
                n_hollow += _series_line(ax, g["seq_len"], g["speedup"], hollow, colour=colour,
                                         style=styles[g["backend_label"].iloc[0]], label=series, gid=f"speedup:{series}")
                at = cross.get((series, facet), math.nan)
                if np.isfinite(at) and at > sub["seq_len"].min():  # winning from the first length is no crossover
                    y = float(g.loc[g["seq_len"] == at, "speedup"].iloc[0])
                    ax.annotate(f"wins from {F.fmt_len(at)}", xy=(at, y), xytext=(-8, 10), textcoords="offset points", ha="right",
                                fontsize="x-small", color=colour, gid=f"crossover:{series}",
                                arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.8})
            full = df[(df["facet"] == facet) & (df["variant"] == "full")]
            failed = full[full["status"].isin(F.FAILED)]["seq_len"]
            ran = set(full[full["status"] == "ok"]["seq_len"])
            failed = sorted(set(failed) - ran)
            if failed:
                ax.axvline(failed[0], color="0.4", linestyle=":", linewidth=1, gid="full_failed")
                ax.text(failed[0], 0.03, f"full fails from {F.fmt_len(failed[0])} ", transform=ax.get_xaxis_transform(),
                        fontsize="x-small", color="0.3", ha="right")
            ax.axhline(1.0, color="0.3", linewidth=1, gid="parity")
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: speedup_tick(v)))
            length_axis(ax, df[df["facet"] == facet]["seq_len"])
            ax.set_ylabel("speed-up over full (×)")
            ax.set_title(facet)
        legend = legend_entries(axes)
        if n_hollow:
            legend.append((Line2D([], [], color="0.2", marker="o", markerfacecolor="none", linestyle=""),
                           HOLLOW_LABEL + " (or its full baseline)"))
    return publish(fig, "Speed-up over full attention", provenance(df) + _hollow_note(n_hollow), out, "speedup", formats,
                   legend)



def speedup_tick(v: float) -> str:
    """A speed-up axis tick people read: 4×, 1.5×, 1/64× -- never 0.015625×."""
    if v <= 0 or not math.isfinite(v):
        return ""
    if v >= 1:
        return f"{v:.3g}×"
    inverse = 1 / v
    return f"1/{inverse:.3g}×" if abs(inverse - round(inverse)) < 1e-6 else f"{v:.2g}×"


__all__ = ["plot_flops_fraction", "plot_latency", "plot_memory", "plot_speedup", "plot_throughput", "speedup_tick"]
