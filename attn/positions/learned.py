"""Learned absolute positions (as in GPT-2 / BERT): one trained vector per position, added to the
token embeddings. They cannot say anything about positions never trained, so a sequence longer
than the table is an error, never a silent wrap-around.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn.positions.base import Position
from attn.registry import check, register_position


@dataclass(frozen=True)
class LearnedConfig:
    max_seq_len: int  # the backbone fills it from TransformerConfig.max_seq_len
    d_model: int = 512  # filled from the model by the backbone

    def __post_init__(self) -> None:
        check(self.max_seq_len > 0, f"max_seq_len must be > 0, got {self.max_seq_len}")
        check(self.d_model > 0, f"d_model must be > 0, got {self.d_model}")


@register_position("learned", config=LearnedConfig)
class Learned(Position):
    """Learned table of max_seq_len x d_model vectors added to embeddings; longer inputs are refused."""

    kind = "additive"

    def __init__(self, config: LearnedConfig):
        super().__init__(config)
        self.weight = nn.Parameter(torch.empty(config.max_seq_len, config.d_model))  # (max_seq_len, d_model)
        nn.init.normal_(self.weight, std=0.02)  # GPT-2's init

    def embed(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x: (B, T, d_model) -> x + weight[start : start + T]."""
        end = start + x.shape[1]
        if end > self.config.max_seq_len:
            raise ValueError(
                f"learned positions: position {end - 1} is beyond the table (max_seq_len={self.config.max_seq_len}); "
                "build the model with a larger max_seq_len or use a position method that extrapolates"
            )
        return x + self.weight[start:end].to(x.dtype)
