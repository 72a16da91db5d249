"""Continuation: bits per byte of real text after a compressed context, on a pretrained checkpoint.

What a press keeps of a model's language modelling, beside what it keeps of retrieval: each example is a window of
the lm corpus's test split in the checkpoint's tokens, ``eval_len`` tokens of context, then ``continuation`` tokens
scored by teacher forcing against each arm's cache of the context -- compressed once prefilled, kvpress's protocol, as
the retrieval tasks' contexts are (:meth:`harness.accuracy.prefill.SharedPrefill.bits`). The first continuation token
follows from the context's last position before any press acts, the same for every arm, so it is not scored, and
neither is a document boundary. Windows do not overlap: each is an independent draw, and its bits per byte is one
example (``per_example``, which the arms pair on); the row's value is their mean, with a t interval over windows.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import torch

from harness.accuracy.jobs import Job, short_hash
from harness.accuracy.stats import Measure, mean_ci
from harness.accuracy.tasks.base import EVAL_EXAMPLES, BuiltOnTask, CheckpointTask, Metric, TaskOption
from harness.accuracy.tasks.lm import LMConfig, LMText, lm_text, load_corpus
from harness.accuracy.tasks.registry import register_task

if TYPE_CHECKING:
    from harness.accuracy.build import Spec
    from harness.accuracy.checkpoint import Checkpoint


@dataclass(frozen=True)
class ContinuationConfig:
    corpus: tuple[str, ...] = ()  # lm's: files or directories; () -> the Python standard library's sources
    test_fraction: float = 0.1
    eval_examples: int = 20  # windows per length, each an independent draw
    continuation: int = 128  # tokens scored after each window's context

    def __post_init__(self) -> None:
        if self.eval_examples < 1 or self.continuation < 2:
            raise ValueError("continuation: eval_examples must be >= 1 and continuation >= 2 tokens")


def windows(text: LMText, config: ContinuationConfig, length: int) -> list[tuple[list[int], list[bool]]]:
    """The first ``eval_examples`` non-overlapping windows of ``length + continuation`` tokens, with which of their
    tokens are text (not a document boundary)."""
    size = length + config.continuation
    return [(text.ids[i * size:(i + 1) * size].tolist(), text.scored[i * size:(i + 1) * size].tolist())
            for i in range(config.eval_examples)]


def continuation_measures(model: torch.nn.Module, ckpt: Checkpoint, config: ContinuationConfig, text: LMText,
                          length: int, cache: Any) -> dict[str | None, dict[str, Measure]]:
    """bpb of each window's continuation, per arm of ``cache`` (the setting's SharedPrefill)."""
    per: dict[str | None, list[float]] = {}
    for ids, text_token in windows(text, config, length):
        keep = torch.tensor(text_token[length + 1:])
        num_bytes = len(ckpt.tokens.decode([t for t, k in zip(ids[length + 1:], keep.tolist(), strict=True) if k])
                        .encode())
        for arm, bits in cache.bits(model, ids, length).items():
            per.setdefault(arm, []).append(float((bits.cpu() * keep).sum()) / max(num_bytes, 1))
    out = {}
    for arm, values in per.items():
        m = mean_ci(values)
        out[arm] = {"bpb": Measure(m.value, m.ci_low, m.ci_high, len(values), per_example=tuple(values))}
    return out


class OnCheckpoint(CheckpointTask):
    """Continuation bits per byte after each length of context, per arm (presses compress the context)."""

    prompts = True  # a context the presses compress, then tokens read against it

    @classmethod
    def config(cls, params: dict[str, Any]) -> ContinuationConfig:
        return ContinuationConfig(**params)

    @classmethod
    def prepare(cls, ckpt: Checkpoint, config: ContinuationConfig, lens: Sequence[int]) -> LMText:
        return lm_text(LMConfig(config.corpus, config.test_fraction), ckpt.tokens,
                       config.eval_examples * (lens[-1] + config.continuation))

    @classmethod
    def cells(cls, config: ContinuationConfig, lens: Sequence[int], data: LMText) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        return [({"eval_len": L, "draws": config.eval_examples}, ("bpb",)) for L in lens]

    @classmethod
    def eval_id(cls, ckpt: Checkpoint, config: ContinuationConfig, data: LMText) -> str:
        corpus = load_corpus(config.corpus, config.test_fraction)
        return short_hash({"corpus": corpus.name, "test_bytes": len(corpus.test), "windows": config.eval_examples,
                           "continuation": config.continuation, "tokens": ckpt.tokens.name})

    @classmethod
    def evaluate(cls, model: torch.nn.Module, ckpt: Checkpoint, config: ContinuationConfig, data: LMText,
                 cell: dict[str, Any], device: str, cache: Any) -> dict[str | None, dict[str, Measure]]:
        from harness.accuracy.prefill import SharedPrefill

        return continuation_measures(model, ckpt, config, data, cell["eval_len"], cache or SharedPrefill())


@register_task("continuation")
class Continuation(BuiltOnTask):
    """Bits per byte of real text read after a compressed context (a pretrained checkpoint's, --hf-model)."""

    pretrained = OnCheckpoint
    main_metric = "bpb"
    declares = (Metric("bpb", "loss"),)
    options = (EVAL_EXAMPLES, TaskOption("continuation", "continuation", "tokens scored after each "
                                         "window's context.", click.IntRange(min=2)))

    @classmethod
    def default_job(cls) -> Job:
        return Job(cls.name, variants=["full"], positions=["rope"])

    @classmethod
    def evaluated_variants(cls, variants: list[Spec]) -> list[Spec]:
        raise ValueError("continuation reads a pretrained checkpoint's text after a compressed context: give --hf-model")


__all__ = ["Continuation", "ContinuationConfig", "continuation_measures", "windows"]
