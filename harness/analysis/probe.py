"""The task probe: which tasks can show what a method keeps, per model and length (``attn-bench probe``).

A frontier cell at a ceiling or a floor shows nothing: where full attention scores 1.0, "a press matches the oracle" is
a tie at the top; where it scores 0, a budget cannot lose what the model never had. The probe reads full attention's
rows on every task (``attn-bench accuracy --preset probe-*-cpu``: a few examples of every RULER task at each length)
and keeps for the frontier the tasks where full scores between ``low`` and ``high`` (0.5 and 0.95): room above for a
method to lose, and below 1 for the oracle to show a gap. Each task's line says its score, interval and draws, and why
it is in or out. The rows say which metric their task ranks by (``metric_role``), so no task is named here.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import click
import numpy as np
import pandas as pd

from harness.analysis.frontier import clusters, read_files
from harness.analysis.paired import interval
from harness.results import check_writable, write_atomic
from harness.schema import declaration, subject


@dataclass(frozen=True)
class ProbeConfig:
    low: float = 0.5  # full below this: the floor, nothing for a budget to lose
    high: float = 0.95  # full above this: the ceiling, no room for the oracle to show a gap


def _full(row: dict[str, Any]) -> bool:
    """A row of the model as it is: no press (or ``none``), no budget, not a sized variant."""
    return row.get("press") in (None, "none") and not row.get("budget") and row.get("matched_ratio") is None


def probe(rows: Iterable[dict[str, Any]], config: ProbeConfig = ProbeConfig()) -> pd.DataFrame:
    """One row per (model, eval_len, variant, task): full's score on the task's ranked metric, its 95 % interval, the
    examples and independent draws it rests on, and the verdict (in / ceiling / floor / failed)."""
    cells: dict[tuple, dict[Any, dict[str, Any]]] = {}
    for r in rows:
        d = declaration(r)
        if d["metric_role"] != "ranked" or not _full(r):
            continue
        key = (subject(r), int(r.get("eval_len") or 0), str(r.get("variant_spec")), d["task_label"])
        cells.setdefault(key, {})[repr(r.get("depth"))] = r  # a resumed run's later row replaces the earlier one
    out = []
    for (model, L, variant, task), cell in sorted(cells.items()):
        got = list(cell.values())
        base = {"model": model, "eval_len": L, "variant": variant, "task": task}
        failed = [r for r in got if r.get("status") != "ok" or not isinstance(r.get("per_example"), list)]
        if failed:
            out.append({**base, "score": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n": 0, "draws": 0,
                        "verdict": "failed", "why": str(failed[0].get("error") or "no per-example outcomes")})
            continue
        ex = np.concatenate([np.asarray(r["per_example"], dtype=float) for r in got])
        sizes = [c for r in got for c in clusters(r)]
        score, lo, hi, _ = interval([ex], clusters=[sizes])
        verdict = "floor" if score < config.low else "ceiling" if score > config.high else "in"
        why = {"floor": f"full below {config.low:g}: nothing for a budget to lose",
               "ceiling": f"full above {config.high:g}: no room for the oracle to show a gap",
               "in": f"full in [{config.low:g}, {config.high:g}]"}[verdict]
        out.append({**base, "score": score, "ci_low": lo, "ci_high": hi, "n": len(ex), "draws": len(sizes),
                    "verdict": verdict, "why": why})
    if not out:
        raise ValueError("no probe rows (rows of full attention, no press or budget, on a task's ranked metric)")
    return pd.DataFrame(out)


def lines(df: pd.DataFrame, config: ProbeConfig = ProbeConfig(), head: str = "#") -> list[str]:
    """The probe as markdown: per model, length and variant, each task's line, then the tasks kept."""
    out = [f"{head} Task probe: full attention per task (kept where it scores {config.low:g} to {config.high:g})"]
    for (model, L, variant), g in df.groupby(["model", "eval_len", "variant"], sort=True):
        kept = list(g[g["verdict"] == "in"]["task"])
        out += ["", f"{head}# {model} at {L} tokens ({variant})", "", "| task | full | 95 % interval | n (draws) | |",
                "|---|---|---|---|---|"]
        for r in g.itertuples():
            if r.verdict == "failed":
                out.append(f"| {r.task} | - | - | - | failed: {r.why} |")
                continue
            out.append(f"| {r.task} | {r.score:.2f} | [{r.ci_low:.2f}, {r.ci_high:.2f}] | {r.n} ({r.draws}) | "
                       f"{'**in**' if r.verdict == 'in' else 'out'}: {r.why} |")
        out += ["", f"Kept: {', '.join(f'`{t}`' for t in kept) if kept else 'none'}."]
    return out


@click.command("probe")
@click.argument("files", nargs=-1, required=True)
@click.option("--low", default=ProbeConfig.low, show_default=True, type=click.FloatRange(0, 1),
              help="Full below this: a floor, the task is out.")
@click.option("--high", default=ProbeConfig.high, show_default=True, type=click.FloatRange(0, 1),
              help="Full above this: a ceiling, the task is out.")
@click.option("--heading-level", default=1, type=click.IntRange(1, 5), help="The top heading's level.")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write the markdown here (else stdout).")
def probe_command(files: Sequence[str], low: float, high: float, heading_level: int, out: str | None) -> None:
    """The task probe of accuracy FILES: full attention's score per model, length and task, and which tasks can show
    what a method keeps (full between --low and --high), as markdown."""
    if low >= high:
        raise click.UsageError(f"--low {low:g} must be below --high {high:g}")
    if out is not None:
        check_writable(out, what="markdown file")
    config = ProbeConfig(low, high)
    text = "\n".join(lines(probe(read_files(files), config), config, "#" * heading_level)) + "\n"
    if out is None:
        return click.echo(text, nl=False)
    write_atomic(out, text)
    click.echo(f"wrote {out}")


__all__ = ["ProbeConfig", "lines", "probe", "probe_command"]
