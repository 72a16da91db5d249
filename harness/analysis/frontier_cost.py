"""Two tables beside the frontier's ranking: each method's score per task at one budget (:func:`task_lines`: the
variants sized to it ran on fewer tasks than the presses, so they are compared task by task), and what each method
costs (:func:`cost_lines`: ``attn-bench frontier ... --cost FILE``).

The cost rows are ``attn-bench sweep --scope hf`` rows of the frontier's methods on a checkpoint's architecture
(``results/frontier-cost-cpu.toml``): the prefill (``forward``) and one decoded token (``decode``) at a length. Each
method is matched to its frontier name (a press by its name; a variant by its family, ``sinks`` for a window with
sinks), and its time is set beside full's in the same run: the time it saves when measured. Beside it, the share of
full's KV bytes a decoded token reads (the frontier's ``kv_fraction``, measured on the accuracy run's caches): the
work it saves on paper. The score is the frontier's at the same budget, model and length when that was measured.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import pandas as pd

from harness.schema import subject


def cost_method(row: dict[str, Any]) -> str | None:
    """The frontier's name of a cost row's method (None: not a frontier method)."""
    press = row.get("press_spec")
    if isinstance(press, str) and press:
        name = re.sub(r":[^()]*", "", press)  # adakv(snapkv:compression_ratio=0.875) -> adakv(snapkv), as the frontier
        if name == "none":
            return "full"
        if name == "quantized":
            bits = re.search(r"nbits=(\d+)", press)
            return f"quantized {bits[1] if bits else '?'}-bit"
        return name
    spec = str(row.get("variant_spec") or row.get("variant") or "")
    if not spec or spec.split(":")[0] == "full":
        return "full" if spec else None
    return "sinks" if "sinks=" in spec else spec.split(":")[0]


def cost_frame(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """(model, eval_len, method, mode) -> latency_ms, the latest ok row of each (a re-measured cell supersedes); the
    model as the frontier names its subject (:func:`harness.schema.subject`: with its dtype unless float32),
    so a cost is set beside scores of its own dtype only."""
    out = {}
    for r in rows:
        if r.get("task") is not None or r.get("scope") != "hf" or r.get("status") != "ok" or not r.get("latency_ms"):
            continue
        method = cost_method(r)
        if method is not None:
            key = (subject(r), int(r["seq_len"]), method, str(r["mode"]))
            out[key] = {"noisy": bool(r.get("noisy")), "latency_ms": float(r["latency_ms"])}
    return pd.DataFrame([{"model": k[0], "eval_len": k[1], "method": k[2], "mode": k[3], **v} for k, v in out.items()])


def _ms(v: float, full: float) -> str:
    """A time and its ratio to full's; seconds from 10 s (a long prefill)."""
    if v != v:
        return "-"
    return (f"{v / 1e3:.1f} s" if v >= 1e4 else f"{v:.1f} ms") + f" ({v / full:.2f}x)"


def cost_lines(cost_rows: Iterable[dict[str, Any]], pts: pd.DataFrame, at: str = "1/8", head: str = "##") -> list[str]:
    """Per (model, length) of the cost rows whose model the frontier has: each method's decode step and prefill
    against full's, the share of full's KV bytes it reads at ``at`` and its score there (the frontier's points ``pts``;
    "-" where not measured)."""
    costs = cost_frame(cost_rows)
    if len(costs) == 0:
        return []
    costs = costs[costs["model"].isin(set(pts["model"]))]  # one cost file may time several models
    ok = pts[pts["status"] == "ok"]
    lines: list[str] = []
    for (model, L), g in costs.groupby(["model", "eval_len"], sort=True):
        wide = g.pivot_table(index="method", columns="mode", values="latency_ms", aggfunc="last")
        noisy = set(g[g["noisy"]]["method"])
        if "full" not in wide.index:
            continue
        full = wide.loc["full"]
        lines += ["", f"{head} What it costs: {model} at {L} tokens, at {at} of the cache", "",
                  "| method | decode step (x full) | prefill (x full) | KV read (of full) | score at this length |",
                  "|---|---|---|---|---|"]
        mine = ok[ok["model"] == model]
        for method in ["full", *sorted(m for m in wide.index if m != "full")]:
            here = mine[(mine["method"] == method) & ((mine["budget"] == at) | (mine["budget"] == ""))]
            frac = here["kv_fraction"].dropna()
            scored = here[here["eval_len"] == L]
            score = (f"{scored['score'].mean():.2f} ({', '.join(sorted(scored['task']))})" if len(scored) else "-")
            row = wide.loc[method]
            lines.append(f"| {method}{' (noisy)' if method in noisy else ''} | "
                         f"{_ms(row.get('decode', float('nan')), full.get('decode', float('nan')))} | "
                         f"{_ms(row.get('forward', float('nan')), full.get('forward', float('nan')))} | "
                         f"{f'{frac.mean():.3f}' if len(frac) else '-'} | {score} |")
    return lines


def task_lines(pts: pd.DataFrame, at: str = "1/8", head: str = "##") -> list[str]:
    """Per (model, length): each method's score on each task at ``at`` (full and quantized caches at every token) with
    its 95 % interval, examples and independent draws, task by task (a "-": not run there)."""
    ok = pts[(pts["status"] == "ok") & ((pts["budget"] == at) | (pts["budget"] == ""))]
    lines: list[str] = []
    for (model, L), g in ok.groupby(["model", "eval_len"], sort=True):
        whole = set(g["family"])  # a task scored whole (passkey) before the subtasks of one (RULER's), then by name
        tasks = sorted(set(g["task"]), key=lambda t: (t not in whole, t))
        lines += ["", f"{head} {model} at {L} tokens: each task at {at} of the cache", "",
                  "| method | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
        for method, m in g.groupby("method", sort=False):
            cell = {r.task: f"{r.score:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}] (n {r.n:.0f}, {r.draws:.0f} draws)"
                    for r in m.itertuples()}
            lines.append(f"| {method} | " + " | ".join(cell.get(t, "-") for t in tasks) + " |")
    return lines


__all__ = ["cost_frame", "cost_lines", "cost_method", "task_lines"]
