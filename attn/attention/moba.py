"""MoBA, mixture of block attention (Lu et al. 2025, arXiv:2502.13189): each query attends to the blocks it routes to.

Keys are cut into blocks of ``block_size``; a query scores every complete earlier block by the dot product with the
block's mean key (the gate, in float32 as MoBA's code computes it), keeps the ``topk - 1`` best and attends to their
tokens plus its own block up to itself: ``topk`` blocks in all, counting its own (MoBA's ``moba_topk``; fla's
``parallel_moba(topk=...)`` counts the same way). The rule, the backends and the decoding state are shared with Quest
(block_selection.py).

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
class MobaAttention(bsel.BlockSelectingAttention):
    """Each query attends to its own block and the topk - 1 earlier blocks whose mean key it scores highest."""

    @property
    def block(self) -> int:
        return self.config.block_size

    @property
    def n_select(self) -> int:
        return self.config.topk - 1

    def summarize(self, blocks: torch.Tensor) -> tuple[torch.Tensor]:
        return mean_keys(blocks)

    def score(self, q: torch.Tensor, summaries: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return bsel.grouped_scores(q, summaries[0])

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

    def selection_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """A decoding step reads the mean key of every complete block before its own, per key head."""
        return batch * kv_heads * head_dim * bsel.candidate_blocks(1, seq_len + 1, self.config.block_size)


__all__ = ["MobaAttention", "MobaConfig", "mean_keys"]
