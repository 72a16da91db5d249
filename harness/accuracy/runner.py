"""Run an accuracy job: train each (variant, position, seed) once, evaluate every cell, append rows.

A job is plain data (:class:`Job`, in ``jobs``, re-exported here); :func:`plan` validates all of it -- names, parameters,
lengths, corpus -- before anything is trained or written. Rows are appended to the results
store one cell at a time; ``resume`` skips cells already there, and a trained model is
reloaded from its checkpoint instead of retrained. A run that fails (a backend that cannot
run, a length a method refuses) writes rows with that status and the sweep goes on (Zoology's
rule: one failing config never stops the others).

Training runs in-process (not in the cost harness's isolated worker): training has no timing
to protect, and failures are caught per run. Memory is bounded as for sweep cells: :func:`plan`
refuses a length whose activations alone cannot fit in the memory available, and the jobs run
under an address-space cap (:func:`memory_cap`), so an allocation that does not fit fails at once
and becomes an ``oom`` row instead of pushing the machine into swap or the kernel's OOM killer.

With ``--executor ray|slurm`` the same Runner trains each run on a host and returns its rows to the
driver, which appends them (harness.accuracy.remote); this module's local path is unchanged by it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import attn
from attn.attention.base import UnsupportedBackend
from harness.accuracy import build
from harness.accuracy.build import Spec
from harness.accuracy.jobs import Job, Plan, Run, resolved, short_hash
from harness.accuracy.loop import evaluate
from harness.accuracy.stats import Measure
from harness.accuracy.tasks import cell_columns, declared, get_task, make_task, trained_task, trained_task_names
from harness.accuracy.train import TrainResult, train
from harness.environment import environment
from harness.memory import AVAILABLE_FRACTION, address_space_cap, available_budget
from harness.messages import is_oom
from harness.results import ACCURACY_FIELDS, ResultsStore, cell_key

FLOAT_BYTES = 4  # models train in float32
TOKEN_BYTES = 8  # int64 token ids
# Columns a cell may add to the accuracy schema (the runner's and the registered tasks'); all part of a row's identity.
CELL_FIELDS = cell_columns()
# What tells two trained models of one task apart beyond the spec columns: width and learning rate (a grid over
# them picks the best rate per point, as Zoology does).
TRAIN_FIELDS = ("d_model", "short_conv", "n_layers", "lr")
KEY_FIELDS = tuple(f for f in ACCURACY_FIELDS if f not in ("value", "ci_low", "ci_high", "n")) + CELL_FIELDS + TRAIN_FIELDS


def width(job: Job) -> dict[str, Any]:
    """The backbone overrides of a job: its width (MQAR's recall vs width), short convolution and depth, when it sets
    them (left out otherwise, so the identity of runs made before they existed does not change)."""
    return (({} if job.d_model is None else {"d_model": job.d_model}) | ({"short_conv": job.short_conv} if job.short_conv else {})
            | ({} if job.n_layers is None else {"n_layers": job.n_layers}))


def check_lengths_fit(job: Job, eval_lens: list[int], finetune_len: int | None, budget: int | None = None) -> None:
    """Refuse (ValueError, one line) a length whose activations alone exceed the memory budget.

    The need is a lower bound, so no run that could fit is refused: training keeps at least the
    residual stream of every layer (and the embedding) for backward, batch x length x d_model x
    (n_layers + 1) floats, plus its token ids; evaluating holds at least one sequence's hidden
    states (fidelity: its random q, k, v). A length past it would only fail after minutes of
    setup, or -- with no cap -- push the machine into swap.
    """
    budget = available_budget() if budget is None else budget
    preset = attn.PRESETS[job.model]
    d, layers = job.d_model or preset["d_model"], job.n_layers or preset.get("n_layers", 1)
    per_train_token = job.train.batch_size * (FLOAT_BYTES * d * (layers + 1) + 2 * TOKEN_BYTES)
    per_eval_token = get_task(job.task).eval_bytes_per_token(job, FLOAT_BYTES * d + TOKEN_BYTES)
    checks = [("train length", job.train_len, per_train_token,
               f"training: batch {job.train.batch_size} x length x d_model {d} x {layers + 1} activations")]
    if finetune_len is not None:
        checks.append(("fine-tune length", finetune_len, per_train_token,
                       f"fine-tuning: batch {job.train.batch_size} x length x d_model {d} x {layers + 1} activations"))
    checks += [("eval length", L, per_eval_token, "evaluation: one sequence's hidden states") for L in eval_lens]
    gib = 2**30
    for what, length, per_token, how in checks:
        need = length * per_token
        if need > budget:
            raise ValueError(
                f"{job.task}: {what} {length} cannot fit in memory: {how} need at least {need / gib:,.1f} GiB "
                f"(model {job.model}), and {budget / gib:,.1f} GiB may be used ({AVAILABLE_FRACTION:.0%} of the memory "
                f"available); no {what} above {budget // per_token:,} can fit")


def memory_cap(budget: int | None = None) -> contextlib.AbstractContextManager[int | None]:
    """The address-space cap (:func:`harness.memory.address_space_cap`) at this process's size plus ``budget``
    (default: the sweep's, :func:`harness.memory.available_budget`) while accuracy jobs run, lifted afterwards.

    Accuracy trains in-process, so this is the sweep worker's ``RLIMIT_AS`` cap applied around the jobs: an allocation
    that cannot fit fails at once (MemoryError, or torch's "can't allocate memory") and is recorded as ``oom``.
    """
    return address_space_cap(available_budget() if budget is None else budget)


def plan(job: Job) -> Plan:
    """Validate a job completely (ValueError naming the problem) and list its runs."""
    spec = get_task(job.task)  # ValueError naming the registered tasks
    trained = trained_task(job)
    if trained not in trained_task_names():
        raise ValueError(f"{job.task}: base task must be one of {', '.join(trained_task_names())}, got {trained!r}")
    if job.train_len < 1:
        raise ValueError(f"train length must be >= 1, got {job.train_len}")
    if not job.seeds:
        raise ValueError("no seeds given")
    if any(s < 0 for s in job.seeds):
        raise ValueError(f"seeds must be >= 0, got {job.seeds}")
    if not (job.variants or job.patterns) or not job.positions:
        raise ValueError("at least one --variant (or --pattern) and one --position are needed")
    if job.n_layers is not None and job.n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {job.n_layers}")
    if job.model not in attn.PRESETS:
        raise ValueError(f"unknown model preset {job.model!r}; valid: {', '.join(attn.PRESETS)}")
    eval_lens = sorted(set(job.eval_lens or spec.default_eval_lens(job.train_len)))
    if eval_lens[0] < 1:
        raise ValueError(f"evaluation lengths must be >= 1, got {eval_lens}")
    preset = attn.PRESETS[job.model]
    if job.d_model is not None and (job.d_model < 1 or job.d_model % preset["n_heads"]):
        raise ValueError(f"d_model {job.d_model} must be a positive multiple of the {preset['n_heads']} heads of {job.model}")
    head_dim = (job.d_model or preset["d_model"]) // preset["n_heads"]
    variants = [build.parse_variant(v) for v in job.variants] + [build.parse_layers(p) for p in job.patterns]
    positions = [build.parse_position(p, head_dim) for p in job.positions]
    variants = spec.evaluated_variants(variants)
    trained_variants = spec.trained_variants(variants)
    task = make_task(trained, job.task_params)
    ft_len = job.finetune_len or 2 * job.train_len
    task.check(job.train_len, eval_lens + ([ft_len] if job.finetune_steps > 0 else []))
    check_lengths_fit(job, eval_lens, ft_len if job.finetune_steps > 0 else None)  # before any model is built
    max_len = max(eval_lens + [job.train_len, ft_len])
    for v in trained_variants:
        for p in positions:  # builds every model once, so bad params fail now, not after hours
            for ctx in {job.train_len, max_len}:
                build.make_model(job.model, task.vocab_size, v, p, build.scaled_params(p, job.train_len, ctx, head_dim),
                                 max_len, 0, **width(job))
    runs = []
    for seed in job.seeds:
        for v in trained_variants:
            for p in positions:
                t = build.training_spec(p, job.train_len, head_dim)
                ident = {"task": task.name, "task_params": task.train_params(), "variant": v.label, "position": t.label,
                         "train_len": job.train_len, "model": job.model, "init_std": job.init_std, "seed": seed,
                         "train": dataclasses.asdict(job.train) | {"ckpt_every": 0}} | width(job)
                if build.has_weights(t, head_dim, max_len):  # learned positions: the table is sized by max_len
                    ident["max_seq_len"] = max_len
                runs.append(Run(v, p, t, seed, short_hash(ident)))
    return Plan(job, task, eval_lens, runs, head_dim, max_len, variants, positions)


class Runner:
    """Executes plans against one results store.

    ``store`` (anything with ``append(row)``) and ``done`` replace the results file of ``out`` and the keys read from
    it: a host of a remote executor collects its rows for the driver, which alone writes (harness.accuracy.remote)."""

    def __init__(self, out: Path | None, ckpt_dir: Path, resume: bool, progress: bool = True,
                 echo: Callable[[str], None] = print, store: Any = None, done: set[str] | None = None):
        self.store = ResultsStore(out, KEY_FIELDS) if store is None else store
        self.ckpt_dir = ckpt_dir
        self.progress = progress
        self.echo = echo
        if done is None:
            done = self.store.keys(statuses=("ok", "unsupported")) if resume else set()
        self.done = done
        self.written = 0
        self._model_cache: tuple[str, torch.nn.Module, TrainResult] | None = None

    # -- rows -------------------------------------------------------------------------------
    def key(self, row: dict[str, Any]) -> str:
        return cell_key(row, KEY_FIELDS)

    def append(self, base: dict[str, Any], measures: dict[str, Measure]) -> None:
        for metric, m in measures.items():
            row = {**base, "metric": metric, "value": m.value, "ci_low": m.ci_low, "ci_high": m.ci_high, "n": m.n}
            row |= declared(row)  # what its task declares of the metric: readers need no task's code
            if m.per_example is not None:
                row["per_example"] = list(m.per_example)
            if self.key(row) in self.done:  # a resumed cell whose other metric was written before the stop
                continue
            self.store.append(row)
            self.done.add(self.key(row))
            self.written += 1

    def pending(self, base: dict[str, Any], metrics: tuple[str, ...]) -> bool:
        return any(self.key({**base, "metric": m}) not in self.done for m in metrics)

    def fail(self, base: dict[str, Any], metrics: tuple[str, ...], err: BaseException) -> None:
        status = "unsupported" if isinstance(err, UnsupportedBackend) else "oom" if is_oom(err) else "error"
        self.failed(base, metrics, status, f"{type(err).__name__}: {err}")

    def failed(self, base: dict[str, Any], metrics: tuple[str, ...], status: str, msg: str, say: bool = True) -> None:
        """A row with ``status`` and ``msg`` for each metric: a cell that raised, or one whose host was lost (said
        once for the whole unit: ``say=False``)."""
        if say:
            self.echo(f"  {status}: {msg}")
        for metric in metrics:
            row = {**base, "metric": metric, "value": None, "ci_low": None, "ci_high": None, "n": 0,
                   "status": status, "error": msg}
            row |= declared(row)
            self.store.append(row)
            self.written += 1

    # -- training ---------------------------------------------------------------------------
    def trained(self, p: Plan, run: Run) -> tuple[torch.nn.Module, TrainResult]:
        """The run's model after training (from its checkpoint when it exists); cached for the next run."""
        if self._model_cache is not None and self._model_cache[0] == run.train_id:
            return self._model_cache[1], self._model_cache[2]
        job = p.job
        params = build.scaled_params(run.trained_as, job.train_len, job.train_len, p.head_dim)
        model = build.make_model(job.model, p.task.vocab_size, run.variant, run.trained_as, params, p.max_len, run.seed,
                                 job.init_std, **width(job))
        ckpt = self.ckpt_dir / f"{p.task.name}-{run.train_id}.pt"
        desc = f"{p.task.name} {run.variant.label} {run.trained_as.label} s{run.seed}"
        result = train(model, lambda step: p.task.train_batch(run.seed, step, job.train.batch_size, job.train_len),
                       job.train, ckpt, identity=run.run_id, desc=desc, progress=self.progress)
        build.pin_backend(model)
        if result.resumed_from < job.train.steps:
            self.echo(f"  trained {desc}: {job.train.steps} steps, final loss {result.final_loss:.4f}, "
                      f"{result.seconds:.0f} s ({model.num_params():,} parameters)")
        self._model_cache = (run.train_id, model, result)
        return model, result

    def finetuned(self, p: Plan, run: Run) -> tuple[torch.nn.Module, TrainResult]:
        """The trained model fine-tuned at ``finetune_len`` with the position scaled for it."""
        job = p.job
        base, _ = self.trained(p, run)
        model = copy.deepcopy(base)
        L = p.finetune_len
        build.set_position(model, run.position.name, build.scaled_params(run.position, job.train_len, L, p.head_dim))
        cfg = job.finetune
        ident = short_hash({"base": run.train_id, "position": run.position.label, "len": L, "train": dataclasses.asdict(cfg)})
        ckpt = self.ckpt_dir / f"{p.task.name}-ft-{ident}.pt"
        desc = f"fine-tune {run.position.label} at {L}"
        result = train(model, lambda step: p.task.train_batch(run.seed + 7919, step, job.train.batch_size, L), cfg, ckpt,
                       identity=ident, desc=desc, progress=self.progress)
        return model, result

    # -- running ----------------------------------------------------------------------------
    def base_row(self, p: Plan, run: Run, stage: str) -> dict[str, Any]:
        job = p.job
        return {
            **environment(seed=run.seed),
            "run_id": run.run_id, "task": p.task.name, "variant": run.variant.name,
            "variant_params": resolved("attention", run.variant), "backend_requested": run.variant.backend,
            "position": run.position.name,
            "variant_spec": run.variant.label, "position_spec": run.position.label,
            "train_len": job.train_len, "stage": stage, "model": job.model, "d_model": job.d_model,
            "short_conv": job.short_conv or None, "n_layers": job.n_layers, "steps": job.train.steps,
            "batch_size": job.train.batch_size, "lr": job.train.lr, "trained_as": run.trained_as.label,
            "task_params": p.task.train_params(), "eval_id": short_hash(p.task.eval_params()), "status": "ok", "error": None,
        } | ({"finetune_steps": job.finetune_steps, "finetune_len": p.finetune_len,
              "finetune_lr": job.finetune.lr} if stage == "finetune" else {})

    def run_plan(self, p: Plan) -> None:
        get_task(p.job.task).run(self, p)

    def run_model(self, p: Plan, i: int) -> None:
        """Every pending cell of the plan's ``i``-th run, at every stage: one trained model (what a remote executor
        places on a host as one unit)."""
        stages = ["zero_shot"] + (["finetune"] if p.job.finetune_steps > 0 else [])
        for stage in stages:
            self.run_stage(p, p.runs[i], stage, f"[{i + 1}/{len(p.runs)}]")

    def cells(self, p: Plan, run: Run, stage: str) -> Iterator[tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]]:
        """(row base, cell, metrics) of every cell of a run at a stage, position scaled per cell."""
        base = self.base_row(p, run, stage)
        ctx_floor = p.finetune_len if stage == "finetune" else 0
        for cell in p.task.cells(p.job.train_len, p.eval_lens):
            ctx = max(cell["eval_len"], ctx_floor)
            params = build.scaled_params(run.position, p.job.train_len, ctx, p.head_dim)
            row = {**base, **cell, "position_params": resolved("position", Spec(run.position.name, params), p.head_dim)}
            yield row, {**cell, "_position_params": params}, p.task.metrics(cell, p.job.train_len)

    def run_stage(self, p: Plan, run: Run, stage: str, tag: str) -> None:
        todo = [(row, cell, m, None) for row, cell, m in self.cells(p, run, stage) if self.pending(row, m)]
        evaluate(self, Trained(self, p, run, stage, tag), todo)


@dataclass
class Trained:
    """A model trained here (or fine-tuned), as the evaluation loop's subject: one arm, its position scaled per cell."""

    runner: Runner
    p: Plan
    run: Run
    stage: str
    tag: str
    sizes: dict[int, dict[str, int | None]] = dataclasses.field(default_factory=dict)  # eval length -> decoding state

    def describe(self, pending: int) -> str:
        r = self.run
        return (f"{self.tag} {self.p.task.name} {r.variant.label} {r.position.label} seed {r.seed} ({self.stage}): "
                f"{pending} cells")

    def load(self) -> tuple[torch.nn.Module, dict[str, Any]]:
        get = self.runner.trained if self.stage == "zero_shot" else self.runner.finetuned
        model, result = get(self.p, self.run)
        return model, {"params": model.num_params(), "train_loss": result.final_loss,
                       "train_seconds": result.seconds or None}

    def answer(self, model: torch.nn.Module, cell: dict[str, Any]) -> dict[str | None, dict[str, Measure]]:
        build.set_position(model, self.run.position.name, cell["_position_params"])
        own = {k: v for k, v in cell.items() if not k.startswith("_")}
        return {None: self.p.task.evaluate(model, own, self.p.job.train_len)}

    def columns(self, model: torch.nn.Module, cell: dict[str, Any], arm: str | None) -> dict[str, Any]:
        return {**size_at(self.sizes, model, cell["eval_len"]), "backend": build.last_backends(model)}

    def after_cell(self, failed: bool) -> None:
        pass


def size_at(sizes: dict[int, dict[str, int | None]], model: torch.nn.Module, length: int) -> dict[str, int | None]:
    """The model's decoding state at ``length`` (build.state_size: one prefill), computed once per length."""
    if length not in sizes:
        sizes[length] = build.state_size(model, length)
    return sizes[length]


def run_jobs(plans: list[Plan], out: Path, ckpt_dir: Path, resume: bool, progress: bool = True,
             echo: Callable[[str], None] = print) -> Runner:
    """Run the plans under the memory cap (see :func:`memory_cap`): a run that does not fit is an ``oom`` row."""
    runner = Runner(out, ckpt_dir, resume, progress, echo)
    with memory_cap():
        for p in plans:
            runner.run_plan(p)
    return runner


__all__ = ["CELL_FIELDS", "Job", "KEY_FIELDS", "Plan", "Run", "Runner", "Trained", "check_lengths_fit",
           "memory_cap", "plan", "run_jobs", "short_hash"]
