"""How far to trust each cost row: noisy (the machine changed, or one timed sample) and suspect (faster than its
roof: the matmul peak, or the bandwidth of the memory level its working set lives in). Figures draw such rows
hollow, the report lists them, and fits and crossovers leave suspect ones out; they stay data.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis.frames import cells, prepare_cost

SUSPECT_COLUMNS = ("variant", "backend", "mode", "seq_len", "peak_fraction", "bandwidth_fraction", "bandwidth_level",
                   "results_file")
NOISY_COLUMNS = ("variant", "backend", "mode", "seq_len", "status", "noisy_reason", "attempts", "other_cpu",
                 "loadavg_1m", "peak_before_flops_per_s", "peak_after_flops_per_s", "results_file")


def _truthy(v: Any) -> bool:
    """A JSON flag as written (true/false/null, or absent = NaN); only a real true counts."""
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    try:
        return bool(v) and not (isinstance(v, float) and math.isnan(v))
    except (TypeError, ValueError):
        return False


def peak_fraction(cost: pd.DataFrame) -> pd.Series:
    """Achieved / measured peak FLOP/s per row: ``peak_fraction``, else derived from the two FLOP/s columns.

    One definition for the figure and the suspect rule, so older rows without the column are judged too."""
    frac = (pd.to_numeric(cost["peak_fraction"], errors="coerce").astype(float) if "peak_fraction" in cost
            else pd.Series(np.nan, index=cost.index))
    if {"achieved_flops_per_s", "peak_flops_per_s"} <= set(cost.columns):
        peak = pd.to_numeric(cost["peak_flops_per_s"], errors="coerce").astype(float)
        derived = pd.to_numeric(cost["achieved_flops_per_s"], errors="coerce").astype(float) / peak.where(peak > 0)
        frac = frac.fillna(derived)
    return frac


# Rows written before ``bandwidth_level`` were judged against a triad over STREAM's memory-sized arrays: a call moving
# less than this may have been served from the caches on every timed repeat, so its fraction of DRAM's bandwidth says
# nothing (it claimed 1.1-1.8 for decoding steps over 4-16 MiB); only larger ones were compared with their own level.
CACHE_RESIDENT_BYTES = 64 << 20


def bandwidth_fraction(cost: pd.DataFrame) -> pd.Series:
    """Achieved / the bandwidth of the memory level the row's working set lives in (``bandwidth_fraction``, timed
    at that working set: ``bandwidth_level``); NaN for rows without it, and for older rows (no level) whose working
    set could sit in a cache."""
    if "bandwidth_fraction" not in cost:
        return pd.Series(np.nan, index=cost.index)
    frac = pd.to_numeric(cost["bandwidth_fraction"], errors="coerce").astype(float)
    level = cost["bandwidth_level"] if "bandwidth_level" in cost else pd.Series(None, index=cost.index, dtype=object)
    moved = (pd.to_numeric(cost["bytes"], errors="coerce").astype(float) if "bytes" in cost
             else pd.Series(np.nan, index=cost.index))
    known = level.map(lambda v: isinstance(v, str) and bool(v)) | (moved >= CACHE_RESIDENT_BYTES)
    return frac.where(known)


def memory_level(cost: pd.DataFrame) -> pd.Series:
    """The level each row's bandwidth fraction is against: ``bandwidth_level``, DRAM for older rows moving at least
    ``CACHE_RESIDENT_BYTES``, else None (not compared)."""
    frac = bandwidth_fraction(cost)
    level = cost["bandwidth_level"] if "bandwidth_level" in cost else pd.Series(None, index=cost.index, dtype=object)
    return pd.Series([lv if isinstance(lv, str) and lv else ("DRAM" if pd.notna(f) else None)
                      for lv, f in zip(level, frac, strict=True)], index=cost.index, dtype=object)


def roof_fraction(cost: pd.DataFrame) -> pd.Series:
    """Each row against the roof its mode is bound by: a decoding step (a few FLOPs per byte of state) against the
    memory bandwidth, a forward or a training step against the matmul peak."""
    decode = cost["mode"] == "decode" if "mode" in cost else pd.Series(False, index=cost.index)
    return bandwidth_fraction(cost).where(decode, peak_fraction(cost))


SINGLE_SAMPLE = "one timed sample: no spread to judge it by"


def single_sample_mask(cost: pd.DataFrame) -> pd.Series:
    """Ok rows that rest on one timed sample (``timing_samples`` 1): no spread says how far to trust them. The worker
    flags them noisy today; rows written before it did are flagged here, so every reader sees them marked."""
    if "timing_samples" not in cost:
        return pd.Series(False, index=cost.index)
    samples = pd.to_numeric(cost["timing_samples"], errors="coerce")
    return ((cost["status"] == "ok") & (samples == 1)).astype(bool)


def noisy_mask(cost: pd.DataFrame) -> pd.Series:
    """Rows the worker flagged noisy (peaks before/after disagreed, or other processes took CPU), and rows resting
    on a single timed sample (:func:`single_sample_mask`).

    Rows written before the check have no ``noisy`` column or a null: they count as quiet."""
    flagged = (pd.Series([_truthy(v) for v in cost["noisy"]], index=cost.index, dtype=bool) if "noisy" in cost
               else pd.Series(False, index=cost.index, dtype=bool))
    return flagged | single_sample_mask(cost)


def suspect_mask(cost: pd.DataFrame) -> pd.Series:
    """Ok rows faster than the hardware allows: ``peak_fraction`` > 1, or ``bandwidth_fraction`` > 1 against the
    bandwidth of their own memory level (:func:`bandwidth_fraction`).

    Either a count or the timing is wrong or the peak was measured under a different load; such a number
    must never be drawn or summarised as if it were fine."""
    if len(cost) == 0:
        return pd.Series(False, index=cost.index, dtype=bool)
    return ((cost["status"] == "ok") & ((peak_fraction(cost) > 1.0) | (bandwidth_fraction(cost) > 1.0))).astype(bool)


def untrusted(cost: pd.DataFrame) -> pd.Series:
    """Whether each row is untrusted: noisy or suspect. Figures draw these hollow; they stay data."""
    return noisy_mask(cost) | suspect_mask(cost)


def _listing(cost: pd.DataFrame, mask: pd.Series, columns: Sequence[str]) -> pd.DataFrame:
    rows = cost[mask]
    out = pd.DataFrame(index=rows.index)
    for c in columns:
        if c == "variant":
            out[c] = rows["variant_label"] if "variant_label" in rows else rows["variant"]
        elif c == "backend":
            out[c] = rows["backend_label"] if "backend_label" in rows else rows["backend"]
        elif c == "peak_fraction":
            out[c] = peak_fraction(rows)
        elif c == "bandwidth_fraction":
            out[c] = bandwidth_fraction(rows)
        elif c == "bandwidth_level":
            out[c] = memory_level(rows)
        elif c == "noisy_reason":
            reason = rows[c] if c in rows else pd.Series(None, index=rows.index, dtype=object)
            out[c] = reason.where(reason.map(lambda v: isinstance(v, str) and bool(v)), SINGLE_SAMPLE)
        elif c in rows:
            out[c] = rows[c]
    return out.sort_values([c for c in ("variant", "backend", "mode", "seq_len") if c in out]).reset_index(drop=True)


def suspect_rows(cost: pd.DataFrame) -> pd.DataFrame:
    """The latest ok cells with ``peak_fraction`` > 1: variant, backend, mode, seq_len, peak_fraction, results_file."""
    if len(cost) == 0:
        return pd.DataFrame(columns=list(SUSPECT_COLUMNS))
    c = cells(cost if "series" in cost else prepare_cost(cost))
    return _listing(c, suspect_mask(c), SUSPECT_COLUMNS)


def noisy_rows(cost: pd.DataFrame) -> pd.DataFrame:
    """The latest cells flagged noisy, with why (``noisy_reason``), how often measured and the load seen."""
    if len(cost) == 0:
        return pd.DataFrame(columns=["variant", "backend", "mode", "seq_len", "status", "noisy_reason"])
    c = cells(cost if "series" in cost else prepare_cost(cost))
    return _listing(c, noisy_mask(c), NOISY_COLUMNS)


def without_suspect(cost: pd.DataFrame) -> pd.DataFrame:
    """The latest cells minus suspect ones, for fitted exponents and crossovers.

    Cells are taken first, so a suspect re-run does not bring back the older row it superseded."""
    if len(cost) == 0:
        return cost
    c = cells(cost if "series" in cost else prepare_cost(cost))
    return c[~suspect_mask(c)]


__all__ = [
    "CACHE_RESIDENT_BYTES", "NOISY_COLUMNS", "SINGLE_SAMPLE", "SUSPECT_COLUMNS", "bandwidth_fraction", "memory_level",
    "noisy_mask", "noisy_rows", "peak_fraction", "roof_fraction", "single_sample_mask", "suspect_mask", "suspect_rows",
    "untrusted", "without_suspect",
]
