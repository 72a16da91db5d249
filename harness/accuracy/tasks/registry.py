"""The accuracy task registry: ``@register_task("name", config=Config)`` on a task class, as
``attn.register_attention`` does for variants. The runner, the command line, the remote executors and
``attn-bench list`` read tasks here; none of them names one."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from harness.accuracy.jobs import Job
from harness.accuracy.tasks.base import AccuracyTask, CheckpointTask, Metric, TaskOption, TrainedTask

if TYPE_CHECKING:
    import pandas as pd

_TASKS: dict[str, type[AccuracyTask]] = {}
RUN_COLUMNS = ("stage", "eval_id")  # columns of every task's cells (the runner's), part of a row's identity


def register_task(name: str, config: type | None = None) -> Callable[[type], type]:
    """Class decorator: ``@register_task("my_task", config=MyConfig)`` on a :class:`TrainedTask` (config: its dataclass)
    or a :class:`BuiltOnTask` (no config: its base task's)."""
    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, AccuracyTask)) or cls in (AccuracyTask, TrainedTask):
            raise TypeError(f"task {name!r}: {cls!r} must subclass TrainedTask or BuiltOnTask")
        if issubclass(cls, TrainedTask) != (config is not None):
            raise TypeError(f"task {name!r}: a TrainedTask takes its config dataclass, a BuiltOnTask none")
        if config is not None and not dataclasses.is_dataclass(config):
            raise TypeError(f"task {name!r}: config must be a dataclass, got {config!r}")
        if not cls.main_metric and issubclass(cls, TrainedTask):
            raise TypeError(f"task {name!r}: declare its main_metric")
        if cls.declares and cls.main_metric not in {m.name for m in cls.declares}:
            raise TypeError(f"task {name!r}: its main_metric {cls.main_metric} is not among the metrics it declares")
        if sum(m.ranks for m in cls.declares) > 1:
            raise TypeError(f"task {name!r}: the frontier ranks by one metric; it declares several")
        if name in _TASKS:
            raise ValueError(f"task {name!r} is already registered (by {_TASKS[name].__module__})")
        cls.name = name
        cls.config_class = config
        if cls.pretrained is not None:
            cls.pretrained.name, cls.pretrained.task = name, cls
        _TASKS[name] = cls
        return cls
    return decorator


def task_names() -> list[str]:
    """Every registered task, in registration order."""
    return list(_TASKS)


def trained_task_names() -> list[str]:
    """The tasks a model is trained on: the possible ``--base-task``."""
    return [n for n, cls in _TASKS.items() if cls.trains]


def checkpoint_task_names() -> list[str]:
    """The tasks a pretrained checkpoint can be evaluated on (``--hf-model``), in registration order."""
    return [n for n, cls in _TASKS.items() if cls.pretrained is not None]


def get_checkpoint_task(name: str) -> type[CheckpointTask]:
    """How task ``name`` runs on a checkpoint (ValueError if it cannot)."""
    face = get_task(name).pretrained
    if face is None:
        raise ValueError(f"task {name} trains a model; a checkpoint is evaluated on {', '.join(checkpoint_task_names())}")
    return face


def get_task(name: str) -> type[AccuracyTask]:
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(_TASKS)}")
    return _TASKS[name]


def metric_of(task: str, name: str) -> Metric:
    """What ``task`` declares of its metric ``name`` (a task not registered here, such as a plugin's not imported: a
    mean, higher is better)."""
    cls = _TASKS.get(task)
    return cls.metric(name) if cls is not None else Metric(name, "mean")


def declared_metric(name: str) -> Metric | None:
    """The first trained task's declaration of a metric called ``name`` (None: none declares it)."""
    return next((m for cls in _TASKS.values() if cls.trains for m in cls.declares if m.name == name), None)


def declared(row: dict[str, Any]) -> dict[str, Any]:
    """The declaration columns of a row of task ``row["task"]`` scoring ``row["metric"]``, as the task declares them
    (:data:`harness.schema.DECLARED`: every accuracy row carries them, so a reader needs no task's code)."""
    task, name = str(row.get("task")), str(row.get("metric"))
    cls = _TASKS.get(task)
    m = metric_of(task, name)
    label = row.get(cls.label_column) if cls is not None and cls.label_column else None
    role = "ranked" if m.ranks else "main" if cls is not None and name == cls.main_metric else ""
    return {"metric_kind": m.kind, "metric_role": role, "task_label": label if isinstance(label, str) and label else task,
            "versus_full": bool(cls is not None and cls.versus_full)}


def trained_task(job: Job) -> str:
    """The task a job's models are trained on (its own, or its --base-task)."""
    return get_task(job.task).trained_task(job)


def make_task(name: str, params: dict[str, Any]) -> TrainedTask:
    """The trained task ``name`` from its config params (unknown params are an error)."""
    cls = get_task(name)
    if not issubclass(cls, TrainedTask):
        raise ValueError(f"{name}: no model is trained on it; valid: {', '.join(trained_task_names())}")
    return cls.make(params)


def table(rows: Iterable[dict[str, Any]], task: str, metric: str | None = None) -> pd.DataFrame:
    """The task's table of ``rows`` by evaluation length (its main metric unless ``metric``)."""
    return get_task(task).table(rows, metric)


def cell_columns() -> tuple[str, ...]:
    """The columns a cell may add to the accuracy schema, all part of a row's identity: the runner's, then each task's."""
    return tuple(dict.fromkeys([*RUN_COLUMNS, *(c for cls in _TASKS.values() for c in cls.columns)]))


def task_options() -> dict[str, tuple[TaskOption, tuple[str, ...]]]:
    """dest -> (the option as first declared, the tasks declaring it), in declaration order."""
    out: dict[str, tuple[TaskOption, tuple[str, ...]]] = {}
    for name, cls in _TASKS.items():
        for opt in cls.options:
            first, tasks = out.get(opt.dest, (opt, ()))
            if (first.field, first.multiple, first.decl) != (opt.field, opt.multiple, opt.decl):
                raise TypeError(f"task {name!r} declares --{opt.dest} unlike {', '.join(tasks)}")
            out[opt.dest] = (first, (*tasks, name))
    return out


def listing() -> list[dict[str, Any]]:
    """What ``attn-bench list`` shows of each task."""
    out = []
    for name, cls in _TASKS.items():
        config = cls.config_class
        params = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                  for f in dataclasses.fields(config)} if config else {}
        out.append({"name": name, "doc": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "",
                    "trains": cls.trains, "checkpoint": cls.pretrained is not None, "params": params,
                    "main_metric": cls.main_metric, "metrics": {m.name: m.kind for m in cls.declares},
                    "default_eval_lens": ", ".join(
                        f"{n}L" if n != 1 else "L" for n in (L // 64 for L in cls.default_eval_lens(64))),
                    "columns": list(cls.columns), "options": [o.decl for o in cls.options], "figures": list(cls.figures),
                    "source": cls.__module__})
    return out


__all__ = ["RUN_COLUMNS", "cell_columns", "checkpoint_task_names", "declared", "declared_metric", "get_checkpoint_task",
           "get_task", "listing", "make_task", "metric_of", "register_task", "table", "task_names", "task_options",
           "trained_task", "trained_task_names"]
