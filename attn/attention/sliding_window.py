"""Sliding-window (local) attention: each query sees only the ``window`` nearest keys.

The local attention of Longformer (Beltagy et al. 2020, https://arxiv.org/abs/2004.05150) and
Mistral 7B (Jiang et al. 2023, https://arxiv.org/abs/2310.06825): O(L * w) work instead of O(L^2),
and a decoding cache bounded by the window (Mistral's rolling buffer cache).

Convention (DESIGN.md): causal, query i sees key j iff ``i - w < j <= i`` (w keys, itself included;
bottom-right aligned when Lq < Lk); bidirectional, ``|i - j| < w``.

Attention sinks (StreamingLLM, Xiao et al. 2023, https://arxiv.org/abs/2309.17453): with ``sinks = s`` the
first s tokens stay visible too (``j < s``, and ``j <= i`` when causal), so a model that leans on its first
tokens keeps working past the window; decoding keeps those s tokens beside the rolling window (bounded memory).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from attn.attention import flex, gqa, score_terms
from attn.attention.base import ALL_MODES, Attention, Backend, UnsupportedBackend, modes
from attn.attention.blocked_window import blocked_attention
from attn.attention.full import XFORMERS, check_softcap, dense_attention, xformers_attention
from attn.attention.masks import causal_mask, visible_pairs
from attn.attention.ragged import RaggedRing
from attn.attention.rolling_cache import RollingKVCache
from attn.attention.sink_logit import check_heads, init_sink_logits, needs_grad, with_sink_column
from attn.attention.window_split import split_window_attention
from attn.registry import check, register_attention

FLEX_BLOCK = 128  # FlexAttention's default tile; the BlockMask layout is built at this granularity
# Flex compiles one kernel per shape (seconds) and works in whole tiles: below FLEX_MIN_LEN (2 tiles) queries
# `auto` runs `blocked` instead, so evaluating short or varying lengths never waits on a compile.


@dataclass(frozen=True)
class SlidingWindowConfig:
    """``window``: keys each query sees (itself included, causal) -- Mistral 7B uses 4096. ``sinks``: first tokens
    every query also sees (StreamingLLM keeps 4; 0 = plain sliding window)."""

    window: int = 256
    sinks: int = 0
    softcap: float = 0.0  # logit softcapping c * tanh(s / c) (Gemma 2: 50); 0 = off
    dilation: int = 1  # d > 1: the w keys are every d-th position, i - m d for m < w (Longformer's dilated window)
    alibi: bool = False  # ALiBi's linear distance bias (alibi.py); the position method `alibi` sets it
    sink_logit: bool = False  # a learnable logit per query head in every softmax (gpt-oss's s_aux; sink_logit.py)
    heads: int = 0  # query heads: the sink logits are made at construction (0: at the first call)

    def __post_init__(self):
        check(self.window >= 1, f"window must be >= 1, got {self.window}")
        check(self.sinks >= 0, f"sinks must be >= 0, got {self.sinks}")
        check_softcap(self.softcap)
        check(self.dilation >= 1, f"dilation must be >= 1, got {self.dilation}")
        check(self.dilation == 1 or self.sinks == 0, "sinks and dilation > 1 cannot be combined (pick one)")
        check_heads(self.heads, self.sink_logit)


def window_mask(q_len: int, k_len: int, window: int, causal: bool, sinks: int = 0,
                device: torch.device | str = "cpu", dilation: int = 1) -> torch.Tensor:
    """Dense (q_len, k_len) bool mask of the rule above, True = visible (reference and tests only)."""
    if dilation > 1:  # distance a multiple of d, fewer than w steps away
        d = torch.arange(q_len, device=device)[:, None] + (k_len - q_len) - torch.arange(k_len, device=device)[None, :]
        d = d if causal else d.abs()
        return (d >= 0) & (d < window * dilation) & (d % dilation == 0)
    mask = causal_mask(q_len, k_len, device, window=window, causal=causal)
    if sinks:
        mask = mask | (causal_mask(q_len, k_len, device, causal=causal) & (torch.arange(k_len, device=device) < sinks))
    return mask


def by_residue(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dilation: int, attend) -> torch.Tensor:
    """A dilated window as ``dilation`` plain ones: positions congruent mod d see each other at steps of d, so each
    residue class is a plain sliding window over its own subsequence (queries still the last of their class: the
    bottom-right alignment holds per class). ``attend(q_c, k_c, v_c)`` runs any backend; exact, differentiable."""
    Lq, Lk = q.shape[2], k.shape[2]
    off = Lk - Lq
    parts, rows = [], []
    for c in range(min(dilation, Lk)):
        first = (c - off) % dilation  # first query row whose absolute position is congruent to c
        if first >= Lq:
            continue
        parts.append(attend(q[:, :, first::dilation], k[:, :, c::dilation], v[:, :, c::dilation]))
        rows.append(torch.arange(first, Lq, dilation, device=q.device))
    return torch.cat(parts, 2)[:, :, torch.argsort(torch.cat(rows))]


def residue_lengths(q_len: int, k_len: int, dilation: int) -> list[tuple[int, int]]:
    """(queries, keys) of each residue class of :func:`by_residue`."""
    off = k_len - q_len
    out = []
    for c in range(min(dilation, k_len)):
        first = (c - off) % dilation
        if first < q_len:
            out.append((len(range(first, q_len, dilation)), len(range(c, k_len, dilation))))
    return out


def sink_pairs(q_len: int, k_len: int, window: int, causal: bool, sinks: int) -> int:
    """Pairs the sinks add outside the window, in closed form (O(q_len), no mask): for query position p,
    sink keys ``j <= p - w`` (and, bidirectional, ``j >= p + w``)."""
    if not sinks:
        return 0
    p = torch.arange(k_len - q_len, k_len, dtype=torch.int64)
    s = min(sinks, k_len)
    below = (p - window + 1).clamp(min=0, max=s)
    above = 0 if causal else (s - (p + window)).clamp(min=0)
    return int((below + above).sum())


# -- flex: BlockMask straight from the band's block layout ---------------------------------------

def band_block_layout(q_len: int, k_len: int, window: int, causal: bool,
                      block: int = FLEX_BLOCK, sinks: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) bool (nq, nk) layouts of the window band, without touching the L x L mask.

    A block is ``full`` when every pair in it is visible and it lies wholly inside both lengths;
    blocks that are cut by the band's edge or touch a padded tail are ``partial`` (masked exactly).
    """
    nq, nk = -(-q_len // block), -(-k_len // block)
    offset = k_len - q_len  # query row r is absolute position r + offset (bottom-right aligned)
    qb = torch.arange(nq)[:, None]
    kb = torch.arange(nk)[None, :]
    # Range of (query position - key position) over the block pair.
    d_lo = qb * block + offset - (kb * block + block - 1)
    d_hi = qb * block + block - 1 + offset - kb * block
    lo, hi = (0, window - 1) if causal else (-(window - 1), window - 1)
    any_visible = (d_hi >= lo) & (d_lo <= hi)
    inside = (d_lo >= lo) & (d_hi <= hi)
    whole = ((qb + 1) * block <= q_len) & ((kb + 1) * block <= k_len)  # no padded rows or columns
    full = any_visible & inside & whole
    if sinks:  # the key blocks holding sink tokens: seen by every query block (causal: not before them)
        any_visible = any_visible | ((kb * block < sinks) & ((d_hi >= 0) if causal else True))
    return any_visible & ~full, full


def band_mask_mod(q_len: int, k_len: int, window: int, causal: bool, device: str = "cpu", sinks: int = 0) -> flex.MaskMod:
    """Exact per-pair rule for partial blocks; excludes padded keys (k >= k_len).

    The numbers live in captured tensors, not Python constants, so every window, direction and
    offset at one shape shares one compiled kernel instead of recompiling (seconds each).
    """
    as_t = lambda x: torch.tensor(x, device=device)
    offset, k_end, w, s = as_t(k_len - q_len), as_t(k_len), as_t(window), as_t(sinks)
    lowest = as_t(0 if causal else 1 - window)  # smallest visible q - k
    sink_lowest = as_t(0 if causal else -k_len)  # a sink is never seen before its position when causal

    def sliding_window_mask(b, h, q_idx, kv_idx):
        d = q_idx + offset - kv_idx
        return (((d >= lowest) & (d < w)) | ((kv_idx < s) & (d >= sink_lowest))) & (kv_idx < k_end)

    sliding_window_mask.__name__ = f"sliding_window_{window}_{'causal' if causal else 'bidirectional'}"
    return sliding_window_mask


@functools.lru_cache(maxsize=32)
def band_block_mask(q_len: int, k_len: int, window: int, causal: bool, device: str, sinks: int = 0,
                    sink_key: bool = False) -> flex.BlockMask:
    """Cached BlockMask of the band (and sink columns); O(nq * nk) to build, never O(L^2). ``sink_key``: one more key
    (position k_len) every query sees, the sink logit's."""
    partial, full = band_block_layout(q_len, k_len, window, causal, sinks=sinks)
    mask_mod = band_mask_mod(q_len, k_len, window, causal, device, sinks)
    if sink_key:
        partial, full, mask_mod = with_sink_column(partial, full, FLEX_BLOCK, k_len, mask_mod, device)
    mask = flex.block_mask_from_layout(partial, full, FLEX_BLOCK, q_len, k_len + sink_key, mask_mod)
    return mask.to(device)


# xformers' local masks run only on its FlashAttention kernels, which take bf16/fp16: the fp32
# CUTLASS forward has no bidirectional local mask, and its backward has the causal one disabled
# upstream ("infs/nans"). Declaring the dtypes makes an fp32 request a recorded refusal.
XFORMERS_LOCAL = dataclasses.replace(XFORMERS, dtypes=(torch.bfloat16, torch.float16),
                                     note="xformers.ops.memory_efficient_attention, local mask (FlashAttention kernels)")


SPLIT_MIN_WINDOW = 1024  # from this window on, auto trains with `split` on CPU (measured: see auto_order)


# -- the variant --------------------------------------------------------------------------------

@register_attention("sliding_window", config=SlidingWindowConfig)
class SlidingWindowAttention(Attention):
    """Local attention over the last ``window`` keys (Longformer / Mistral style); exact, O(L * w)."""

    supports_gqa = True

    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="dense windowed mask + explicit softmax"),
        Backend(
            "flex",
            {"cpu": modes("forward"), "cuda": modes("forward", "backward")},  # Flex has no CPU backward
            dtypes=(torch.float32, torch.bfloat16, torch.float16),
            requires=flex.flex_unavailable,
            note="compiled FlexAttention, BlockMask from the band's block layout",
        ),
        Backend("blocked", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="query chunks x unfolded key spans, SDPA per chunk"),
        Backend("split", {"cpu": modes("forward", "backward")}, dtypes=(torch.float32, torch.float64, torch.bfloat16),
                note="chunks of w - 1 queries: two causal flash calls (own chunk, the one before reversed) merged by "
                     "log-sum-exp, with a custom backward; plain causal windows"),
        XFORMERS_LOCAL,
    )
    # Forward on the 2-core development CPU (AMD EPYC, quiet): compiled flex 1.5-1.9x faster than
    # blocked at 4K-32K (16K: 83 vs 141 ms). Command: attn-bench sweep --config results/targets-cpu.toml
    # (results/targets-cpu.jsonl). The order is the machine's: an earlier 2-core machine with half
    # the matmul peak had blocked 1.35x faster at 16K (301 vs 405 ms). Below FLEX_MIN_LEN auto runs
    # blocked anyway (no compile for short inputs). CUDA: not measured yet; declaration order.
    # Training on the same CPU, B=1 H=8 D=64 fp32 (attn-bench sweep --config results/kernels-cpu.toml): at w=256
    # blocked beats split (452 against 500 ms at 16K, 115 against 141 at 4K); at w=1024 split wins (1243 against 1426
    # at 16K, 301 against 339 at 4K): blocked's spans score 1.5 w keys a query, split's causal parts w, while split's
    # fixed cost (reversed copies, the merge) weighs more at small w. So auto trains with split from SPLIT_MIN_WINDOW
    # (auto_candidates), with blocked below it (declaration order).
    auto_order = {"cpu/forward": ("flex", "blocked")}

    def __init__(self, config: SlidingWindowConfig, backend: str = "auto"):
        super().__init__(config, backend)
        init_sink_logits(self, config.sink_logit, config.heads)

    def mode_of(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        """As for every variant, except that a call whose sink logits need a gradient is a backward call."""
        return "backward" if needs_grad(self) else super().mode_of(q, k, v)

    @property
    def window(self) -> int:
        return self.config.window

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        name = super().select_backend(device, dtype, mode)
        if name == "flex" and self.backend == "auto" and self.short_for_flex():
            return "blocked"  # runs wherever flex does, with no compile
        return name

    def auto_candidates(self, device: str, mode: str) -> list[Backend]:
        """The measured order, except that CPU training tries ``split`` first from ``SPLIT_MIN_WINDOW`` keys on (the
        crossover measured beside ``auto_order``)."""
        order = super().auto_candidates(device, mode)
        if device == "cpu" and mode == "backward" and self.window >= SPLIT_MIN_WINDOW:
            order.sort(key=lambda b: b.name != "split")
        return order

    @property
    def sinks(self) -> int:
        return self.config.sinks

    def kept_keys(self, q, k, causal=True, **inputs):
        mask = window_mask(q.shape[2], k.shape[2], self.window, causal, self.sinks, q.device, self.config.dilation)
        return mask.expand(q.shape[0], q.shape[1], *mask.shape)

    def backend_reference(self, q, k, v, causal):
        mask = window_mask(q.shape[2], k.shape[2], self.window, causal, self.sinks, q.device, self.config.dilation)
        pos = torch.arange(k.shape[2], device=q.device)  # queries are the last Lq positions
        terms = score_terms.reference_terms(self, q, pos[k.shape[2] - q.shape[2]:], pos)
        return dense_attention(q, k, v, mask, softcap=self.config.softcap, **terms)

    def _per_class(self, q, k, v, causal, plain) -> torch.Tensor:
        """``plain(q, k, v, causal, slopes)``, or with dilation d > 1 run on each residue class (:func:`by_residue`),
        whose neighbours are d positions apart: ALiBi's slopes times d there."""
        slopes, d = score_terms.slopes_for(self, q), self.config.dilation
        if d == 1:
            return plain(q, k, v, causal, slopes)
        slopes = None if slopes is None else slopes * d
        return by_residue(q, k, v, d, lambda qc, kc, vc: plain(qc, kc, vc, causal, slopes))

    def backend_flex(self, q, k, v, causal):
        return self._per_class(q, k, v, causal, self._flex)

    def backend_blocked(self, q, k, v, causal):
        return self._per_class(q, k, v, causal, self._blocked)

    def backend_split(self, q, k, v, causal):
        """Plain causal windows with as many queries as keys (a prompt, a training step); under ``auto`` anything
        else runs ``blocked``, chosen by the same dispatch (window_split.py)."""
        plain = not (self.sinks or self.config.softcap or self.config.alibi or self.config.sink_logit)
        if causal and plain and q.shape[2] == k.shape[2]:
            return self._per_class(q, k, v, causal, self._split)
        if self.backend != "auto":
            raise UnsupportedBackend("split runs plain causal windows (no sinks, softcap, ALiBi or sink logit) with "
                                     "as many queries as keys")
        self.last_backend = "blocked"
        return self.backend_blocked(q, k, v, causal)

    def _split(self, q, k, v, causal, slopes):
        if q.shape[2] != k.shape[2]:  # a residue class of a dilated window with one key more than queries
            return self._blocked(q, k, v, causal, slopes)
        return split_window_attention(q, k, v, self.window)

    def backend_xformers(self, q, k, v, causal):
        if self.sinks or self.config.softcap or self.config.alibi or self.config.sink_logit:
            raise UnsupportedBackend("xformers has no local mask with sink tokens, no softcap, and here no ALiBi bias "
                                     "and no sink logit")
        return self._per_class(q, k, v, causal, lambda q, k, v, c, _: xformers_attention(q, k, v, c, window=self.window))

    def _flex(self, q, k, v, causal, slopes):
        sink = score_terms.sink_for(self, q)
        block_mask = band_block_mask(q.shape[2], k.shape[2], self.window, causal, str(q.device), self.sinks,
                                     sink is not None)
        return score_terms.flex_attention(q, k, v, block_mask, self.config.softcap, slopes, sink)

    def _blocked(self, q, k, v, causal, slopes):
        return blocked_attention(q, k, v, self.window, causal, sinks=self.sinks, softcap=self.config.softcap,
                                 slopes=slopes, sink=score_terms.sink_for(self, q))

    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        if self.config.dilation > 1:
            return sum(visible_pairs(nq, nk, causal, window=self.window)
                       for nq, nk in residue_lengths(q_len, k_len, self.config.dilation))
        return visible_pairs(q_len, k_len, causal, window=self.window) + sink_pairs(q_len, k_len, self.window, causal,
                                                                                   self.sinks)

    # -- incremental decoding -----------------------------------------------------------
    def new_state(self, max_len: int = 0) -> RollingKVCache:
        return RollingKVCache(keep=(self.window - 1) * self.config.dilation, sinks=self.sinks)

    def ragged_state(self, states: list[RollingKVCache], step_tokens: int = 1) -> RaggedRing:
        """A plain window decoding one token a step: the sequences' rings side by side, each writing its own slot."""
        cfg = self.config
        if step_tokens != 1 or self.sinks or cfg.dilation > 1 or cfg.alibi or cfg.softcap or cfg.sink_logit:
            raise UnsupportedBackend("ragged decoding is built for a plain window (no sinks, dilation, ALiBi, softcap or "
                                     "sink logit) taking one token a step")
        return RaggedRing.joined(states)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: RollingKVCache) -> torch.Tensor:
        """q, k, v: (B, H, T, D) new tokens -> (B, H, T, D), attending to the cache and themselves."""
        if q.shape[2] == 1 and self.backend in ("auto", "blocked"):
            # One token sees exactly the ring after its own write (the last w tokens, itself included), in any
            # order, plus the sinks the ring no longer holds: one in-place write and one fused SDPA call over
            # <= w + sinks keys -- what `blocked` computes for one query, without the mask or the dispatch.
            state.write(k, v)
            keys, values = state.window()
            q_pos = k_pos = None  # positions: ALiBi's bias needs them (the ring is out of order)
            if self.config.alibi:
                q_pos, k_pos = torch.full((1,), state.length - 1, device=q.device), state.window_positions()
            if self.config.dilation > 1:  # every d-th position back from the new token (no sinks with dilation)
                d, p = self.config.dilation, state.length - 1
                k_pos = p - torch.arange(min(self.window, p // d + 1), device=q.device) * d
                keys, values = state.k[:, :, k_pos % state.capacity], state.v[:, :, k_pos % state.capacity]
            self.last_backend = "blocked"
            return self._attend(q, keys, values, None, q_pos, k_pos)
        if self.sinks and state.length:  # a prompt (empty state) goes through the backends below, sinks and all
            return self._step_with_sinks(q, k, v, state)
        keys, values = state.append(k, v)  # (B, H, cached + T, D); queries are the last T
        # A step is decoding even when the cache is still empty: never compile Flex for one token.
        mode = self.mode_of(q, keys, values)
        name = self.select_backend(q.device.type, q.dtype, "decode" if mode == "forward" else mode)
        self.last_backend = name
        return getattr(self, f"backend_{name}")(q, keys, values, True)

    def _step_with_sinks(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: RollingKVCache) -> torch.Tensor:
        """Several new tokens with sinks: the evicted sinks, the cached window and the new tokens, masked by position."""
        start, T = state.length, q.shape[2]
        extra = min(self.sinks, start - state.cached)  # sinks before the first cached token
        sink_k = state.sink_k[:, :, :extra] if extra else None
        sink_v = state.sink_v[:, :, :extra] if extra else None
        keys, values = state.append(k, v)  # (B, H_kv, cached + T, D): positions start - cached .. start + T - 1
        first = start + T - keys.shape[2]
        k_pos = torch.arange(first, start + T, device=q.device)
        if extra:
            keys, values = torch.cat([sink_k, keys], 2), torch.cat([sink_v, values], 2)
            k_pos = torch.cat([torch.arange(extra, device=q.device), k_pos])
        q_pos = torch.arange(start, start + T, device=q.device)
        d = q_pos[:, None] - k_pos[None, :]  # (T, keys)
        mask = (d >= 0) & ((d < self.window) | (k_pos[None, :] < self.sinks))
        self.last_backend = "blocked"
        return self._attend(q, keys, values, mask, q_pos, k_pos)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                q_pos: torch.Tensor | None, k_pos: torch.Tensor | None) -> torch.Tensor:
        """A decoding step over gathered keys at positions ``k_pos`` (any order; needed with ALiBi only): fused SDPA, or
        the explicit form when scores are softcapped; ALiBi's bias from the positions, the sink logits as everywhere."""
        terms = score_terms.reference_terms(self, q, q_pos, k_pos)
        if self.config.softcap:
            return dense_attention(q, k, v, mask, softcap=self.config.softcap, **terms)
        if terms:
            return score_terms.sdpa(q, k, v, mask, bias=terms.get("bias"), sink=terms.get("sink"))
        return gqa.sdpa(q, k, v, attn_mask=mask)


__all__ = [
    "RollingKVCache", "SlidingWindowAttention", "SlidingWindowConfig", "band_block_layout", "band_block_mask",
    "band_mask_mod", "sink_pairs", "window_mask",
]
