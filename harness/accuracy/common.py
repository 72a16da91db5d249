"""What every accuracy task shares: the train/test split rule, the task contract, scoring helpers.

Train and test data are disjoint by construction, not by luck: each example's content (an
MQAR key-value mapping, a passkey, a corpus file) is hashed, and the hash decides its split.
A generator asked for one split resamples until the content belongs to it.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from harness.accuracy.stats import Measure

IGNORE = -100  # target of positions that are not scored (torch cross_entropy's ignore_index)
# between the lm corpus's documents (files containing NUL are treated as binary and skipped), and a byte-level
# checkpoint's boundary token
SEPARATOR = b"\x00"
SPLITS = ("train", "test")


def split_of(content: bytes, test_fraction: float = 0.125) -> str:
    """'test' for a fixed fraction of contents (by a stable hash), 'train' for the rest."""
    h = int.from_bytes(hashlib.blake2b(content, digest_size=8).digest(), "little")
    return "test" if h / 2**64 < test_fraction else "train"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


def rng_for(*parts: int) -> np.random.Generator:
    """A generator seeded by a tuple of ints: (seed, step, ...) always gives the same stream."""
    return np.random.default_rng([int(p) for p in parts])


class Task(ABC):
    """An accuracy task: training batches at one length, evaluation cells at many.

    A cell is a dict with ``eval_len`` and the task's own columns (``depth``, ``num_pairs``...);
    ``evaluate`` returns ``{metric: Measure}`` for it.
    """

    name: ClassVar[str]
    vocab_size: int

    @abstractmethod
    def check(self, train_len: int, eval_lens: Sequence[int]) -> None:
        """Raise ValueError naming what does not fit (before any work is done)."""

    @abstractmethod
    def train_batch(self, seed: int, step: int, batch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both (batch_size, length) int64; targets IGNORE where unscored."""

    @abstractmethod
    def cells(self, train_len: int, eval_lens: Sequence[int]) -> list[dict[str, Any]]:
        """The evaluation cells; each has ``eval_len`` and the task-specific columns."""

    @abstractmethod
    def metrics(self, cell: dict[str, Any], train_len: int) -> tuple[str, ...]:
        """Names of the metrics ``evaluate`` returns for this cell."""

    @abstractmethod
    def evaluate(self, model: torch.nn.Module, cell: dict[str, Any], train_len: int) -> dict[str, Measure]:
        """Score a trained model on one cell (test split only)."""

    @abstractmethod
    def sample_inputs(self, n: int, length: int) -> torch.Tensor:
        """n test-split input sequences of ``length`` tokens, (n, length): what fidelity feeds a model."""

    def train_params(self) -> dict[str, Any]:
        """Everything about the task that changes what a model learns (part of the run id)."""
        return {}

    def eval_params(self) -> dict[str, Any]:
        """Everything about the task that changes what a cell measures (part of the cell key)."""
        return {}


@torch.no_grad()
def predictions(model: torch.nn.Module, inputs: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Greedy next-token predictions (argmax), in batches: (N, L) -> (N, L)."""
    model.eval()
    return torch.cat([model(chunk).argmax(-1) for chunk in inputs.split(batch_size)])


def tokens_per_batch_for(length: int, budget: int = 1 << 15) -> int:
    """How many sequences of ``length`` to run at once for evaluation (bounded activation memory)."""
    return max(1, budget // max(1, length))


__all__ = ["IGNORE", "SEPARATOR", "SPLITS", "Task", "check_split", "predictions", "rng_for", "split_of", "tokens_per_batch_for"]
