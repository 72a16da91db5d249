"""``attn-bench sweep``: measure every cell of a grid of variants x lengths x shapes x modes.

The options are the spec's keys, each declared once with its help (harness.cost.spec); the cells run through
harness.cost.sweep and the summary tables come from harness.cost.summary.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import shlex
import tempfile
from pathlib import Path
from typing import Any

import click

from harness.cost.options import click_options
from harness.cost.pinned import pinned
from harness.cost.profile import top_table
from harness.cost.spec import Grid, RunSettings, expand, load_spec
from harness.cost.summary import failed_variants, summary_tables
from harness.cost.sweep import check_executor, run_sweep
from harness.cost.versus import speedup_table
from harness.executors import executor_options


@click.command("sweep")
@click_options(Grid, RunSettings, stop="device")  # every spec key: harness.cost.spec, declared once
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Results JSONL (default: results/sweep-<preset>-<time>.jsonl).")
@click.option("--resume", is_flag=True, help="Continue --out: cells already in it are not run again.")
@click.option("--preset", help="quick, long or gpu (see attn-bench list).")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), help="TOML sweep file; keys are these option names.")
@click_options(RunSettings, start="plugin")  # the help lists them in the order they always had
@click_options(RunSettings, start="time_limit", stop="threads")
@executor_options
@click.option("--dry-run", is_flag=True, help="Validate and list the cells; measure nothing.")
def sweep_command(out: Path | None, resume: bool, preset: str | None, config: Path | None, dry_run: bool, **opts: Any) -> None:
    """Measure latency, throughput, peak memory and FLOP/s across sequence lengths, each cell isolated in a worker process."""
    from harness.plugins import absolute_plugins, load_plugins, report_plugins

    spec = load_spec(preset, config, opts)
    failed_plugins = load_plugins(spec.run.plugin, report=False)  # a bad spec's one error line names them
    check_executor(spec.run)
    ref = check_ref(spec.run)
    cells = expand(spec, check_device_available=spec.run.executor.kind == "local")  # a login node may have no GPU
    report_plugins(failed_plugins)
    if spec.run.base is not None:  # each cell on both sides, base then head: the machine's drift hits both
        cells = [dataclasses.replace(c, side=side) for c in cells for side in ("base", "head")]
    if out is None and spec.run.out:
        out = Path(spec.run.out)
    if out is None:
        if resume:
            raise click.UsageError("--resume needs --out (the results file to continue)")
        out = Path("results") / f"sweep-{spec.preset or 'custom'}-{dt.datetime.now():%Y%m%d-%H%M%S}.jsonl"
    if dry_run:
        for c in cells:
            kv = (f" H_kv={c.num_kv_heads}" if c.num_kv_heads else "") + (f" docs={c.docs}" if c.docs else "")
            click.echo(f"{c.label}  [{c.scope}, {c.dtype}, B={c.batch_size} H={c.num_heads}{kv} D={c.head_dim}]")
        click.echo(f"{len(cells)} cells -> {out}")
        return
    with pinned(ref, absolute_plugins(spec.run.plugin)) if ref else contextlib.nullcontext() as side:
        spec = dataclasses.replace(spec, run=dataclasses.replace(spec.run, pinned=side))
        rows = run_sweep(spec, cells, out, resume)  # checks, locks and reads out once; a second writer stops there
    if rows or not spec.run.executor.detach:
        click.echo(summary_tables(rows))
    if spec.run.profile:
        click.echo(top_table(rows))
    click.echo(f"results: {out}")
    if spec.run.base is not None:
        table, why = speedup_table(rows, spec.run.fail_over)
        click.echo(table)
        if why:
            click.echo("\n".join(["head fails against the base: exit status 1", *why]), err=True)
            raise click.exceptions.Exit(1)
    refused = [r for r in rows if r.get("status") == "mismatch"]
    if refused:
        click.echo(f"{len(refused)} cell(s) refused by the gate (not timed): exit status 1", err=True)
        raise click.exceptions.Exit(1)
    failed = failed_variants(rows)
    if failed:
        click.echo(f"every cell of {', '.join(failed)} failed with an error (reasons above): exit status 1", err=True)
        raise click.exceptions.Exit(1)


def _rows(target: str, run_id: str | None) -> list[tuple[Path, int, dict[str, Any]]]:
    from harness.results import numbered_rows

    file, _, line = target.rpartition(":") if ":" in target and target.rsplit(":", 1)[1].isdigit() else (target, "", "")
    path = Path(file)
    if not path.is_file():
        raise click.UsageError(f"{file}: no such results file")
    if not line and run_id is None:
        raise click.UsageError("name a row: FILE:LINE, or FILE --run-id ID")
    rows = [(path, n, r) for n, r in numbered_rows(path)
            if (str(n) == line if line else r.get("run_id") == run_id) and "status" in r and "task" not in r]
    if not rows:
        raise click.UsageError(f"{target}: no cost row" + (f" of run {run_id}" if run_id else " at that line"))
    missing = [n for _, n, r in rows if not r.get("repro")]
    if missing:
        raise click.UsageError(f"{file}: line {missing[0]} has no repro command (written before rows carried one)")
    return rows


def _latency(row: dict[str, Any]) -> str:
    if row.get("status") != "ok":
        return f"{row.get('status')} ({row.get('error')})"
    iqr = row.get("latency_iqr_ms")
    return f"{row['latency_ms']:.4g} ms" + (f" (IQR {iqr:.2g})" if iqr is not None else "")


@click.command("repro")
@click.argument("target")
@click.option("--run-id", help="Every cost row of this run in FILE, instead of one line.")
@click.option("--dry-run", is_flag=True, help="Print the commands; run nothing.")
def repro_cli(target: str, run_id: str | None, dry_run: bool) -> None:
    """Measure a recorded cost row again (TARGET: FILE:LINE) with the command it carries; print both measurements."""
    from harness.results import read_rows

    rows = _rows(target, run_id)
    for path, line, row in rows:
        click.echo(f"{path}:{line}: {row['repro']}")
        if dry_run:
            continue
        with tempfile.TemporaryDirectory(prefix="attn-bench-repro-") as tmp:
            out = Path(tmp) / "repro.jsonl"
            sweep_command.main(shlex.split(row["repro"])[2:] + ["--out", str(out)], standalone_mode=False)
            new = read_rows(out)[-1]
        click.echo(f"  recorded: {_latency(row)} on {row.get('device_name')} at {row.get('code_commit')}")
        click.echo(f"  now:      {_latency(new)} on {new.get('device_name')} at {new.get('code_commit')}")
        if row.get("status") == new.get("status") == "ok":
            click.echo(f"  now / recorded: {new['latency_ms'] / row['latency_ms']:.3f}"
                       + ("" if new.get("device_name") == row.get("device_name") else
                          " (another machine: compare ratios measured in one run, not times)"))


def check_ref(run: RunSettings) -> str | None:
    """The git ref whose variants are measured (--base, --at), checked against the other settings."""
    if run.base is not None and run.at is not None:
        raise click.UsageError("--base compares a ref with the working tree, --at measures one ref: give one of them")
    ref = run.base or run.at
    if ref is not None and run.executor.kind != "local":
        raise click.UsageError("--base and --at check the ref out on this machine: use --executor local")
    return ref


__all__ = ["check_ref", "repro_cli", "sweep_command"]
