"""Where a command's work runs: in this process (``local``), on a Ray cluster (``ray``) or as Slurm jobs (``slurm``).
May import harness.results, harness.messages, harness.environment, harness.memory; never harness.cost,
harness.accuracy, harness.analysis or harness.cli (hosts come in through ``Workload.make_host``); see base.py."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.executors.base import Chain, Host, Record, TaskList, Workload, drive, job_minutes
from harness.executors.config import (
    EXECUTOR_KEYS,
    EXECUTORS,
    EXTRAS,
    SLURM_CLUSTERS,
    ExecutorConfig,
    check_engine,
    config_from,
    executor_options,
    require,
)
from harness.executors.local import LocalExecutor
from harness.executors.ray import HostActor, RayExecutor
from harness.executors.slurm import SlurmExecutor, pending_jobs, run_job, sidecar_path


def make_executor(config: ExecutorConfig, out: Path, echo: Callable[[str], None] = print, command: str = "sweep"
                  ) -> LocalExecutor | RayExecutor | SlurmExecutor:
    """The executor ``config`` names (ValueError with the install line if its engine is missing); ``command`` is the
    attn-bench subcommand writing ``out`` (a detached Slurm run says how to collect it).

    Defined here, above the three executors it chooses between, so that none of them imports another."""
    require(config.kind)
    if config.kind == "ray":
        return RayExecutor(config, echo)
    if config.kind == "slurm":
        return SlurmExecutor(config, out, echo, command)
    return LocalExecutor()


__all__ = [
    "EXECUTORS", "EXECUTOR_KEYS", "EXTRAS", "SLURM_CLUSTERS", "Chain", "ExecutorConfig", "Host", "HostActor",
    "LocalExecutor", "RayExecutor", "Record", "SlurmExecutor", "TaskList", "Workload", "check_engine", "config_from",
    "drive", "executor_options", "job_minutes", "make_executor", "pending_jobs", "require", "run_job", "sidecar_path",
]
