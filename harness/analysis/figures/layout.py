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
from harness.analysis.identity import params_dict


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
    longest measured length whose layout fits ``max_blocks`` blocks a side (else the shortest).
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



__all__ = ["plot_block_sparse_layout"]
