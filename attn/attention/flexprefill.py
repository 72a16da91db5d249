"""FlexPrefill (Lai et al., ICLR 2025, arXiv:2502.20766): per head, a pattern and a budget chosen from the prompt.

The last ``block_size`` queries (the representative queries) give, per query head, the true attention over key blocks
(``a_bar``: their causal attention, averaged over them and summed per block) and a cheap estimate of it (``a_hat``: the
softmax of their mean query against each block's mean key). When the square-root Jensen-Shannon divergence of the two
is below ``tau`` the pooled estimate is trusted and the head is *query-aware*: each query block's mean query scores
every causal key block's mean key (softmax per query block), and the head keeps the highest entries of that whole
matrix whose running sum stays within ``gamma`` x the number of query blocks (bytedance/FlexPrefill
``score_cover_idx``), plus a vertical-slash set of ``min_budget`` tokens. Otherwise it is *vertical-slash*: the
representative queries' column means (verticals) and diagonal sums per query (slashes) each cover ``gamma`` of their
mass with some number of tokens; that many blocks (``tokens // block_size + 1``, within ``min_budget`` and
``max_budget``) of the block-summed lines are kept, the first key block and the diagonal always; a block is computed
when a kept column block or a kept diagonal band passes through it.

Deviations from the reference code, each small: the token-to-block division uses ``block_size`` (the code divides by
128, its default block); diagonal bands are summed from distance 0 (the code pools from the far end, which shifts the
bands when the length is not a multiple of the block). Paper defaults: gamma 0.9, tau 0.1, block 128; the released
configurations use min_budget 1024 or 512 tokens. Prompts of at most ``max(2 x block, min_budget)`` tokens are dense,
as there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn.attention.prompt_sparse import BlockPrefillAttention, causal_probs
from attn.attention.vertical_slash import line_scores, line_scores_by_diagonal
from attn.registry import check, register_attention


@dataclass(frozen=True)
class FlexPrefillConfig:
    gamma: float = 0.9
    tau: float = 0.1
    min_budget: int = 1024  # tokens (the released configurations: 1024 or 512)
    max_budget: int = 0  # tokens; 0 = no cap
    block_size: int = 128

    def __post_init__(self) -> None:
        check(0.0 < self.gamma <= 1.0, f"gamma must be in (0, 1], got {self.gamma}")
        check(0.0 <= self.tau <= 1.0, f"tau must be in [0, 1] (a square-root JS divergence), got {self.tau}")
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(self.min_budget >= 1, f"min_budget must be >= 1 token, got {self.min_budget}")
        check(self.max_budget == 0 or self.max_budget >= self.min_budget,
              f"max_budget must be 0 (no cap) or >= min_budget ({self.min_budget}), got {self.max_budget}")


def mean_blocks(x: torch.Tensor, bs: int) -> torch.Tensor:
    """(B, H, L, D) -> (B, H, n, D): each block's mean over its real tokens (the last block may be short)."""
    L = x.shape[2]
    n = -(-L // bs)
    sums = F.pad(x, (0, 0, 0, n * bs - L)).reshape(*x.shape[:2], n, bs, x.shape[-1]).sum(3)
    count = (L - torch.arange(n, device=x.device) * bs).clamp(max=bs)
    return sums / count[:, None].to(sums.dtype)


def sqrt_js(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Square-root Jensen-Shannon divergence (natural log) of distributions over the last dim."""
    m = (p + q) / 2

    def kl(a: torch.Tensor) -> torch.Tensor:
        return torch.where(a > 0, a * (a.clamp_min(1e-30).log() - m.clamp_min(1e-30).log()), 0).sum(-1)

    return ((kl(p) + kl(q)) / 2).clamp(min=0).sqrt()


def cover_count(scores: torch.Tensor, gamma: float) -> torch.Tensor:
    """Entries of the last dim, largest first, whose running sum stays within gamma, plus one (score_cover_topk)."""
    s = scores.sort(-1, descending=True).values.cumsum(-1)
    return (s <= gamma).sum(-1) + 1


def band_blocks(slash: torch.Tensor, bs: int, n: int) -> torch.Tensor:
    """Per-token distance sums (B, H, L) -> per block distance (B, H, n): distances [c*bs, (c+1)*bs) summed."""
    L = slash.shape[-1]
    return F.pad(slash, (0, n * bs - L)).reshape(*slash.shape[:2], n, bs).sum(-1)


@register_attention("flexprefill", config=FlexPrefillConfig)
class FlexPrefillAttention(BlockPrefillAttention):
    """Per head: query-aware blocks (when its pooled estimate is trusted) or vertical-slash blocks, to ``gamma``."""

    @property
    def block(self) -> int:
        return self.config.block_size

    def dense_below(self, length: int) -> bool:
        bs = self.config.block_size
        return length <= max(2 * bs, -(-self.config.min_budget // bs) * bs)

    def choose(self, q: torch.Tensor, k: torch.Tensor, reference: bool) -> torch.Tensor:
        cfg, L, D = self.config, q.shape[2], q.shape[-1]
        bs = cfg.block_size
        n = -(-L // bs)
        m = min(bs, L)
        if reference:
            vertical, slash = line_scores_by_diagonal(causal_probs(q, k)[:, :, L - m:], L)
        else:
            vertical, slash = line_scores(causal_probs(q, k, slice(L - m, L)), L)
        vertical, slash = vertical / m, slash / m  # means over the representative queries: each sums to 1
        g = q.shape[1] // k.shape[1]
        f = vertical.dtype
        kbar = mean_blocks(k.to(f), bs).repeat_interleave(g, 1)  # (B, H, n, D)
        a_bar = band_blocks(vertical, bs, n)  # the true share of each key block
        a_hat = torch.softmax((q[:, :, L - m:].to(f).mean(2, keepdim=True) @ kbar.transpose(-2, -1)).squeeze(2)
                              / math.sqrt(D), -1)
        query_aware = sqrt_js(a_hat, a_bar) < cfg.tau  # (B, H)
        lo = -(-cfg.min_budget // bs)
        hi = n if cfg.max_budget == 0 else min(n, -(-cfg.max_budget // bs))
        nv = (cover_count(vertical, cfg.gamma) // bs + 1).clamp(lo, hi)
        ns = (cover_count(slash, cfg.gamma) // bs + 1).clamp(lo, hi)
        nv, ns = torch.where(query_aware, min(lo, hi), nv), torch.where(query_aware, min(lo, hi), ns)
        layout = _lines(band_blocks(vertical, bs, n), band_blocks(slash, bs, n), nv, ns)
        if bool(query_aware.any()):
            layout |= _query_aware(mean_blocks(q.to(f), bs), kbar, cfg.gamma, D) & query_aware[..., None, None]
        return layout

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        """The representative queries against every key, and the pooled block matrix (2 per MAC); decoding
        chooses nothing."""
        if mode == "decode":
            return 0
        bs = self.config.block_size
        n = -(-seq_len // bs)
        return 2 * batch * heads * head_dim * (min(bs, seq_len) * seq_len + n * n)


def _lines(vertical: torch.Tensor, bands: torch.Tensor, nv: torch.Tensor, ns: torch.Tensor) -> torch.Tensor:
    """Block-summed columns and distance bands (B, H, n), how many of each to keep (B, H) -> (B, H, n, n) layout:
    block (r, c) when column block c or band r - c is kept; the first column block and band 0 always."""
    n = vertical.shape[-1]
    vertical, bands = vertical.clone(), bands.clone()
    vertical[..., 0], bands[..., 0] = float("inf"), float("inf")
    rank = torch.arange(n, device=vertical.device)
    keep_v = torch.zeros_like(vertical, dtype=torch.bool).scatter(
        -1, vertical.argsort(dim=-1, descending=True, stable=True), rank < nv[..., None])
    keep_s = torch.zeros_like(bands, dtype=torch.bool).scatter(
        -1, bands.argsort(dim=-1, descending=True, stable=True), rank < ns[..., None])
    r, c = rank[:, None], rank[None, :]
    band = keep_s.gather(-1, (r - c).clamp(min=0).flatten().expand(*keep_s.shape[:2], -1)).view(*keep_s.shape[:2], n, n)
    return (keep_v[..., None, :] | band) & (c <= r)


def _query_aware(qbar: torch.Tensor, kbar: torch.Tensor, gamma: float, head_dim: int) -> torch.Tensor:
    """Pooled queries and keys (B, H, n, D) -> the entries of the block-causal pooled attention (softmax per query
    block) that cover ``gamma`` x n of its total, largest first, over the head's whole matrix -> (B, H, n, n)."""
    n = qbar.shape[2]
    r = torch.arange(n, device=qbar.device)
    scores = (qbar @ kbar.transpose(-2, -1)) / math.sqrt(head_dim)
    probs = torch.softmax(scores.masked_fill(r[None, :] > r[:, None], float("-inf")), -1).flatten(2)
    order = probs.argsort(dim=-1, descending=True, stable=True)
    keep = probs.gather(-1, order).cumsum(-1) <= gamma * n
    return torch.zeros_like(keep).scatter(-1, order, keep).view(*qbar.shape[:2], n, n)


__all__ = ["FlexPrefillAttention", "FlexPrefillConfig", "cover_count", "mean_blocks", "sqrt_js"]
