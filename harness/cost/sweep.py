"""Running a cost sweep: each cell in a worker process (harness.cost.worker), its row appended and
flushed as soon as it finishes.

Where the workers run is the executor's business (harness.executors: this machine, a Ray cluster or
Slurm jobs): each runs a :class:`CellMeasurer` per slot and sends back what it measured; only
:func:`run_sweep` writes rows, so resume and dedup do not depend on where a cell ran.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import click

from harness.cost.cells import KEY_FIELDS, Cell
from harness.cost.noise import assess, least_noisy
from harness.cost.pinned import on_ref
from harness.cost.spec import RunSettings, SweepSpec
from harness.memory import cell_memory_limits
from harness.plugins import absolute_plugins
from harness.results import COST_FIELDS, ResultsStore, cell_key, check_rows, check_writable, exclusive

Failures = dict[str, tuple[str, int]]  # configuration key -> (status, shortest length) that skips its longer lengths

MIN_RUN_PEAKS = 3  # peaks timed earlier in a run before its median judges a cell

FAILURES_THAT_SKIP = ("oom", "timeout")  # a longer length of the same configuration would fail too


def skips_longer(status: str | None, device: str | None) -> bool:
    """Whether a cell's ``status`` makes the longer lengths of its configuration not worth running.

    oom and timeout: a longer length would fail too. On CUDA an ``error`` as well: the worker restarts
    after any CUDA error (they are sticky), so every further length would pay a fresh start and every
    compile again, and a backend that fails at one length almost always fails at all of them.
    """
    return status in FAILURES_THAT_SKIP or (status == "error" and str(device or "").startswith("cuda"))


def note_failure(failures: Failures, config_key: str, status: str | None, seq_len: Any, device: str | None) -> None:
    """Remember a cell's failure if it makes its configuration's longer lengths not worth running (the one place
    skip-after-failure is kept: the driver's index of earlier rows and every chain use it)."""
    if skips_longer(status, device) and isinstance(seq_len, int):
        prev = failures.get(config_key)
        if prev is None or seq_len < prev[1]:
            failures[config_key] = (status, seq_len)


def failure_index(rows: Sequence[dict[str, Any]]) -> Failures:
    """The failures of rows already measured, by configuration."""
    failures: Failures = {}
    config_fields = tuple(f for f in KEY_FIELDS if f != "seq_len")
    for r in rows:
        note_failure(failures, cell_key(r, config_fields), r.get("status"), r.get("seq_len"), r.get("device"))
    return failures


def skip_reason(cell: Cell, failures: dict[str, tuple[str, int]]) -> str | None:
    """Why ``cell`` is not worth running: its configuration already failed at a shorter length."""
    failed = failures.get(cell.config_key())
    if failed is None or cell.seq_len <= failed[1]:
        return None
    why = " on CUDA (each CUDA error restarts the worker, losing its compiles)" if failed[0] == "error" else ""
    return (f"not run: {failed[0]} at seq_len {failed[1]} in this configuration{why} "
            f"(--no-skip-after-failure runs it anyway)")


class CellMeasurer:
    """Measures cells on the machine it is built on, in one isolated worker process (harness.cost.worker).

    Every executor runs one of these per slot (in this process, in a Ray actor, in a Slurm job), so a
    cell is measured the same way everywhere. Its payloads carry this machine's environment, memory
    limit, and each cell's result carries the matmul peaks and load timed next to it (harness.cost.noise), so
    each row describes where and under what load it was measured.
    """

    def __init__(self, run: RunSettings, run_id: str, profiles: str | None = None):
        from harness.cost.worker import Worker, WorkerConfig
        from harness.environment import environment

        self.settings, self.run_id = run, run_id
        mem_bytes, host_bytes, rule = cell_memory_limits(run.device, run.mem_limit)
        config = WorkerConfig(run.device, mem_limit_bytes=mem_bytes, host_limit_bytes=host_bytes,
                              plugins=tuple(run.plugin), threads=run.threads)
        self.worker = Worker(config)
        # --base / --at: a second worker whose import path and plugin files are the ref's (harness.cost.pinned)
        self.pinned_worker = None if run.pinned is None else Worker(
            dataclasses.replace(config, plugins=run.pinned.plugins, path=run.pinned.path))
        self.gate_dir = tempfile.mkdtemp(prefix="attn-bench-gate-") if gated(run) else None
        self.profiles = profiles  # --profile: the folder the traces go to
        self.env = environment(run.device, run.seed)
        self.extra: dict[str, Any] = {"mem_limit_bytes": mem_bytes, "host_limit_bytes": host_bytes,
                                      "host_limit_rule": rule}
        self.run_peaks: dict[str, list[float]] = {}  # dtype -> every matmul peak this host timed in the run
        # CUDA: (configuration key, matmul peak) of the chain being measured -- see peaks_for
        self._chain_peak: tuple[str, float] | None = None

    def pinned(self, cell: Cell) -> bool:
        return on_ref(self.settings.pinned, cell.side)

    def options(self, cell: Cell) -> dict[str, Any]:
        """The cell's gate (the head side compares with the base's output too) and profile trace, for the worker."""
        from harness.cost.gate import GateOptions

        out: dict[str, Any] = {}
        if self.gate_dir:
            stem = hashlib.sha1(dataclasses.replace(cell, side=None).key().encode()).hexdigest()[:16]
            against = f"{self.gate_dir}/{stem}-base.pt" if cell.side == "head" else None
            out["gate"] = GateOptions(self.settings.check_tokens, f"{self.gate_dir}/{stem}-{cell.side or 'cell'}.pt",
                                      against).as_dict()
        if self.profiles:
            out["profile"] = str(Path(self.profiles) / (re.sub(r"[^A-Za-z0-9_.=-]+", "_", cell.label) + ".json"))
        return out

    def peaks_for(self, cell: Cell) -> tuple[str, ...]:
        """Which matmul peaks the worker times around ``cell``: before and after it on CPU, where the
        load changes from minute to minute; on CUDA once per chain (configuration), before its first
        cell, since an 8192^3 peak twice per cell cost a GPU check a fifth of its sweep."""
        if not self.settings.device.startswith("cuda"):
            return ("before", "after")
        return () if self._chain_peak and self._chain_peak[0] == cell.config_key() else ("before",)

    def run(self, cell: Cell) -> dict[str, Any]:
        """Measure ``cell``; while the result is ``noisy``, measure it again (``retries`` times at most). Each
        attempt is assessed here, once (harness.cost.noise.assess): the row keeps the chosen attempt's verdict."""
        s = self.settings
        peaks = self.peaks_for(cell)
        attempts, walls = [], []
        worker, options = self.pinned_worker if self.pinned(cell) else self.worker, self.options(cell)
        for _ in range(1 + s.retries):
            start, startup = time.monotonic(), worker.startup_s
            result = worker.run_cell(cell.as_row(), s.timing, s.seed, s.time_limit, peaks=peaks, options=options)
            if result.get("status") == "ok":
                result = self._with_run_median(cell, self._with_peaks(cell, result, peaks), peaks)
            result = assess(result)
            walls.append(time.monotonic() - start - (worker.startup_s - startup))  # a worker's start is not the cell's
            attempts.append(result)
            if not result.get("noisy"):
                break
        # Later attempts run with compiled kernels cached: the first one's warm-up is the cell's.
        first = {k: attempts[0][k] for k in ("warmup_s", "compile_s") if k in attempts[0]}
        result = {**least_noisy(attempts), **first, "attempts": len(attempts)}
        env, extra = self.env, {**self.extra, "cell_wall_s": sum(walls),
                                "worker_starts": self.worker.starts + getattr(self.pinned_worker, "starts", 0)}
        if s.pinned is not None:  # the row's code is the ref's; the harness that measured it, this checkout's
            extra.update(harness_commit=self.env.get("code_commit"), ref=s.pinned.ref if self.pinned(cell) else None)
            env = {**env, "code_commit": s.pinned.commit} if self.pinned(cell) else env
        return {"result": result, "env": env, "run_id": self.run_id, "extra": extra}

    def _with_run_median(self, cell: Cell, result: dict[str, Any], peaks: tuple[str, ...]) -> dict[str, Any]:
        """Give the row the median of the matmul peaks this host timed earlier in the run, in the cell's dtype
        (``run_peak_flops_per_s``, from the fourth cell on), and remember this cell's: a cell whose peaks
        agree with each other but sit well below the run's was measured while the machine was slow throughout
        (harness.cost.noise.noisy_reason). Per host: a Ray or Slurm run spans machines with peaks of their own."""
        earlier = self.run_peaks.setdefault(cell.dtype, [])
        median = statistics.median(earlier) if len(earlier) >= MIN_RUN_PEAKS else None
        timed = [result.get(f"peak_{when}_flops_per_s") for when in peaks]  # not a chain's peak handed on
        earlier.extend(p for p in timed if p)
        return {**result, "run_peak_flops_per_s": median}

    def _with_peaks(self, cell: Cell, result: dict[str, Any], peaks: tuple[str, ...]) -> dict[str, Any]:
        """Say how the row's peaks were timed (``peak_timing``: per ``cell`` or per ``chain``); on CUDA keep
        the peak timed with a chain's first cell, and give it to the chain's later cells."""
        if "after" in peaks:
            return {**result, "peak_timing": "cell"}
        if "before" in peaks:
            peak = result.get("peak_before_flops_per_s")
            self._chain_peak = (cell.config_key(), peak) if peak else None
            return {**result, "peak_timing": "chain"}
        assert self._chain_peak is not None  # peaks_for times none only once the chain has its peak
        # the bandwidth is the cell's own (timed at its working set before it): only the matmul peak is handed on
        return {**result, "peak_before_flops_per_s": self._chain_peak[1], "peak_dtype": cell.dtype,
                "peak_timing": "chain"}

    def close(self) -> None:
        self.worker.close()
        if self.pinned_worker is not None:
            self.pinned_worker.close()
        if self.gate_dir:
            shutil.rmtree(self.gate_dir, ignore_errors=True)


def gated(run: RunSettings) -> bool:
    """Whether cells are checked against their reference before they are timed: --refcheck, and always with --base."""
    return run.refcheck or run.base is not None


def lost_cell(cell: Cell, why: str) -> dict[str, Any]:
    """The payload of a cell whose host was lost (Ray worker or node died, Slurm job ended early)."""
    return {"result": {"status": "error", "error": why}, "env": None, "run_id": None, "extra": {"cell_wall_s": None}}


class CostChain:
    """One configuration's cells, lengths ascending: after an oom or timeout at one length (on CUDA, an
    error too: :func:`skips_longer`) the longer ones are recorded as skipped instead of run
    (``skip_after_failure``), wherever the chain runs."""

    def __init__(self, cells: Sequence[Cell], failures: Failures | None = None, skip: bool = True):
        self.tasks = sorted(cells, key=lambda c: c.seq_len)
        self._todo = list(reversed(self.tasks))
        self.failures: Failures = dict(failures or {})  # its own copy: a chain may run on another machine
        self.skip = skip
        self.last: dict[str, Any] | None = None  # the latest measured payload: a skipped row says where

    def next(self) -> tuple[Cell, dict[str, Any] | None] | None:
        if not self._todo:
            return None
        cell = self._todo.pop()
        reason = skip_reason(cell, self.failures) if self.skip else None
        if reason is None:
            return cell, None
        last = self.last or {"env": None, "run_id": None, "extra": {}}
        return cell, {"result": {"status": "skipped", "error": reason}, "env": last["env"], "run_id": last["run_id"],
                      "extra": {**last["extra"], "cell_wall_s": 0.0}}

    def finish(self, cell: Cell, payload: dict[str, Any]) -> None:
        note_failure(self.failures, cell.config_key(), payload["result"].get("status"), cell.seq_len, cell.device)
        if payload.get("env") is not None:
            self.last = payload


def make_chains(cells: Sequence[Cell], failures: Failures, skip: bool) -> list[CostChain]:
    """Skipping after a failure orders a configuration's lengths, so each configuration is one chain;
    without it every cell is independent."""
    if not skip:
        return [CostChain([c], skip=False) for c in cells]
    groups: dict[str, list[Cell]] = {}
    for c in cells:  # a --base run's two sides of a configuration are one chain: its cells alternate as given
        groups.setdefault(dataclasses.replace(c, side=None).config_key(), []).append(c)
    return [CostChain(g, {k: failures[k] for k in {c.config_key() for c in g} if k in failures}, skip=True)
            for g in groups.values()]


def make_row(cell: Cell, result: dict[str, Any], env: dict[str, Any], run_id: str, extra: dict[str, Any]) -> dict[str, Any]:
    """A results row: DESIGN.md's cost columns first, then the cell, the environment and the extras. The result
    comes assessed from its host (CellMeasurer.run); a row no host measured keeps ``noisy`` None."""
    row: dict[str, Any] = {f: None for f in COST_FIELDS}
    row.update(cell.as_row())
    row.update(env)
    row.update({"run_id": run_id, "device": cell.device})
    row.update(extra)
    row.update(result)
    row["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return row


def existing_rows(out: Path, resume: bool) -> list[dict[str, Any]]:
    """Rows already in ``out``; refuses to mix a new sweep into a file (or its uncollected Slurm jobs) unless resuming it,
    and to append to a file that is not a cost results file at all (the store would cut its last line)."""
    from harness.executors import pending_jobs, sidecar_path

    rows = check_rows(out, "cost")
    if rows and not resume:
        raise ValueError(f"{out} already holds {len(rows)} rows; pass --resume to continue it, or choose another --out")
    if not resume and pending_jobs(out):
        raise ValueError(f"{sidecar_path(out)} lists {pending_jobs(out)} Slurm jobs of an earlier run of {out}; "
                         f"pass --resume to collect them, or choose another --out")
    return rows


def check_executor(run: RunSettings) -> None:
    """The executor's engine is installed and can place this device's cells (ValueError if not)."""
    from harness.executors import check_engine

    check_engine(run.executor)
    kind = run.executor.kind
    if kind != "local" and re.fullmatch(r"cuda:\d+", run.device):
        raise ValueError(f"--executor {kind} gives each cell a GPU of its own: use --device cuda, not {run.device}")


def run_sweep(spec: SweepSpec, cells: list[Cell], out: Path, resume: bool,
              echo: Callable[[str], None] = click.echo) -> list[dict[str, Any]]:
    """Measure the cells not yet in ``out`` with the spec's executor; returns the rows of ``out`` that belong to ``cells``.

    One pass: ``out`` is checked writable, locked for the whole run and read once, before anything is measured (a
    second writer stops there); hosts return payloads and only this function writes rows, so resume and dedup work
    the same for every executor. The rows returned are those read plus those written, as they read back.
    """
    from tqdm import tqdm

    from harness.cost.repro import repro_command
    from harness.cost.worker import WorkerConfig
    from harness.environment import environment
    from harness.executors import Workload, job_minutes, make_executor, pending_jobs, sidecar_path

    run = dataclasses.replace(spec.run, plugin=absolute_plugins(spec.run.plugin))  # hosts may start elsewhere
    kind = run.executor.kind
    check_writable(out)  # before any work: a run must not measure for an hour and then fail to write
    with exclusive(out):
        rows = existing_rows(out, resume)
        where = "" if kind == "local" else f" (executor {kind})"
        click.echo(f"{len(cells)} cells on {run.device}{where} -> {out}", err=True)
        if kind != "slurm" and pending_jobs(out):
            echo(f"warning: {sidecar_path(out)} lists Slurm jobs not yet collected; --executor slurm --resume collects them")
        done = {cell_key(r, KEY_FIELDS) for r in rows}
        run_id = f"{spec.preset or 'sweep'}-{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
        env = environment(run.device, run.seed)  # the driver's: only rows no host measured (lost, or skipped at once)
        store = ResultsStore(out, KEY_FIELDS)
        defaults = {"preset": spec.preset, "time_limit_s": run.time_limit, "mem_limit_bytes": None,
                    "host_limit_bytes": None, "host_limit_rule": None, "cell_wall_s": None, "worker_starts": 0,
                    "attempts": 1, "peak_timing": None}
        todo_at_start = sum(c.key() not in done for c in cells)
        profiles = str(out.parent.resolve() / f"{out.stem}-profiles") if run.profile else None
        with tqdm(total=todo_at_start, unit="cell", dynamic_ncols=True, file=sys.stderr, disable=not todo_at_start) as bar:

            def record(cell: Cell, payload: dict[str, Any]) -> None:
                key = cell.key()
                if key in done:  # e.g. a Slurm job's row collected twice
                    return
                done.add(key)
                extra = {**defaults, **payload["extra"], "executor": kind}
                row = make_row(cell, payload["result"], payload.get("env") or env, payload.get("run_id") or run_id, extra)
                row["repro"] = repro_command(cell, run, row.get("code_commit"), row.get("num_threads"))
                if row.get("profile_trace"):  # named from the results file's folder, which travels with it
                    row["profile_trace"] = os.path.relpath(row["profile_trace"], out.parent)
                rows.append(store.append(row))
                if row["status"] not in ("ok", "skipped"):
                    bar.write(f"{cell.label}: {row['status']}: {row['error']}")
                bar.set_postfix_str(row["status"], refresh=False)
                bar.update()

            executor = make_executor(run.executor, out, echo=lambda s: bar.write(s, file=sys.stderr))
            elsewhere = executor.recover({c.key(): c for c in cells}, record)  # Slurm jobs of an earlier run
            todo = [c for c in cells if c.key() not in done and c.key() not in elsewhere]
            if resume and rows:
                echo(f"resuming {out}: {len(cells) - len(todo)} of {len(cells)} cells already measured or being measured")
            chains = make_chains(todo, failure_index(rows), run.skip_after_failure)
            startup = WorkerConfig().startup_timeout_s
            work = Workload(
                chains=chains, make_host=partial(CellMeasurer, run, run_id, profiles), key=Cell.key, lost=lost_cell,
                gpus=1 if run.device.startswith("cuda") else 0,
                # every attempt of a cell (1 + retries), each with a worker restart and its two peak timings
                task_timeout_s=(1 + run.retries) * (run.time_limit + 2 * startup + 120),
                job_minutes=job_minutes([len(c.tasks) for c in chains], (1 + run.retries) * (run.time_limit + 30)),
            )
            executor.run(work, record, started=lambda cell: bar.set_description_str(cell.label))
    keys = {c.key() for c in cells}
    return [r for r in rows if cell_key(r, KEY_FIELDS) in keys]


__all__ = [
    "FAILURES_THAT_SKIP", "CellMeasurer", "CostChain", "Failures", "check_executor", "existing_rows", "failure_index",
    "lost_cell", "make_chains", "make_row", "note_failure", "run_sweep", "skip_reason", "skips_longer",
]
