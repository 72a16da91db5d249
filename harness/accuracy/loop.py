"""The evaluation loop every accuracy run walks, whatever it evaluates.

What is evaluated -- a model trained here (:class:`harness.accuracy.runner.Trained`), a pretrained checkpoint's
setting (:class:`harness.accuracy.pretrained.CheckpointRun`) -- is a :class:`Subject`: it loads its model, answers one
cell for every arm it has (a trained model has one, ``None``; a checkpoint one per press, all from one prefill), and
adds its own columns to each row. The loop does the rest once: it loads the model only when a cell is pending, answers
the cells' arms together, and writes one row per arm and metric; a model that does not load, or a cell that raises,
becomes rows with that status (Zoology's rule: one failure never stops the others).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from harness.accuracy.stats import Measure

Todo = tuple[dict[str, Any], dict[str, Any], tuple[str, ...], "str | None"]  # row, cell, metrics, arm (None: the model)


class Subject(Protocol):
    """What the loop evaluates."""

    def describe(self, pending: int) -> str:
        """The line said before its pending rows are measured."""

    def load(self) -> tuple[torch.nn.Module, dict[str, Any]]:
        """Its model, and the columns every row of it adds (parameters, training loss...)."""

    def answer(self, model: torch.nn.Module, cell: dict[str, Any]) -> dict[str | None, dict[str, Measure]]:
        """One cell's measures, per arm."""

    def columns(self, model: torch.nn.Module, cell: dict[str, Any], arm: str | None) -> dict[str, Any] | BaseException:
        """What one arm's row adds after its cell was answered (statistics, backends), or why that arm failed."""

    def after_cell(self, failed: bool) -> None:
        """A cell is done: drop what its answer left (statistics of arms already on record), or, where it raised,
        what it left half done (a shared prefill out of step with its tokens)."""


def evaluate(runner: Any, subject: Subject, todo: Sequence[Todo], say_rows: bool = False) -> None:
    """Measure ``todo`` (the subject's pending rows) into ``runner`` (a :class:`harness.accuracy.runner.Runner`), the
    arms of one cell answered together; ``say_rows``: a line per row written."""
    if not todo:
        return
    runner.echo(subject.describe(len(todo)))
    try:
        model, extra = subject.load()
    except Exception as e:  # one failing subject never stops the others
        for row, _, metrics, _ in todo:
            runner.fail(row, metrics, e)
        return
    cells: dict[str, list[Todo]] = {}
    for t in todo:  # a cell's arms are answered together
        cells.setdefault(repr(sorted(t[1].items())), []).append(t)
    for rows in cells.values():
        cell = rows[0][1]
        t0 = time.perf_counter()
        try:
            measures = subject.answer(model, cell)
        except Exception as e:
            for row, _, metrics, _ in rows:
                runner.fail({**row, **extra}, metrics, e)
            subject.after_cell(failed=True)
            continue
        spent = time.perf_counter() - t0
        for row, _, metrics, arm in rows:
            own = subject.columns(model, cell, arm)
            if isinstance(own, BaseException):
                runner.fail({**row, **extra}, metrics, own)
                continue
            runner.append({**row, **extra, **own, "eval_seconds": spent}, measures[arm])
            if say_rows:
                shown = {k: v for k, v in cell.items() if not k.startswith("_")}
                runner.echo(f"  {shown}{' ' + arm if arm else ''}: "
                            + ", ".join(f"{k} {m.value}" for k, m in measures[arm].items()) + f" ({spent:.0f} s)")
        subject.after_cell(failed=False)


__all__ = ["Subject", "Todo", "evaluate"]
