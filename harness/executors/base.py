"""What every executor shares: the work (:class:`Workload` of chains run on hosts) and :func:`drive`.

An executor decides where a command's work runs (a sweep's cost cells, an accuracy job's trained
models): in this process (``local``), on a Ray cluster (``ray``) or as Slurm jobs (``slurm``). We
schedule nothing ourselves: Ray and Slurm (through submitit, as xformers' benchmark suite did) place
the work; the executors only feed them and collect what comes back.

The work arrives as a :class:`Workload` of *chains*: sequences of tasks that run in order on one
*host* -- an object built on the measuring machine by ``make_host()`` (for cost sweeps the cost
harness's cell measurer: one isolated worker process with its time and memory limits; for accuracy
jobs a trainer that keeps its latest model). Hosts are injected, so this package never imports the
cost or accuracy harness. A chain may decide its next task from the results so far (a sweep's
configuration skips longer lengths after an oom), or just keep tasks together that share what a host
holds (:class:`TaskList`), so it runs on one host; different chains run concurrently.
Every result (a *payload*) comes back to the driver, which alone writes the results file: resume,
dedup and the row schema are the same wherever a task ran.

- ``local``: one host in this process's machine, the chains one after another.
- ``ray``: one Ray actor per slot (``num_gpus=1`` for CUDA work, else one CPU), each holding a host,
  so imports and compiled kernels are paid once per slot as they are locally. A lost actor (its
  worker or node died, or it stopped answering past the task's deadline) is replaced and the task
  retried once; a second loss is recorded as a failure. Nothing waits without a deadline.
- ``slurm``: one submitit job per chain (a job array, ``--max-concurrency`` at a time). A job writes
  each payload as a JSON line to its own file in the submission folder; the driver tails those
  files, appends the rows, and keeps the job ids in ``OUT.jobs.json`` so a sweep can be left
  (``--detach``, Ctrl-C, a closed terminal) and collected later with ``--resume``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# -- the work ------------------------------------------------------------------------------------

class Host(Protocol):
    """Lives on the measuring machine; ``run`` never raises for a task's own failure (that is a payload)."""

    def run(self, task: Any) -> Any: ...

    def close(self) -> None: ...


class Chain(Protocol):
    """Tasks in order. ``next`` gives (task, None) to run, (task, payload) for a task it settles itself
    (a skipped cell), or None when done; ``finish`` tells it each task's payload."""

    tasks: list[Any]  # every task it may run

    def next(self) -> tuple[Any, Any] | None: ...

    def finish(self, task: Any, payload: Any) -> None: ...


class TaskList:
    """A chain whose tasks do not depend on each other's results, run in the given order. One list, one host: tasks
    that share what a host keeps (an accuracy run's trained model, and its checkpoint file) go in one list."""

    def __init__(self, tasks: list[Any]):
        self.tasks = list(tasks)
        self._next = 0

    def next(self) -> tuple[Any, None] | None:
        if self._next >= len(self.tasks):
            return None
        self._next += 1
        return self.tasks[self._next - 1], None

    def finish(self, task: Any, payload: Any) -> None:
        pass


@dataclass
class Workload:
    """Everything an executor needs; the callables must pickle by reference (they travel to the cluster)."""

    chains: list[Chain]
    make_host: Callable[[], Host]
    key: Callable[[Any], str]  # a task's identity, as the results store knows it
    lost: Callable[[Any, str], Any]  # the payload of a task whose host was lost, given why
    gpus: int = 0  # per host
    task_timeout_s: float = 3600.0  # past this without an answer a Ray host counts as lost
    job_minutes: int = 60  # default Slurm time per chain


Record = Callable[[Any, Any], None]


def drive(chain: Chain, host: Host, emit: Record, started: Callable[[Any], None] | None = None) -> None:
    """Run one chain to its end on ``host``, emitting every (task, payload)."""
    while (step := chain.next()) is not None:
        task, payload = step
        if payload is None:
            if started:
                started(task)
            payload = host.run(task)
        chain.finish(task, payload)
        emit(task, payload)


def job_minutes(chain_lengths: list[int], time_limit_s: float) -> int:
    """Slurm time for the longest chain at its per-task time limit, plus start-up."""
    return int(math.ceil(max(chain_lengths, default=1) * time_limit_s / 60)) + 10


__all__ = ["Chain", "Host", "Record", "TaskList", "Workload", "drive", "job_minutes"]
