"""The oracle: the ceiling of every selector of a budget, as a press arm of a transformers model.

At every decoding step (the question's tokens, then each answer token) each attention head computes its true weights
over the whole cache, keeps exactly the budget's context keys with the highest weight, and attends over those (and over
every key after the context: the question's and the answer's, as a press keeps them). Its budget is a press's:
``compression_ratio`` is the share of the context's keys dropped, ``int(context * (1 - ratio))`` kept (kvpress's
rounding). No selector that gives a head that many context keys -- a press, a window, blocks, Quest's pages -- can
keep more of that head's attention mass at that step, which is what makes it a ceiling; it is not a method (it needs
every key resident and all the scores).

Per query head: with grouped-query attention the heads of one group may keep different keys (a press keeps one set per
key-value head), so the oracle is the ceiling per query head. A layer the model's own sliding window serves (Gemma 3's
local layers: transformers passes ``sliding_window``) keeps its window, as presses leave such layers (kvpress's rule).
Batch 1, unpadded: the oracle's mask is its own (causal from the bottom right, and the window), not transformers',
which a press arm's cache of layers of different lengths would size wrong. It runs during decoding only: the context is prefilled
with full attention, as kvpress compresses after the prefill, so it shares the prefill of every press arm
(:mod:`attn.hf.arms.oracle`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

ORACLE = "oracle"
NAME = "attn_bench_oracle"  # the attn_implementation it switches a model to while it decodes
_ACTIVE: list[Oracle] = []


class Oracle:
    """The oracle at ``compression_ratio``; ``with oracle(model):`` decodes under it. A layer's context is what its
    cache holds when its first call in the block attends (its keys before the call's own), and :attr:`mass` collects,
    per attention call of a pruned layer, the share of the true weights the kept context keys carry (mean over heads and
    queries)."""

    def __init__(self, compression_ratio: float = 0.0):
        if not 0.0 <= compression_ratio < 1.0:
            raise ValueError(f"oracle: compression_ratio must be in [0, 1), got {compression_ratio}")
        self.compression_ratio = compression_ratio
        self.context: dict[int, int] = {}  # layer index -> its context's length
        self.mass: list[float] = []

    def kept(self, context_len: int) -> int:
        """Context keys each head keeps (kvpress's ``int(q_len * (1 - compression_ratio))``)."""
        return int(context_len * (1 - self.compression_ratio))

    @contextlib.contextmanager
    def __call__(self, model: Any) -> Iterator[Oracle]:
        register()
        before = model.config._attn_implementation
        self.context = {}
        _ACTIVE.append(self)
        model.config._attn_implementation = NAME
        try:
            yield self
        finally:
            model.config._attn_implementation = before
            _ACTIVE.remove(self)

    def columns(self, layer_bytes: list[int], layer_tokens: list[int], context_len: int,
                windows: dict[int, int]) -> dict[str, Any]:
        """Row columns of what one head reads per step: each pruned layer the kept context tokens and that share of
        its bytes, each window layer (``windows``) what its cache holds."""
        k = self.kept(context_len)
        tokens = [n if i in windows else k for i, n in enumerate(layer_tokens)]
        return {"kv_tokens_min": min(tokens), "kv_tokens_mean": sum(tokens) / len(tokens), "kv_tokens_max": max(tokens),
                "kv_cache_bytes": sum(b if i in windows else b * k / max(context_len, 1)
                                      for i, b in enumerate(layer_bytes))}


def oracle_weights(scores: torch.Tensor, context_len: int, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention weights over the kept keys, and the kept mask: ``scores`` (..., Lq, Lk) already masked (-inf where a
    query may not look); of the first ``context_len`` keys each row keeps its ``keep`` of highest true weight, every
    later key stays. Pure: the test compares it with a top-k written out by hand."""
    true = torch.softmax(scores.float(), dim=-1)
    kept = torch.ones_like(true, dtype=torch.bool)
    if keep < context_len:
        ctx = true[..., :context_len]
        top = ctx.topk(keep, dim=-1).indices
        kept[..., :context_len] = torch.zeros_like(ctx, dtype=torch.bool).scatter_(-1, top, True)
    return torch.softmax(scores.float().masked_fill(~kept, float("-inf")), dim=-1), kept


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: (B, H, Lq, D) queries against (B, Hkv, Lk, D) keys, causal from the bottom
    right (the queries are the last Lq positions), under the active oracle; ``sliding_window``: a window layer."""
    oracle = _ACTIVE[-1]
    B, H, Lq, D = query.shape
    Lk = key.shape[-2]
    window = kwargs.get("sliding_window")
    group = H // key.shape[1]
    k, v = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    scores = (query.float() @ k.float().transpose(-1, -2)) * (scaling if scaling is not None else D ** -0.5)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(Lq, device=query.device)[:, None] + (Lk - Lq)
    cols = torch.arange(Lk, device=query.device)[None]
    allowed = (cols <= rows) & ((cols > rows - window) if window else True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if window:
        weights = torch.softmax(scores, dim=-1)
    else:
        n = min(oracle.context.setdefault(getattr(module, "layer_idx", 0), Lk - Lq), Lk)
        weights, kept = oracle_weights(scores, n, oracle.kept(n))
        true = torch.softmax(scores, dim=-1)[..., :n]
        oracle.mass.append(float((true * kept[..., :n]).sum(-1).mean()))
    out = weights.to(v.dtype) @ v
    return out.transpose(1, 2).contiguous().to(query.dtype), None


def register() -> None:
    """The oracle's attention under :data:`NAME` in transformers' interfaces (its mask: sdpa's boolean one)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


__all__ = ["NAME", "ORACLE", "Oracle", "attention", "oracle_weights", "register"]
