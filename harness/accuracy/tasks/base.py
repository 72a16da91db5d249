"""What a registered accuracy task declares, and the defaults the harness falls back on.

:class:`AccuracyTask` holds the facts every task gives (config, default lengths, main metric, the columns its cells add,
its command-line options, its figures) and the hooks the runner calls (plan, run, remote units, summary table), each
with the plain default; a task overrides only what differs. :class:`TrainedTask` is a task a model is trained on
(mqar, passkey, ruler, lm: the :class:`harness.accuracy.common.Task` contract); :class:`BuiltOnTask` evaluates models
trained on another task, ``--base-task`` (fidelity, lengthgen). :class:`CheckpointTask` is how a task runs on a
pretrained checkpoint instead (passkey, ruler, lm, selection), declared in the same file as the task's ``pretrained``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import click

from harness.accuracy.build import Spec
from harness.accuracy.common import Task
from harness.accuracy.jobs import Job, Plan

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from harness.accuracy.checkpoint import Checkpoint
    from harness.accuracy.stats import Measure


@dataclass(frozen=True)
class TaskOption:
    """A command-line option of a task: ``--<dest>`` (or ``flag``) sets the task config's ``field``. Tasks that declare
    the same ``dest`` share one option; its help is prefixed with their names (``mqar/passkey: ...``)."""

    dest: str  # the option's name in the command's options: num_pairs for --num-pairs
    field: str  # the config dataclass field it sets
    help: str
    type: Any = None  # a click type; None: text
    multiple: bool = False
    flag: str = ""  # the option as typed, when it is not --<dest with dashes> (--subtask for subtasks)
    parse: Callable[[Any], Any] | None = None  # the value as given -> the field's value (comma-separated numbers...)

    @property
    def decl(self) -> str:
        return self.flag or "--" + self.dest.replace("_", "-")


@dataclass(frozen=True)
class Metric:
    """One number a task's rows hold, as the summaries, the figures and the frontier read it (every row says it:
    :func:`harness.accuracy.tasks.registry.declared`): ``kind`` proportion (a share in [0, 1]: intervals clipped to it,
    cells pooled as counts), mean (higher is better) or loss (lower is better: bits, perplexity, an error);
    ``ranks``: the score the memory-quality frontier ranks a checkpoint's arms by."""

    name: str
    kind: str = "proportion"
    ranks: bool = False

    KINDS: ClassVar[tuple[str, ...]] = ("proportion", "mean", "loss")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"metric {self.name}: kind must be one of {', '.join(self.KINDS)}, got {self.kind!r}")

    @property
    def lower_is_better(self) -> bool:
        return self.kind == "loss"

    @property
    def proportion(self) -> bool:
        return self.kind == "proportion"


# the option every task with a test set of examples shares
EVAL_EXAMPLES = TaskOption("eval_examples", "eval_examples", "test examples per cell.", click.IntRange(min=1))


class CheckpointTask:
    """How a task runs on a pretrained checkpoint: no training, its text or prompts in the checkpoint's tokens, the
    task's config. Declared in the task's own file, as its class's ``pretrained``; the registry names it."""

    name: ClassVar[str]  # the task's (set by the registry)
    task: ClassVar[type[AccuracyTask]]  # the task class it is the face of (set by the registry)
    default: ClassVar[bool] = False  # run when --hf-model is given without --task
    prompts: ClassVar[bool] = False  # answered after a context (passkey, ruler): what a KV press compresses
    defaults: ClassVar[dict[str, Any]] = {}  # config fields a checkpoint run sets unless the command line does

    @classmethod
    def config(cls, params: dict[str, Any]) -> Any:
        return cls.task.config_class(**{**cls.defaults, **params})

    @classmethod
    def prepare(cls, ckpt: Checkpoint, config: Any, lens: Sequence[int]) -> Any:
        """Check the lengths (ValueError naming one that does not fit) and build what every cell shares (None)."""
        return None

    @classmethod
    def cells(cls, config: Any, lens: Sequence[int], data: Any) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        """(cell columns, metrics) of each cell of one setting."""
        raise NotImplementedError

    @classmethod
    def eval_id(cls, ckpt: Checkpoint, config: Any, data: Any) -> str:
        raise NotImplementedError

    @classmethod
    def evaluate(cls, model: torch.nn.Module, ckpt: Checkpoint, config: Any, data: Any, cell: dict[str, Any],
                 device: str, cache: Any) -> dict[str | None, dict[str, Measure]]:
        """One cell's measures per arm of ``cache`` (the setting's :class:`harness.accuracy.prefill.SharedPrefill`, shared
        by its cells): None for the plain arm, each press's label for a press arm."""
        raise NotImplementedError


class AccuracyTask:
    """The facts and hooks of a registered task (``@register_task``); subclass :class:`TrainedTask` or
    :class:`BuiltOnTask`."""

    name: ClassVar[str]  # set by the registry
    config_class: ClassVar[type | None] = None  # the task config dataclass (set by the registry); None: the base task's
    main_metric: ClassVar[str] = ""  # what the summary and the figures lead with
    declares: ClassVar[tuple[Metric, ...]] = ()  # what its rows' metrics are (one left out: a mean, higher is better)
    versus_full: ClassVar[bool] = False  # its rows compare a variant with full attention: no task score of their own
    label_column: ClassVar[str] = ""  # the cell column naming the task each row scores (RULER's subtask); "": the task
    columns: ClassVar[tuple[str, ...]] = ()  # columns a cell adds to its rows that tell cells apart (part of the key)
    options: ClassVar[tuple[TaskOption, ...]] = ()
    figures: ClassVar[tuple[str, ...]] = ("accuracy", "position_heatmap", "tradeoff")  # `attn-bench plot` figures of its rows
    trains: ClassVar[bool] = True  # a model is trained on it (a possible --base-task)
    pretrained: ClassVar[type[CheckpointTask] | None] = None  # how it runs on a checkpoint (--hf-model); None: it cannot

    @classmethod
    def metric(cls, name: str) -> Metric:
        """What the task declares of its metric ``name``."""
        return next((m for m in cls.declares if m.name == name), Metric(name, "mean"))

    # -- planning -------------------------------------------------------------------------------------------
    @classmethod
    def default_eval_lens(cls, train_len: int) -> list[int]:
        return [train_len, 2 * train_len, 4 * train_len]

    @classmethod
    def default_job(cls) -> Job:
        """The job ``--task NAME`` runs without a preset: full attention and every position method."""
        from harness.accuracy.presets import POSITIONS

        return Job(cls.name, variants=["full"], positions=list(POSITIONS))

    @classmethod
    def trained_task(cls, job: Job) -> str:
        """The name of the task the job's models are trained on."""
        return cls.name

    @classmethod
    def label(cls, job: Job) -> str:
        return cls.name

    @classmethod
    def evaluated_variants(cls, variants: list[Spec]) -> list[Spec]:
        """The variants whose rows the job writes (ValueError if the job cannot run with them)."""
        return variants

    @classmethod
    def trained_variants(cls, variants: list[Spec]) -> list[Spec]:
        """The variants a model is trained with."""
        return variants

    @classmethod
    def eval_bytes_per_token(cls, job: Job, hidden: int) -> int:
        """Bytes per token an evaluation holds at least (``hidden``: one sequence's hidden states and token ids)."""
        return hidden

    # -- running --------------------------------------------------------------------------------------------
    @classmethod
    def units(cls, p: Plan) -> list[tuple[int | None, int]]:
        """(run index, seed) of each unit a remote executor places on a host, in the local path's order; run None: a
        unit that needs no trained model."""
        return [(i, r.seed) for i, r in enumerate(p.runs)]

    @classmethod
    def run_unit(cls, runner: Any, p: Plan, run: int | None, seed: int) -> None:
        """Every pending cell of one unit (``runner``: a :class:`harness.accuracy.runner.Runner`)."""
        runner.run_model(p, run)

    @classmethod
    def run(cls, runner: Any, p: Plan) -> None:
        """Every pending cell of the plan."""
        for run, seed in cls.units(p):
            cls.run_unit(runner, p, run, seed)

    # -- reading rows ---------------------------------------------------------------------------------------
    @classmethod
    def table(cls, rows: Iterable[dict[str, Any]], metric: str | None = None) -> pd.DataFrame:
        """Position method (and stage) x evaluation length: the mean over seeds (and depths, pairs...)."""
        import pandas as pd

        from harness.accuracy.stats import summarize

        metric = metric or cls.main_metric
        s = pd.DataFrame(summarize(r for r in rows if r.get("task") == cls.name and r.get("metric") == metric))
        if s.empty:
            return s
        s["stage"] = s["stage"].fillna("zero_shot")
        index = ["variant_spec", "position_spec", "stage"] if s["variant_spec"].nunique() > 1 else ["position_spec", "stage"]
        if s["press_spec"].notna().any():  # KV presses: one line each (harness/accuracy/prefill.py)
            s["press_spec"] = s["press_spec"].fillna("-")
            index.insert(1 if index[0] == "variant_spec" else 0, "press_spec")
        if s["dtype"].nunique(dropna=False) > 1:  # float32 and bfloat16 rows: never one number (--dtype)
            s["dtype"] = s["dtype"].fillna("float32")
            index.append("dtype")
        t = s.pivot_table(index=index, columns="eval_len", values="value", aggfunc="mean")
        t.columns.name = f"{cls.name} {metric} at eval length"
        return t

    @classmethod
    def summary(cls, rows: list[dict[str, Any]]) -> tuple[str, pd.DataFrame] | None:
        """(title, table) the accuracy command prints after a run; None when the rows hold nothing of this task."""
        t = cls.table(rows)
        return (f"{cls.name}: {cls.main_metric} by evaluation length (mean over seeds)", t) if len(t) else None


class TrainedTask(Task, AccuracyTask):
    """A task a model is trained on: training batches at one length, evaluation cells at many
    (:class:`harness.accuracy.common.Task`), built from its config."""

    @classmethod
    def make(cls, params: dict[str, Any]) -> TrainedTask:
        """The task from its config params (unknown params are an error)."""
        fields = {f.name for f in dataclasses.fields(cls.config_class)}
        unknown = sorted(set(params) - fields)
        if unknown:
            raise ValueError(f"{cls.name}: unknown task parameter(s) {', '.join(unknown)}; "
                             f"valid: {', '.join(sorted(fields))}")
        return cls(cls.config_class(**params))


class BuiltOnTask(AccuracyTask):
    """A task that evaluates the models of another, trained task (``Job.base_task``) in its own way."""

    trains = False
    figures = ()

    @classmethod
    def trained_task(cls, job: Job) -> str:
        return job.base_task

    @classmethod
    def label(cls, job: Job) -> str:
        return f"{cls.name}/{job.base_task}"

    @classmethod
    def summary(cls, rows: list[dict[str, Any]]) -> tuple[str, pd.DataFrame] | None:
        return None


def comma_floats(what: str) -> Callable[[str], tuple[float, ...]]:
    """An option's parser: comma-separated numbers (click.UsageError naming ``what`` otherwise)."""
    def parse(text: str) -> tuple[float, ...]:
        try:
            return tuple(float(t) for t in text.replace(" ", "").split(",") if t)
        except ValueError:
            raise click.UsageError(f"{what} must be comma-separated numbers, got {text!r}") from None
    return parse


__all__ = ["EVAL_EXAMPLES", "AccuracyTask", "BuiltOnTask", "CheckpointTask", "Metric", "TaskOption", "TrainedTask",
           "comma_floats"]
