"""Keys masked per head while decoding: what kvpress's AdaKV (and CriticalAdaKV) leave after compressing.

AdaKV gives each head its own budget: it scores every head's context keys, keeps the top ones across all heads of a
layer (each head at least ``alpha_safeguard`` of an even share) and, since a cache holds as many keys per head, keeps
every key resident and records the dropped ones on the layer (``module.masked_key_indices``: batch, key head and
position). kvpress then swaps those keys for a key whose weight underflows to zero in every attention call while
decoding (its ``attention_patch``). Here the same keys are masked out exactly, with the causal (and window) mask, in one
SDPA call: weight zero, not nearly zero. Batch 1 or a batch of one arm's rows, unpadded; the masks are the arm's, set on
the layers only while it decodes (:func:`active`), so arms sharing one model never see another's.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

NAME = "attn_bench_head_masked"  # the attn_implementation a model decodes under while an arm's masks are set
Masks = dict[int, tuple[torch.Tensor, ...]]  # layer index -> masked_key_indices (batch, key head, position)


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' signature: (B, H, Lq, D) queries against (B, Hkv, L, D) keys, causal from the bottom right (and
    within ``sliding_window``), the layer's masked keys excluded for their head's queries."""
    from attn.attention.masks import causal_mask

    if kwargs.get("softcap"):
        raise ValueError("head-masked decoding is softmax attention without a softcap")
    B, H, Lq, _ = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    mask = causal_mask(Lq, L, query.device, window=sliding_window)[None, None]  # (1, 1, Lq, L)
    masked = getattr(module, "masked_key_indices", None)
    if masked is not None:
        keep = torch.ones(B, Hkv, L, dtype=torch.bool, device=query.device)
        keep[masked] = False
        mask = mask & keep.repeat_interleave(H // Hkv, dim=1)[:, :, None, :]  # a key head's mask for its query heads
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=Hkv != H)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None  # :func:`attention` masks itself


def take(model: Any) -> Masks:
    """The masks a press left on the model's attention layers, cleared from them (each arm keeps its own)."""
    from attn.hf.presses import language_model

    out = {}
    for i, layer in enumerate(language_model(model).layers):
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        if masked is not None:
            out[i] = masked
            layer.self_attn.masked_key_indices = None
    return out


def kept_share(masks: Masks, layer: int, heads: int, length: int) -> float:
    """The share of one layer's ``heads`` x ``length`` context keys its masks leave."""
    return 1.0 - (len(masks[layer][0]) / (heads * length) if layer in masks else 0.0)


@contextlib.contextmanager
def active(model: Any, masks: Masks) -> Iterator[None]:
    """The model decodes with ``masks`` on its layers, through :func:`attention`, while inside."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from attn.hf.presses import language_model

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, _no_mask)
    layers = language_model(model).layers
    before = model.config._attn_implementation
    for i, masked in masks.items():
        layers[i].self_attn.masked_key_indices = masked
    model.config._attn_implementation = NAME
    try:
        yield
    finally:
        model.config._attn_implementation = before
        for i in masks:
            layers[i].self_attn.masked_key_indices = None


__all__ = ["NAME", "Masks", "active", "attention", "kept_share", "take"]
