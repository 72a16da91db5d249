"""``attn-bench compare BASE NEW``: cell-by-cell ratios between two cost runs, and a CI regression gate.

A cell is slower only when the latency grew by more than the tolerance *plus* the measured noise:
``new - base > tol * base + max(iqr_base, iqr_new)``, with the IQRs of the timings recorded in the
rows (``latency_iqr_ms``, as ``torch.utils.benchmark`` reports them). Peak memory is counted, not
sampled, so it only gets the tolerance. A cell that ran in BASE and fails in NEW (oom, timeout,
error) is a regression too.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import click
import numpy as np
import pandas as pd

from harness.analysis import frames as F
from harness.analysis import identity as I
from harness.results import COST_KEY_FIELDS

DEFAULT_TOL = 0.05




def _shorten(value: Any, quote: bool = True) -> str:
    from attn.registry import shorten  # lazily: only a refusal needs it, and attn imports the models

    return shorten(value, quote=quote)


def _auto_alias(df: pd.DataFrame) -> pd.Series:
    """Per row, the key it has under ``backend_requested=auto`` plus the backend that ran; None where that
    does not apply. A row without ``backend_requested`` and an ``auto`` row that ran the same backend share it."""
    def one(row: pd.Series) -> str | None:
        ran, requested = row.get("backend"), row.get("backend_requested")
        if not (isinstance(ran, str) and ran) or not (I.absent(requested) or requested == "auto"):
            return None
        return json.dumps({**I.cell_values(row), "backend_requested": "auto"}, sort_keys=True, default=str) + "|" + ran

    return df.apply(one, axis=1) if len(df) else pd.Series(dtype=object)


def _adopt(rows: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Rows lacking ``backend_requested`` take the key of the other run's ``auto`` row that ran their backend."""
    if len(rows) == 0 or len(other) == 0:
        return rows
    lacking = rows["backend_requested"].map(I.absent) if "backend_requested" in rows else pd.Series(True, rows.index)
    if not lacking.any():
        return rows
    auto = other[other["backend_requested"] == "auto"] if "backend_requested" in other else other.iloc[0:0]
    by_alias = dict(zip(_auto_alias(auto), auto["key"], strict=True))
    taken, theirs = set(rows["key"]), set(other["key"])
    keys = rows["key"].copy()
    for i, alias in zip(rows.index[lacking.to_numpy()], _auto_alias(rows[lacking]), strict=True):
        target = by_alias.get(alias) if alias is not None else None
        if keys[i] not in theirs and target is not None and target not in taken:
            keys[i] = target
            taken.add(target)
    return rows.assign(key=keys)


def match_keys(base: pd.DataFrame, new: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Give both runs' rows the keys they are matched on; idempotent, so callers may count on the result."""
    def keyed(df: pd.DataFrame) -> pd.DataFrame:  # a prepared frame has its identity already (frames.prepare_cost)
        return df if "key" in df else df.assign(key=df["cell"] if "cell" in df else I.cell_identity(df))

    base, new = keyed(base), keyed(new)
    return _adopt(base, new), _adopt(new, base)


def _load(path: str, role: str) -> pd.DataFrame:
    res = F.load_results([path])
    if len(res.cost) == 0:
        raise ValueError(f"{role} {path} holds no cost rows (compare needs cost rows: {', '.join(F.COST_REQUIRED)})")
    F.require_ok(res.cost, [path])
    cost = res.cost.assign(key=res.cost["cell"])
    return cost.drop_duplicates("key", keep="last")  # a re-run supersedes what came before


def compare_frames(base: pd.DataFrame, new: pd.DataFrame, tol: float = DEFAULT_TOL) -> pd.DataFrame:
    """One row per cell present in both runs, with ratios and a verdict; ``regression`` marks the gate."""
    base, new = match_keys(base, new)
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


def _first_difference(b: pd.DataFrame, n: pd.DataFrame) -> str:
    """``"; e.g. dtype: float32 in BASE, bfloat16 in NEW"``: the first key field the two runs share no value of."""
    def values(df: pd.DataFrame) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {c: set() for c in COST_KEY_FIELDS}
        for _, row in df.iterrows():
            for c, v in I.cell_values(row).items():
                out[c].add(json.dumps(v, default=str))
            if I.absent(row.get("backend_requested")):
                out["backend_requested"].add(json.dumps("auto"))  # may match an auto row (see _adopt)
        return out

    vb, vn = values(b), values(n)
    for c in COST_KEY_FIELDS:
        sb, sn = vb[c], vn[c]
        if not sb & sn:
            def show(s: set[str]) -> str:
                return _shorten(", ".join(sorted(s)), quote=False)
            return f"; e.g. {c}: {show(sb)} in BASE, {show(sn)} in NEW"
    return ""


def _show(table: pd.DataFrame) -> str:
    fmt = table.drop(columns=["regression"]).assign(
        seq_len=table["seq_len"].map(F.fmt_len),
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
    b, n = match_keys(_load(base, "BASE"), _load(new, "NEW"))
    table = compare_frames(b, n, tol)
    if len(table) == 0:
        raise ValueError(f"no cells in common between {base} ({b['series'].nunique()} series) and {new} "
                         f"({n['series'].nunique()} series): compare needs the same variants, shapes and lengths"
                         f"{_first_difference(b, n)}")
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


__all__ = ["DEFAULT_TOL", "compare_command", "compare_frames", "match_keys"]
