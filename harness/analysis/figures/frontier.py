"""``frontier``: the memory-quality frontier of ``attn-bench accuracy --preset frontier-*`` rows (with the retrieval
and dynamic sparse prefill rows run on the same prompts), as two figures that answer *what keeps the most at 1/8*.

``frontier.<fmt>``, a forest: one panel per model (SmolLM2, Qwen, Gemma 3; another model after them, by size), at
its longest length run at the budget the text quotes (:data:`AT`, 1/8). Each method is one row: a dot at its score
at 1/8 pooled over the model's ranked tasks there (full >= 0.5), a line for its 95 % interval, sorted best first,
coloured by family with a fixed map (:data:`FAMILY`: press, variant, quantized, retrieval, sparse prefill). Full and
the oracle are vertical lines, their intervals light bands. A method run on only some ranked tasks is drawn hollow in
a block of its own below a divider naming the tasks, beside full and the oracle pooled on the same tasks. A method
whose every cell scores 1.0 (0.0) is a triangle at the right (left) edge: the tasks cannot tell it from a better
(worse) one. A quantized cache keeps every token at fewer bits: its share of full's bytes is in its label.

``frontier-curves.<fmt>``: score against the KV bytes kept (share of full's, log) over the budgets, for a few methods
per model at the same length: full, the oracle, the two best presses at 1/8, the best retrieval, the 4-bit cache.

Every number is :func:`harness.analysis.frontier.ranking`'s (``attn-bench frontier`` tables the same): ``at`` and its
interval at the budget, ``score`` for a cache with no budget. A block of fewer tasks is that function on those tasks.
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator
from matplotlib.transforms import blended_transform_factory, offset_copy

from harness.analysis import frontier as FR
from harness.analysis.figures.registry import register_figure
from harness.analysis.figures.style import Skip, figure_style, save

AT = "1/8"  # the budget the README and results/README.md quote
# kind -> (legend entry, colour): fixed, the same in every panel, figure and run (tab10 hues far apart)
FAMILY: dict[str, tuple[str, str]] = {
    "press": ("press (kvpress: evicts after the prefill)", "#1f77b4"),
    "variant": ("variant attending to 1/8 of the keys", "#ff7f0e"),
    "quantized": ("quantized cache (every token, fewer bits)", "#9467bd"),
    "retrieval": ("retrieval (reads only the chunks it keeps)", "#2ca02c"),
    "prefill": ("sparse prefill (1/8 of the pairs; whole cache)", "#e377c2"),
}
LINES: dict[str, tuple[str, str, Any]] = {  # kind -> (legend entry, colour, dash): drawn across the rows
    "reference": ("full (uncompressed cache)", "0.45", (0, (4, 2))),
    "oracle": ("oracle (per head, the keys of highest true weight)", "black", "-"),
}
MODEL_ORDER = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m")  # the order the README quotes them
MODEL_NAME = {"smollm2-135m": "SmolLM2-135M", "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B", "gemma3-270m": "Gemma 3 270M"}
WIDTH = 6.0  # inches: 900 px at save()'s 150 dpi, a README's width
ROW = 0.19  # inches a method's row takes
X_LABEL = f"score at {AT} of the KV cache (mean over ranked tasks)"


# -- the numbers -------------------------------------------------------------------------------------

@dataclass
class Block:
    """The methods of one panel run on the same ranked tasks, best first, with full and the oracle on those tasks."""

    tasks: tuple[str, ...]
    complete: bool  # every ranked task of the panel
    rows: pd.DataFrame  # method, kind, label, score, lo, hi, edge ("ceiling", "floor" or ""), kv_fraction, n
    lines: dict[str, tuple[float, float, float]]  # "reference" / "oracle" -> (score, lo, hi)


@dataclass
class Panel:
    model: str
    eval_len: int
    tasks: tuple[str, ...]  # the ranked tasks
    blocks: list[Block]
    press_bytes: float  # the presses' mean share of full's KV bytes at the budget (Gemma 3: its windows stay)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (method, why)
    passkey: tuple[int, int] | None = None  # full's passkey cell: (examples, independent draws)
    name: str = ""  # as the figure names the model: model_name of its checkpoint and dtype


def model_name(checkpoint: str, dtype: str = "float32") -> str:
    """The checkpoint's display name, with its dtype unless float32 (as harness.schema.subject names a subject)."""
    base = Path(str(checkpoint)).name
    return MODEL_NAME.get(base, base) + ("" if dtype == "float32" else f" ({dtype})")


def _model_key(model: str) -> tuple[int, float, str]:
    base = Path(str(model)).name
    if base in MODEL_ORDER:
        return (0, float(MODEL_ORDER.index(base)), base)
    size = re.search(r"(\d+(?:\.\d+)?)([mb])(?![a-z])", base.lower())  # 135m, 0.5b: parameters
    return (1, float(size[1]) * (1e3 if size[2] == "b" else 1.0) if size else float("inf"), base)


def frontier_points(acc: pd.DataFrame) -> pd.DataFrame:
    """:func:`harness.analysis.frontier.points` of the rows (every status: the ranking reads the ok ones); Skip when
    there are none."""
    if len(acc) == 0:
        raise Skip("no accuracy rows")
    try:
        pts = FR.points(acc)
    except ValueError as e:
        raise Skip(str(e)) from None
    if not (pts["status"] == "ok").any():
        raise Skip("no frontier rows that ran")
    return pts


def _label(method: str, kind: str, kv: float) -> str:
    if kind == "quantized" and kv == kv:
        return f"{method} ({kv:.2f} of the bytes)"
    return method


def _block(pts: pd.DataFrame, rk: pd.DataFrame, methods: list[tuple[str, str]], tasks: tuple[str, ...],
           complete: bool, at: str, left_out: list[str]) -> Block | None:
    """One block's rows from ``rk`` (the ranking of ``pts`` on ``tasks``); a method it could not score is left out."""
    rk = rk.set_index("method")
    rows = []
    for method, kind in methods:
        col = "score" if kind == "quantized" else "at"
        r = rk.loc[method] if method in rk.index else None
        if r is None or pd.isna(r[col]):
            n = int(pts[(pts["method"] == method) & pts["task"].isin(tasks)]["n"].min())
            full = int(pts[(pts["kind"] == "reference") & pts["task"].isin(tasks)]["n"].min())
            left_out.append((method, f"{n} of full's {full} {'/'.join(tasks)} examples: a run cut short, not paired"))
            continue
        cells = pts[(pts["method"] == method) & pts["task"].isin(tasks) & (pts["budget"] == ("" if kind == "quantized"
                                                                                              else at))]["score"]
        edge = "ceiling" if (cells == 1.0).all() else "floor" if (cells == 0.0).all() else ""
        rows.append({"method": method, "kind": kind, "label": _label(method, kind, float(r["kv_fraction"])),
                     "score": float(r[col]), "lo": float(r[f"{col}_lo"]), "hi": float(r[f"{col}_hi"]), "edge": edge,
                     "kv_fraction": float(r["kv_fraction"]),
                     "n": int(pts[(pts["method"] == method) & pts["task"].isin(tasks)]["n"].max())})
    if not rows:
        return None
    lines = {k: (float(r["at"]), float(r["at_lo"]), float(r["at_hi"])) for k, name in (("reference", "full"),
             ("oracle", "oracle")) if name in rk.index and pd.notna((r := rk.loc[name])["at"])}
    df = pd.DataFrame(rows).sort_values(["score", "hi", "lo", "label"], ascending=[False, False, False, True],
                                        ignore_index=True)
    return Block(tasks, complete, df, lines)


def forest(pts: pd.DataFrame, at: str = AT, rank: pd.DataFrame | None = None) -> list[Panel]:
    """Per model (:func:`_model_key`'s order), at its longest length with a cell at ``at`` (the length the README's
    line a model quotes, given the files it reads): its methods' pooled scores
    at ``at`` over the ranked tasks (``rank``: :func:`harness.analysis.frontier.ranking` of ``pts`` at ``at``), then
    those run on fewer tasks, ranked on those tasks."""
    ok = pts[pts["status"] == "ok"]
    rank = FR.ranking(pts, at=at) if rank is None else rank
    panels = []
    who = ok[["model", "checkpoint", "dtype"]].drop_duplicates().itertuples(index=False)
    for model, checkpoint, dtype in sorted(who, key=lambda w: (_model_key(w.checkpoint), w.model)):
        mine = ok[ok["model"] == model]
        lengths = sorted(set(mine[mine["budget"] == at]["eval_len"]))
        if not lengths:
            continue
        L = int(lengths[-1])
        g = mine[mine["eval_len"] == L]
        ref = g[g["kind"] == "reference"]
        whole = set(g["family"])  # a task scored whole (passkey) before the subtasks of one (RULER's), then by name

        def _task_key(t: str, whole: set[str] = whole) -> tuple[bool, str]:
            return (t not in whole, t)

        tasks = tuple(sorted(ref[ref["ranked"]]["task"], key=_task_key))
        if not tasks:
            continue
        cells = g[g["task"].isin(tasks) & ~g["kind"].isin(["reference", "oracle"])
                  & ((g["budget"] == at) | (g["kind"] == "quantized"))]
        have: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for (method, kind), c in cells.groupby(["method", "kind"], sort=True):
            have.setdefault(tuple(sorted(set(c["task"]), key=_task_key)), []).append((method, kind))
        blocks, left_out = [], []
        for subset in sorted(have, key=lambda s: (s != tasks, -len(s), [_task_key(t) for t in s])):
            here = pts[(pts["model"] == model) & (pts["eval_len"] == L)]
            rk = rank[(rank["model"] == model) & (rank["eval_len"] == L)] if subset == tasks else \
                FR.ranking(here[here["task"].isin(subset)], at=at)
            b = _block(g, rk, have[subset], subset, subset == tasks, at, left_out)
            blocks += [b] if b is not None else []
        if blocks:
            press = g[(g["kind"] == "press") & (g["budget"] == at) & g["task"].isin(tasks)]["kv_fraction"]
            pk = ref[ref["family"] == "passkey"]
            panels.append(Panel(model, L, tasks, blocks, float(press.mean()) if len(press) else float("nan"), left_out,
                                (int(pk["n"].iloc[0]), int(pk["draws"].iloc[0])) if len(pk) else None,
                                model_name(checkpoint, dtype)))
    return panels


# -- the forest --------------------------------------------------------------------------------------

def _rows(panel: Panel) -> float:
    return sum(len(b.rows) for b in panel.blocks) + 1.2 * (len(panel.blocks) - 1)


TITLE_CHARS = 100  # a panel title's line at 8.5 pt across WIDTH


def _title(panel: Panel, at: str) -> str:
    title = "\n".join(textwrap.wrap(f"{panel.name} at {panel.eval_len} tokens · ranked tasks: "
                                     f"{', '.join(panel.tasks)}", TITLE_CHARS, subsequent_indent="  "))
    if panel.press_bytes == panel.press_bytes and panel.press_bytes > 1.5 * float(Fraction(at)):
        title += (f"\n{at} of the context's keys is {panel.press_bytes:.2f} of full's KV bytes here: "
                  "its sliding layers keep their window")
    return title


def _draw_panel(ax: Axes, panel: Panel) -> None:
    gid = f"frontier:{panel.name}"
    ax.set_gid(gid)
    y, ticks, labels, numbers = 0.0, [], [], []
    for block in panel.blocks:
        if not block.complete:  # a divider naming the tasks, then the block
            ax.axhline(y - 0.1, color="0.55", lw=0.8, gid=f"divider:{gid}")
            ax.text(0.01, y + 0.35, f"run on {', '.join(block.tasks)} only (hollow); full and the oracle there:",
                    transform=ax.get_yaxis_transform(), fontsize=7, style="italic", color="0.3", va="center",
                    clip_on=True, in_layout=False)  # inside the panel: never what sizes it
            y += 1.2
        top, bottom = y - 0.5, y + len(block.rows) - 0.5
        for kind, (score, lo, hi) in block.lines.items():
            _, colour, dash = LINES[kind]
            ax.fill_betweenx([top, bottom], lo, hi, color=colour, alpha=0.10, lw=0, zorder=1, gid=f"band:{gid}:{kind}")
            ax.vlines(score, top, bottom, colors=colour, linestyles=[dash], lw=1.4, gid=f"{gid}:{kind}",
                      zorder=2.6 if kind == "reference" else 2.4)  # full's dashes over the oracle where they agree
        for r in block.rows.itertuples():
            colour = FAMILY[r.kind][1]
            ax.hlines(y, r.lo, r.hi, colors=colour, lw=1.6, zorder=3, gid=f"ci:{gid}:{r.method}")
            marker = {"ceiling": ">", "floor": "<"}.get(r.edge, "o")
            ax.plot([r.score], [y], marker=marker, markersize=6.5 if r.edge else 5.5, ls="none", zorder=4,
                    color=colour, markerfacecolor=colour if block.complete else "white", markeredgewidth=1.3,
                    gid=f"{gid}:{r.method}")
            ticks.append(y)
            labels.append(r.label)
            numbers.append(f"{r.score:.2f} [{r.lo:.2f}, {r.hi:.2f}]")
            y += 1
    ax.set_ylim(y - 0.4, -0.6)  # best on top
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.set_yticklabels(labels, fontsize=7.5)
    ax.yaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="y", length=0, pad=3)
    right = ax.twinx()  # the numbers, a forest plot's right-hand column
    right.set_gid(f"numbers:{gid}")
    right.set_ylim(ax.get_ylim())
    right.yaxis.set_major_locator(FixedLocator(ticks))
    right.set_yticklabels(numbers, fontsize=6.5, color="0.3")
    right.tick_params(axis="y", length=0, pad=2)
    right.grid(False)
    for s in right.spines.values():
        s.set_visible(False)
    ax.set_xlim(-0.04, 1.04)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.tick_params(axis="x", labelsize=7.5, labelbottom=True)


def _legend(panels: list[Panel]) -> list[tuple[Any, str]]:
    kinds = {k for p in panels for b in p.blocks for k in b.rows["kind"]}
    out: list[tuple[Any, str]] = [(Line2D([], [], color=c, marker="o", ls="-", lw=1.6, markersize=5.5), name)
                                  for k, (name, c) in FAMILY.items() if k in kinds]
    lines = {k for p in panels for b in p.blocks for k in b.lines}
    out += [(Line2D([], [], color=LINES[k][1], ls=LINES[k][2], lw=1.4), LINES[k][0]) for k in LINES if k in lines]
    if any(not b.complete for p in panels for b in p.blocks):
        out.append((Line2D([], [], color="0.3", marker="o", markerfacecolor="white", ls="none"),
                    "hollow: run on some ranked tasks only"))
    edges = [(e, m) for e, m in (("ceiling", ">"), ("floor", "<")) if e in {e for p in panels for b in p.blocks
                                                                      for e in b.rows["edge"]}]
    if edges:  # one entry: a triangle at the edge, each way it points
        out.append((tuple(Line2D([], [], color="0.3", marker=m, ls="none", markersize=6.5) for _, m in edges),
                    " / ".join({"ceiling": "every cell 1.0 (ceiling)", "floor": "every cell 0 (floor)"}[e]
                               for e, _ in edges)))
    return out


def _left_out(panels: list[Panel]) -> str:
    """The methods left out, grouped by model and why: "SmolLM2-135M: a, b (query-aware) (16 of full's 20 ...)"."""
    parts = []
    for p in panels:
        groups: dict[str, list[str]] = {}
        for method, why in p.left_out:
            groups.setdefault(why, []).append(method)
        for why, methods in groups.items():
            suffix = re.search(r" \([^()]*\)$", methods[0])
            common = suffix[0] if suffix and len(methods) > 1 and all(m.endswith(suffix[0]) for m in methods) else ""
            names = ", ".join(m[:len(m) - len(common)] for m in methods)
            parts.append(f"{p.name}'s {names}{common} ({why})")
    return "; ".join(parts)


def _caption(panels: list[Panel], at: str) -> str:
    n = sorted({int(v) for p in panels for b in p.blocks for v in b.rows["n"]})
    hay = sorted({"one haystack a key" if k == d else f"{d} haystacks of {k // d} keys"
                  for p in panels if p.passkey for k, d in [p.passkey]})
    text = (f"Each row: a method's score with {at} of the KV cache, pooled over the model's ranked tasks at that length "
            f"(full >= 0.5 there), and its 95 % interval, as `attn-bench frontier` tables it (right: the numbers); "
            f"{'/'.join(map(str, n))} examples a task{' (passkey: ' + ' or '.join(hay) + ')' if hay else ''}. "
            f"Lines: full and the oracle on the same tasks, shaded: their intervals.")
    kinds = {k for p in panels for b in p.blocks for k in b.rows["kind"]}
    text += " A quantized cache has no budget: every token at fewer bits." if "quantized" in kinds else ""
    text += (f" A sparse prefill computes {at} of the prompt's attention pairs and keeps the whole cache."
             if "prefill" in kinds else "")
    left = _left_out(panels)
    return text + (f" Left out: {left}." if left else "")


TITLE_IN, LEGEND_ROW_IN, CAPTION_LINE_IN = 0.32, 0.17, 0.115  # inches of the margins drawn outside the layout
CAPTION_CHARS = 118  # a caption line at 6.5 pt across WIDTH


def _save_forest(panels: list[Panel], out: str | Path | None, formats: Sequence[str], at: str) -> Figure:
    """Title and legend above, the caption below, in margins of known inches; the panels in between, laid out."""
    titles = [_title(p, at) for p in panels]
    rows = [_rows(p) + 0.2 for p in panels]  # the y range each panel's axes spans, in rows
    legend = _legend(panels)
    caption = "\n".join(textwrap.wrap(_caption(panels, at), CAPTION_CHARS))
    top = TITLE_IN + LEGEND_ROW_IN * np.ceil(len(legend) / 2) + 0.08
    bottom = CAPTION_LINE_IN * (caption.count("\n") + 1) + 0.12
    decorations = sum(0.42 + 0.14 * t.count("\n") for t in titles) + 0.2  # title, x ticks; the x label
    height = ROW * sum(rows) + decorations + top + bottom
    with figure_style():
        fig = Figure(figsize=(WIDTH, height), layout="constrained")
        fig.get_layout_engine().set(rect=(0, bottom / height, 1, 1 - (top + bottom) / height))
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, height_ratios=rows).ravel().tolist()
        for ax, panel, title in zip(axes, panels, titles, strict=True):
            _draw_panel(ax, panel)
            where = offset_copy(blended_transform_factory(fig.transFigure, ax.transAxes), fig=fig, y=5, units="points")
            ax.text(0.012, 1.0, title, transform=where, fontsize=8.5, ha="left", va="bottom", gid=f"title:{ax.get_gid()}")
        axes[-1].set_xlabel(X_LABEL, fontsize=8.5)
        fig.text(0.5, 1 - 0.06 / height, f"What keeps the most with {at} of the KV cache, per model", fontsize=11,
                 ha="center", va="top", gid="title")
        handles, labels = zip(*legend, strict=True)
        fig.legend(handles, labels, handler_map={tuple: HandlerTuple(ndivide=None, pad=0.6)}, loc="upper center",
                   bbox_to_anchor=(0.5, 1 - TITLE_IN / height), ncols=2, fontsize=7, frameon=False, columnspacing=1.2,
                   handlelength=1.8, borderaxespad=0, borderpad=0.2)
        fig.text(0.012, 0.06 / height, caption, fontsize=6.5, color="0.35", ha="left", va="bottom", gid="caption")
    save(fig, out, "frontier", formats)
    return fig


@register_figure("frontier", "accuracy", description=f"Memory-quality frontier: per model, each method's score at {AT} "
                 "of the KV cache with its interval, sorted, coloured by family; full and the oracle as lines.")
def plot_frontier(acc: pd.DataFrame, out: str | Path | None = None, *, palette: dict | None = None,
                  formats: Sequence[str] = ("png",)) -> Figure:
    """The forest (``frontier.<fmt>``; the curves beside it are ``frontier-curves``). ``palette`` is not used: the
    families have fixed colours."""
    pts = frontier_points(acc)
    panels = forest(pts, AT)
    if not panels:
        raise Skip(f"no model has a ranked task (full >= 0.5) with a method run at {AT}")
    return _save_forest(panels, out, formats, AT)


__all__ = ["AT", "FAMILY", "LINES", "Block", "Panel", "forest", "frontier_points", "model_name", "plot_frontier"]
