"""Grouped-query attention (GQA, Ainslie et al. 2023; MQA, Shazeer 2019): H query heads share H_kv key/value heads.

Query head ``h`` reads key/value head ``h // G`` with ``G = H // H_kv`` (the convention of Hugging Face's
``repeat_kv`` and of SDPA's ``enable_gqa``). Backends avoid copying keys G times: the G query heads of one
key head are *folded* into that head's query rows, ``(B, H, L, D) -> (B, H_kv, G * L, D)``, so one matmul
serves the whole group; or the kernel takes the groups itself (SDPA ``enable_gqa``, Flex ``enable_gqa``,
xformers' 5-D BMGHK inputs). :func:`repeat_kv` is for references, tests and kernels without groups.
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

# Below this many queries SDPA gets folded groups (one query block per key head); above it, enable_gqa.
# Measured (2-core CPU, H=8, H_kv=2, 16K keys, one query): folded 0.65 ms, enable_gqa 1.12 ms, repeated 36 ms.
FOLD_MAX_QUERIES = 128


def kv_groups(q: torch.Tensor, k: torch.Tensor) -> int:
    """G = H / H_kv for q (B, H, Lq, D) and k (B, H_kv, Lk, D)."""
    return q.shape[1] // k.shape[1]


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H_kv, L, D) -> (B, H_kv * G, L, D): each key head repeated for its G query heads (a copy)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def fold(q: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H, L, D) -> (B, H_kv, G * L, D): a key head's G query heads, one after another, as its query rows."""
    B, H, L, D = q.shape
    return q if groups == 1 else q.reshape(B, H // groups, groups * L, D)


def unfold(out: torch.Tensor, groups: int) -> torch.Tensor:
    """Inverse of :func:`fold`: (B, H_kv, G * L, D) -> (B, H, L, D)."""
    B, Hkv, GL, D = out.shape
    return out if groups == 1 else out.reshape(B, Hkv * groups, GL // groups, D)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
         is_causal: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` for k, v with H_kv <= H heads, never repeating them.

    ``attn_mask``: None or (Lq, Lk) bool (True = may attend), shared by every head. Few queries (decoding)
    are folded into their key head's rows (the mask repeated G times: tiny); longer calls use ``enable_gqa``,
    which keeps SDPA's fused kernels and its ``is_causal`` path.
    """
    g = kv_groups(q, k)
    if g == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    if q.shape[2] <= FOLD_MAX_QUERIES and not is_causal:
        mask = None if attn_mask is None else attn_mask.repeat(g, 1)  # (G * Lq, Lk)
        return unfold(F.scaled_dot_product_attention(fold(q, g), k, v, attn_mask=mask), g)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=True)


@functools.cache
def _warn_repeated(cls: type) -> None:
    warnings.warn(f"{cls.__qualname__} does not declare supports_gqa: grouped keys and values are repeated to the "
                  "query heads before each call (the time and memory of multi-head attention; caches still hold "
                  "H_kv heads)", stacklevel=4)


def repeated_for(cls: type, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: dict[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """k, v and the token inputs (per key head) repeated to q's heads, for a variant without GQA support (warned
    once per class)."""
    _warn_repeated(cls)
    g = q.shape[1] // k.shape[1]
    return (k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1),
            {n: t.repeat_interleave(g, dim=1) for n, t in inputs.items()})


__all__ = ["FOLD_MAX_QUERIES", "fold", "kv_groups", "repeat_kv", "repeated_for", "sdpa", "unfold"]
