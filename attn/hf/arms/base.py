"""What every arm is to the evaluation: a cache of the context to decode against, and how it decodes.

An arm of a checkpoint evaluation is what happens to the model's KV cache once a prompt's context is prefilled (a
kvpress press, a quantized cache, the oracle, retrieval). The evaluation (:mod:`harness.accuracy.prefill`) prefills a
prompt's context once when some arm :attr:`~Arm.replays` it, asks each arm for its :class:`Branch` -- the cache it
decodes against, the question it decodes next and at which position -- and decodes the answers: the arms that
:attr:`~Branch.batches` in one batch (:mod:`attn.hf.batched`), the others one at a time inside :meth:`Arm.decoding`. No
code outside this folder asks which kind an arm is.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from attn.hf.presses import PressSpec
from attn.hf.replay import Recorder, compress


@dataclass
class Shared:
    """One prompt's recorded prefill of its context, which replaying arms read: each layer's keys and values, the
    layers' inputs (:class:`attn.hf.replay.Recorder`), and scores one arm computed that another may reuse."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    recorder: Recorder | None
    scores: dict[Any, torch.Tensor] = field(default_factory=dict)

    def replay(self, model: Any, spec: PressSpec, press: Any = None) -> Any:
        """A cache of its own holding the context as ``press`` leaves it (None: every key, in ``spec``'s cache)."""
        return compress(model, spec, press, self.keys, self.values, self.recorder)  # type: ignore[arg-type]


@dataclass
class Branch:
    """An arm's cache for one prompt: decode ``question`` from position ``start`` against ``cache``; ``columns``: the
    row statistics the cache gives (tokens and bytes kept, the arm's own); ``batches``: whether it may decode in the
    shared batch (a plain cache whose keys stay as they are while decoding, nothing hooked on the model)."""

    cache: Any
    question: list[int]
    start: int
    columns: dict[str, Any]
    batches: bool = True
    state: Any = None  # what the arm keeps beside the cache to decode it (AdaKV's keys masked per head)


@dataclass
class Prompt:
    """One prompt as an arm sees it: the ids, where the question starts (``question_at``) and where the context is cut
    for the arms that compress it (``cut``: the question's start, or its last token when the press reads the
    question); ``new_tokens``: the most an answer decodes; ``decode`` (ids -> text) and ``needles`` (the answers the
    context hides) for arms that read text."""

    ids: list[int]
    question_at: int
    cut: int
    new_tokens: int
    decode: Callable[[list[int]], str] | None = None
    needles: Sequence[str] | None = None


class Arm:
    """One arm. Subclasses say whether they read the shared prefill (:attr:`replays`) and build their
    :class:`Branch`, which says whether it decodes in the shared batch."""

    name: ClassVar[str]
    replays: ClassVar[bool] = True
    decodes: ClassVar[bool] = False  # it changes the cache while decoding (a step's cost changes step to step)

    def __init__(self, spec: PressSpec):
        self.spec = spec
        self.press = spec.build()

    @property
    def label(self) -> str:
        return self.spec.label

    def branch(self, model: Any, prompt: Prompt, shared: Shared | None) -> Branch:
        raise NotImplementedError

    def decoding(self, model: Any, branch: Branch) -> contextlib.AbstractContextManager[Any]:
        """What stays on the model while this arm's question and answer are decoded against ``branch`` (nothing, by
        default)."""
        return contextlib.nullcontext()

    def after(self, columns: dict[str, Any]) -> dict[str, Any]:
        """The prompt's row statistics once its answer is decoded (what decoding measured, where an arm does)."""
        return columns


__all__ = ["Arm", "Branch", "Prompt", "Shared"]
