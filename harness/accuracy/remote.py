"""``attn-bench accuracy --executor ray|slurm``: the same runs as the local path, placed by harness.executors.

The unit of remote work (:class:`Unit`) is one trained model, a :class:`~harness.accuracy.jobs.Run` of a plan:
train it or load its checkpoint, then evaluate every pending cell at every stage (for fidelity, also one seed's
random-input rows). For a pretrained checkpoint (:class:`~harness.accuracy.pretrained.HFPlan`) it is one setting: the
model of one variant and position override, with every arm that shares its prefill (its presses), built on the
weights the host reads once. A host (:class:`AccuracyHost`: one Ray actor, one Slurm job) runs units with the local path's
own :class:`~harness.accuracy.runner.Runner` and sends their rows back; only the driver appends them, as each unit
finishes, so ``--resume`` and the store's keys are the local path's, and a killed driver loses only the units that
had not come back (a detached or interrupted Slurm run is collected by ``--resume``, as for the sweep).

Units that share a trained model (the RoPE family at factor 1, a fine-tune and its base) form one chain: they run
in order on one host, which trains the model once and keeps it, so no two hosts ever write one checkpoint. Hosts
share the checkpoint directory through the file system, as Slurm jobs share their submission folder.

A unit that fails on its host (the host raised, the Ray worker or the Slurm job died) becomes a row for each of
its cells still missing, status ``oom`` when the reason says so, else ``error``; the driver never stops for it.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.accuracy.jobs import Plan, short_hash
from harness.accuracy.pretrained import HFPlan
from harness.accuracy.runner import Runner, memory_cap
from harness.accuracy.tasks import get_task
from harness.executors import ExecutorConfig, TaskList, Workload, job_minutes, make_executor
from harness.messages import looks_like_oom
from harness.plugins import absolute_plugins

# Slurm asks for this much per unit of a chain (--slurm-time overrides); a Ray unit silent for four times as long
# counts as lost. Tiny and small presets train in minutes on a CPU node; a day-long run needs --slurm-time.
UNIT_TIME_S = 6 * 3600
DONE_STATUSES = ("ok", "unsupported")  # what --resume does not run again (Runner's rule)


@dataclass(frozen=True)
class Unit:
    """One trained model of a plan (``run``: its index in ``plan.runs``), or rows of ``seed`` that need no trained
    model (``run`` None: fidelity's random inputs; the task's ``units`` says which). ``done``: keys of its cells
    already in the results file, which the host skips."""

    plan: Plan | HFPlan
    run: int | None
    seed: int
    done: frozenset[str] = frozenset()

    @property
    def label(self) -> str:
        if isinstance(self.plan, HFPlan):
            s = self.plan.settings[self.run]  # type: ignore[index]
            return f"{self.plan.ckpt.name} {s.variant_spec} {s.position_spec}"
        if self.run is None:
            return f"{self.plan.job.task} random inputs seed {self.seed}"
        r = self.plan.runs[self.run]
        return f"{self.plan.job.task} {r.variant.label} {r.position.label} seed {r.seed}"

    @property
    def model(self) -> str:
        """The trained model it needs, as its checkpoint is named (random inputs need none: a model of their own; a
        checkpoint's setting is a model of its own, built on the weights)."""
        if isinstance(self.plan, HFPlan):
            return f"setting|{unit_key(self)}"
        if self.run is None:
            return f"random|{unit_key(self)}"
        return f"{self.plan.task.name}-{self.plan.runs[self.run].train_id}"


def unit_key(u: Unit) -> str:
    """A unit's identity, stable across invocations (a detached Slurm run's jobs are matched by it on --resume):
    the run and the job's settings, not which other variants, positions or seeds the job lists."""
    if isinstance(u.plan, HFPlan):
        from harness.accuracy.pretrained import base_row

        p = u.plan
        cells = {t: p.eval_id(t) for t in p.tasks} | {"lens": p.eval_lens, "only": p.settings[u.run].only_len}  # type: ignore[index]
        return f"{base_row(p, p.settings[u.run])['run_id']}|{short_hash(cells)}"  # type: ignore[index]
    job = {k: v for k, v in dataclasses.asdict(u.plan.job).items() if k not in ("variants", "positions", "seeds")}
    what = f"random|s{u.seed}" if u.run is None else f"{u.plan.runs[u.run].position.label}|{u.plan.runs[u.run].run_id}"
    return f"{u.plan.job.task}|{what}|{short_hash(job)}"


def units(plans: list[Plan | HFPlan]) -> list[Unit]:
    """Every unit of the plans, in the local path's order."""
    return [Unit(p, i, 0) if isinstance(p, HFPlan) else Unit(p, *unit)
            for p in plans for i, unit in enumerate(range(len(p.settings)) if isinstance(p, HFPlan)
                                                    else get_task(p.job.task).units(p))]


@functools.lru_cache(maxsize=1)
def checkpoint_weights(path: Path) -> dict[str, Any] | None:
    """A checkpoint's weights, read once per host (the last checkpoint's kept); None: each setting reads its own."""
    from attn.hf.models import load_weights

    try:
        return load_weights(path)
    except Exception:  # noqa: BLE001  (run_setting loads, and records the failure, itself)
        return None


def run_unit(runner: Runner, u: Unit) -> None:
    """Run one unit's pending cells on ``runner``: the local path's code, one trained model (or one checkpoint
    setting) at a time."""
    if isinstance(u.plan, HFPlan):
        from harness.accuracy import pretrained

        p, s = u.plan, u.plan.settings[u.run]  # type: ignore[index]
        if pretrained.pending_cells(runner, p, s):  # a probe (unit_cells) is answered here, and reads no weights
            pretrained.run_setting(runner, p, s, pretrained.device_for(), checkpoint_weights(p.ckpt.path))
        return
    get_task(u.plan.job.task).run_unit(runner, u.plan, u.run, u.seed)


class _Probe(Runner):
    """Names a unit's cells without running it: the task code asks ``pending`` about every cell and skips the ones
    that are not, so answering False throughout lists them all and trains nothing."""

    def __init__(self) -> None:
        super().__init__(None, Path("."), False, progress=False, echo=lambda line: None, store=[], done=set())
        self.asked: list[tuple[dict[str, Any], tuple[str, ...]]] = []

    def pending(self, base: dict[str, Any], metrics: tuple[str, ...]) -> bool:
        self.asked.append((base, metrics))
        return False


def unit_cells(u: Unit) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
    """(row base, metrics) of every cell of a unit, as its host would write them."""
    probe = _Probe()
    run_unit(probe, u)
    return probe.asked


@dataclass(frozen=True)
class HostSettings:
    """What a host needs from the driver; paths are absolute, since hosts start elsewhere (another directory, node)."""

    ckpt_dir: str
    plugins: tuple[str, ...] = ()
    threads: int | None = None
    cwd: str = "."  # the driver's: a relative --corpus means on a host what it meant to the driver


class AccuracyHost:
    """Trains and evaluates units in one process (a Ray actor, a Slurm job) and returns their rows; it keeps the
    latest trained model, so the units of one chain train it once."""

    def __init__(self, settings: HostSettings):
        import torch

        import attn
        from harness.plugins import load_plugins

        if os.path.isdir(settings.cwd):
            os.chdir(settings.cwd)
        if settings.threads:
            torch.set_num_threads(settings.threads)
        failed = load_plugins(settings.plugins, report=False)
        self.broken = "; ".join(f"plugin {p} failed to import on this host: {attn.plugin_errors().get(p)}"
                                for p in sorted(failed))
        self.runner = Runner(None, Path(settings.ckpt_dir), False, progress=False, store=[], done=set())

    def run(self, u: Unit) -> dict[str, Any]:
        """{"rows", "log", "error"}: the unit's rows and printed lines; ``error`` if it stopped before its end."""
        rows: list[dict[str, Any]] = []  # the store the unit's rows go to (a list has the store's one method, append)
        log: list[str] = []
        if self.broken:
            return {"rows": rows, "log": log, "error": self.broken}
        r = self.runner  # one Runner per host, for its model cache; the rows, done keys and log are this unit's
        r.store, r.done, r.echo = rows, set(u.done), log.append
        error = None
        try:
            with memory_cap():  # as run_jobs: an allocation that cannot fit fails at once, as an oom row
                run_unit(r, u)
        except Exception as e:  # a failure outside the cells' own handling: the driver fills in the missing cells
            error = f"{type(e).__name__}: {e}"
        return {"rows": rows, "log": log, "error": error}

    def close(self) -> None:
        pass


def lost_unit(u: Unit, why: str) -> dict[str, Any]:
    """The payload of a unit whose host was lost (Ray worker or node died, Slurm job ended early)."""
    return {"rows": [], "log": [], "error": why}


def chains(todo: list[Unit]) -> list[TaskList]:
    """One chain per trained model, in order of first appearance (see the module docstring)."""
    groups: dict[str, list[Unit]] = {}
    for u in todo:
        groups.setdefault(u.model, []).append(u)
    return [TaskList(g) for g in groups.values()]


def run_remote(plans: list[Plan | HFPlan], out: Path, ckpt_dir: Path, resume: bool, config: ExecutorConfig,
               plugins: tuple[str, ...] = (), threads: int | None = None,
               echo: Callable[[str], None] = print) -> Runner:
    """Run the plans' units with ``config``'s executor, appending each unit's rows to ``out`` as it comes back.

    Returns the driver's Runner (its ``written`` counts the rows appended). The caller holds ``out``'s lock."""
    runner = Runner(out, ckpt_dir, resume, progress=False, echo=echo)
    written: set[str] = set()  # keys appended by this run, whatever their status (a Slurm row collected twice)

    def have(key: str) -> bool:
        return key in runner.done or key in written

    def record(u: Unit, payload: dict[str, Any]) -> None:
        for line in payload.get("log") or ():
            echo(line)
        for row in payload["rows"]:
            key = runner.key(row)
            if have(key):
                continue
            runner.store.append(row)
            runner.written += 1
            written.add(key)
            if row.get("status", "ok") in DONE_STATUSES:
                runner.done.add(key)
        why = payload.get("error")
        if why:
            status = "oom" if looks_like_oom(why) else "error"
            echo(f"{u.label}: {status}: {why}")
            for base, metrics in unit_cells(u):
                missing = tuple(m for m in metrics if not have(runner.key({**base, "metric": m})))
                if missing:
                    runner.failed(base, missing, status, why, say=False)
                    written.update(runner.key({**base, "metric": m}) for m in missing)

    executor = make_executor(config, out, echo=echo, command="accuracy")
    every = units(plans)
    elsewhere = executor.recover({unit_key(u): u for u in every}, record)  # Slurm jobs of an earlier run
    todo = []
    for u in every:
        if unit_key(u) in elsewhere:
            continue
        keys = {runner.key({**base, "metric": m}) for base, metrics in unit_cells(u) for m in metrics}
        if keys - runner.done:
            todo.append(dataclasses.replace(u, done=frozenset(keys & runner.done)))
    if resume and len(todo) < len(every):
        echo(f"resuming {out}: {len(every) - len(todo)} of {len(every)} runs finished, or still running in Slurm jobs")
    work_chains = chains(todo)
    settings = HostSettings(str(Path(ckpt_dir).resolve()), absolute_plugins(plugins), threads, os.getcwd())
    work = Workload(chains=work_chains, make_host=functools.partial(AccuracyHost, settings), key=unit_key,
                    lost=lost_unit, gpus=0,  # accuracy models train on the CPU; checkpoints are evaluated there
                    task_timeout_s=4 * UNIT_TIME_S, job_minutes=job_minutes([len(c.tasks) for c in work_chains], UNIT_TIME_S))
    if todo:
        echo(f"executor {config.kind}: {len(todo)} runs in {len(work_chains)} chains (one per trained model or "
             "checkpoint setting)")
    executor.run(work, record, started=lambda u: echo(f"started {u.label}"))
    return runner


__all__ = ["AccuracyHost", "HostSettings", "UNIT_TIME_S", "Unit", "chains", "lost_unit", "run_remote", "run_unit",
           "unit_cells", "unit_key", "units"]
