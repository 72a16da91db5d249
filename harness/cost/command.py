"""``attn-bench sweep``: measure every cell of a grid of variants x lengths x shapes x modes.

The options are the spec's keys (harness.cost.spec); the cells run through harness.cost.sweep and
the summary tables come from harness.cost.summary.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import click

from harness.cost.spec import expand, load_spec
from harness.cost.summary import failed_variants, summary_tables
from harness.cost.sweep import check_executor, run_sweep
from harness.executors import EXECUTOR_KEYS, executor_options
from harness.results import check_writable


def _cli_layer(opts: dict[str, Any]) -> dict[str, Any]:
    """The options the user actually gave (click passes None / () for the others)."""
    names = {"variant", "position", "lengths", "batch", "heads", "kv_heads", "docs", "head_dim", "hf_config", "dtype", "mode",
             "scope", "causal", "layers", "device", "time_limit", "mem_limit", "skip_after_failure", "seed", "min_run_time",
             "max_run_time", "retries", "threads", "plugin", *EXECUTOR_KEYS}
    layer = {}
    for k in names:
        v = opts.get(k)
        if v is None or v == ():
            continue
        layer[k] = list(v) if isinstance(v, tuple) else v
    return layer


@click.command("sweep")
@click.option("--variant", multiple=True, help="NAME[:key=value,...]; backend=NAME picks a backend. Repeatable.")
@click.option("--position", multiple=True, help="Position method spec (scope=model only). Repeatable.")
@click.option("--lengths", help="Sequence lengths: 1024,2048 or 1K,4K or a doubling range 1K..1M.")
@click.option("--batch", help="Batch sizes, comma list.")
@click.option("--heads", help="Numbers of (query) heads, comma list.")
@click.option("--kv-heads", help="Numbers of key/value heads (GQA; 1 = multi-query), comma list; default: as many as --heads.")
@click.option("--docs", help="Documents packed per sequence (equal lengths, no attention across them), comma list; "
              "forward and train cells (default 1).")
@click.option("--head-dim", help="Head dimensions, comma list.")
@click.option("--dtype", multiple=True, help="float32, bfloat16, float16, float64 (repeatable or comma list).")
@click.option("--mode", multiple=True, help="forward, train, decode (repeatable or comma list).")
@click.option("--scope", multiple=True, help="op (attention alone), model (our backbone) or hf (a transformers model).")
@click.option("--hf-config", "--hf-model", "hf_config", multiple=True,
              help="--scope hf: llama, mistral, qwen2 (small random-weight presets), a named checkpoint (smollm2-135m, "
                   "gemma3-270m: attn-bench list), a .gguf file or a local config.json / model directory. Cost needs "
                   "only the architecture: the model is built from the config with random weights.")
@click.option("--causal/--bidirectional", default=None, help="Causal (default) or bidirectional attention.")
@click.option("--layers", type=int, help="Backbone depth for --scope model (default 2).")
@click.option("--device", help="cpu (default), cuda or cuda:N.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Results JSONL (default: results/sweep-<preset>-<time>.jsonl).")
@click.option("--resume", is_flag=True, help="Continue --out: cells already in it are not run again.")
@click.option("--preset", help="quick, long or gpu (see attn-bench list).")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), help="TOML sweep file; keys are these option names.")
@click.option("--plugin", multiple=True, help="File or module registering extra variants. Repeatable.")
@click.option("--time-limit", type=float, help="Seconds per cell, warm-up included (default 300).")
@click.option("--mem-limit", type=float,
              help="GiB per cell: process memory on CPU (default 80% of what is free at start), device memory on CUDA.")
@click.option("--skip-after-failure/--no-skip-after-failure", default=None,
              help="After an OOM or timeout, record longer lengths of that configuration as skipped (default on).")
@click.option("--seed", type=int, help="Seed of the random inputs (default 0).")
@click.option("--min-run-time", type=float, help="Seconds of timed calls before the spread is checked.")
@click.option("--max-run-time", type=float, help="Seconds of timed calls after which a cell stops repeating.")
@click.option("--retries", type=int, help="Re-measure a cell flagged noisy up to N times (default 2; keeps the least noisy).")
@click.option("--threads", type=int, help="torch CPU threads per cell (default: torch's choice); rows record num_threads.")
@executor_options
@click.option("--dry-run", is_flag=True, help="Validate and list the cells; measure nothing.")
def sweep_command(out: Path | None, resume: bool, preset: str | None, config: Path | None, dry_run: bool, **opts: Any) -> None:
    """Measure latency, throughput, peak memory and FLOP/s across sequence lengths, each cell isolated in a worker process."""
    from harness.plugins import load_plugins, report_plugins

    spec = load_spec(preset, config, _cli_layer(opts))
    failed_plugins = load_plugins(spec.run.plugin, report=False)  # a bad spec's one error line names them
    check_executor(spec.run)
    cells = expand(spec, check_device_available=spec.run.executor.kind == "local")  # a login node may have no GPU
    report_plugins(failed_plugins)
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
    check_writable(out)  # before any work: a run must not measure for an hour and then fail to write
    rows = run_sweep(spec, cells, out, resume)  # locks and reads out once; a second writer stops before any output
    if rows or not spec.run.executor.detach:
        click.echo(summary_tables(rows))
    click.echo(f"results: {out}")
    failed = failed_variants(rows)
    if failed:
        click.echo(f"every cell of {', '.join(failed)} failed with an error (reasons above): exit status 1", err=True)
        raise click.exceptions.Exit(1)


__all__ = ["sweep_command"]
