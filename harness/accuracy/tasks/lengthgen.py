"""Length generalisation: train at L, evaluate at L, 2L, 4L, 8L, 16L, for each position method.

The experiment the RoPE family exists for. Each method is evaluated zero-shot with its scaling
``factor = eval_len / L`` (see :mod:`harness.accuracy.build`), and optionally after a short
fine-tune at 2L with ``factor = 2`` (stage ``finetune``; evaluated with factor max(2, eval_len / L)),
the recipe of Position Interpolation (Chen et al. 2023) and YaRN (Peng et al. 2023).
The trained task is ``--base-task`` (``lm``: bits per byte; ``passkey``: retrieval accuracy), and the rows are
that task's: the runner does the work, its tables and figures show them.
"""
from __future__ import annotations

from harness.accuracy.tasks.base import BuiltOnTask
from harness.accuracy.tasks.registry import register_task


@register_task("lengthgen")
class LengthGen(BuiltOnTask):
    """The base task's models evaluated at 1x-16x their training length, zero-shot and after a fine-tune."""

    @classmethod
    def default_eval_lens(cls, train_len: int) -> list[int]:
        return [train_len * m for m in (1, 2, 4, 8, 16)]


__all__ = ["LengthGen"]
