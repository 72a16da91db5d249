"""A reproducer on every cost row: ``repro`` holds the one ``attn-bench sweep`` command that measures that cell alone
(the exact variant spec with every parameter and the backend, shape, dtype, mode, threads, seed, timing, plugins
and, where the row's code was committed, ``--at COMMIT``: the variants as that commit holds them). ``attn-bench repro
FILE:LINE`` (or ``FILE --run-id ID``: harness.cost.command) runs it and prints the new measurement beside the
recorded one -- FlashInfer's ``--generate_repro_command``, run for you.
"""
from __future__ import annotations

import shlex
from typing import Any

from harness.cost.cells import SCOPES, Cell
from harness.cost.pinned import on_ref


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
                ("--layers", cell.layers), ("--hf-config", cell.hf_config)]
    args += [str(a) for flag, value in optional if value is not None for a in (flag, value)]
    if not SCOPES[cell.scope].positions_from_config and cell.position != "none":
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
    at = run.pinned.commit if on_ref(run.pinned, cell.side) else commit
    if at and not at.endswith("-dirty"):  # a dirty checkout's code was never committed: no commit reproduces it
        args += ["--at", at]
    return shlex.join(["attn-bench", "sweep", *args])


__all__ = ["repro_command", "spec_text", "spec_value"]
