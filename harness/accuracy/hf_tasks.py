"""Tasks evaluated on a pretrained checkpoint (``attn-bench accuracy --hf-model``): a registry keyed by the accuracy
task's name, ``@register_checkpoint_task("lm")``, read by :mod:`harness.accuracy.hf_eval` and the command line.

A checkpoint task reuses the task's config (the accuracy task registry) and says how its cells are built and scored
in the checkpoint's own tokens: ``lm`` in :mod:`harness.accuracy.hf_lm`, ``passkey`` and ``ruler`` (prompts answered
by greedy generation) in :mod:`harness.accuracy.hf_prompts`. They live apart from the trained tasks' modules because
they need the checkpoint machinery (tokenizers, caches), which those never import."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from harness.accuracy.tasks import get_task

if TYPE_CHECKING:
    import torch

    from harness.accuracy.hf_checkpoint import Checkpoint
    from harness.accuracy.stats import Measure

_CHECKPOINT_TASKS: dict[str, type[CheckpointTask]] = {}


class CheckpointTask:
    """How one accuracy task runs on a pretrained checkpoint: no training, its own text or prompts in the checkpoint's
    tokens, the task's config."""

    name: ClassVar[str]
    default: ClassVar[bool] = False  # run when --hf-model is given without --task
    prompts: ClassVar[bool] = False  # answered after a context (passkey, ruler): what a KV press compresses
    defaults: ClassVar[dict[str, Any]] = {}  # config fields a checkpoint run sets unless the command line does

    @classmethod
    def config(cls, params: dict[str, Any]) -> Any:
        return get_task(cls.name).config_class(**{**cls.defaults, **params})

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
        """One cell's measures per arm of ``cache`` (the setting's prefix cache, shared by its cells): None for a plain
        cache, each press's label for a press cache (:mod:`harness.accuracy.hf_presses`)."""
        raise NotImplementedError


def register_checkpoint_task(name: str) -> Callable[[type], type]:
    """Class decorator on a :class:`CheckpointTask`; ``name``: the registered accuracy task whose config it takes."""
    def decorator(cls: type) -> type:
        get_task(name)  # ValueError if there is no such accuracy task
        if name in _CHECKPOINT_TASKS:
            raise ValueError(f"checkpoint task {name!r} is already registered")
        cls.name = name
        _CHECKPOINT_TASKS[name] = cls
        return cls
    return decorator


def checkpoint_task_names() -> list[str]:
    return list(_CHECKPOINT_TASKS)


def get_checkpoint_task(name: str) -> type[CheckpointTask]:
    return _CHECKPOINT_TASKS[name]


__all__ = ["CheckpointTask", "checkpoint_task_names", "get_checkpoint_task", "register_checkpoint_task"]
