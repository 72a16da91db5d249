"""MoBA, mixture of block attention (Lu et al. 2025, arXiv:2502.13189): each query attends to the blocks it routes to.

Keys are cut into blocks of ``block_size``; a query scores every complete earlier block by the dot product with the
block's mean key (the gate, in float32 as MoBA's code computes it), keeps the ``topk - 1`` best and attends to their
tokens plus its own block up to itself: ``topk`` blocks in all, counting its own (MoBA's ``moba_topk``; fla's
``parallel_moba(topk=...)`` counts the same way). The rule and the fast path are in block_selection.py.

No parameters are learned, so MoBA drops into a pretrained model (training-free) as well as into ours. Paper
defaults: block 512 (4096 in its long-context runs), top-k 3; ours are scaled to the lengths trained here.

Decoding keeps every key (a later query may route to any block) and the mean key of each complete block: a step
scores ``L / block_size`` means and reads ``topk * block_size`` keys, so its work is nearly flat in context while
its memory grows like full attention's (MoBA's own decoding falls back to dense attention: MoBA#30).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attn.attention import block_selection as bsel
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.full import dense_attention
from attn.registry import check, register_attention


@dataclass(frozen=True)
class MobaConfig:
    block_size: int = 64
    topk: int = 4  # blocks per query, its own included: topk - 1 routed blocks

    def __post_init__(self) -> None:
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(self.topk >= 1, f"topk must be >= 1 (blocks per query, its own included), got {self.topk}")


def mean_keys(blocks: torch.Tensor) -> tuple[torch.Tensor]:
    """The gate's block summary: complete blocks (B, H_kv, n, bs, D) -> their mean keys (B, H_kv, n, D)."""
    return (blocks.mean(-2),)


@register_attention("moba", config=MobaConfig)
class MobaAttention(Attention):
    """Each query attends to its own block and the topk - 1 earlier blocks whose mean key it scores highest."""

    supports_gqa = True
    supports_bidirectional = False
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="dense mask from the chosen blocks"),
        Backend("gathered", {"cpu": ALL_MODES, "cuda": ALL_MODES},
                note="gathers each query's chosen blocks (linear in length; the gate scores L/block_size means)"),
    )

    def select(self, q: torch.Tensor, k: torch.Tensor, means: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Routed blocks of each query: (idx, valid), each (B, H, Lq, topk - 1). ``means``: the complete blocks'
        mean keys when a decoding state already holds them."""
        bs = self.config.block_size
        means = mean_keys(bsel.block_view(k, bs))[0] if means is None else means  # (B, H_kv, n, D)
        return bsel.choose(q, k.shape[2], bs, self.config.topk - 1, lambda qc: bsel.grouped_scores(qc, means))

    def kept_keys(self, q, k, causal=True, **inputs):
        return bsel.selection_mask(*self.select(q, k), k.shape[2], self.config.block_size)

    def backend_reference(self, q, k, v, causal):
        mask = self.kept_keys(q, k)  # (B, H, Lq, Lk)
        B, H, Lq, Lk = mask.shape
        return dense_attention(q, k, v, mask.view(B, k.shape[1], H // k.shape[1], Lq, Lk))

    def backend_gathered(self, q, k, v, causal, means: torch.Tensor | None = None):
        with torch.no_grad():  # the routing is a fixed index set: no gradient through the gate
            idx, valid = self.select(q, k, means)
        return bsel.attend_selected(q, k, v, idx, valid, self.config.block_size)

    # -- cost ------------------------------------------------------------------------------
    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        return bsel.selected_pairs(q_len, k_len, self.config.block_size, self.config.topk - 1)

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        """The gate: 2 D per (query, earlier complete block) it scores, plus the mean pooling, one add per key
        element of each complete block (a decoding step pools at most the block its token completes: not
        counted). Training adds nothing: the routing takes no gradient."""
        bs, hkv = self.config.block_size, kv_heads or heads
        if mode == "decode":
            return 2 * batch * heads * head_dim * bsel.candidate_blocks(1, seq_len + 1, bs)
        gate = 2 * batch * heads * head_dim * bsel.candidate_blocks(seq_len, seq_len, bs)
        return gate + batch * hkv * (seq_len // bs) * bs * head_dim

    # -- decoding --------------------------------------------------------------------------
    def new_state(self, max_len: int = 0) -> bsel.SummaryCache:
        return bsel.SummaryCache(self.config.block_size, mean_keys, bsel.KVCache(capacity_hint=max_len))

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: bsel.SummaryCache) -> torch.Tensor:
        keys, values, summaries = state.append(k, v)
        means = summaries[0] if summaries else None
        if self.backend == "reference":
            return self(q, keys, values, causal=True)
        self.last_backend = "gathered"
        return self.backend_gathered(q, keys, values, True, means)


__all__ = ["MobaAttention", "MobaConfig", "mean_keys"]
