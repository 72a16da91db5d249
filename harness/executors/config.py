"""Which executor a command (``sweep``, ``accuracy``) uses and how it is configured: :class:`ExecutorConfig`, the
``--executor`` click options (defined once here, shared by every command that places work), :func:`require`, which
imports an optional engine (ray, submitit) or says how to install it, and :func:`check_engine`."""
from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attn.optional import try_import

EXECUTORS = ("local", "ray", "slurm")
EXTRAS = {"ray": ("ray", "ray"), "slurm": ("submitit", "slurm")}  # executor -> (module, pip extra)
SLURM_CLUSTERS = ("slurm", "local")  # local: submitit's LocalExecutor, the same code path on this machine


@dataclass(frozen=True)
class ExecutorConfig:
    """Where the work runs; ``None`` fields take the defaults described on each option."""

    kind: str = "local"
    ray_address: str | None = None  # None: $RAY_ADDRESS if set, else start a Ray instance on this machine
    max_concurrency: int | None = None  # hosts at once; None: ray, one per GPU (CUDA) or CPU of the cluster; slurm, all
    slurm_partition: str | None = None
    slurm_time: int | None = None  # minutes per job; None: enough for the longest chain at its time limit
    slurm_gpus: int | None = None  # GPUs per job; None: 1 for CUDA work, else 0
    slurm_folder: str | None = None  # submitit's folder (shared with the nodes); None: OUT.slurm/ next to the results
    slurm_cluster: str = "slurm"
    detach: bool = False  # slurm: submit, record the jobs, return; --resume collects them

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"unknown executor {self.kind!r}; valid: {', '.join(EXECUTORS)}")
        if self.slurm_cluster not in SLURM_CLUSTERS:
            raise ValueError(f"unknown slurm_cluster {self.slurm_cluster!r}; valid: {', '.join(SLURM_CLUSTERS)}")
        if self.kind == "local" and (self.max_concurrency or 1) > 1:
            raise ValueError("--max-concurrency needs --executor ray or slurm: the local executor measures one cell "
                             "at a time so that cells do not contend for the machine")
        if self.detach and self.kind != "slurm":
            raise ValueError("--detach needs --executor slurm (Ray and local runs end with the command)")
        # A sweep file's values are checked with their source named (harness.cost.spec); this catches the rest.
        for name, least in (("max_concurrency", 1), ("slurm_time", 1), ("slurm_gpus", 0)):
            value = getattr(self, name)
            if value is not None and value < least:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {least}, got {value}")


EXECUTOR_KEYS = ("executor", "ray_address", "max_concurrency", "slurm_partition", "slurm_time", "slurm_gpus",
                 "slurm_folder", "slurm_cluster", "detach")  # option / sweep-file names; "executor" is ``kind``


def config_from(options: dict[str, Any]) -> ExecutorConfig:
    """An ExecutorConfig from option names (EXECUTOR_KEYS); absent or None values keep their defaults."""
    given = {("kind" if k == "executor" else k): v for k, v in options.items() if k in EXECUTOR_KEYS and v is not None}
    return ExecutorConfig(**given)


def executor_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--executor`` family of click options (values reach the command as keyword arguments named as EXECUTOR_KEYS)."""
    import click

    options = [
        click.option("--executor", type=click.Choice(EXECUTORS),
                     help="Where the work runs: local (default: this machine, one task at a time), ray or slurm "
                          "(docs/scaling.md)."),
        click.option("--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else a new local instance)."),
        click.option("--max-concurrency", type=int,
                     help="Hosts at once: Ray actors (default one per GPU, or CPU, of the cluster) or Slurm jobs."),
        click.option("--slurm-partition", help="Slurm partition of the jobs."),
        click.option("--slurm-time", type=int, help="Minutes per Slurm job (default: enough for the longest chain of work)."),
        click.option("--slurm-gpus", type=int, help="GPUs per Slurm job (default 1 for --device cuda, else 0)."),
        click.option("--slurm-folder", help="submitit folder, shared with the nodes (default: OUT.slurm/ next to --out)."),
        click.option("--slurm-cluster", type=click.Choice(SLURM_CLUSTERS),
                     help="slurm (default) or local: submitit's local executor, the same jobs on this machine."),
        click.option("--detach", is_flag=True, default=None,
                     help="Slurm: submit, note the jobs in OUT.jobs.json and return; --resume collects the results."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def check_engine(config: ExecutorConfig) -> None:
    """The executor's engine is installed and can place work from this machine (ValueError, one line, if not):
    checked before anything is written, so a missing engine never leaves a half-started run."""
    require(config.kind)
    if config.kind == "slurm" and config.slurm_cluster == "slurm" and shutil.which("sbatch") is None:
        raise ValueError("--executor slurm: no Slurm on this machine (sbatch not found); run from a login node, "
                         "or --slurm-cluster local to run the jobs here")


def require(kind: str) -> Any:
    """The engine module of ``kind``, or ValueError with the one line that says how to install it."""
    if kind not in EXTRAS:
        return None
    module, extra = EXTRAS[kind]
    found = try_import(module)  # a broken engine (an import raising anything) fails here, not inside a job
    if isinstance(found, str):
        why = "" if found.endswith(" is not installed") else f"{found}; "
        raise ValueError(f"--executor {kind} needs {module}: {why}pip install 'attn-bench[{extra}]'")
    return found


__all__ = ["EXECUTORS", "EXECUTOR_KEYS", "EXTRAS", "SLURM_CLUSTERS", "ExecutorConfig", "check_engine", "config_from",
           "executor_options", "require"]
