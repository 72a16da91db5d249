"""Multi-query associative recall, MQAR (Arora et al. 2023, Zoology, https://arxiv.org/abs/2312.04927).

A sequence holds N key-value pairs, filler, then every key again in a random order. At each
queried key the model must output that key's value: it must look the key up across the gap.
As in Zoology, a query is the key alone (its value is not fed back), so no query can be
answered by elimination from earlier answers. Layout of one example of length L, gap G::

    [filler P] [k1 v1 k2 v2 ... kN vN] [filler G] [kq1 kq2 ... kqN]      P = L - 3N - G

The distance from a pair to its query is between G + 2 and G + 3N - 2 tokens, so G controls
what a sliding window must reach; N controls how much a fixed-size state (linear attention)
must hold. Tokens: 0 = filler, keys 1..K, values K+1..2K. Training uses N = num_pairs and draws
G uniformly; the split (train/test) is decided by a hash of the whole key-value mapping.
Unlike Zoology, the queries sit together at the end (so the gap is one number, not a power-law
draw) and the filler is one token, not random noise.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from harness.accuracy.common import IGNORE, Task, check_split, predictions, rng_for, split_of, tokens_per_batch_for
from harness.accuracy.stats import Measure, accuracy

FILLER = 0
SPAN = 3  # tokens per pair: key and value in the context, the key again as a query


@dataclass(frozen=True)
class MQARConfig:
    num_pairs: int = 8  # pairs in every training example
    num_keys: int = 64  # key vocabulary K (values use another K tokens)
    eval_pairs: tuple[int, ...] = ()  # () -> num_pairs, 2x, 4x (those that fit)
    eval_gaps: tuple[str, ...] = ("0", "half", "max")  # filler between pairs and queries: ints or half/max
    eval_examples: int = 256
    data_seed: int = 1234  # the test set is the same for every trained model

    def __post_init__(self) -> None:
        if self.num_pairs < 1:
            raise ValueError(f"mqar num_pairs must be >= 1, got {self.num_pairs}")
        if self.num_keys < max(self.num_pairs, *self.eval_pairs, 1):
            raise ValueError(f"mqar num_keys ({self.num_keys}) must be >= the number of pairs (keys are distinct)")
        for g in self.eval_gaps:
            if g not in ("half", "max") and not (g.isdigit()):
                raise ValueError(f"mqar gap must be a non-negative int, 'half' or 'max', got {g!r}")


def example(rng: np.random.Generator, length: int, num_pairs: int, gap: int, num_keys: int,
            split: str) -> tuple[np.ndarray, np.ndarray]:
    """One sequence and its targets (IGNORE except at queried keys, where it is the key's value)."""
    n = num_pairs
    prefix = length - SPAN * n - gap
    if prefix < 0:
        raise ValueError(f"mqar: {n} pairs with gap {gap} need length >= {SPAN * n + gap}, got {length}")
    for _ in range(10_000):  # resample the whole mapping until it belongs to the split
        keys = rng.choice(num_keys, n, replace=False) + 1
        values = rng.integers(0, num_keys, n) + 1 + num_keys
        if split_of(np.stack([keys, values]).astype(np.int64).tobytes()) == split:
            break
    else:
        raise ValueError(f"mqar: no {split} mapping found for {n} pairs of {num_keys} keys (key space too small)")
    seq = np.full(length, FILLER, dtype=np.int64)
    tgt = np.full(length, IGNORE, dtype=np.int64)
    seq[prefix : prefix + 2 * n : 2], seq[prefix + 1 : prefix + 2 * n : 2] = keys, values
    order = rng.permutation(n)
    seq[length - n :], tgt[length - n :] = keys[order], values[order]
    return seq, tgt


def generate(n: int, length: int, num_pairs: int, gap: int | None, split: str, seed: int,
             num_keys: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """n examples: (inputs, targets), each (n, length); ``gap=None`` draws the gap uniformly per example."""
    check_split(split)
    rng = rng_for(seed, length, num_pairs, 0 if gap is None else gap + 1, SPLIT_CODE[split])
    xs, ys = [], []
    for _ in range(n):
        g = int(rng.integers(0, length - SPAN * num_pairs + 1)) if gap is None else gap
        x, y = example(rng, length, num_pairs, g, num_keys, split)
        xs.append(x)
        ys.append(y)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


SPLIT_CODE = {"train": 0, "test": 1}


def resolve_gap(gap: str, length: int, num_pairs: int) -> int:
    room = length - SPAN * num_pairs
    return {"max": room, "half": room // 2}.get(gap, int(gap) if gap.isdigit() else -1)


class MQAR(Task):
    name: ClassVar[str] = "mqar"

    def __init__(self, config: MQARConfig | None = None):
        self.config = config or MQARConfig()
        self.vocab_size = 1 + 2 * self.config.num_keys

    def eval_pairs(self) -> tuple[int, ...]:
        c = self.config
        return c.eval_pairs or tuple(p for p in (c.num_pairs, 2 * c.num_pairs, 4 * c.num_pairs) if p <= c.num_keys)

    def check(self, train_len: int, eval_lens: Sequence[int]) -> None:
        need = SPAN * self.config.num_pairs
        if train_len < need:
            raise ValueError(f"mqar: train length {train_len} is too short for {self.config.num_pairs} pairs "
                             f"(needs >= {SPAN} * num_pairs = {need})")
        for L in eval_lens:
            if L < need:
                raise ValueError(f"mqar: eval length {L} is too short for {self.config.num_pairs} pairs (needs >= {need})")
        for p in self.eval_pairs():
            if p > self.config.num_keys:
                raise ValueError(f"mqar: eval pairs {p} exceed num_keys {self.config.num_keys}")

    def train_batch(self, seed: int, step: int, batch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return generate(batch_size, length, self.config.num_pairs, None, "train", seed * 1_000_003 + step,
                        self.config.num_keys)

    def cells(self, train_len: int, eval_lens: Sequence[int]) -> list[dict[str, Any]]:
        out = []
        for L in eval_lens:
            for n in self.eval_pairs():
                if SPAN * n > L:
                    continue
                rules: dict[int, str] = {}  # gap -> the rule that named it first ("0", "half", "max")
                for rule in self.config.eval_gaps:
                    g = resolve_gap(rule, L, n)
                    if 0 <= g <= L - SPAN * n:
                        rules.setdefault(g, rule)
                out += [{"eval_len": L, "num_pairs": n, "gap": g, "gap_rule": r} for g, r in sorted(rules.items())]
        return out

    def metrics(self, cell: dict[str, Any], train_len: int) -> tuple[str, ...]:
        return ("accuracy",)

    def evaluate(self, model: torch.nn.Module, cell: dict[str, Any], train_len: int) -> dict[str, Measure]:
        c = self.config
        x, y = generate(c.eval_examples, cell["eval_len"], cell["num_pairs"], cell["gap"], "test", c.data_seed, c.num_keys)
        pred = predictions(model, x, tokens_per_batch_for(cell["eval_len"]))
        scored = y != IGNORE
        return {"accuracy": accuracy(int((pred[scored] == y[scored]).sum()), int(scored.sum()))}

    def sample_inputs(self, n: int, length: int) -> torch.Tensor:
        c = self.config
        return generate(n, length, min(c.num_pairs, length // SPAN), None, "test", c.data_seed, c.num_keys)[0]

    def train_params(self) -> dict[str, Any]:
        return {"num_pairs": self.config.num_pairs, "num_keys": self.config.num_keys}

    def eval_params(self) -> dict[str, Any]:
        return {"eval_examples": self.config.eval_examples, "data_seed": self.config.data_seed}


__all__ = ["FILLER", "MQAR", "MQARConfig", "SPAN", "example", "generate", "resolve_gap"]
