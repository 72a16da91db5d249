"""``attn-bench compare BASE NEW``: cell-by-cell ratios between two cost runs, and a CI regression gate.

A cell is slower only when the latency grew by more than the tolerance *plus* the measured noise:
``new - base > tol * base + max(iqr_base, iqr_new)``, with the IQRs of the timings recorded in the
rows (``latency_iqr_ms``, as ``torch.utils.benchmark`` reports them). Peak memory is counted, not
sampled, so it only gets the tolerance. A cell that ran in BASE and fails in NEW (oom, timeout,
error) is a regression too.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any

import click
import numpy as np
import pandas as pd

from harness import tables as T

# What makes two cost rows the same measurement (device *type*, so a rerun on another box still matches).
# The backend is the one *requested*: a failed cell has no backend that ran, and must still match.
KEY = ("variant", "variant_params", "backend_requested", "position", "position_params", "scope", "mode", "device", "dtype",
       "batch_size", "num_heads", "head_dim", "seq_len", "causal", "layers")
DEFAULT_TOL = 0.05


def _key(df: pd.DataFrame) -> pd.Series:
    cols = [c for c in KEY if c in df]

    def norm(c: str, v: Any) -> Any:
        if c.endswith("_params"):
            return json.dumps(T.params_dict(v), sort_keys=True, default=str)
        if isinstance(v, float):
            return None if math.isnan(v) else (int(v) if v.is_integer() else v)
        return v

    def one(row: pd.Series) -> str:
        vals = {c: norm(c, row[c]) for c in cols}
        if vals.get("backend_requested") is None:  # older rows: only the backend that ran
            vals["backend_requested"] = row.get("backend")
        return json.dumps(vals, sort_keys=True, default=str)

    return df.apply(one, axis=1) if len(df) else pd.Series(dtype=str)


def _load(path: str, role: str) -> pd.DataFrame:
    res = T.load_results([path])
    if len(res.cost) == 0:
        raise ValueError(f"{role} {path} holds no cost rows (compare needs cost rows: {', '.join(T.COST_REQUIRED)})")
    T.require_ok(res.cost, [path])
    cost = res.cost.assign(key=_key(res.cost))
    return cost.drop_duplicates("key", keep="last")  # a re-run supersedes what came before


def compare_frames(base: pd.DataFrame, new: pd.DataFrame, tol: float = DEFAULT_TOL) -> pd.DataFrame:
    """One row per cell present in both runs, with ratios and a verdict; ``regression`` marks the gate."""
    if "key" not in base:
        base = base.assign(key=_key(base))
    if "key" not in new:
        new = new.assign(key=_key(new))
    cols = ["key", "series", "facet", "seq_len", "status", "latency_ms", "latency_iqr_ms", "peak_mem_bytes"]
    b = base.reindex(columns=cols)
    n = new.reindex(columns=cols).drop(columns=["series", "facet", "seq_len"])
    m = b.merge(n, on="key", suffixes=("_base", "_new"))
    both_ok = (m["status_base"] == "ok") & (m["status_new"] == "ok") & m["latency_ms_base"].notna() & m["latency_ms_new"].notna()
    noise = np.fmax(m["latency_iqr_ms_base"].fillna(0.0), m["latency_iqr_ms_new"].fillna(0.0))
    delta = m["latency_ms_new"] - m["latency_ms_base"]
    allowed = tol * m["latency_ms_base"] + noise
    slower = both_ok & (delta > allowed)
    faster = both_ok & (-delta > allowed)
    mem_ok = both_ok & m["peak_mem_bytes_base"].notna() & m["peak_mem_bytes_new"].notna()
    more_mem = mem_ok & (m["peak_mem_bytes_new"] > (1 + tol) * m["peak_mem_bytes_base"])
    less_mem = mem_ok & (m["peak_mem_bytes_new"] < m["peak_mem_bytes_base"] / (1 + tol))
    now_failing = (m["status_base"] == "ok") & (m["status_new"] != "ok")
    now_ok = (m["status_base"] != "ok") & (m["status_new"] == "ok")

    def verdict(i: int) -> str:
        if now_failing.iloc[i]:
            return f"REGRESSION: now {m['status_new'].iloc[i]}"
        if now_ok.iloc[i]:
            return "now runs"
        if not both_ok.iloc[i]:
            return f"{m['status_base'].iloc[i]} / {m['status_new'].iloc[i]}"
        words = [w for w, hit in (("slower", slower), ("more memory", more_mem)) if hit.iloc[i]]
        if words:
            return "REGRESSION: " + ", ".join(words)
        good = [w for w, hit in (("faster", faster), ("less memory", less_mem)) if hit.iloc[i]]
        return ", ".join(good) or "within noise"

    out = pd.DataFrame({
        "series": m["series"], "mode": m["facet"], "seq_len": m["seq_len"],
        "base_ms": m["latency_ms_base"].where(both_ok), "new_ms": m["latency_ms_new"].where(both_ok),
        "ratio": (m["latency_ms_new"] / m["latency_ms_base"]).where(both_ok),
        "noise_ms": noise.where(both_ok),
        "mem_ratio": (m["peak_mem_bytes_new"] / m["peak_mem_bytes_base"]).where(mem_ok),
        "verdict": [verdict(i) for i in range(len(m))],
        "regression": slower | more_mem | now_failing,
    })
    return out.sort_values(["series", "mode", "seq_len"], kind="stable").reset_index(drop=True)


def _show(table: pd.DataFrame) -> str:
    fmt = table.drop(columns=["regression"]).assign(
        seq_len=table["seq_len"].map(T.fmt_len),
        base_ms=table["base_ms"].map(lambda x: f"{x:.4g}" if pd.notna(x) else "—"),
        new_ms=table["new_ms"].map(lambda x: f"{x:.4g}" if pd.notna(x) else "—"),
        ratio=table["ratio"].map(lambda x: f"{x:.3f}×" if pd.notna(x) else "—"),
        noise_ms=table["noise_ms"].map(lambda x: f"±{x:.2g}" if pd.notna(x) else "—"),
        mem_ratio=table["mem_ratio"].map(lambda x: f"{x:.3f}×" if pd.notna(x) else "—"),
    )
    return fmt.to_string(index=False)


@click.command("compare")
@click.argument("base")
@click.argument("new")
@click.option("--fail-if-regression", "fail_tol", type=float, default=None, metavar="TOL",
              help="Exit 1 if a matched cell is slower, or uses more memory, by more than TOL (e.g. 0.05) beyond noise.")
def compare_command(base: str, new: str, fail_tol: float | None) -> None:
    """Match the cost cells of BASE and NEW and print NEW/BASE ratios per cell."""
    if fail_tol is not None and not (0 <= fail_tol < 10):
        raise click.UsageError(f"--fail-if-regression must be a fraction such as 0.05, got {fail_tol}")
    tol = DEFAULT_TOL if fail_tol is None else fail_tol
    b, n = _load(base, "BASE"), _load(new, "NEW")
    table = compare_frames(b, n, tol)
    if len(table) == 0:
        raise ValueError(f"no cells in common between {base} ({b['series'].nunique()} series) and {new} "
                         f"({n['series'].nunique()} series): compare needs the same variants, shapes and lengths")
    names_b, names_n = set(b["device_key"]), set(n["device_key"])
    if names_b != names_n:
        click.echo(f"note: BASE ran on {', '.join(sorted(names_b))}; NEW on {', '.join(sorted(names_n))}")
    click.echo(_show(table))
    only_b = len(set(b["key"]) - set(n["key"]))
    only_n = len(set(n["key"]) - set(b["key"]))
    regressed = int(table["regression"].sum())
    faster = int(table["verdict"].str.contains("faster").sum())
    click.echo(f"{len(table)} matched cell(s) ({only_b} only in BASE, {only_n} only in NEW): {regressed} regression(s), "
               f"{faster} faster; tolerance {tol:.0%} beyond noise (the larger latency IQR)")
    if fail_tol is not None and regressed:
        click.echo(f"attn-bench compare: {regressed} cell(s) regressed by more than {fail_tol:.0%} beyond noise", err=True)
        sys.exit(1)  # not click's Exit: harness.cli.main() drops the code click returns for it


__all__ = ["DEFAULT_TOL", "KEY", "compare_command", "compare_frames"]
