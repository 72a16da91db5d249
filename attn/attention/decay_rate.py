"""Mamba-2's decay parametrisation, shared by ``mamba2`` and ``gated_deltanet``: log decay = A_h dt_t.

A step size dt_t = softplus(projection + dt_bias) > 0 per token and key head, and a learned rate A_h < 0 per key
head (kept as ``A_log``, A = -exp(A_log)); the state decays by exp(A_h dt_t) a token. Mamba-2 (``mamba_ssm``'s
``Mamba2``) and Gated DeltaNet (the paper's sec. 3.3; fla's ``GatedDeltaNet`` layer,
``g = -A_log.exp() * softplus(a_proj(x) + dt_bias)``) both start dt near 0.01 and A spread over [1, 16], so a fresh
layer's decays lie between exp(-0.16) and exp(-0.01) a token: it remembers from the first step. A decay drawn near
1/2 instead (a plain sigmoid gate of a zero-mean projection) forgets everything 30 tokens back, and the gradient that
could lengthen its memory vanishes with it: measured here, Gated DeltaNet then never learns MQAR at 128 tokens.
Here dt_bias is the projection's bias (zero at init) plus the fixed ``DT_SHIFT``; A is deterministic, spread evenly
over the range (mamba_ssm and fla draw both at random).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

DT_SHIFT = math.log(math.expm1(0.01))  # softplus(0 + DT_SHIFT) = 0.01: a fresh layer's step size
A_RANGE = (1.0, 16.0)  # Mamba-2's A_init_range (fla's GatedDeltaNet draws A from (0, 16))


def step_size(x: torch.Tensor) -> torch.Tensor:
    """A raw projection -> the step size dt = softplus(x + DT_SHIFT) > 0."""
    return F.softplus(x + DT_SHIFT)


def initial_a_log(heads: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """log A for ``heads`` key heads, A spread evenly over ``A_RANGE`` (one head: its low end, the longest memory)."""
    a = torch.linspace(*A_RANGE, heads, device=device) if heads > 1 else torch.full((1,), A_RANGE[0], device=device)
    return a.log()


class LogDecay(nn.Module):
    """Raw projection (B, H_kv, L, 1) -> log decay A_h dt_t <= 0, with A_h = -exp(A_log_h) learned per key head."""

    def __init__(self, heads: int):
        super().__init__()
        self.A_log = nn.Parameter(initial_a_log(heads))

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        A = -self.A_log.to(raw.dtype).exp()
        return A[:, None, None] * step_size(raw)


__all__ = ["A_RANGE", "DT_SHIFT", "LogDecay", "initial_a_log", "step_size"]
