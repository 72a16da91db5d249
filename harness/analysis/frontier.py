"""The memory-quality frontier: accuracy rows of ``attn-bench accuracy --preset frontier-*`` -> points, a ranking,
effective lengths and a markdown summary (``attn-bench frontier``).

A point is one task's score for one method at one budget (passkey's depths pooled into one cell). Every arm answers
the same prompts, so every comparison is paired, and counts independent draws (:mod:`harness.analysis.paired`): a row
says how many it holds (``draws``); older passkey rows, whose keys at one depth share a haystack, are one draw a depth.
A task full scores below 0.5 on is not ranked: a budget cannot lose what the model never had. The comparisons the
documents state are :mod:`harness.analysis.claims`'.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd

from harness.analysis import continuation
from harness.analysis.claims import against_oracle, claim_lines
from harness.analysis.effective import effective_length, effective_lines, kept_tests
from harness.analysis.paired import ALPHA, interval, paired_difference
from harness.messages import one_line
from harness.results import check_writable, scan_rows, write_atomic
from harness.schema import declaration, dtype_of, one_draw_a_cell, press_method, subject

MIN_EXAMPLES = 20  # a cell on fewer (a run stopped inside it) is shown, not ranked


@dataclass(frozen=True)
class FrontierConfig:
    """What the summary rests on: the seed of the Monte Carlo tests (deterministic), the budget tabled alone, the
    floors."""

    seed: int = 0
    at: str = "1/8"  # the budget the sized variants run at
    floor: float = 0.5  # full below this on a task: the task is not ranked
    keep: float = 0.85  # effective length: the share of full's score a method must keep
    level: int = 1  # the markdown's top heading level (4: a section of results/README.md)


# -- rows -> points ----------------------------------------------------------------------------------

def _text(v: Any) -> str | None:
    return v or None if isinstance(v, str) else None


def arm(row: dict[str, Any]) -> tuple[str, str, str] | None:
    """(method, kind, budget) of a frontier row; None for a row of another kind of run."""
    press, budget = _text(row.get("press")), _text(row.get("budget")) or ""
    if press is not None:
        if press == "none":
            return "full", "reference", ""
        if press == "retrieval":  # the chunks a retriever picks for the question (attn/hf/retrieval.py)
            params = row.get("press_params") if isinstance(row.get("press_params"), dict) else {}
            return f"retrieval ({params.get('retriever', 'bm25')})", "retrieval", budget
        if press == "quantized":
            bits = re.search(r"nbits=(\d+)", str(row.get("press_spec", "")))
            return f"quantized {bits[1] if bits else '?'}-bit", "quantized", ""
        name = press_method(row) + (" (query-aware)" if row.get("query_aware") in (True,) else "")
        return (name, "oracle" if press == "oracle" else "press", budget) if budget else None  # else: not sized
    spec = _text(row.get("variant_spec")) or ""
    if not budget or not spec:
        return None
    if row.get("decode_keys") == "all":  # a dynamic sparse prefill: the budget is its share of the prefill's pairs
        return spec.split(":")[0], "prefill", budget
    return ("sinks" if "sinks=" in spec else spec.split(":")[0]), "variant", budget


def task_of(row: dict[str, Any]) -> str | None:
    """The frontier's task of a row (the task it scores, as the row names it: passkey, a RULER subtask) when the row
    holds the metric its task ranks arms by (``metric_role`` ranked), else None."""
    d = declaration(row)
    return d["task_label"] if d["metric_role"] == "ranked" else None


def _num(v: Any, missing: float = float("nan")) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return missing
    return missing if f != f else f


def _depth(row: dict[str, Any]) -> float:
    return _num(row.get("depth"), -1.0)  # NaN is no dictionary key: RULER rows have no depth


def clusters(row: dict[str, Any]) -> tuple[int, ...]:
    """The sizes of a row's independent draws, in its examples' order: from its ``draws`` (equal clusters), else one
    draw where the row's examples shared one context before rows said so (passkey's keys of one depth shared one
    haystack: :func:`harness.schema.one_draw_a_cell`), else one draw an example."""
    n = len(row["per_example"])
    k = _num(row.get("draws"))  # a float where a frame mixed rows with and without it
    if k > 0 and k.is_integer() and n % int(k) == 0:
        return (n // int(k),) * int(k)
    return (n,) if one_draw_a_cell(row) else (1,) * n


def _pool(cell: list[dict[str, Any]]) -> dict[str, Any]:
    """One task's rows of one arm (passkey: one per depth) -> its pooled examples, or why it did not run."""
    cell = sorted(cell, key=_depth)
    failed = [r for r in cell if r.get("status") != "ok"]
    if failed:
        return {"n": 0, "score": float("nan"), "kv_bytes": float("nan"), "status": str(failed[0].get("status")),
                "error": one_line(failed[0].get("error") or "no reason given")}
    if any(not isinstance(r.get("per_example"), list) for r in cell):
        raise ValueError(f"a {cell[0].get('task')} row of {cell[0].get('model')} lacks per_example: the frontier pairs "
                         "arms by example")
    ex = np.concatenate([np.asarray(r["per_example"], dtype=float) for r in cell])
    key = tuple((_depth(r), len(r["per_example"])) for r in cell)
    sizes = tuple(c for r in cell for c in clusters(r))
    kv = [_num(r.get("kv_bytes")) for r in cell if _num(r.get("kv_bytes")) == _num(r.get("kv_bytes"))]
    score, lo, hi, _ = interval([ex], clusters=[sizes])
    return {"status": "ok", "error": None, "per_example": ex, "examples": key, "clusters": sizes, "n": len(ex),
            "draws": len(sizes), "score": score,
            "ci_low": lo, "ci_high": hi, "binary": bool(np.isin(ex, (0.0, 1.0)).all()),
            "kv_bytes": float(np.mean(kv)) if kv else float("nan")}


def points(rows: Iterable[dict[str, Any]] | pd.DataFrame, floor: float = 0.5) -> pd.DataFrame:
    """One row per (model, eval_len, task, method, budget) -- ``model`` the subject (the checkpoint with its dtype
    unless float32), ``checkpoint`` and ``dtype`` apart: score, interval, n, per_example, kv_bytes, kv_fraction,
    kind, status (cells that did not run keep their error and no score), ranked / below_half (full's score)."""
    cells: dict[tuple, dict[float, dict[str, Any]]] = {}  # cell -> depth -> row
    for r in rows.to_dict("records") if isinstance(rows, pd.DataFrame) else rows:
        task, a = task_of(r), arm(r)
        if task is not None and a is not None:  # a resumed run's later row replaces the earlier one
            cells.setdefault((subject(r), int(_num(r.get("eval_len"))), task, *a), {})[_depth(r)] = r
    if not cells:
        raise ValueError("no memory-quality frontier rows (passkey or RULER rows with a press or a budget)")
    out = []
    for (model, L, task, method, kind, budget), cell in cells.items():
        first = next(iter(cell.values()))
        frac, family = _num(first.get("budget_fraction")) if budget else float("nan"), str(first.get("task"))
        out.append({"model": model, "checkpoint": first.get("model"), "dtype": dtype_of(first), "eval_len": L,
                    "task": task, "family": family, "method": method, "kind": kind,
                    "budget": budget, "budget_fraction": frac, **_pool(list(cell.values()))})
    df = pd.DataFrame(out)
    full = df[(df["kind"] == "reference") & (df["status"] == "ok")].set_index(["model", "eval_len", "task"])
    at = pd.MultiIndex.from_frame(df[["model", "eval_len", "task"]])
    df["full_score"] = ref = full["score"].reindex(at).to_numpy(dtype=float)
    df["kv_fraction"] = df["kv_bytes"].to_numpy(dtype=float) / full["kv_bytes"].reindex(at).to_numpy(dtype=float)
    df["few"] = full["n"].reindex(at).to_numpy(dtype=float) < MIN_EXAMPLES  # a cell the run was cut inside
    df["below_half"], df["ranked"] = ref < floor, (ref >= floor) & ~df["few"]
    order = ["model", "eval_len", "task", "kind", "budget_fraction", "method"]
    return df.sort_values(order, ascending=[True, True, True, True, False, True], ignore_index=True)


# -- points -> numbers ---------------------------------------------------------------------------------

def _auc(curve: list[list[np.ndarray]], x: np.ndarray) -> list[np.ndarray]:
    """Per task, each example's trapezoid area of its score over log2(budget), divided by the range (one budget: its
    score there): the AUC is linear in the scores, so the method's AUC is the equal-weight mean of these, an example's
    value in [0, 1], and its interval and tests are a score's."""
    if len(x) == 1:
        return [row[0] for row in curve]
    dx = np.diff(x) / (x[-1] - x[0])
    c = np.concatenate([[dx[0] / 2], (dx[:-1] + dx[1:]) / 2, [dx[-1] / 2]])  # trapezoid weight of each budget
    return [np.tensordot(c, np.stack(row), axes=1) for row in curve]


def _rank_group(g: pd.DataFrame, cfg: FrontierConfig) -> list[dict[str, Any]]:
    refs = g[(g["kind"] == "reference") & g["ranked"]]
    ref = dict(zip(refs["task"], refs["examples"], strict=True))
    sizes = dict(zip(refs["task"], refs["clusters"], strict=True))
    tasks = sorted(ref)
    cl = [sizes[t] for t in tasks]
    if not tasks:
        return []
    # a cell enters a comparison only on the reference's examples: paired
    ex = {(r.method, r.task, r.budget): r.per_example for r in g.itertuples() if ref.get(r.task) == r.examples}
    budgets = sorted(set(g[g["kind"].isin(["press", "oracle"])]["budget"]) - {""}, key=lambda t: float(Fraction(t)))
    x = np.log2([float(Fraction(b)) for b in budgets])
    curves = {m: [[ex.get((m, t, "" if m == "full" else b)) for b in budgets] for t in tasks] for m in set(g["method"])}
    whole = {m: _auc(c, x) for m, c in curves.items() if budgets and all(a is not None for row in c for a in row)}
    oracle = whole.get("oracle")
    out = []
    for method, kind in sorted(set(zip(g["method"], g["kind"], strict=True))):
        rec: dict[str, Any] = {"model": g["model"].iloc[0], "eval_len": g["eval_len"].iloc[0], "method": method,
                               "kind": kind, "tasks": len(tasks), "n": sum(len(ex[("full", t, "")]) for t in tasks),
                               "draws": sum(len(c) for c in cl)}
        if method in whole:
            rec["auc"], rec["auc_lo"], rec["auc_hi"], rec["n_eff"] = interval(whole[method], cl)
            if oracle:
                rec["gap"], rec["gap_lo"], rec["gap_hi"] = paired_difference(oracle, whole[method], cl)
        b = cfg.at if kind in ("press", "oracle", "variant", "prefill", "retrieval") else ""
        own = [ex.get((method, t, b)) for t in tasks]
        if all(a is not None for a in own):
            where = "score" if kind == "quantized" else "at"  # full: flat, its score at every budget
            rec[where], rec[f"{where}_lo"], rec[f"{where}_hi"], rec["n_eff"] = interval(own, cl)
            rec["kv_fraction"] = float(g[(g["method"] == method) & (g["budget"] == b)]["kv_fraction"].mean())
            o_at = [ex.get(("oracle", t, cfg.at)) for t in tasks]  # the oracle at this budget, on every task
            if where == "at" and all(a is not None for a in o_at):
                rec["gap_at"], rec["gap_at_lo"], rec["gap_at_hi"] = paired_difference(o_at, own, cl)
        out.append(rec)
    return out


RANK_COLUMNS = ["model", "eval_len", "method", "kind", "tasks", "n", "draws", "n_eff", "auc",
                "auc_lo", "auc_hi", "gap", "gap_lo", "gap_hi", "at",
                "at_lo", "at_hi", "gap_at", "gap_at_lo", "gap_at_hi", "score", "score_lo", "score_hi", "kv_fraction"]


def ranking(pts: pd.DataFrame, at: str = "1/8") -> pd.DataFrame:
    """Per (model, eval_len), each method's normalised AUC over the press budgets with its interval and its paired gap
    to the oracle, and its score and gap at ``at``; no-budget arms (quantized) get ``score``. ``n``: examples,
    ``draws``: the independent ones, ``n_eff``: what the equal-weight mean over tasks counts them as. Best AUC first."""
    cfg = FrontierConfig(at=at)
    recs = [r for _, g in pts[pts["status"] == "ok"].groupby(["model", "eval_len"], sort=True) for r in _rank_group(g, cfg)]
    df = pd.DataFrame(recs, columns=RANK_COLUMNS)
    return df.sort_values(["model", "eval_len", "auc", "at", "score"], ascending=[True, True, False, False, False],
                          na_position="last", ignore_index=True)


# -- markdown ------------------------------------------------------------------------------------------

def _f(v: Any) -> str:
    return "-" if v is None or pd.isna(v) else f"{v:.2f}"


def _iv(r: pd.Series, col: str) -> str:
    """``0.71 [0.60, 0.80]``: the number and its interval, "-" when blank."""
    return "-" if pd.isna(r[col]) else f"{r[col]:.2f} [{r[f'{col}_lo']:.2f}, {r[f'{col}_hi']:.2f}]"


def _ranking_lines(rk: pd.DataFrame, at: str) -> list[str]:
    lines = [f"| method | AUC [95% CI] | gap to oracle | score at {at} | gap at {at} |", "|---|---|---|---|---|"]
    for _, r in rk[rk["score"].isna()].iterrows():
        lines.append(f"| {r['method']} | {_iv(r, 'auc')} | {_iv(r, 'gap')} | {_iv(r, 'at')} | {_iv(r, 'gap_at')} |")
    lines.append(f"\n-: no score at every budget (AUC) or at {at} on every ranked task, or no oracle to compare with.")
    for _, r in rk[rk["score"].notna()].iterrows():
        lines.append(f"\n{r['method']} (no budget): score {_iv(r, 'score')} at {_f(r['kv_fraction'])} of full's KV bytes")
    return lines


METHODS_NOTE = (
    "AUC: score over log2(budget), trapezoid, normalised to [0, 1] (a length run at one budget: the score there), equal "
    "weight per ranked task. Every count is of independent draws (a passkey row's keys in one haystack are one draw). "
    "Intervals, one method throughout: 95 % Wilson score intervals at the effective number of draws (Kish's n_eff of "
    "the equal-weight mean over tasks); gaps (oracle minus method): Newcombe's paired interval on those. Claims: the "
    "sign-flip test of the paired draw differences (on 0/1 draws, the exact sign test on the discordant ones), Holm's "
    "adjustment over each table's pairs, resolved at 0.05; a tie at 1.00 or 0.00 is a tie.")


ORACLE_NOTE = ("The oracle keeps, per head and decoding step, the keys with the largest true attention weight: the most "
               "attention mass a selector of the budget can keep, not the best answer. An arm that keeps other keys "
               "(the recent window or sinks the model copies from, or fewer distracting keys) can answer better, so "
               "attention mass kept is not the whole of what a budget must hold.")


RETRIEVAL_NOTE = ("retrieval (...): the model reads only the context's chunks a retriever ranks best for the question, "
                  "up to the budget's tokens: query-aware by nature, to compare with the query-aware presses and the "
                  "oracle, which also see the question before choosing.")


def _draws_line(r: pd.Series) -> str:
    return (f"Pooled over {r['tasks']} ranked task{'s' if r['tasks'] > 1 else ''}: {r['n']} examples, {r['draws']} "
            f"independent draws, which the equal-weight mean counts as n_eff {r['n_eff']:.1f}.")


def _oracle_lines(beat: pd.DataFrame) -> list[str]:
    above = beat[beat["diff"] > 0]
    if len(above) == 0:
        return ["", f"No arm scores above the oracle on any of the {len(beat)} cells compared with it."]
    sure = above[above["p_adj"] < ALPHA]
    lines = ["", f"Above the oracle at its budget ({len(above)} of the {len(beat)} cells compared with it; paired test, "
                 f"Holm over the {len(beat)}): " + ("none resolved." if len(sure) == 0 else f"{len(sure)} resolved:")]
    lines += [f"- {r['method']} at {r['budget']} on {r['task']}: {r['a']:.2f} vs {r['b']:.2f}, "
              f"{r['diff']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}], ahead on {r['a_ahead']} of "
              f"{r['a_ahead'] + r['b_ahead']} discordant draws, {r['test']} p = {r['p']:.3f}, Holm {r['p_adj']:.3f}"
              for _, r in sure.iterrows()]
    return lines + (["", ORACLE_NOTE] if len(sure) else [])


def _length_section(g: pd.DataFrame, rk: pd.DataFrame, beat: pd.DataFrame, at: str, head: str,
                    seed: int = 0) -> list[str]:
    """One model at one length: ranked and marked tasks, the ranking, its claims, what did not run, the cells above
    the oracle."""
    full = g[(g["kind"] == "reference") & (g["status"] == "ok")]
    lines = ["", f"{head} {g['model'].iloc[0]} at {g['eval_len'].iloc[0]} tokens", "",
             f"Ranked tasks: {', '.join(sorted(full[full['ranked']]['task'])) or 'none'}."]
    for why, m in (("full < 0.5: a budget cannot lose what the model never had", full[full["below_half"]]),
                   (f"fewer than {MIN_EXAMPLES} examples: the run stopped inside it", full[full["few"]])):
        lines += [f"Not ranked ({why}): " + ", ".join(f"{t} (full {_f(s)}, n {n})" for t, s, n in zip(
            m["task"], m["score"], m["n"], strict=True)) + "."] if len(m) else []
    if len(rk):
        lines += [_draws_line(rk.iloc[0]), ""] + _ranking_lines(rk, at)
        lines += claim_lines(g, rk, str(g["model"].iloc[0]), int(g["eval_len"].iloc[0]), at, seed)
    failed = g[g["status"] != "ok"]
    if len(failed):
        lines += ["", "Did not run:"] + [f"- {r['method']}{' at ' + r['budget'] if r['budget'] else ''} on {r['task']}: "
                                         f"{r['status']}: {r['error']}" for _, r in failed.iterrows()]
    return lines + (_oracle_lines(beat) if len(beat) else [])


def markdown(pts: pd.DataFrame, config: FrontierConfig = FrontierConfig()) -> str:
    """Per model and length: the ranking, its claims, the tasks not ranked, what did not run, the cells above the
    oracle; per model the effective lengths. Deterministic: the Monte Carlo tests are seeded."""
    rk = ranking(pts, config.at)
    eff = effective_length(pts, config.keep)
    kept = kept_tests(pts, config.keep, config.at, config.seed)
    beat = against_oracle(pts, config.seed)
    lines = [f"{'#' * config.level} Memory-quality frontier", "", METHODS_NOTE.format(at=config.at)]
    if (pts["kind"] == "retrieval").any():
        lines += ["", RETRIEVAL_NOTE]
    for model in sorted(set(pts["model"])):
        for L in sorted(set(pts[pts["model"] == model]["eval_len"])):
            here = {k: v[(v["model"] == model) & (v["eval_len"] == L)] for k, v in (("p", pts), ("r", rk), ("b", beat))}
            lines += _length_section(here["p"], here["r"], here["b"], config.at, "#" * (config.level + 1), config.seed)
        e = eff[eff["model"] == model]
        if len(e):
            lines += effective_lines(model, e, kept[kept["model"] == model], config.keep, config.at,
                                     "#" * (config.level + 1))
    from harness.analysis.frontier_cost import task_lines  # noqa: I001  (the per-task table, beside the ranking)
    lines += task_lines(pts, config.at, "#" * (config.level + 1))
    return "\n".join(lines) + "\n"


# -- the command ---------------------------------------------------------------------------------------

def read_files(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of the files; one-line errors for a missing file or a line that is not a JSON object (a torn last
    line of a file still being written is not a row, and not an error)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise click.UsageError(f"results file {p} {'is not a regular file' if p.exists() else 'does not exist'}")
        got, bad = scan_rows(p)
        if bad:
            raise ValueError(f"{p} line {bad[0]} is not a JSON object")
        rows += got
    return rows


@click.command("frontier")
@click.argument("files", nargs=-1, required=True)
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write the markdown here (else stdout).")
@click.option("--heading-level", default=1, type=click.IntRange(1, 5), help="The top heading's level (4: a section of "
              "results/README.md, as committed there).")
@click.option("--cost", "costs", multiple=True, help="Cost rows of the same methods (attn-bench sweep --scope hf): "
              "each one's decode step and prefill against full's, beside its score (repeatable).")
def frontier_command(files: tuple[str, ...], out: str | None, heading_level: int, costs: tuple[str, ...]) -> None:
    """The memory-quality frontier of accuracy FILES: per model and length, each method's AUC over the budgets and its
    gap to the oracle, effective lengths, what did not run, and the text each keeps (continuation bpb), as markdown."""
    from harness.analysis.frontier_cost import cost_lines

    if out is not None:
        check_writable(out, what="markdown file")
    config = FrontierConfig(level=heading_level)
    rows, head = read_files(files), "#" * (config.level + 1)
    text = "".join(f"{line}\n" for line in continuation.lines(rows, arm, head, config.seed))  # bpb: not a ranked score
    if text and not any(task_of(r) is not None and arm(r) is not None for r in rows):
        text = f"{'#' * config.level} Memory-quality frontier\n" + text  # the text read after compression alone
    else:
        pts = points(rows, config.floor)
        text = markdown(pts, config) + text + "".join(f"{line}\n" for line in cost_lines(read_files(costs), pts,
                                                                                          config.at, head))
    if out is None:
        return click.echo(text, nl=False)
    write_atomic(out, text)
    click.echo(f"wrote {out}")


__all__ = ["FrontierConfig", "RANK_COLUMNS", "arm", "clusters", "frontier_command", "markdown",
           "points", "ranking", "read_files", "task_of"]
