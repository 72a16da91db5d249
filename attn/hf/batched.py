"""Every arm's answer in one batch: the arms' caches of one prompt stacked, padded, and decoded together.

A greedy decoding step reads all the model's weights; decoding n arms one at a time reads them n times a step. Here the
arms that branch from one prompt decode as one batch: each layer's caches (a press leaves a different number of keys
per arm, and per layer) are right-padded to the longest with zeros, and a mask per layer and arm hides the padding
(:func:`stack`). The tokens decoded after the context are appended behind the padding, the same for every arm; their
positions are each arm's own (a retrieval arm's question follows its kept chunks, a press's the whole context). While
the batch decodes, the model attends through :func:`attention` (transformers' attention signature, under
:data:`NAME`): softmax attention over each arm's real keys, causal among the new tokens. A key's place in the cache
does not change its score (RoPE was applied when it was written), so padding on the right changes no weight. An arm
whose answer has ended leaves the batch (:func:`decode`). Models whose layers pass a sliding window or a softcap are
decoded one arm at a time (:func:`batchable`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

NAME = "attn_bench_batched"
_ACTIVE: list[list[torch.Tensor]] = []  # per layer, (B, N) True where a row's padded context holds a real key


def batchable(model: Any) -> str | None:
    """Why the arms of this model cannot decode in one batch (None: they can)."""
    from attn.hf.layers import window_layers

    if window_layers(model.config):
        return "a model with sliding-window layers (its window's mask follows positions the padding would move)"
    if getattr(model.config, "attn_logit_softcapping", None):
        return "a model whose attention is softcapped"
    return None


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' signature: (B, H, Lq, D) queries against (B, Hkv, Lk, D) keys whose first N are each row's padded
    context (its mask in the active batch), the rest the tokens decoded since, causal from the bottom right."""
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise ValueError("a batch of arms decodes full softmax attention only (no window, no softcap)")
    valid = _ACTIVE[-1][module.layer_idx]
    B, H, Lq, _ = query.shape
    Lk, N = key.shape[-2], valid.shape[1]
    rows = torch.arange(Lq, device=query.device)[:, None] + (Lk - Lq)
    allowed = (torch.arange(Lk, device=query.device)[None] <= rows).expand(B, 1, Lq, Lk).clone()
    allowed[..., :N] &= valid[:, None, None, :]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling,
                                         enable_gqa=H != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def active(model: Any, valid: list[torch.Tensor]) -> Iterator[None]:
    """The model attends through :func:`attention` with these masks while inside."""
    register()
    before = model.config._attn_implementation
    _ACTIVE.append(valid)
    model.config._attn_implementation = NAME
    try:
        yield
    finally:
        model.config._attn_implementation = before
        _ACTIVE.remove(valid)


def stack(caches: Sequence[Any], layers: int) -> tuple[Any, list[torch.Tensor]]:
    """One ``DynamicCache`` holding ``caches`` as rows (each a batch-1 cache, consumed: its tensors are released layer by
    layer), each layer right-padded to its longest row; and per layer the (B, N) mask of real keys."""
    from transformers import DynamicCache

    def kv(cache: Any, i: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if i >= len(cache.layers):
            return None, None
        return getattr(cache.layers[i], "keys", None), getattr(cache.layers[i], "values", None)

    template = next(k for c in caches for i in range(layers) if (k := kv(c, i)[0]) is not None)
    _, heads, _, dim = template.shape
    out, valid = DynamicCache(), []
    for i in range(layers):
        pairs = [kv(c, i) for c in caches]
        sizes = [0 if k is None else k.shape[-2] for k, _ in pairs]
        n = max(sizes)
        keys = template.new_zeros(len(caches), heads, n, dim)
        values = template.new_zeros(len(caches), heads, n, dim)
        for row, (k, v) in enumerate(pairs):
            if k is not None and k.shape[-2]:
                keys[row, :, :k.shape[-2]], values[row, :, :k.shape[-2]] = k[0], v[0]
        for c in caches:
            if i < len(c.layers):
                c.layers[i].keys = c.layers[i].values = None
        out.update(keys, values, i)
        valid.append(torch.arange(n, device=template.device)[None] < torch.tensor(sizes, device=template.device)[:, None])
    return out, valid


@torch.no_grad()
def decode(model: Any, caches: Sequence[Any], question: Sequence[int], starts: Sequence[int],
           pick: Callable[[torch.Tensor, int], int], ended: Callable[[list[int]], bool], new_tokens: int,
           layers: int) -> list[list[int]]:
    """Each row's greedy answer: ``question`` decoded from the row's position in ``starts`` against its cache, then
    ``pick(logits, made)`` token by token until ``new_tokens`` or ``ended(ids)``; the rules of one arm decoding alone,
    row by row. ``caches`` are consumed."""
    dev = model.device
    cache, valid = stack(caches, layers)
    said: list[list[int]] = [[] for _ in caches]
    live = list(range(len(caches)))
    at = torch.tensor(list(starts), device=dev)[:, None]
    ids = torch.tensor([list(question)] * len(caches), device=dev)
    with active(model, valid):
        while True:
            pos = at + torch.arange(ids.shape[1], device=dev)[None]
            logits = model(input_ids=ids, past_key_values=cache, position_ids=pos, logits_to_keep=1,
                           use_cache=True).logits[:, -1]
            at = at + ids.shape[1]
            for r, row in enumerate(live):
                said[row].append(pick(logits[r], len(said[row])))
            going = [r for r, row in enumerate(live) if len(said[row]) < new_tokens and not ended(said[row])]
            if not going:
                return said
            if len(going) < len(live):  # an answer has ended: its row leaves the batch
                index = torch.tensor(going, device=dev)
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[index], layer.values[index]
                valid[:] = [v[index] for v in valid]
                at = at[index]
                live = [live[r] for r in going]
            ids = torch.tensor([[said[row][-1]] for row in live], device=dev)


__all__ = ["NAME", "active", "attention", "batchable", "decode", "register", "stack"]
