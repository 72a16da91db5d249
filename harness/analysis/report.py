"""``attn-bench report``: one self-contained HTML page of some results files -- per file its command,
environment, findings, tables and figures, the files grouped by kind of run.

Everything is recomputed from the results files (via :mod:`harness.analysis.frames` and
:mod:`harness.analysis.derive`); the figures are the ones ``attn-bench plot`` draws, embedded as palette
PNGs at screen resolution so the page can be mailed or attached to a pull request as one file and still
loads like a page. The sources table holds each file's SHA-256, so a test can tell, by reading files alone,
that a committed report no longer matches the results it claims to show.
"""
from __future__ import annotations

import contextlib
import html
import math
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import click
import pandas as pd

from harness.analysis import derive as D
from harness.analysis import embed as E
from harness.analysis import figures as P
from harness.analysis import frames as F
from harness.analysis import runs as R
from harness.analysis import trust as T
from harness.analysis.figures.positions import position_table
from harness.analysis.figures.style import provenance
from harness.analysis.findings import findings
from harness.results import write_atomic

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
article.run{border-top:3px solid #888;margin-top:1.5em}h3.run-title{border:none;font-size:1.3em;display:inline;margin:0}
summary{cursor:pointer;padding:.6em 0}
table{display:block;overflow-x:auto;max-width:100%}nav ol ol{columns:2}
section.kind>h2{margin-top:2.5em}p.command{background:#f6f6f6;border-left:3px solid #888;padding:.5em .8em;overflow-wrap:anywhere}
details.table>summary{padding:.3em 0;font-weight:600}details.table{margin:.2em 0}
"""


def fmt_num(x: float, digits: int = 4) -> str:
    """Numbers at a readable precision (the JSONL keeps full precision)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, (int,)) or float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def _compact(table_html: str) -> str:
    """pandas' table HTML without its indentation and per-row styles: a third of the bytes, the same table."""
    table_html = table_html.replace(' class="dataframe"', "").replace(' style="text-align: right;"', "")
    return re.sub(r">\s+<", "><", table_html)


def _table(df: pd.DataFrame, table_id: str, index: bool = False) -> str:
    if len(df) == 0:
        return '<p class="muted">nothing to show</p>'
    return _compact(df.to_html(index=index, table_id=table_id, border=0, na_rep="—", escape=True))


def _folded(title: str, body: str) -> str:
    """A table one click away: a run's tables are reference, its findings and figures the reading."""
    return f'<details class="table"><summary>{html.escape(title)}</summary>{body}</details>'


def _section(sid: str, title: str, body: str, level: int = 2) -> str:
    return f'<section id="{sid}"><h{level}>{html.escape(title)}</h{level}>\n{body}\n</section>\n'


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
    suspect, noisy = T.suspect_rows(cost), T.noisy_rows(cost)
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
    cost = T.without_suspect(cost)
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
    cr = D.crossovers(T.without_suspect(cost))
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
    flag = pd.Series("", index=cells.index).mask(T.noisy_mask(cells), " (noisy)").mask(T.suspect_mask(cells), " (suspect)")
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
    acc = F.declared(acc)
    versus_full = set(acc.loc[acc["versus_full"], "task"])  # fidelity, selection: each variant against full
    pts = D.accuracy_points(acc)
    for (task, metric), g in pts.groupby(["task", "metric"], sort=True):
        table = position_table(g) if task not in versus_full else \
            g.pivot_table(index="variant_label", columns="length", values="value", aggfunc="mean").rename(columns=int)
        out[f"{task} · {metric}"] = table.rename(columns=F.fmt_len).map(fmt_num)
    return out


def _figure_names(data: F.Results, kind: str, all_figures: bool = False) -> Sequence[str]:
    """The figures a run shows (``all_figures``: every one ``plot`` draws for its kind)."""
    needs = ("cost", "variants") if kind == "cost" else ("accuracy",)
    if all_figures:
        return [f.name for f in P.FIGURES if f.needs in needs]
    if kind == "accuracy" and data.accuracy.get("budget", pd.Series()).notna().any():  # frontier
        return ("frontier",)
    if kind == "cost" and data.cost.get("seq_len", pd.Series()).nunique() == 1:
        return ()  # a run at one length: its tables say it; its figures (mostly curves over length) stay off the page
    return E.RUN_FIGURES[kind]


def _figure_sections(drawn: Sequence[E.Drawn], ids: E.PageIds) -> list[str]:
    figs, skipped = E.figures_html(drawn, ids)
    return [_section(ids("figures"), "Figures", figs or '<p class="muted">no figures</p>', 3),
            _section(ids("skipped"), "Figures not drawn",
                     _folded(f"{len(skipped)} figure(s), each with why", _table(pd.DataFrame(skipped), ids("skipped-table")))
                     if skipped else '<p class="muted">none</p>', 3)]


def _cost_run(data: F.Results, ids: E.PageIds, drawn: Sequence[E.Drawn]) -> list[str]:
    """One run's sections: environment, suspect cells, findings, tables, figures (``drawn``)."""
    cost, acc_empty = data.cost, data.accuracy
    parts = [_section(ids("environment"), "Environment",
                      _folded("device, versions, timestamps", _table(environment_table(data), ids("environment-table"))), 3)]
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
                tables.append(_folded(f"{name} · {facet}", _compact(table.to_html(border=0, escape=True))))
    parts.append(_section(ids("tables"), "Summary tables", "".join(tables) or '<p class="muted">no tables</p>', 3))
    return parts + _figure_sections(drawn, ids)


def _accuracy_run(data: F.Results, ids: E.PageIds, drawn: Sequence[E.Drawn]) -> list[str]:
    """One accuracy file's sections: findings, best positions, tables, figures (``drawn``; never pooled with another
    file's rows: runs of different protocols would stand in one table as if comparable)."""
    acc, cost_empty = data.accuracy, data.cost
    items = "".join(f"<li>{html.escape(x)}</li>" for x in findings(cost_empty, acc))
    sub = _section(ids("positions"), "Best position method per evaluation length",
                   _table(positions_table(acc), ids("positions-table")), 4)
    parts = [_section(ids("findings"), "Findings", (f"<ul>{items}</ul>" if items else "") + sub, 3)]
    frontier = acc.get("budget", pd.Series()).notna().any()  # its tables: `attn-bench frontier`, in results/README.md
    tables = [] if frontier else [_folded(name, _compact(table.to_html(border=0, escape=True)))
                                  for name, table in pivot_accuracy(acc).items()]
    parts.append(_section(ids("tables"), "Summary tables", "".join(tables) or '<p class="muted">no tables</p>', 3))
    return parts + _figure_sections(drawn, ids)


def _sources_table(runs: list[tuple[str, str, str, pd.DataFrame]]) -> pd.DataFrame:
    rows = []
    for kind, group, src, g in runs:
        status = F.status_counts(g) if kind == "cost" else f"{g['value'].notna().sum()} with a value"
        rows.append({"file": Path(src).name, "group": R.KINDS[group], "rows": len(g), "status": status,
                     "sha256": R.file_digest(src)})
    return pd.DataFrame(rows)


def build_report(results: F.Results, device: str | None = None, title: str = "attn-bench report",
                 commands: Mapping[str, str] | None = None, commands_source: str | None = None,
                 all_figures: bool = False, jobs: int = 1) -> str:
    """The whole report as one HTML string: a contents list, the sources (each file's rows and SHA-256), then each
    results file as one folded run -- its command (from ``commands``, file name -> HTML), environment, findings,
    tables and figures -- grouped by kind of run. ``all_figures``: every figure ``plot`` draws, not the page's set.

    Drawing the figures is most of the time (matplotlib, a third of a second each): with ``jobs`` > 1, worker
    processes draw them, a run at a time, while this one writes the tables; the page is the same."""
    P.check_plottable(results)
    commands = commands or {}
    cost = F.select_device(results.cost, device)
    acc = results.accuracy
    ids = E.PageIds()
    runs = R.runs(cost, acc, commands)
    for kind, _, _, rows in runs:
        if kind == "cost":
            F.check_single_device(rows)
    data = [F.Results(cost=rows, accuracy=acc.iloc[0:0], sources=[src]) if kind == "cost" else
            F.Results(cost=cost.iloc[0:0], accuracy=rows, sources=[src]) for kind, _, src, rows in runs]
    figures = [_figure_names(d, kind, all_figures) for d, (kind, *_) in zip(data, runs, strict=True)]
    articles: dict[str, list[str]] = {}
    contents: dict[str, list[str]] = {}
    with ProcessPoolExecutor(jobs) if jobs > 1 else contextlib.nullcontext() as pool:
        drawing = [pool.submit(E.draw_figures, d, only) for d, only in zip(data, figures, strict=True)] if pool else []
        for i, (kind, group, src, rows) in enumerate(runs):
            drawn = drawing[i].result() if pool else E.draw_figures(data[i], figures[i])
            name = Path(src).name
            anchor = ids("run")
            if name in commands:
                command = f'<p class="command">{commands[name]}</p>'
            else:
                where = f" in {commands_source}" if commands_source else " (attn-bench report --commands gives it)"
                command = f'<p class="command muted">no command recorded{html.escape(where)}</p>'
            if kind == "cost":
                caption = provenance(rows)
                sections = _cost_run(data[i], ids, drawn)
            else:
                caption = provenance(None, rows)
                sections = _accuracy_run(data[i], ids, drawn)
            size = f"{len(rows)} {kind} row{'s' if len(rows) != 1 else ''}"
            # each run folds (the first is open): the page is a contents list and the run you are reading
            articles.setdefault(group, []).append(
                f'<article class="run" id="{anchor}" data-file="{html.escape(name)}"><details{" open" if i == 0 else ""}>'
                f'<summary><h3 class="run-title">{html.escape(name)}</h3> <span class="muted">{html.escape(size)}</span>'
                f"</summary>\n{command}"
                f'<p class="muted">{html.escape(src)} · {html.escape(caption)}</p>' + "".join(sections) + "</details></article>")
            contents.setdefault(group, []).append(f'<li><a href="#{anchor}">{html.escape(name)}</a></li>')
    nav = "".join(f'<li><a href="#kind-{g}">{html.escape(R.KINDS[g])}</a><ol>{"".join(contents[g])}</ol></li>'
                  for g in R.KINDS if g in contents)
    n_files = len({src for _, _, src, _ in runs})
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<p class="muted">{n_files} results file(s), {len(runs)} run(s). Each run folds open from the contents; its '
             "tables fold too. <code>attn-bench plot</code> draws what the page leaves out: "
             + ("" if all_figures else "throughput, the FLOP/s fraction and roofline figures (or <code>report "
                "--all-figures</code>), and ") + "the figures pairing a cost run with an accuracy run (tradeoff, patterns).</p>",
             f'<nav id="contents"><h2>Contents</h2><ol><li><a href="#sources">Sources</a></li>{nav}</ol></nav>',
             _section("sources", "Sources", _folded(f"{n_files} file(s): rows, status and SHA-256 of each",
                                                    _table(_sources_table(runs), "sources-table")))]
    for g in R.KINDS:
        if g in articles:
            parts.append(f'<section class="kind" id="kind-{g}"><h2>{html.escape(R.KINDS[g])}</h2>\n'
                         + "\n".join(articles[g]) + "</section>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(parts) + "</body></html>\n")


def write_report(paths: Sequence[str], out: str | Path, device: str | None = None,
                 commands: str | Path | None = None, all_figures: bool = False, jobs: int = 1) -> Path:
    """Build the report of ``paths`` (each file's command from the ``commands`` document, if given) into ``out``."""
    table = R.run_commands(Path(commands).read_text(encoding="utf-8")) if commands else None
    text = build_report(F.load_results(paths), device, commands=table, commands_source=str(commands) if commands else None,
                        all_figures=all_figures, jobs=jobs)
    return write_atomic(out, text)  # never a half-written report


@click.command("report")
@click.argument("results", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The HTML file to write.")
@click.option("--device", default=None, help="Only cost rows whose device (name) contains this text.")
@click.option("--commands", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Markdown with a '### `<file name>`' section per results file opening with the command that made it "
                   "(results/README.md): shown with each run.")
@click.option("--all-figures", is_flag=True,
              help="Every figure `plot` draws (throughput, FLOP/s fraction, roofline too): for a report of a run or two.")
@click.option("--jobs", default=2, show_default=True, type=click.IntRange(min=1),
              help="Processes drawing the figures (most of the time); each holds its own matplotlib, ~0.2 GB.")
def report_command(results: tuple[str, ...], out: str, device: str | None, commands: str | None,
                   all_figures: bool, jobs: int) -> None:
    """Write one self-contained HTML report (figures embedded) of the RESULTS files, one run per file."""
    from harness.results import check_writable

    check_writable(out, what="report")  # before the figures are drawn
    path = write_report(results, out, device, commands, all_figures, jobs)
    click.echo(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


__all__ = ["build_report", "crossover_table", "environment_table", "findings", "reach_table", "report_command",
           "scaling_table", "suspect_section", "write_report"]
