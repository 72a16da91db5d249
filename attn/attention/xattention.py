"""XAttention (Xu et al. 2025, arXiv:2503.16428): block-sparse prefill whose blocks are scored by antidiagonal sums.

Within every ``stride`` x ``stride`` tile of the score matrix, the sum along the antidiagonal sees each tile's vertical
and slash structure at 1/stride of the cost: the tile sum ``sum_t q[i*S + S-1-t] . k[j*S + t]`` is one product of
strided copies of q (offsets reversed) and k (mit-han-lab/x-attention, ``xattn_estimate``: ``select_mode="inverse"``).
Those sums, scaled by ``1 / (sqrt(D) * stride)``, causal at the stride level (tile row i sees tile columns j <= i: the
diagonal tile whole), go through a softmax per strided query row; summing the probabilities over each block x block
square gives block scores. Per query block, the first key block and the diagonal block are always kept and counted
first, then the others in decreasing score while the sum of everything kept before a block is below ``threshold`` of
the row's total (``find_blocks_chunked``: the block that crosses the threshold is kept).

Ours pads the prompt to whole blocks with zero rows (padded keys lie after every real query, so the stride-level causal
mask hides them; padded query rows are zeroed, as the reference code does) and chooses per query head (the reference
code repeats the key heads). Paper defaults:
stride 8 or 16, threshold 0.9, block 128.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn.attention.prompt_sparse import BlockPrefillAttention
from attn.registry import check, register_attention


@dataclass(frozen=True)
class XAttentionConfig:
    block_size: int = 128
    stride: int = 8
    threshold: float = 0.9

    def __post_init__(self) -> None:
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(self.stride >= 1 and self.block_size % self.stride == 0,
              f"stride must be >= 1 and divide block_size ({self.block_size}), got {self.stride}")
        check(0.0 < self.threshold <= 1.0, f"threshold must be in (0, 1], got {self.threshold}")


def strided_scores(q: torch.Tensor, k: torch.Tensor, stride: int) -> torch.Tensor:
    """Antidiagonal sums of every stride x stride tile of q k^T: q (B, H, L, D), k (B, H_kv, L, D), L a multiple of
    stride -> (B, H, L/S, L/S) in float32 or wider, by strided copies (the fast estimate)."""
    f = torch.promote_types(q.dtype, torch.float32)
    rq = torch.cat([q[:, :, stride - 1 - t::stride] for t in range(stride)], -1).to(f)  # (B, H, L/S, S*D)
    rk = torch.cat([k[:, :, t::stride] for t in range(stride)], -1).to(f)
    g = q.shape[1] // k.shape[1]
    B, H, n, SD = rq.shape
    return (rq.reshape(B, k.shape[1], g * n, SD) @ rk.transpose(-2, -1)).reshape(B, H, n, -1)


def dense_antidiagonals(q: torch.Tensor, k: torch.Tensor, stride: int) -> torch.Tensor:
    """The same sums read off the dense score matrix (the reference): each tile flipped, its diagonal summed."""
    f = torch.promote_types(q.dtype, torch.float32)
    s = q.to(f) @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).to(f).transpose(-2, -1)  # (B, H, L, L)
    B, H, L, _ = s.shape
    n = L // stride
    tiles = s.reshape(B, H, n, stride, n, stride).flip(3)
    return tiles.diagonal(dim1=3, dim2=5).sum(-1)


def block_scores(sums: torch.Tensor, head_dim: int, stride: int, block: int, length: int) -> torch.Tensor:
    """Strided sums (B, H, n, n) -> block scores (B, H, R, R): scaled, stride-level causal, softmax per strided row
    (padded query rows zeroed), summed over each block square."""
    B, H, n, _ = sums.shape
    i = torch.arange(n, device=sums.device)
    scores = sums / (math.sqrt(head_dim) * stride)
    probs = torch.softmax(scores.masked_fill(i[None, :] > i[:, None], float("-inf")), -1)
    probs = probs * (i * stride < length)[:, None]  # strided rows made only of padding carry no weight
    per = block // stride
    R = n // per
    return probs.reshape(B, H, R, per, R, per).sum((3, 5))


def threshold_blocks(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """find_blocks_chunked, causal: (B, H, R, R) block scores -> (B, H, R, R) kept blocks. Block 0 and the diagonal
    first, then the rest in decreasing score while what is kept before each is below threshold x the row's total."""
    R = scores.shape[-1]
    r = torch.arange(R, device=scores.device)[:, None]
    c = torch.arange(R, device=scores.device)[None, :]
    forced = (c == 0) | (c == r)
    causal = c <= r
    s = scores.double().masked_fill(~causal, 0.0)
    total = s.sum(-1, keepdim=True)
    rank = torch.where(forced, s + 1e6, s).masked_fill(~causal, -1.0)  # forced first, future blocks last
    order = rank.argsort(dim=-1, descending=True, stable=True)
    before = torch.cumsum(s.gather(-1, order), -1) - s.gather(-1, order)  # kept before each, in that order
    keep_sorted = before < threshold * total
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return (keep | forced) & causal


@register_attention("xattention", config=XAttentionConfig)
class XAttention(BlockPrefillAttention):
    """Per query block, the key blocks whose antidiagonal-scored attention reaches ``threshold`` of the row."""

    @property
    def block(self) -> int:
        return self.config.block_size

    def choose(self, q: torch.Tensor, k: torch.Tensor, reference: bool) -> torch.Tensor:
        cfg, L = self.config, q.shape[2]
        pad = -L % cfg.block_size
        qp, kp = F.pad(q, (0, 0, 0, pad)), F.pad(k, (0, 0, 0, pad))
        sums = dense_antidiagonals(qp, kp, cfg.stride) if reference else strided_scores(qp, kp, cfg.stride)
        return threshold_blocks(block_scores(sums, q.shape[-1], cfg.stride, cfg.block_size, L), cfg.threshold)

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        """The strided product of a prefill: (L/S)^2 tiles of S*D products each (2 per MAC), causal half not
        skipped (a dense product); decoding chooses nothing."""
        if mode == "decode":
            return 0
        n = -(-seq_len // self.config.block_size) * self.config.block_size // self.config.stride
        return 2 * batch * heads * n * n * self.config.stride * head_dim


__all__ = ["XAttention", "XAttentionConfig", "block_scores", "strided_scores", "threshold_blocks"]
