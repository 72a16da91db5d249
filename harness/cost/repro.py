"""A reproducer on every cost row: ``repro`` holds the one ``attn-bench sweep`` command that measures that cell alone
(the exact variant spec with every parameter and the backend, shape, dtype, mode, threads, seed, timing, plugins
and, where the row's code was committed, ``--at COMMIT``: the variants as that commit holds them). ``attn-bench repro
FILE:LINE`` (or ``FILE --run-id ID``) runs it and prints the new measurement beside the recorded one -- FlashInfer's
``--generate_repro_command``, run for you.
"""
from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from typing import Any

import click

from harness.cost.cells import Cell


def spec_value(value: Any) -> str:
    """A parameter's value as a spec writes it (tuples as a/b, None as none)."""
    if isinstance(value, (list, tuple)):
        return "/".join(spec_value(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)


def spec_text(name: str, params: dict[str, Any], backend: str | None = None) -> str:
    items = [f"{k}={spec_value(v)}" for k, v in params.items()] + ([f"backend={backend}"] if backend else [])
    return name + (":" + ",".join(items) if items else "")


def repro_command(cell: Cell, run: Any, commit: str | None, threads: int | None = None) -> str:
    """The sweep command measuring ``cell`` alone with ``run``'s settings (a harness.cost.spec.RunSettings)."""
    from attn.patterns import LAYERS

    if cell.variant == LAYERS:
        args = ["--pattern", cell.variant_params["pattern"]]
    else:
        args = ["--variant", spec_text(cell.variant, cell.variant_params, cell.backend_requested)]
    args += ["--scope", cell.scope, "--mode", cell.mode, "--lengths", str(cell.seq_len), "--batch", str(cell.batch_size),
             "--heads", str(cell.num_heads), "--head-dim", str(cell.head_dim), "--dtype", cell.dtype]
    optional = [("--kv-heads", cell.num_kv_heads), ("--docs", cell.docs), ("--queries-per-step", cell.queries),
                ("--budget", cell.budget_bytes), ("--ragged", cell.ragged), ("--press", cell.press_spec),
                ("--layers", cell.layers), ("--hf-config", cell.hf_config if cell.scope == "hf" else None)]
    args += [str(a) for flag, value in optional if value is not None for a in (flag, value)]
    if cell.scope == "model":
        args += ["--position", spec_text(cell.position, cell.position_params)]
    if not cell.causal:
        args.append("--bidirectional")
    args += ["--device", run.device, "--seed", str(run.seed), "--time-limit", f"{run.time_limit:g}",
             "--min-run-time", f"{run.min_run_time:g}", "--max-run-time", f"{run.max_run_time:g}"]
    if run.threads or threads:
        args += ["--threads", str(run.threads or threads)]
    if run.mem_limit:
        args += ["--mem-limit", f"{run.mem_limit:g}"]
    for p in run.plugin:
        args += ["--plugin", p]
    if run.refcheck or run.base is not None:
        args += ["--refcheck", "--check-tokens", str(run.check_tokens)]
    at = run.pinned.commit if run.pinned is not None and cell.side != "head" else commit
    if at and not at.endswith("-dirty"):  # a dirty checkout's code was never committed: no commit reproduces it
        args += ["--at", at]
    return shlex.join(["attn-bench", "sweep", *args])


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
    from harness.cost.command import sweep_command
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


__all__ = ["repro_cli", "repro_command", "spec_text", "spec_value"]
