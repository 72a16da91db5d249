"""No positional information (NoPE): causal masking alone carries order."""
from __future__ import annotations

from dataclasses import dataclass

from attn.positions.base import Position
from attn.registry import register_position


@dataclass(frozen=True)
class NoneConfig:
    head_dim: int = 64
    d_model: int = 512
    max_seq_len: int = 0


@register_position("none", config=NoneConfig)
class NoPosition(Position):
    """No positional encoding; only a causal mask tells tokens apart by order."""

    kind = "none"
