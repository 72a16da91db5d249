"""``attn-bench plot``: the figures of a sweep, drawn from its results files alone.

One function per figure, each registered by its module (``@register_figure``, :mod:`.registry`; the shared look in
:mod:`.style`); each takes a frame prepared by :mod:`harness.analysis.frames`, returns the matplotlib
Figure and, given ``out``, writes ``out/<name>.<format>``. A figure the data cannot support raises
:class:`Skip` saying why; ``plot`` reports those and draws the rest. This module imports the figure modules (the
order figures are drawn in), and holds :data:`FIGURES`, :func:`draw`, :func:`figures` and the click command.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import click
import pandas as pd
from matplotlib.figure import Figure

from harness.analysis import frames as F

# The order figures are drawn in and shown in the report: importing a module registers its figures.
# isort: off
import harness.analysis.figures.cost
import harness.analysis.figures.headline
import harness.analysis.figures.fidelity
import harness.analysis.figures.selection
import harness.analysis.figures.accuracy
import harness.analysis.figures.mqar
import harness.analysis.figures.positions
import harness.analysis.figures.passkey
import harness.analysis.figures.ruler
import harness.analysis.figures.checkpoint
import harness.analysis.figures.kvpress
import harness.analysis.figures.frontier
import harness.analysis.figures.frontier_curves
import harness.analysis.figures.tradeoff
import harness.analysis.figures.patterns
import harness.analysis.figures.layout  # noqa: F401
# isort: on
from harness.analysis.figures.accuracy import plot_accuracy
from harness.analysis.figures.checkpoint import plot_checkpoints
from harness.analysis.figures.cost import plot_flops_fraction, plot_latency, plot_memory, plot_speedup, plot_throughput
from harness.analysis.figures.fidelity import plot_fidelity
from harness.analysis.figures.layout import plot_block_sparse_layout
from harness.analysis.figures.mqar import plot_mqar, plot_mqar_width
from harness.analysis.figures.passkey import plot_passkey
from harness.analysis.figures.patterns import plot_patterns
from harness.analysis.figures.positions import plot_position_heatmap, position_table
from harness.analysis.figures.registry import FigureSpec, figure_specs, own_figures, register_figure
from harness.analysis.figures.ruler import plot_ruler
from harness.analysis.figures.style import FORMATS, Skip, mem_unit, palette, palette_for, save
from harness.analysis.figures.tradeoff import plot_tradeoff, tradeoff_points

# -- the command ---------------------------------------------------------------------------------

FIGURES = figure_specs()  # every registered figure, in the order above


def draw(spec: FigureSpec, cost: pd.DataFrame, results: F.Results, out: Path | None, formats: Sequence[str],
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


def check_plottable(results: F.Results) -> None:
    """Refuse input with nothing drawable: no ok cost rows and no accuracy values."""
    has_acc = len(results.accuracy) and results.accuracy["value"].notna().any()
    if not has_acc:
        F.require_ok(results.cost, results.sources)


def figures(results: F.Results, out: Path | None = None, formats: Sequence[str] = ("png",),
            only: Sequence[str] = (), device: str | None = None) -> Iterator[tuple[str, Figure | Skip, Path | None]]:
    """Every figure the results support, as (name, Figure or Skip, directory written to).

    Cost figures are drawn per device: with several devices they go to ``out/<device>/``.
    """
    check_plottable(results)
    pal = palette_for(results)
    cost = F.select_device(results.cost, device)
    devs = F.devices(cost)
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
                    if len(F.ok_rows(sub)) == 0:
                        raise Skip(f"no ok cost rows ({F.status_counts(sub)})")
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
    data = F.load_results(results)
    if len(F.devices(F.select_device(data.cost, device))) > 1:
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
    "FIGURES", "FORMATS", "FigureSpec", "Skip", "check_plottable", "draw", "figure_specs", "figures", "mem_unit",
    "own_figures", "palette", "palette_for", "plot_accuracy", "plot_block_sparse_layout", "plot_checkpoints",
    "plot_command", "plot_fidelity", "plot_flops_fraction", "plot_latency", "plot_memory", "plot_mqar", "plot_mqar_width",
    "plot_passkey", "plot_patterns", "plot_position_heatmap", "plot_ruler", "plot_speedup", "plot_throughput", "plot_tradeoff",
    "position_table", "register_figure", "save", "tradeoff_points",
]
