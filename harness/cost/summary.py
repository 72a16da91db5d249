"""The tables ``attn-bench sweep`` prints at the end: variant x length, median latency (with the
log-log slope) and peak memory, failures marked."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.messages import one_line

MARKS = {"oom": "OOM", "timeout": "T/O", "skipped": "skip", "unsupported": "n/a", "error": "ERR", "mismatch": "≠ref"}
LEGEND = ("OOM = out of memory, T/O = over the time limit, skip = not run after a failure, n/a = unsupported, "
          "ERR = error, ≠ref = differs from the reference (refused: not timed)")


def _fmt_len(n: int) -> str:
    for unit, size in (("M", 1024**2), ("K", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def loglog_slope(lengths: Sequence[float], latencies: Sequence[float]) -> float:
    """Least-squares slope of log(latency) against log(length): the empirical exponent of the cost."""
    import numpy as np

    return float(np.polyfit(np.log(np.asarray(lengths, float)), np.log(np.asarray(latencies, float)), 1)[0])


def _fmt_slope(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def summary_tables(rows: Sequence[dict[str, Any]]) -> str:
    """Variant x length tables of median latency and peak memory, failures marked."""
    import pandas as pd

    if not rows:
        return "no rows"
    df = pd.DataFrame(rows)
    df["variant"] = [r.get("variant_spec") or r.get("variant") for r in rows]
    dims = [c for c in ("scope", "position", "press_spec", "mode", "dtype", "batch_size", "num_heads", "num_kv_heads",
                        "head_dim", "causal", "layers", "docs", "device") if c in df and df[c].astype(str).nunique() > 1]
    index = ["variant", *dims]
    for c in dims:  # pivot tables drop rows whose index holds None (e.g. layers of op-scope cells)
        df[c] = df[c].map(lambda v: "-" if v is None else str(v))

    def table(value: str, scale: float, slope: bool = False) -> str:
        text = [
            _num(r[value] / scale) if r["status"] == "ok" and r.get(value) is not None
            else MARKS.get(r["status"], r["status"]) if r["status"] != "ok" else "-"
            for r in df.to_dict("records")
        ]
        t = df.assign(text=text, length=df["seq_len"]).pivot_table(
            index=index, columns="length", values="text", aggfunc="first", sort=False
        )
        t = t.reindex(columns=sorted(t.columns)).fillna("")
        t.columns = [_fmt_len(int(c)) for c in t.columns]
        if slope:
            t["slope"] = [_fmt_slope(slopes.get(k if isinstance(k, tuple) else (k,))) for k in t.index]
        return t.to_string()

    slopes = {}
    for key, g in df[(df["status"] == "ok") & df["latency_ms"].notna()].groupby(index, sort=False):
        if g["seq_len"].nunique() >= 3:
            slopes[key if isinstance(key, tuple) else (key,)] = loglog_slope(g["seq_len"], g["latency_ms"])

    counts = df["status"].value_counts()
    parts = [
        "median latency, ms (slope: of log latency vs log length, ~1 linear, ~2 quadratic)",
        table("latency_ms", 1.0, slope=True),
        "",
        "peak memory above baseline, MiB",
        table("peak_mem_bytes", 2**20),
        "",
        LEGEND,
        f"{len(df)} cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()),
    ]
    reasons = error_reasons(rows)
    if reasons:
        parts += ["", "why cells did not finish (each reason once; its first cell and how many share it):"]
        parts += [f"  {status} x{n} at {label}: {why}" for status, why, label, n in reasons]
    noisy = int(df["noisy"].fillna(False).astype(bool).sum()) if "noisy" in df else 0
    if noisy:
        parts.append(f"{noisy} ok cells are noisy (ran under load or beside a changing matmul peak after every retry): "
                     f"see their noisy_reason; plots draw them hollow")
    return "\n".join(parts)


def _label(r: dict[str, Any]) -> str:
    press = f" press={r['press_spec']}" if r.get("press_spec") else ""
    return f"{r.get('variant_spec') or r.get('variant')}{press} {r.get('mode', '')} L={_fmt_len(int(r.get('seq_len') or 0))}"


def error_reasons(rows: Sequence[dict[str, Any]], width: int = 160) -> list[tuple[str, str, str, int]]:
    """(status, reason, first cell, count) per distinct reason of error/oom/timeout/unsupported rows, in order seen.

    ``skipped`` rows are left out: their reason is another cell's failure, which is listed itself.
    """
    seen: dict[tuple[str, str], list] = {}
    for r in rows:
        if r.get("status") in ("error", "oom", "timeout", "unsupported"):
            why = one_line(r.get("error") or "(no reason recorded)", width)
            entry = seen.setdefault((r["status"], why), [_label(r), 0])
            entry[1] += 1
    return [(status, why, label, n) for (status, why), (label, n) in seen.items()]


def failed_variants(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Variants (as specified) none of whose cells is ok and at least one of which ended in ``error``.

    The sweep exits with status 1 when there is one: every cell of it failed for a reason that is a
    bug, not a measured limit. Out of memory, over the time limit, skipped and unsupported are results.
    """
    by_variant: dict[str, set[str]] = {}
    for r in rows:
        by_variant.setdefault(str(r.get("variant_spec") or r.get("variant")), set()).add(str(r.get("status")))
    return [v for v, statuses in by_variant.items() if "ok" not in statuses and "error" in statuses]


__all__ = ["LEGEND", "MARKS", "error_reasons", "failed_variants", "loglog_slope", "summary_tables"]
