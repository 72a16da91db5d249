"""Multi-query associative recall, MQAR, as Zoology defines it (Arora et al. 2023, https://arxiv.org/abs/2312.04927;
the generator ``zoology/data/multiquery_ar.py``).

One example of length L with N key-value pairs::

    [k1 v1 k2 v2 ... kN vN] [query region: L - 2N tokens]

Keys come from the lower half of the vocabulary (1 .. V/2 - 1) and values from the upper half (V/2 .. V - 1),
both drawn *without replacement*, so every value in an example is different. The query region has
(L - 2N) / 2 even slots; N distinct slots are drawn with probability p_i ~ i^(a - 1) (i = 1, 2, ..., a = 0.01:
Zoology's power law, so most queries come soon after the pairs and a few far away), and each holds one
key; the model must output that key's value at the key's position (the value is never fed back). Every
other token of the query region is random noise from the whole vocabulary. Zoology scales N with L
(its configs: 64 -> 4, 128 -> 8, 256 -> 16 pairs): ``num_pairs = 0`` means L / 16.

Train and test never share an example: the split is decided by a hash of the *set* of (key, value) pairs
(the order they appear in does not change the split). Models are trained and evaluated at the same length,
as in Zoology; other evaluation lengths are allowed but measure length extrapolation too.

Two reference points ride on every row: ``chance`` (1 / number of values) and ``baseline``, the trivial
in-context strategy that answers a random value from the context -- computed from the test examples
themselves (with distinct values it is 1 / N). A model between the two has learned something about the
format but not the key binding.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import torch

from harness.accuracy.common import IGNORE, check_split, predictions, rng_for, split_of, tokens_per_batch_for
from harness.accuracy.jobs import Job
from harness.accuracy.stats import Measure, accuracy, clustered_accuracy, summarize_best_lr
from harness.accuracy.tasks.base import EVAL_EXAMPLES, Metric, TaskOption, TrainedTask
from harness.accuracy.tasks.registry import register_task

if TYPE_CHECKING:
    import pandas as pd

PAIRS_PER_LENGTH = 16  # Zoology's configs: N = L / 16


@dataclass(frozen=True)
class MQARConfig:
    vocab_size: int = 8192  # Zoology's; keys are the lower half, values the upper half
    num_pairs: int = 0  # pairs per example; 0 -> length / 16 at every length (Zoology's scaling)
    power_a: float = 0.01  # the query gaps' power law p_i ~ i^(a - 1); 1.0 = uniform
    random_non_queries: bool = True  # noise tokens between queries (Zoology's default), else 0
    eval_examples: int = 256
    data_seed: int = 1234  # the test set is the same for every trained model

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ValueError(f"mqar vocab_size must be >= 8, got {self.vocab_size}")
        if self.num_pairs < 0:
            raise ValueError(f"mqar num_pairs must be >= 0 (0 = length / {PAIRS_PER_LENGTH}), got {self.num_pairs}")
        if not 0 < self.power_a <= 1:
            raise ValueError(f"mqar power_a must be in (0, 1], got {self.power_a}")
        if self.eval_examples < 1:
            raise ValueError(f"mqar eval_examples must be >= 1, got {self.eval_examples}")

    def pairs(self, length: int) -> int:
        return self.num_pairs or max(1, length // PAIRS_PER_LENGTH)


def gap_probabilities(space: int, power_a: float) -> np.ndarray:
    """Zoology's power law over the query slots 1..space: p_i ~ a i^(a - 1), normalised."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def check_fits(length: int, num_pairs: int, vocab_size: int) -> None:
    """ValueError unless an example of this length, pair count and vocabulary can be built."""
    if length % 2:
        raise ValueError(f"mqar: length must be even (query slots are every other token), got {length}")
    if 4 * num_pairs > length:
        raise ValueError(f"mqar: {num_pairs} pairs need length >= {4 * num_pairs} (pairs, then as many query slots)")
    if num_pairs > vocab_size // 2 - 1:
        raise ValueError(f"mqar: {num_pairs} pairs need a vocabulary of at least {2 * num_pairs + 2} (distinct keys)")


def example(rng: np.random.Generator, length: int, num_pairs: int, config: MQARConfig,
            split: str) -> tuple[np.ndarray, np.ndarray]:
    """One sequence and its targets (IGNORE except at query positions, where it is the key's value)."""
    n, half = num_pairs, config.vocab_size // 2
    for _ in range(10_000):  # resample the whole mapping until its set of pairs belongs to the split
        keys = rng.choice(np.arange(1, half), n, replace=False)
        values = rng.choice(np.arange(half, config.vocab_size), n, replace=False)
        order = np.argsort(keys)
        if split_of(np.stack([keys[order], values[order]]).astype(np.int64).tobytes()) == split:
            break
    else:
        raise ValueError(f"mqar: no {split} example found for {n} pairs in a vocabulary of {config.vocab_size}")
    space = (length - 2 * n) // 2
    slots = rng.choice(space, n, replace=False, p=gap_probabilities(space, config.power_a))
    seq = np.zeros(length, dtype=np.int64)
    tgt = np.full(length, IGNORE, dtype=np.int64)
    seq[0:2 * n:2], seq[1:2 * n:2] = keys, values
    if config.random_non_queries:
        seq[2 * n:] = rng.integers(0, config.vocab_size, length - 2 * n)
    where = 2 * n + 2 * slots
    seq[where], tgt[where] = keys, values
    return seq, tgt


def generate(n: int, length: int, split: str, seed: int, config: MQARConfig,
             num_pairs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """n examples of ``split``: (inputs, targets), each (n, length)."""
    check_split(split)
    pairs = config.pairs(length) if num_pairs is None else num_pairs
    check_fits(length, pairs, config.vocab_size)
    rng = rng_for(seed, length, pairs, SPLIT_CODE[split])
    xs, ys = zip(*(example(rng, length, pairs, config, split) for _ in range(n)), strict=True)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


SPLIT_CODE = {"train": 0, "test": 1}


def in_context_baseline(inputs: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """Accuracy of answering each query with a value drawn uniformly from the example's context: the mean over
    queries of (how many context values equal the answer) / (how many values the context holds). Only the pairs
    (the tokens before the first query) count as context; noise tokens are not answers."""
    half, total = vocab_size // 2, []
    for x, y in zip(inputs.tolist(), targets.tolist(), strict=True):
        scored = [i for i, t in enumerate(y) if t != IGNORE]
        context = [t for t in x[: 2 * len(scored)] if t >= half]  # the values of the pairs
        total += [context.count(y[i]) / len(context) for i in scored]
    return float(np.mean(total))


@register_task("mqar", config=MQARConfig)
class MQAR(TrainedTask):
    """Multi-query associative recall (Zoology): recall of key-value pairs against the decoding state."""

    main_metric = "accuracy"
    declares = (Metric("accuracy"), Metric("exact_match"))
    columns = ("num_pairs", "gap")  # gap: the old protocol's rows
    options = (
        TaskOption("num_pairs", "num_pairs", "key-value pairs per example (default 0 = length / 16, Zoology's scaling).",
                   click.IntRange(min=0)),
        TaskOption("vocab_size", "vocab_size", "vocabulary (keys its lower half, values its upper).",
                   click.IntRange(min=8)),
        EVAL_EXAMPLES,
    )
    figures = ("mqar", "mqar-width", "position_heatmap", "tradeoff")

    @classmethod
    def default_eval_lens(cls, train_len: int) -> list[int]:
        return [train_len]  # Zoology's protocol: recall at the length trained (other lengths add extrapolation)

    @classmethod
    def default_job(cls) -> Job:
        """Zoology's protocol at its smallest length, every family."""
        from harness.accuracy.presets import MQAR_CONV, MQAR_VARIANTS

        return Job(cls.name, variants=list(MQAR_VARIANTS), positions=["rope"], train_len=64, short_conv=MQAR_CONV)

    @classmethod
    def table(cls, rows: Iterable[dict[str, Any]], metric: str | None = None) -> pd.DataFrame:
        """Variant (and width, pairs... where they vary) x evaluation length, each seed at its best learning rate."""
        import pandas as pd

        metric = metric or cls.main_metric
        rows = [r for r in rows if r.get("task") == cls.name and r.get("metric") == metric]
        return mqar_table(pd.DataFrame(summarize_best_lr(rows)), metric)

    def __init__(self, config: MQARConfig | None = None):
        self.config = config or MQARConfig()
        self.vocab_size = self.config.vocab_size

    def check(self, train_len: int, eval_lens: Sequence[int]) -> None:
        for L in (train_len, *eval_lens):
            check_fits(L, self.config.pairs(L), self.config.vocab_size)

    def train_batch(self, seed: int, step: int, batch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return generate(batch_size, length, "train", seed * 1_000_003 + step, self.config)

    def test_set(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        return generate(c.eval_examples, length, "test", c.data_seed, c)

    def cells(self, train_len: int, eval_lens: Sequence[int]) -> list[dict[str, Any]]:
        out = []
        for L in eval_lens:
            x, y = self.test_set(L)
            out.append({"eval_len": L, "num_pairs": self.config.pairs(L), "chance": 2 / self.config.vocab_size,
                        "baseline": in_context_baseline(x, y, self.config.vocab_size)})
        return out

    def metrics(self, cell: dict[str, Any], train_len: int) -> tuple[str, ...]:
        return ("accuracy", "exact_match")

    def evaluate(self, model: torch.nn.Module, cell: dict[str, Any], train_len: int) -> dict[str, Measure]:
        """Per-query accuracy with an interval clustered by example (the queries of one example are not independent
        trials), and exact match per example (every query right) with a Wilson interval over examples."""
        x, y = self.test_set(cell["eval_len"])
        pred = predictions(model, x, tokens_per_batch_for(cell["eval_len"]))
        scored = y != IGNORE
        right = ((pred == y) & scored).sum(1)  # (examples,) correct queries of each example
        per_example = scored.sum(1)
        return {"accuracy": clustered_accuracy(right.tolist(), per_example.tolist()),
                "exact_match": accuracy(int((right == per_example).sum()), len(right))}

    def sample_inputs(self, n: int, length: int) -> torch.Tensor:
        return generate(n, length, "test", self.config.data_seed, self.config)[0]

    def train_params(self) -> dict[str, Any]:
        c = self.config
        return {"vocab_size": c.vocab_size, "num_pairs": c.num_pairs, "power_a": c.power_a,
                "random_non_queries": c.random_non_queries}

    def eval_params(self) -> dict[str, Any]:
        return {"eval_examples": self.config.eval_examples, "data_seed": self.config.data_seed,
                "generator": "zoology"}


def mqar_table(s: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows: variant_spec, then d_model, the pairs, the old protocol's gap rule, training length, position and short
    convolution, each only where it takes several values at one evaluation length; columns: evaluation length.

    Under Zoology's protocol the pairs (length / 16) and the training length follow the evaluation length, so the
    header names them instead of the index making a diagonal table."""
    if s.empty:
        return s
    s = s.assign(d_model=[-1 if _missing(v) else int(v) for v in s["d_model"]],  # -1: the preset's width, sorted first
                 **{c: ["" if _missing(v) else str(v) for v in s[c]] for c in ("gap_rule", "position_spec", "short_conv")})
    per_len = s.groupby("eval_len")
    index = ["variant_spec", *[c for c in ("d_model", "num_pairs", "gap_rule", "train_len", "position_spec", "short_conv")
                               if per_len[c].nunique().max() > 1]]
    t = s.pivot_table(index=index, columns="eval_len", values="value", aggfunc="mean")
    if "d_model" in index:
        t = t.rename(index={-1: PRESET_WIDTH}, level="d_model")
    notes = []
    if "num_pairs" not in index:
        notes.append("pairs " + ", ".join(f"{int(n)} at {int(L)}" for L, n in per_len["num_pairs"].first().items()
                                          if not _missing(n)))
    if "train_len" not in index and (s["train_len"] == s["eval_len"]).all():
        notes.append("trained at the length evaluated")
    t.columns.name = f"mqar {metric} at eval length" + (f" ({'; '.join(notes)})" if notes else "")
    return t


PRESET_WIDTH = "preset"  # rows whose d_model is None: the model preset's own width


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


__all__ = ["MQAR", "PRESET_WIDTH", "MQARConfig", "PAIRS_PER_LENGTH", "check_fits", "example", "gap_probabilities", "generate",
           "in_context_baseline", "mqar_table"]
