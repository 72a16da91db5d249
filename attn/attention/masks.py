"""The mask conventions of DESIGN.md in one place: causal masks are bottom-right aligned (query i of q_len is absolute
position i + k_len - q_len), a window w keeps i - w < j <= i. Below every variant: base and full both use it."""

from __future__ import annotations

import torch


def causal_mask(q_len: int, k_len: int, device: torch.device | str = "cpu", window: int | None = None,
                causal: bool = True) -> torch.Tensor:
    """Boolean (q_len, k_len) mask, True = may attend; bottom-right aligned as in DESIGN.md."""
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    allowed = j <= i if causal else torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if window is not None:
        allowed = allowed & ((i - j) < window) if causal else allowed & ((i - j).abs() < window)
    return allowed


def visible_pairs(q_len: int, k_len: int, causal: bool, window: int | None = None) -> int:
    """Number of (query, key) pairs a mask lets through, under the design's conventions.

    Causal masks are bottom-right aligned (query i is absolute position i + k_len - q_len);
    ``window`` w keeps ``i - w < j <= i`` (causal) or ``|i - j| < w`` (bidirectional).
    """
    p = torch.arange(q_len, dtype=torch.int64) + (k_len - q_len)  # absolute query positions
    lo = torch.zeros_like(p) if window is None else (p - window + 1).clamp(min=0)
    if causal:
        hi = p.clamp(max=k_len - 1)
    else:
        hi = torch.full_like(p, k_len - 1) if window is None else (p + window - 1).clamp(max=k_len - 1)
    return int((hi - lo + 1).clamp(min=0).sum())
