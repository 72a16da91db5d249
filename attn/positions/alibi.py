"""ALiBi as a position method (Press et al. 2022, https://arxiv.org/abs/2108.12409): nothing added to embeddings, q and
k untouched; the attention adds ``-m_h |i - j|`` to its scores, so the backbone builds the variant with
``alibi=True`` (``full`` and ``sliding_window`` have it; other variants are refused when the model is configured).
"""
from __future__ import annotations

from dataclasses import dataclass

from attn.positions.base import Position
from attn.registry import register_position


@dataclass(frozen=True)
class AlibiConfig:
    """No parameters: the slopes follow from the number of query heads, which the attention sees at each call."""


@register_position("alibi", config=AlibiConfig)
class Alibi(Position):
    """ALiBi: a per-head linear distance penalty on the attention scores (the variant's ``alibi`` parameter)."""

    kind = "bias"
    attention_params = {"alibi": True}
