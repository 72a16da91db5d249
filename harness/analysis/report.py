"""``attn-bench report``: one self-contained HTML page of a sweep -- environment, findings, tables, figures.

Everything is recomputed from the results files (via :mod:`harness.analysis.frames` and
:mod:`harness.analysis.derive`); the figures are the ones ``attn-bench plot`` draws, embedded as base64
PNG so the page can be mailed or attached to a pull request as one file.
"""
from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Sequence
from pathlib import Path

import click
import pandas as pd

from harness.analysis import derive as D
from harness.analysis import figures as P
from harness.analysis import frames as F
from harness.analysis.figures.positions import position_table
from harness.analysis.figures.style import figure_style, provenance
from harness.analysis.findings import findings

ENV_COLUMNS = ("device", "device_name", "cpu_capability", "num_threads", "torch_version", "cuda_version",
               "project_version", "hostname", "seed")
SECTIONS = ("sources", "environment", "suspect", "findings", "scaling", "crossover", "reach", "positions", "tables", "figures",
            "skipped")
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.15em;margin-top:1.6em}h4{font-size:1em;margin:1em 0 .3em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1em}th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.muted{color:#666;font-size:.9em}
figure{margin:1.5em 0}img{max-width:100%;height:auto;display:block}figcaption{color:#333;font-size:.9em;margin-bottom:.4em}
article.run{border-top:3px solid #888;margin-top:2.5em}h2.run-title{border:none;font-size:1.4em;display:inline}
summary{cursor:pointer;padding:.6em 0}
table{display:block;overflow-x:auto;max-width:100%}nav ol{columns:2}
"""


def fmt_num(x: float, digits: int = 4) -> str:
    """Numbers at a readable precision (the JSONL keeps full precision)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, (int,)) or float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def _table(df: pd.DataFrame, table_id: str, index: bool = False) -> str:
    if len(df) == 0:
        return '<p class="muted">nothing to show</p>'
    return df.to_html(index=index, table_id=table_id, border=0, na_rep="—", escape=True)


def _section(sid: str, title: str, body: str, level: int = 2) -> str:
    return f'<section id="{sid}"><h{level}>{html.escape(title)}</h{level}>\n{body}\n</section>\n'


def _sources(results: F.Results) -> pd.DataFrame:
    rows = []
    for kind, df in (("cost", results.cost), ("accuracy", results.accuracy)):
        if len(df) == 0:
            continue
        for src, g in df.groupby("results_file", sort=True):
            status = F.status_counts(g) if kind == "cost" else f"{g['value'].notna().sum()} with a value"
            rows.append({"file": src, "kind": kind, "rows": len(g), "status": status})
    return pd.DataFrame(rows)


def environment_table(results: F.Results) -> pd.DataFrame:
    """Each environment column with the distinct values seen (several values = a mixed run: worth knowing)."""
    frames = [f for f in (results.cost, results.accuracy) if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    rows = []
    for col in ENV_COLUMNS:
        if col in df and df[col].notna().any():
            rows.append({"field": col, "value": ", ".join(sorted({str(v) for v in df[col].dropna()}))})
    if "timestamp" in df and df["timestamp"].notna().any():
        ts = sorted(df["timestamp"].dropna().astype(str))
        rows.append({"field": "timestamp", "value": ts[0] if ts[0] == ts[-1] else f"{ts[0]} … {ts[-1]}"})
    return pd.DataFrame(rows)


def suspect_section(cost: pd.DataFrame) -> str:
    """HTML listing the suspect cells (peak_fraction > 1, or bandwidth_fraction > 1 past the caches) and the noisy ones,
    or saying there are none.

    A number faster than the hardware, or taken while something else ran, must be seen next to the
    findings it could distort, not discovered later in a figure."""
    if len(cost) == 0:
        return '<p class="muted">no cost rows</p>'
    suspect, noisy = D.suspect_rows(cost), D.noisy_rows(cost)
    parts = ['<p class="muted">Suspect: an ok cell whose achieved FLOP/s exceeds the peak measured around it '
             "(peak_fraction &gt; 1), or which moved at least 64 MiB faster than the memory bandwidth measured around it "
             "(bandwidth_fraction &gt; 1), so a count, its timing or its peak is wrong. Noisy: the peaks timed before "
             "and after the cell disagreed or sat below the run's median, other processes used the CPU while it was "
             "timed, or its latency spread was wide or unmeasured, on every attempt. Both are drawn with hollow "
             "markers; suspect cells are left out of the fitted exponents and crossovers.</p>"]
    if len(suspect):
        shown = suspect.assign(seq_len=suspect["seq_len"].map(F.fmt_len),
                               **{c: suspect[c].map(fmt_num) for c in ("peak_fraction", "bandwidth_fraction") if c in suspect})
        parts.append(f"<h3>Suspect cells: {len(suspect)} faster than the hardware</h3>" + _table(shown, "suspect-table"))
    else:
        parts.append('<p id="no-suspect">No suspect cells: no ok cell has peak_fraction &gt; 1 or, past the caches, '
                     "bandwidth_fraction &gt; 1.</p>")
    if len(noisy):
        shown = noisy.assign(seq_len=noisy["seq_len"].map(F.fmt_len),
                             **{c: noisy[c].map(fmt_num) for c in ("other_cpu", "loadavg_1m", "peak_before_flops_per_s",
                                                                   "peak_after_flops_per_s", "attempts") if c in noisy})
        parts.append(f"<h3>Noisy cells: {len(noisy)}</h3>" + _table(shown, "noisy-table"))
    else:
        parts.append('<p id="no-noisy">No noisy cells.</p>')
    cells = F.cells(cost)
    unchecked = int((cells["status"] == "ok").sum() - cells.loc[cells["status"] == "ok", "noisy"].notna().sum()) \
        if "noisy" in cells else int((cells["status"] == "ok").sum())
    if unchecked:
        parts.append(f'<p class="muted">{unchecked} ok cell(s) predate the noise check (no noisy column): '
                     "only the peak_fraction rule could be applied to them.</p>")
    return "".join(parts)


def _num_or_dash(x: float) -> str:
    return f"{x:.2f}" if isinstance(x, float) and math.isfinite(x) else "—"


def _fit_note(x: float, r2: float, points: int) -> str:
    if not math.isfinite(x):
        return f"{points} length{'s' if points != 1 else ''}: a fit needs {D.MIN_FIT_POINTS}"
    return "" if D.plausible_exponent(x, r2) else "not stated as a scaling law: negative, above 3 or R² < 0.9"


def scaling_table(cost: pd.DataFrame) -> pd.DataFrame:
    """Fitted exponents of latency and peak memory vs length, per series and mode (suspect cells left out).

    Fits need 3 lengths; each shows its R², and one that is negative, above 3 or a poor fit is noted."""
    cost = D.without_suspect(cost)
    lat = D.fit_exponents(cost, "latency_ms")
    mem = D.fit_exponents(cost, "peak_mem_bytes") if "peak_mem_bytes" in cost else lat.iloc[0:0]
    table = lat.merge(mem, on=["series", "facet"], how="left", suffixes=("", "_mem"))
    nan = pd.Series(math.nan, index=table.index)
    return pd.DataFrame({
        "series": table["series"], "mode": table["facet"],
        "latency exponent": table["exponent"].map(_num_or_dash),
        "R²": table["r2"].map(_num_or_dash),
        "memory exponent": table.get("exponent_mem", nan).map(_num_or_dash),
        "fit over": [f"{F.fmt_len(a)}–{F.fmt_len(b)} ({n} pts)" for a, b, n in
                     zip(table["from_len"], table["to_len"], table["points"], strict=True)],
        "note": [_fit_note(x, r, int(n)) for x, r, n in zip(table["exponent"], table["r2"], table["points"], strict=True)],
    })


def crossover_table(cost: pd.DataFrame) -> pd.DataFrame:
    """Where each variant starts beating full, from the cells that are not suspect."""
    cr = D.crossovers(D.without_suspect(cost))
    return pd.DataFrame({
        "series": cr["series"], "mode": cr["facet"],
        "beats full from": cr["crossover_len"].map(lambda x: F.fmt_len(x) if math.isfinite(x) else "not within the sweep"),
        "speed-up at longest shared length": [f"{s:.2f}× at {F.fmt_len(L)}" for s, L in
                                              zip(cr["speedup_at_longest"], cr["longest_matched"], strict=True)],
    })


def reach_table(cost: pd.DataFrame) -> pd.DataFrame:
    lr = D.longest_reached(cost)
    return pd.DataFrame({
        "series": lr["series"], "mode": lr["facet"],
        "longest ok length": lr["longest_ok"].map(lambda x: F.fmt_len(x) if math.isfinite(x) else "none"),
        "stopped by": [f"{s} at {F.fmt_len(a)}" if s else "—" for s, a in zip(lr["stopped_by"], lr["stopped_at"], strict=True)],
        "why": [w or "" for w in lr["why"]],
        "longest tried": lr["tried_up_to"].map(F.fmt_len),
    })


def positions_table(acc: pd.DataFrame) -> pd.DataFrame:
    bp = D.best_positions(acc) if len(acc) else pd.DataFrame()
    if len(bp) == 0:
        return bp
    bp = bp.assign(eval_len=bp["eval_len"].map(F.fmt_len), value=bp["value"].map(fmt_num))
    return bp.rename(columns={"eval_len": "eval length", "best_position": "best position", "runner_up": "runner-up"})


def pivot_cost(cost: pd.DataFrame, column: str, scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """Per mode: series × length; cells that did not run show their status, never a number.

    A suspect or noisy cell keeps its number, followed by "(suspect)" or "(noisy)"."""
    cells = F.cells(cost)
    flag = pd.Series("", index=cells.index).mask(D.noisy_mask(cells), " (noisy)").mask(D.suspect_mask(cells), " (suspect)")
    out = {}
    for facet, g in cells.groupby("facet", sort=True):
        text = [fmt_num(v / scale) + f if s == "ok" and pd.notna(v) else (s if s != "ok" else "—")
                for s, v, f in zip(g["status"], g[column] if column in g else [math.nan] * len(g), flag[g.index],
                                   strict=True)]
        table = g.assign(cell=text).pivot(index="series", columns="seq_len", values="cell")
        table.columns = [F.fmt_len(c) for c in table.columns]
        out[facet] = table.fillna("")
    return out


def pivot_accuracy(acc: pd.DataFrame) -> dict[str, pd.DataFrame]:
    out = {}
    pts = D.accuracy_points(acc)
    for (task, metric), g in pts.groupby(["task", "metric"], sort=True):
        table = position_table(g) if task not in F.VERSUS_FULL else \
            g.pivot_table(index="variant_label", columns="length", values="value", aggfunc="mean").rename(columns=int)
        out[f"{task} · {metric}"] = table.rename(columns=F.fmt_len).map(fmt_num)
    return out


REPORT_DPI = 80  # figures are ~2000 px wide at the plot command's 150 dpi; a page shows them at <= 1150 px
COST_FIGURE_KINDS = ("cost", "variants")


def _png(fig) -> str:
    buf = io.BytesIO()
    with figure_style():
        fig.savefig(buf, format="png", dpi=REPORT_DPI)
    return base64.b64encode(buf.getvalue()).decode("ascii")


class _Ids:
    """Section and table ids unique on the page: the first run keeps the plain id, later ones get -2, -3."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, base: str) -> str:
        n = self.seen.get(base, 0) + 1
        self.seen[base] = n
        return base if n == 1 else f"{base}-{n}"


def _figures_html(data: F.Results, only: Sequence[str], ids: _Ids) -> tuple[str, list[dict[str, str]]]:
    figs, skipped = [], []
    described = {f.name: f.description for f in P.FIGURES}
    for name, fig, _ in P.figures(data, None, only=only):
        if isinstance(fig, P.Skip):
            skipped.append({"figure": name, "reason": str(fig)})
            continue
        base = name.split(" [")[0]
        title = base.replace("_", " ").capitalize()
        text = described[base]
        figs.append(f'<figure id="{ids("fig-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name))}"><figcaption><b>{html.escape(title)}'
                    f"</b>{html.escape(name[len(base):])} — {html.escape(text)}</figcaption>"
                    f'<img alt="{html.escape(name)}" src="data:image/png;base64,{_png(fig)}"></figure>')
    return "".join(figs), skipped


def _cost_run(cost: pd.DataFrame, acc_empty: pd.DataFrame, sources: list[str], ids: _Ids) -> list[str]:
    """One run's sections: environment, suspect cells, findings, tables, figures."""
    data = F.Results(cost=cost, accuracy=acc_empty, sources=sources)
    parts = [_section(ids("environment"), "Environment", _table(environment_table(data), ids("environment-table")), 3)]
    parts.append(_section(ids("suspect"), "Suspect and noisy cells", suspect_section(cost), 3))
    items = "".join(f"<li>{html.escape(x)}</li>" for x in findings(cost, acc_empty))
    body = f"<ul>{items}</ul>" if items else '<p class="muted">no findings: too little data</p>'
    has_cost = len(cost) and len(F.ok_rows(cost))
    none = '<p class="muted">no ok cost rows</p>'
    sub = [
        _section(ids("scaling"), "Scaling exponents (log-log fit of latency and peak memory vs length)",
                 _table(scaling_table(cost), ids("scaling-table")) if has_cost else none, 4),
        _section(ids("crossover"), "Crossover length vs full",
                 _table(crossover_table(cost), ids("crossover-table")) if has_cost else none, 4),
        _section(ids("reach"), "Longest length reached",
                 _table(reach_table(cost), ids("reach-table")) if len(cost) else '<p class="muted">no cost rows</p>', 4),
    ]
    parts.append(_section(ids("findings"), "Findings", body + "".join(sub), 3))
    tables = []
    for column, name, scale in (("latency_ms", "Latency (ms)", 1.0), ("tokens_per_s", "Throughput (tokens/s)", 1.0),
                                ("peak_mem_bytes", "Peak memory (MiB)", 2.0**20)):
        if column in cost:
            for facet, table in pivot_cost(cost, column, scale).items():
                tables.append(f"<h4>{html.escape(name)} · {html.escape(facet)}</h4>" + table.to_html(border=0, escape=True))
    parts.append(_section(ids("tables"), "Summary tables", "".join(tables) or '<p class="muted">no tables</p>', 3))
    figs, skipped = _figures_html(data, [f.name for f in P.FIGURES if f.needs in COST_FIGURE_KINDS], ids)
    parts.append(_section(ids("figures"), "Figures", figs or '<p class="muted">no figures</p>', 3))
    parts.append(_section(ids("skipped"), "Figures not drawn", _table(pd.DataFrame(skipped), ids("skipped-table")), 3))
    return parts


def _accuracy_group(cost: pd.DataFrame, acc: pd.DataFrame, sources: list[str], ids: _Ids) -> list[str]:
    data = F.Results(cost=cost, accuracy=acc, sources=sources)
    items = "".join(f"<li>{html.escape(x)}</li>" for x in findings(cost.iloc[0:0], acc))
    sub = _section(ids("positions"), "Best position method per evaluation length",
                   _table(positions_table(acc), ids("positions-table")), 4)
    parts = [_section(ids("findings"), "Findings", (f"<ul>{items}</ul>" if items else "") + sub, 3)]
    tables = [f"<h4>{html.escape(name)}</h4>" + table.to_html(border=0, escape=True)
              for name, table in pivot_accuracy(acc).items()]
    parts.append(_section(ids("tables"), "Summary tables", "".join(tables) or '<p class="muted">no tables</p>', 3))
    figs, skipped = _figures_html(data, [f.name for f in P.FIGURES if f.needs in ("accuracy", "both")], ids)
    parts.append(_section(ids("figures"), "Figures", figs or '<p class="muted">no figures</p>', 3))
    parts.append(_section(ids("skipped"), "Figures not drawn", _table(pd.DataFrame(skipped), ids("skipped-table")), 3))
    return parts


def build_report(results: F.Results, device: str | None = None, title: str = "attn-bench report") -> str:
    """The whole report as one HTML string: a contents list, then one group per run (each cost results
    file: its environment, findings, tables and figures), then the accuracy rows as one group."""
    P.check_plottable(results)
    cost = F.select_device(results.cost, device)
    acc = results.accuracy
    ids = _Ids()
    groups: list[tuple[str, str, list[str]]] = []  # (anchor, heading, sections)
    runs = sorted(cost["results_file"].unique()) if len(cost) and "results_file" in cost else ([None] if len(cost) else [])
    for src in runs:
        run = cost if src is None else cost[cost["results_file"] == src]
        F.check_single_device(run)
        anchor = ids("run")
        caption = provenance(run)
        groups.append((anchor, f"Run: {Path(str(src)).name if src else 'cost'}",
                       [f'<p class="muted">{html.escape(str(src or ""))} · {html.escape(caption)}</p>',
                        *_cost_run(run, acc.iloc[0:0], [str(src)] if src else results.sources, ids)]))
    if len(acc):
        srcs = sorted(acc["results_file"].unique()) if "results_file" in acc else []
        anchor = ids("run")
        head = f'<p class="muted">{html.escape(", ".join(map(str, srcs)))} · {html.escape(provenance(None, acc))}</p>'
        groups.append((anchor, "Accuracy", [head, *_accuracy_group(cost, acc, srcs, ids)]))
    contents = "".join(f'<li><a href="#{a}">{html.escape(h)}</a></li>' for a, h, _ in groups)
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<nav id="contents"><h2>Contents</h2><ol><li><a href="#sources">Sources</a></li>{contents}</ol></nav>',
             _section("sources", "Sources", _table(_sources(F.Results(cost=cost, accuracy=acc, sources=results.sources)),
                                                   "sources-table"))]
    for i, (anchor, heading, sections) in enumerate(groups):
        # each run folds (the first is open): the page is a contents list and the run you are reading
        head = (f'<article class="run" id="{anchor}"><details{" open" if i == 0 else ""}><summary>'
                f'<h2 class="run-title">{html.escape(heading)}</h2></summary>\n')
        parts.append(head + "".join(sections) + "</details></article>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(parts) + "</body></html>\n")


def write_report(paths: Sequence[str], out: str | Path, device: str | None = None) -> Path:
    text = build_report(F.load_results(paths), device)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)  # never leave a half-written report behind
    return out


@click.command("report")
@click.argument("results", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The HTML file to write.")
@click.option("--device", default=None, help="Only cost rows whose device (name) contains this text.")
def report_command(results: tuple[str, ...], out: str, device: str | None) -> None:
    """Write one self-contained HTML report (figures embedded) of the RESULTS files."""
    from harness.results import check_writable

    check_writable(out, what="report")  # before the figures are drawn
    path = write_report(results, out, device)
    click.echo(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


__all__ = ["build_report", "crossover_table", "environment_table", "findings", "reach_table", "report_command",
           "scaling_table", "suspect_section", "write_report"]
