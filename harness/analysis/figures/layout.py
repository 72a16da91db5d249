"""The block-sparse layout figure: which (query block, key block) pairs the measured configurations compute."""
from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.analysis import frames as F
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, figure_style, finish_figure, new_figure, save
from harness.analysis.identity import params_dict, registered_defaults

# A panel is a few hundred pixels across: a layout with many more blocks a side is resampled to blank (a 16384-block
# one lost its band entirely), and its dense grid alone takes GiBs to draw (18 GB for 16384²).
MAX_DRAWN_BLOCKS = 512


def drawn_length(lengths: Sequence[float], block_size: int, max_blocks: int) -> tuple[float, int]:
    """(length, blocks a side) of the layout to draw: the longest of ``lengths`` whose layout fits ``max_blocks``
    blocks a side, else the shortest. A layout has ceil(length / block_size) blocks a side, so none is built to choose."""
    side = {float(n): -(-int(n) // block_size) for n in lengths}
    fits = [n for n, s in side.items() if s <= max_blocks]
    length = max(fits) if fits else min(side)
    return length, side[length]


def _default_build(name: str, **params: Any) -> Any:
    import attn

    return attn.build_attention(name, **params)


@register_figure('block_sparse_layout', 'variants',
                 description='The block-sparse layouts measured: which key blocks each query block sees.')
def plot_block_sparse_layout(df: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                             formats: Sequence[str] = ("png",), build: Callable[..., Any] | None = None,
                             max_blocks: int = 64) -> Figure:
    """The block-sparse layouts that were measured, drawn: which (query block, key block) pairs are computed.

    Built from each row's params with ``build("block_sparse", **params).layout(seq_len)``, at the
    longest measured length whose layout fits ``max_blocks`` blocks a side (else the shortest; a configuration whose
    layout would then be over ``MAX_DRAWN_BLOCKS`` a side is left out, and said in the Skip if none is left).
    """
    rows = df[df["variant"] == "block_sparse"] if len(df) and "variant" in df else df.iloc[0:0]
    if len(rows) == 0:
        raise Skip("no block_sparse rows")
    build = build or _default_build
    length_col = "seq_len" if "seq_len" in rows else "length"
    configs: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for params, length in zip(rows["variant_params"], rows[length_col], strict=True):
        p = {k: v for k, v in params_dict(params).items() if k != "backend"}
        entry = configs.setdefault(F.spec_label("block_sparse", p), (p, []))
        if pd.notna(length):
            entry[1].append(float(length))
    layouts, too_large = [], []
    for label, (params, lengths) in sorted(configs.items())[:4]:
        try:
            module = build("block_sparse", **params)
            layout_fn = module.layout
        except Exception as e:  # the variant may be absent or older: say so, draw the rest
            raise Skip(f"cannot build the block_sparse layout ({type(e).__name__}: {e})") from e
        block = params.get("block_size") or (registered_defaults("attention", "block_sparse") or {}).get("block_size", 64)
        length, side = drawn_length(lengths or [1024.0], int(block), max_blocks)
        if side > MAX_DRAWN_BLOCKS:
            too_large.append(f"{label} at {F.fmt_len(length)}: {side}×{side} blocks")
            continue
        layouts.append((label, length, np.asarray(layout_fn(int(length)), dtype=bool)))
    if not layouts:
        raise Skip(f"layouts larger than a figure shows ({MAX_DRAWN_BLOCKS} blocks a side): {'; '.join(too_large)}")
    with figure_style():
        fig, axes = new_figure(len(layouts), width=4.2, height=4.4)
        for ax, (label, length, grid) in zip(axes, layouts, strict=True):
            ax.imshow(grid, cmap="Greys", vmin=0, vmax=1, interpolation="nearest", gid=f"layout:{label}")
            ax.grid(False)
            ax.set_title(f"{textwrap.fill(label, 44)}\nL={F.fmt_len(length)}: {grid.shape[0]}×{grid.shape[1]} blocks, "
                         f"{grid.mean():.0%} of them computed", fontsize="small")
            ax.set_xlabel("key block")
            ax.set_ylabel("query block")
        finish_figure(fig, "Block-sparse layouts (black = computed block)", "")
    save(fig, out, "block_sparse_layout", formats)
    return fig



__all__ = ["MAX_DRAWN_BLOCKS", "drawn_length", "plot_block_sparse_layout"]
