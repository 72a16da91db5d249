"""The decoding state of the decayed and gated linear family: one (D_k x D_v) matrix per key head.

RetNet, GLA and Gated DeltaNet all carry S_t (B, H_kv, D_k, D_v) in fp32 (fp64 for fp64 inputs): the same size at
every length. A recurrent state cannot forget tokens, so ``truncate`` only undoes the last update (the harness
rewinds one timed decoding step): :class:`attn.attention.state.OneStepUndo`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attn.attention.base import RecurrentAttention
from attn.attention.state import OneStepUndo


@dataclass
class MatrixState(OneStepUndo):
    UNDO_FIELDS = ("S",)
    KIND = "recurrent state"
    S: torch.Tensor | None = None  # (B, H_kv, D_k, D_v)

    def update(self, S: torch.Tensor, new_tokens: int) -> None:
        self.remember()
        self.S, self.length = S, self.length + new_tokens

    def nbytes(self) -> int:
        return 0 if self.S is None else self.S.numel() * self.S.element_size()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """State and sums in fp32 at least (fp64 stays fp64): a bf16 running sum drifts over thousands of tokens."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class MatrixStateAttention(RecurrentAttention):
    """Base of RetNet, GLA and Gated DeltaNet: the recurrent cost rule and a :class:`MatrixState` to decode with,
    one (D_k x D_v) matrix per key head; ``max_len`` is not needed (nothing grows with length)."""

    def new_state(self, max_len: int = 0) -> MatrixState:
        return MatrixState()


__all__ = ["MatrixState", "MatrixStateAttention", "compute_dtype"]
