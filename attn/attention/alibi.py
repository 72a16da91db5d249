"""ALiBi: attention with linear biases (Press et al. 2022, "Train Short, Test Long", https://arxiv.org/abs/2108.12409).

No position embedding at all: query head h adds ``-m_h * (i - j)`` to the score of key j (query i, both absolute
positions, bottom-right aligned: query row r is position ``r + Lk - Lq``), so attention decays linearly with distance
at a per-head rate and a model trained short extrapolates. The paper is causal; bidirectionally the bias is
``-m_h * |i - j|`` (the symmetric form encoders use). One formula, ``-m_h * |i - j|``, serves both, since a causal
query never sees ``j > i``. The bias depends on distances only, so any backend may count positions from its own
first key, and a decoding cache needs nothing but its keys' positions.

Slopes (the reference implementation's ``get_slopes``, ofirpress/attention_with_linear_biases): for H a power of two,
the geometric sequence ``m_h = start^(h+1)`` with ``start = 2^(-8/H)`` (H = 8: 1/2, 1/4, ..., 1/256). Otherwise, with
n the largest power of two below H: the n slopes of n heads, then every other slope of 2n heads (the odd powers of
``2^(-4/n)``) for the remaining H - n heads -- the interpolation Hugging Face's BLOOM (``build_alibi_tensor``) uses.
With grouped-query attention the slope belongs to the query head.

Cost: the bias add is not counted in FLOPs (like the mask, it is one add per visible score, not a matmul).
"""
from __future__ import annotations

import functools
import math

import torch


def alibi_slopes(heads: int) -> list[float]:
    """The per-head slopes m_0 .. m_{H-1} of the paper (see the module docstring), largest first."""
    if heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got {heads}")
    n = 2 ** math.floor(math.log2(heads))
    geometric = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    return geometric + [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(heads - n)]


@functools.lru_cache(maxsize=32)
def slopes_tensor(heads: int, device: str) -> torch.Tensor:
    """:func:`alibi_slopes` as a float32 tensor (H,) on ``device`` (cached: built once per head count)."""
    return torch.tensor(alibi_slopes(heads), dtype=torch.float32, device=device)


def alibi_bias(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """-m_h * |i - j| for queries at ``q_pos`` (..., Lq) and keys at ``k_pos`` (..., Lk): float32 (H, ..., Lq, Lk).

    ``slopes``: (H,). Positions are integers; float32 holds them exactly up to 2^24 tokens, and the bias is kept in
    float32 whatever the inputs' dtype (in bf16 the bias of a key 100 tokens back would be off by ~0.25)."""
    dist = (q_pos[..., :, None] - k_pos[..., None, :]).abs().to(torch.float32)  # (..., Lq, Lk)
    return -slopes.to(torch.float32).view(-1, *[1] * dist.dim()) * dist


def alibi_score_mod_terms(slopes: torch.Tensor, offset: int):
    """The Flex ``score_mod`` piece: ``score - m_h |q + offset - kv|`` (``offset`` = Lk - Lq, bottom-right); the numbers
    are captured tensors, so every slope set and offset at one shape shares one compiled kernel."""
    off = torch.tensor(offset, device=slopes.device)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx + off - kv_idx).abs()

    return alibi


__all__ = ["alibi_bias", "alibi_score_mod_terms", "alibi_slopes", "slopes_tensor"]
