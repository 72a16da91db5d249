"""Figures as a page embeds them: drawn by the figure registry, encoded small (a palette WebP at screen resolution)
so a report of every committed run loads like a page, and given ids unique on it."""
from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence

from PIL import Image

from harness.analysis import figures as P
from harness.analysis import frames as F
from harness.analysis.figures.style import figure_style

REPORT_DPI = 55  # the widest figures are ~18 in: ~990 px at 55 dpi, about the page's width (the plot command draws at 150)
PALETTE_COLOURS = 32  # enough for a dozen series, the grid and the bands
# The figures each kind of run shows. Left to `attn-bench plot`: throughput (latency again: tokens/s = B·L / latency,
# and in the summary tables), flops_fraction and roofline (per-cell diagnostics: the suspect section lists the cells
# they would flag), and the "both" figures (tradeoff, patterns), which pair a cost run with an accuracy run.
RUN_FIGURES = {"cost": ("latency", "memory", "speedup", "kvpress_cost", "block_sparse_layout"),
               "accuracy": tuple(f.name for f in P.FIGURES if f.needs == "accuracy")}


def _image(fig) -> tuple[str, int, int]:
    """A figure as (data URI, width, height): 32 colours at screen resolution in lossless WebP, a fifth of the bytes
    of the RGBA PNG (a fifth smaller than the same pixels as a palette PNG), so ~150 figures load as one page."""
    buf = io.BytesIO()
    with figure_style():
        fig.savefig(buf, format="png", dpi=REPORT_DPI, pil_kwargs={"compress_level": 0})  # read back at once: no deflate
    buf.seek(0)
    img = Image.open(buf).convert("RGB").quantize(PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE,
                                                  dither=Image.Dither.NONE).convert("RGB")
    out = io.BytesIO()
    img.save(out, format="WEBP", lossless=True, quality=100, method=4)  # method 6: 1% smaller, 50x slower
    return "data:image/webp;base64," + base64.b64encode(out.getvalue()).decode("ascii"), *img.size


class PageIds:
    """Section and table ids unique on the page: the first run keeps the plain id, later ones get -2, -3."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, base: str) -> str:
        n = self.seen.get(base, 0) + 1
        self.seen[base] = n
        return base if n == 1 else f"{base}-{n}"


# One figure as a page embeds it: (name, (data URI, width, height)), or (name, why it was not drawn).
Drawn = tuple[str, tuple[str, int, int] | str]


def draw_figures(data: F.Results, only: Sequence[str]) -> list[Drawn]:
    """The figures of ``data`` named in ``only`` (none if it is empty), drawn and encoded: plain strings, so a worker
    process can draw them."""
    if not only:
        return []
    return [(name, str(fig) if isinstance(fig, P.Skip) else _image(fig)) for name, fig, _ in P.figures(data, None, only=only)]


def figures_html(drawn: Sequence[Drawn], ids: PageIds) -> tuple[str, list[dict[str, str]]]:
    figs, skipped = [], []
    described = {f.name: f.description for f in P.FIGURES}
    for name, image in drawn:
        if isinstance(image, str):
            skipped.append({"figure": name, "reason": image})
            continue
        base = name.split(" [")[0]
        title = base.replace("_", " ").capitalize()
        text = described[base]
        uri, width, height = image  # the size given: a folded or lazily loaded figure keeps its place
        figs.append(f'<figure id="{ids("fig-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name))}"><figcaption><b>{html.escape(title)}'
                    f"</b>{html.escape(name[len(base):])} — {html.escape(text)}</figcaption>"
                    f'<img alt="{html.escape(name)}" width="{width}" height="{height}" loading="lazy" src="{uri}"></figure>')
    return "".join(figs), skipped


__all__ = ["PALETTE_COLOURS", "REPORT_DPI", "RUN_FIGURES", "Drawn", "PageIds", "draw_figures", "figures_html"]
