"""``sweep --base REF``: head against base, cell by cell -- the speed-up of each cell with a 95% interval from the two
sides' timing samples (a bootstrap of the ratio of their medians, not one ratio of two medians), the geometric mean
per variant with its interval (every cell resampled at once), and the verdict that gates a pull request: exit status
1 when a head cell was refused by the gate, failed where the base ran, or is slower than ``--fail-over`` beyond its
interval (the interval's upper end below 1 / (1 + fail_over)).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.results import COST_KEY_FIELDS, cell_key

RESAMPLES = 2000
LEVEL = 0.95
BOTH_SIDES = tuple(f for f in COST_KEY_FIELDS if f != "side")  # a cell's identity on either side


@dataclass(frozen=True)
class Pair:
    """One cell measured on both sides (the latest row of each)."""

    label: str
    variant: str
    base: dict[str, Any]
    head: dict[str, Any]

    @property
    def timed(self) -> bool:
        return all(r.get("status") == "ok" and r.get("sample_ms") for r in (self.base, self.head))


def pairs(rows: Sequence[dict[str, Any]]) -> list[Pair]:
    """The cells of a --base file with both sides, in the order they were measured."""
    sides: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("side") in ("base", "head"):
            sides.setdefault(cell_key(r, BOTH_SIDES), {})[r["side"]] = r
    out = []
    for both in sides.values():
        if len(both) == 2:
            h = both["head"]
            spec = h.get("variant_spec") or h["variant"]
            out.append(Pair(f"{spec} {h['mode']} L={h['seq_len']}", spec, both["base"], h))
    return out


def _medians(samples: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The median of each of ``RESAMPLES`` resamples (with replacement) of ``samples``."""
    idx = rng.integers(0, len(samples), size=(RESAMPLES, len(samples)))
    return np.median(samples[idx], axis=1)


def speedups(pair_list: Sequence[Pair], seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Per cell: base / head median latency with its interval; per variant: the geometric mean of its timed cells'
    speed-ups, its interval from the same resamples."""
    rng = np.random.default_rng(seed)
    cells, draws = [], {}
    tail = (1 - LEVEL) / 2
    for p in pair_list:
        row: dict[str, Any] = {"label": p.label, "variant": p.variant, "base_ms": p.base.get("latency_ms"),
                               "head_ms": p.head.get("latency_ms"), "base_status": p.base.get("status"),
                               "head_status": p.head.get("status"), "check": p.head.get("check"),
                               "base_check": p.head.get("base_check"), "speedup": None, "low": None, "high": None}
        if p.timed:
            b, h = (np.asarray(r["sample_ms"], float) for r in (p.base, p.head))
            ratio = _medians(b, rng) / _medians(h, rng)
            draws.setdefault(p.variant, []).append(np.log(ratio))
            row.update(speedup=float(np.median(b) / np.median(h)), low=float(np.quantile(ratio, tail)),
                       high=float(np.quantile(ratio, 1 - tail)))
        cells.append(row)
    means = {}
    for variant, logs in draws.items():
        mean = np.exp(np.mean(logs, axis=0))  # each resample's geometric mean over the variant's cells
        point = float(np.exp(np.mean([np.log(c["speedup"]) for c in cells if c["variant"] == variant and c["speedup"]])))
        means[variant] = {"geomean": point, "low": float(np.quantile(mean, tail)),
                          "high": float(np.quantile(mean, 1 - tail)), "cells": len(logs)}
    return cells, means


def failures(cells: Sequence[dict[str, Any]], fail_over: float) -> list[str]:
    """Why the comparison fails (exit status 1): each cell that is wrong, broken or slower beyond its interval."""
    out = []
    for c in cells:
        if c["head_status"] == "mismatch":
            out.append(f"{c['label']}: head refused by the gate (differs from the reference or the base)")
        elif c["head_status"] != "ok" and c["base_status"] == "ok":
            out.append(f"{c['label']}: head {c['head_status']} where the base ran")
        elif c["high"] is not None and c["high"] < 1 / (1 + fail_over):
            out.append(f"{c['label']}: head is {1 / c['speedup']:.2f}x the base's time (interval of the speed-up "
                       f"{c['low']:.2f}-{c['high']:.2f}, all below 1/(1 + {fail_over:g}))")
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def speedup_table(rows: Sequence[dict[str, Any]], fail_over: float) -> tuple[str, list[str]]:
    """The table the sweep prints after a --base run, and the reasons it fails (empty: it passes)."""
    cells, means = speedups(pairs(rows))
    if not cells:
        return "no cell was measured on both sides", []
    lines = [f"{'cell':<44} {'base ms':>9} {'head ms':>9}  speed-up [{LEVEL:.0%} interval]  gate"]
    for c in cells:
        timed = (f"{c['speedup']:.3f}x [{c['low']:.3f}, {c['high']:.3f}]" if c["speedup"] is not None
                 else f"base {c['base_status']}, head {c['head_status']}")
        gate = c["check"] or "-"
        if c["base_check"] not in (None, "ok"):
            gate += f", vs base {c['base_check']}"
        lines.append(f"{c['label']:<44} {_ms(c['base_ms']):>9} {_ms(c['head_ms']):>9}  {timed:<29} {gate}")
    for variant, m in means.items():
        lines.append(f"geometric mean, {variant}: {m['geomean']:.3f}x [{m['low']:.3f}, {m['high']:.3f}] "
                     f"over {m['cells']} cells (speed-up = base time / head time; above 1: head is faster)")
    return "\n".join(lines), failures(cells, fail_over)


__all__ = ["LEVEL", "Pair", "RESAMPLES", "failures", "pairs", "speedup_table", "speedups"]
