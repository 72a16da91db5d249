"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", arXiv 2405.04434, sec. 2.1).

Keys and values come from one low-rank latent per token, c_t = RMSNorm(W_DKV x_t) (``kv_lora_rank`` numbers),
expanded per head, [k_nope; v] = W_UKV c_t, plus a decoupled RoPE key k_rope = RoPE(W_KR x_t) (``qk_rope_head_dim``)
shared by every head. Queries are [q_nope; RoPE(q_rope)], from their own low rank (``q_lora_rank``) or directly.
Scores scale by (nope + rope)^-1/2. Decoding caches only (c_t, k_rope): 512 + 64 = 576 numbers a token at
DeepSeek-V3's sizes, against 2 H_kv D for grouped-query attention, and scores in the *absorbed* form: W_UK folded
into the query (q_nope W_UK . c_t = q_nope . k_nope), W_UV applied once to the softmax-weighted latents.

MLA owns its projections, so it is a *layer-level* variant: ``layer`` (:class:`MLALayer`) maps the layer input to
its output and declares its cache, and the backbone builds it in place of its q/k/v projection (attn/model.py,
``Block``). Its attention over the expanded heads is plain causal softmax (q, k: nope + rope channels, v: its own),
the ``reference`` / ``sdpa`` backends of this class, which the expanded forward runs; an op-scope call on q, k, v of
one head dim is full attention, so the op-scope harness refuses it (the layer is what differs).

Sizes default from the backbone's head dim D at DeepSeek-V3's ratios (head dim 128, latent 512, rope 64):
kv_lora_rank 4 D, qk_rope_head_dim D / 2, qk_nope_head_dim = v_head_dim = D; q_lora_rank 0 (queries projected
directly, as DeepSeek-V2-Lite). The projections have no bias, as DeepSeek's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attn.attention import gqa
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.masks import causal_mask
from attn.attention.short_conv import causal_conv
from attn.attention.state import KVCache
from attn.registry import check, register_attention


@dataclass(frozen=True)
class MLAConfig:
    kv_lora_rank: int | None = None  # the cached latent; None = 4 x head dim (V3: 512 at 128)
    q_lora_rank: int = 0  # queries' low rank; 0 = one direct projection (V2-Lite; V3: 1536)
    qk_rope_head_dim: int | None = None  # the shared RoPE key; None = head dim / 2 (V3: 64 at 128)
    qk_nope_head_dim: int | None = None  # None = head dim
    v_head_dim: int | None = None  # None = head dim

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            check(value is None or value >= 1, f"{name} must be >= 1 (or None: from the head dim), got {value}")
        check(self.q_lora_rank >= 0, f"q_lora_rank must be >= 0 (0 = no query compression), got {self.q_lora_rank}")

    def dims(self, head_dim: int) -> tuple[int, int, int, int]:
        """(kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim) for a backbone of ``head_dim``."""
        pick = lambda v, d: d if v is None else v  # noqa: E731
        return (pick(self.kv_lora_rank, 4 * head_dim), pick(self.qk_rope_head_dim, max(1, head_dim // 2)),
                pick(self.qk_nope_head_dim, head_dim), pick(self.v_head_dim, head_dim))


class LatentCache(KVCache):
    """MLA's decoding state: the latent c_t (in ``k``) and the shared RoPE key (in ``v``) of every past token, one
    "head" each: (B, 1, L, kv_lora_rank) and (B, 1, L, qk_rope_head_dim)."""

    def nbytes(self) -> int:
        if self.k is None:
            return 0
        per_token = self.k.shape[3] * self.k.element_size() + self.v.shape[3] * self.v.element_size()
        return self.k.shape[0] * self.length * per_token


class MLALayer(nn.Module):
    """The MLA layer of one backbone block: (B, T, d_model) -> (B, T, d_model), expanded in a forward, absorbed when
    decoding (``state``: a :class:`LatentCache`)."""

    def __init__(self, config: Any, position: nn.Module, name: str, params: dict[str, Any], backend: str,
                 rotary: Callable[[int], nn.Module]):
        """``config``: the backbone's; ``rotary(head_dim)``: its position method at a head dim (RoPE acts on the rope
        channels only)."""
        from attn.registry import build_attention

        super().__init__()
        self.attn = build_attention(name, backend=backend, **params)
        self.n_heads, self.causal = config.n_heads, config.causal
        r, rope, nope, dv = self.attn.config.dims(config.head_dim)
        self.rank, self.rope_dim, self.nope, self.v_dim = r, rope, nope, dv
        H, d, qk = config.n_heads, config.d_model, nope + rope
        q_rank = self.attn.config.q_lora_rank
        self.q_down = nn.Linear(d, q_rank, bias=False) if q_rank else None
        self.q_norm = nn.RMSNorm(q_rank) if q_rank else None
        self.q_proj = nn.Linear(q_rank or d, H * qk, bias=False)
        self.kv_down = nn.Linear(d, r + rope, bias=False)  # W_DKV and W_KR, one matmul
        self.kv_norm = nn.RMSNorm(r)
        self.kv_up = nn.Linear(r, H * (nope + dv), bias=False)  # W_UK and W_UV, per head
        self.proj = nn.Linear(H * dv, d, bias=False)
        # the backbone's short convolution (Zoology's, on q/k/v) on the query and latent projections, where it has one
        width = H * qk + r + rope
        self.conv = nn.Conv1d(width, width, config.short_conv, groups=width, bias=False) if config.short_conv else None
        self.position = rotary(rope)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, start: int, seq_len: int, state: LatentCache | None = None,
                documents: torch.Tensor | None = None, conv: Any = None) -> torch.Tensor:
        B, T, _ = x.shape
        H = self.n_heads
        q = self.q_proj(self.q_norm(self.q_down(x)) if self.q_down is not None else x)
        kv = self.kv_down(x)
        if self.conv is not None:
            check(documents is None, "short_conv would mix packed documents: run them without short_conv")
            q, kv = causal_conv(self.conv.weight, torch.cat([q, kv], -1), conv).split([q.shape[-1], kv.shape[-1]], -1)
        q_nope, q_rope = q.reshape(B, T, H, -1).transpose(1, 2).split([self.nope, self.rope_dim], -1)
        q_rope = self.position.rotate(q_rope, start, seq_len)
        c, k_rope = kv.split([self.rank, self.rope_dim], -1)
        c = self.kv_norm(c)[:, None]  # (B, 1, T, r)
        k_rope = self.position.rotate(k_rope[:, None], start, seq_len)  # (B, 1, T, rope)
        if state is None:
            y = self.expanded(q_nope, q_rope, c, k_rope, documents)
        else:
            check(documents is None, "decoding packed documents is not supported: start a new state per document")
            cached_c, cached_rope = state.append(c, k_rope)
            # one token: the absorbed form; a prefill chunk: expanded (an (T, L) score matrix per head either way,
            # but the expanded one runs fused and never holds it)
            y = (self.absorbed(q_nope, q_rope, cached_c, cached_rope) if T == 1
                 else self.expanded(q_nope, q_rope, cached_c, cached_rope))
        return self.dropout(self.proj(y.transpose(1, 2).reshape(B, T, -1)))

    def expanded(self, q_nope, q_rope, c, k_rope, documents=None):
        """Every head's keys and values made from the latents c (B, 1, L, r), then softmax attention (the training and
        prefill form; the queries are the last T positions)."""
        B, H, L = q_nope.shape[0], self.n_heads, c.shape[2]
        k_nope, v = self.kv_up(c[:, 0]).view(B, L, H, -1).transpose(1, 2).split([self.nope, self.v_dim], -1)
        q = torch.cat([q_nope, q_rope], -1)
        k = torch.cat([k_nope, k_rope.expand(B, H, L, self.rope_dim)], -1)
        return self.attn(q, k, v, causal=self.causal, documents=documents)

    def absorbed(self, q_nope, q_rope, c, k_rope):
        """Scores against the cached latents with W_UK folded into the queries, W_UV after the softmax: no per-head
        key or value is made. q: (B, H, T, .), c: (B, 1, L, r), k_rope: (B, 1, L, rope) -> (B, H, T, v_head_dim).
        Every head reads the same latents, so the heads are rows of one product against the cache (FlashMLA's view:
        absorbed MLA is multi-query attention); a per-head product would copy the cache H times a step."""
        B, H, T = q_nope.shape[:3]
        L = c.shape[2]
        w = self.kv_up.weight.view(H, self.nope + self.v_dim, self.rank)
        w_uk, w_uv = w[:, :self.nope], w[:, self.nope:]  # (H, nope, r), (H, v, r)
        c, k_rope = c[:, 0], k_rope[:, 0]  # (B, L, r), (B, L, rope)
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk).reshape(B, H * T, self.rank)
        scores = (q_latent @ c.transpose(1, 2) + q_rope.reshape(B, H * T, self.rope_dim) @ k_rope.transpose(1, 2))
        scores = (scores * (self.nope + self.rope_dim) ** -0.5).view(B, H, T, L)
        if T > 1:  # a prefill chunk: its queries are the last T positions
            scores = scores.masked_fill(~causal_mask(T, L, scores.device), -torch.inf)
        self.attn.last_backend = "absorbed"
        latent = (scores.softmax(-1).view(B, H * T, L) @ c).view(B, H, T, self.rank)
        return torch.einsum("bhtr,hvr->bhtv", latent, w_uv)

    def use_position(self, rotary: Callable[[int], nn.Module]) -> None:
        """Take the backbone's new position method (a rescaled RoPE at evaluation): ``rotary`` as at build."""
        self.position = rotary(self.rope_dim)

    def cache_numbers_per_token(self) -> int:
        """Numbers a decoding state holds per token per layer: the latent and the shared RoPE key."""
        return self.rank + self.rope_dim


@register_attention("mla", config=MLAConfig)
class MultiHeadLatentAttention(Attention):
    """DeepSeek's multi-head latent attention: keys and values from a cached low-rank latent (layer-level variant)."""

    layer = MLALayer  # the backbone builds this in place of its own projections
    supports_gqa = True  # the layer expands every head's own keys; an op call with fewer key heads repeats them here
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="dense softmax over the expanded heads"),
        Backend("sdpa", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="torch SDPA over the expanded heads"),
    )

    def backend_reference(self, q, k, v, causal):
        k, v = gqa.repeat_kv(k, gqa.kv_groups(q, k)), gqa.repeat_kv(v, gqa.kv_groups(q, k))
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), -torch.inf)
        return scores.softmax(-1) @ v

    def backend_sdpa(self, q, k, v, causal):
        k, v = gqa.repeat_kv(k, gqa.kv_groups(q, k)), gqa.repeat_kv(v, gqa.kv_groups(q, k))
        # SDPA's fused CPU kernel wants one head dim for q, k and v, and otherwise falls back to the math path that
        # holds every (L, L) score matrix (17 GB at 32K, 4 heads): pad v with zeros to q's dim and cut the output, as
        # DeepSeek-V3's transformers code pads values for FlashAttention-2
        dv = v.shape[-1]
        if dv < q.shape[-1]:
            v = F.pad(v, (0, q.shape[-1] - dv))
        if causal and q.shape[2] != k.shape[2]:  # SDPA's is_causal is top-left: give the bottom-right mask
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(q.shape[2], k.shape[2], q.device))
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out[..., :dv]

    def new_state(self, max_len: int = 0) -> LatentCache:
        return LatentCache(capacity_hint=max_len)

    def mode_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = True,
                   kv_heads: int | None = None) -> int:
        """The attention of one MLA layer (its projections are nn.Linear, counted by the scope), 2 per MAC: forward
        over the expanded heads, q.k over nope + rope channels and p.v over v_head_dim, on the visible pairs; a decode
        step in the absorbed form, per head against the L + 1 cached tokens: q.c over the latent and q.k_rope, then
        p.c over the latent (W_UK's and W_UV's products are the layer's kv_up weights, once per token)."""
        r, rope, nope, dv = self.config.dims(head_dim)
        if mode == "decode":
            return 2 * batch * heads * (seq_len + 1) * (2 * r + rope)
        pairs = self.pairs(seq_len, seq_len, causal)
        forward = 2 * batch * heads * pairs * (nope + rope + dv)
        return 3 * forward if mode == "train" else forward

    def decode_state_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """The latent cache, one "head": every cached token's latent and shared RoPE key read, the new token's
        written."""
        r, rope, _, _ = self.config.dims(head_dim)
        return batch * (seq_len + 1) * (r + rope)


__all__ = ["LatentCache", "MLAConfig", "MLALayer", "MultiHeadLatentAttention"]
