"""Full softmax attention (Vaswani et al. 2017): the exact baseline every variant is compared to."""
from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attn.attention import flex, gqa, score_terms
from attn.attention.base import ALL_MODES, Attention, Backend, UnsupportedBackend, have_module, modes
from attn.attention.masks import causal_mask
from attn.attention.ragged import RaggedKVCache
from attn.attention.score_terms import softcap_score_mod
from attn.attention.sink_logit import check_heads, init_sink_logits, needs_grad, with_sink_column
from attn.registry import check, register_attention


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    scale: float | None = None, softcap: float = 0.0, *, bias: torch.Tensor | None = None,
                    sink: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v with explicit matmuls: the shared reference computation.

    k, v may have fewer heads than q (GQA): each group of query heads broadcasts against its key head.
    ``mask``: (Lq, Lk) or anything that broadcasts to (B, H_kv, G, Lq, Lk). Rows with no visible key return 0
    (SDPA would return NaN), so references stay comparable. ``softcap`` c > 0 (Gemma 2): scores pass through
    ``c * tanh(s / c)`` before the mask and the softmax. ``bias``: added after the cap, (H, Lq, Lk) or (B, H, Lq, Lk)
    (ALiBi); ``sink``: (H,) logits joining each row's softmax as a zero-valued column (see score_terms.py).
    """
    B, H, Lq, D = q.shape
    g = H // k.shape[1]  # GQA: query head h reads key head h // g
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qg = q.reshape(B, H // g, g, Lq, D)  # (B, H_kv, G, Lq, D)
    if bias is not None:
        bias = bias.unflatten(-3, (H // g, g))  # (..., H_kv, G, Lq, Lk)
    if sink is not None:
        sink = sink.view(H // g, g, 1, 1)
    out = score_terms.softmax_attention(qg, k[:, :, None], v[:, :, None], mask, scale, softcap, bias, sink)
    return out.reshape(B, H, Lq, D)


def _xformers_bias(causal: bool, q_len: int, k_len: int, window: int | None = None):
    from xformers.ops import fmha

    if window is not None:
        if causal:
            return fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(window)
        return fmha.attn_bias.LocalAttentionFromBottomRightMask(window_left=window - 1, window_right=window - 1)
    if causal:
        return fmha.attn_bias.LowerTriangularFromBottomRightMask()
    return None


def xformers_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       window: int | None = None) -> torch.Tensor:
    """xformers memory_efficient_attention; it takes (B, L, H, D), we keep (B, H, L, D).

    xformers picks its kernels per call (and, when gradients are needed, the backward kernel during
    the forward); when none fits the inputs it raises NotImplementedError listing each kernel's
    reasons. That is a refusal, not a bug: it becomes :class:`UnsupportedBackend` with the reasons.
    """
    from xformers.ops import memory_efficient_attention

    xformers_extension_note()
    bias = _xformers_bias(causal, q.shape[2], k.shape[2], window)
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g = H // Hkv
    if g == 1:
        qx, kx, vx = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    else:  # GQA as xformers takes it: 5-D (B, L, G=H_kv, H=group, D), keys expanded with stride 0 over the group
        qx = q.transpose(1, 2).reshape(B, Lq, Hkv, g, D)
        kx = k.transpose(1, 2)[:, :, :, None].expand(B, Lk, Hkv, g, D)
        vx = v.transpose(1, 2)[:, :, :, None].expand(B, Lk, Hkv, g, D)
    try:
        out = memory_efficient_attention(qx, kx, vx, attn_bias=bias)
    except NotImplementedError as e:
        reasons = " ".join(str(e).split())
        raise UnsupportedBackend(f"xformers has no kernel for these inputs: {reasons[:400]}") from e
    return out.reshape(B, Lq, H, D).transpose(1, 2)


_XFORMERS_WHY = " (pip install 'attn-bench[gpu]')"


@functools.cache
def xformers_extension_note() -> str | None:
    """When xformers' C extension did not load, let its dispatcher use the operators that need none of it.

    The 0.0.35 wheel's extension needs libcudart.so.12 (CUDA 12); beside a CUDA 13 torch it does not
    load, and xformers then refuses *every* CUDA operator ("xFormers wasn't build with CUDA support"),
    although the ones this project calls -- FlashAttention-2 ``fa2F/B@...-pt`` and CUTLASS
    ``cutlassF/B-pt`` -- run torch's own kernels (aten._flash_attention_* / _efficient_attention_*).
    So that flag is set, and this returns the note saying so (None when the extension loaded).
    """
    import xformers.ops  # noqa: F401
    from xformers import _cpp_lib
    from xformers.ops.fmha import common

    err = getattr(_cpp_lib, "_cpp_library_load_exception", None)
    if err is None or not torch.cuda.is_available() or torch.version.hip is not None:
        return None
    common._built_with_cuda = True
    return (f"xformers' C extension did not load ({type(err).__name__}); its dispatcher runs torch's own "
            "FlashAttention / memory-efficient kernels")


@functools.cache
def xformers_unavailable() -> str | None:
    """Import xformers, then run one tiny causal bf16 call on the current CUDA device.

    Importing is not enough: the 0.0.35 wheel is built against CUDA 12 / torch 2.10, and beside
    another torch its C extension may not load (xformers then only warns) or its kernels may refuse.
    The tiny call shows what a measured cell would meet, with xformers' own reason.
    """
    why = have_module("xformers.ops", _XFORMERS_WHY)()
    if why is not None or not torch.cuda.is_available():
        return why
    try:
        note = xformers_extension_note()
        if note:
            warnings.warn(note, stacklevel=2)
        q = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
        xformers_attention(q, q, q, causal=True)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 -- whatever it is, it is the reason the backend cannot run
        return f"xformers cannot run on {torch.cuda.get_device_name()}: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return None


XFORMERS = Backend(
    "xformers",
    {"cuda": ALL_MODES},
    dtypes=(torch.float32, torch.bfloat16, torch.float16),  # fp32: the CUTLASS kernels (causal or none)
    requires=xformers_unavailable,
    note="xformers.ops.memory_efficient_attention",
)


def check_softcap(softcap: float) -> None:
    check(math.isfinite(softcap) and softcap >= 0, f"softcap must be a finite number >= 0 (0 = off), got {softcap}")


@dataclass(frozen=True)
class FullConfig:
    """``softcap`` c > 0: logit softcapping, scores -> c * tanh(s / c) (Gemma 2 uses 50); 0 = off. ``prefix`` P > 0:
    prefix-LM (T5 / UniLM): the first P tokens see each other both ways, the rest is causal (query i sees j <= i or
    j < P); a decoder must be given the whole prefix in its first step. ``alibi``: ALiBi's linear distance bias
    (alibi.py; the position method ``alibi`` sets it). ``sink_logit``: a learnable logit per query head in every
    softmax (gpt-oss; sink_logit.py), ``heads`` of them made at construction, or at the first call when 0."""

    softcap: float = 0.0
    prefix: int = 0
    alibi: bool = False
    sink_logit: bool = False
    heads: int = 0

    def __post_init__(self) -> None:
        check_softcap(self.softcap)
        check(self.prefix >= 0, f"prefix must be >= 0, got {self.prefix}")
        check_heads(self.heads, self.sink_logit)


def prefix_mask(q_len: int, k_len: int, prefix: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Causal (bottom-right) mask plus every query seeing the first ``prefix`` keys."""
    return causal_mask(q_len, k_len, device) | (torch.arange(k_len, device=device) < prefix)


@register_attention("full", config=FullConfig)
class FullAttention(Attention):
    """Exact softmax attention over every visible key: O(L^2) time, O(L) memory with SDPA."""

    supports_gqa = True

    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="explicit matmul + softmax"),
        Backend("sdpa", {"cpu": ALL_MODES, "cuda": ALL_MODES},
                note="torch scaled_dot_product_attention (no softcap; ALiBi as an H x L x L float mask)"),
        Backend("flex", {"cpu": modes("forward"), "cuda": modes("forward", "backward")},
                dtypes=(torch.float32, torch.bfloat16, torch.float16), requires=flex.flex_unavailable,
                note="compiled FlexAttention, softcap/ALiBi/sink logit in its score_mod (auto: with a softcap, prefix "
                     "or ALiBi)"),
        XFORMERS,
    )

    def __init__(self, config: FullConfig, backend: str = "auto"):
        super().__init__(config, backend)
        init_sink_logits(self, config.sink_logit, config.heads)

    def mode_of(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        """As for every variant, except that a call whose sink logits need a gradient is a backward call."""
        return "backward" if needs_grad(self) else super().mode_of(q, k, v)

    def ragged_state(self, states: list[Any], step_tokens: int = 1) -> RaggedKVCache:
        """Plain causal attention: the caches padded to the longest and masked per sequence."""
        cfg = self.config
        if cfg.softcap or cfg.prefix or cfg.alibi or cfg.sink_logit:
            raise UnsupportedBackend("ragged decoding is built for plain full attention (no softcap, prefix, ALiBi or "
                                     "sink logit): its padded step is one masked SDPA call")
        return RaggedKVCache.joined(states, step_tokens)

    def _mask(self, q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor | None:
        if not causal:
            return None
        if self.config.prefix:
            return prefix_mask(q.shape[2], k.shape[2], self.config.prefix, q.device)
        return causal_mask(q.shape[2], k.shape[2], q.device)

    def backend_reference(self, q, k, v, causal):
        pos = torch.arange(k.shape[2], device=q.device)  # queries are the last Lq positions
        terms = score_terms.reference_terms(self, q, pos[k.shape[2] - q.shape[2]:], pos)
        return dense_attention(q, k, v, self._mask(q, k, causal), softcap=self.config.softcap, **terms)

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        """With a softcap ``auto`` runs only Flex (SDPA and xformers have no score hook); with a prefix or ALiBi it
        prefers Flex over SDPA's explicit L x L mask (with ALiBi, SDPA where Flex cannot run, e.g. a CPU backward);
        below ``FLEX_MIN_LEN`` queries it never compiles Flex (SDPA or the reference run); plain attention never picks
        Flex (SDPA's fused kernels are the fast path there); xformers runs neither ALiBi nor sink logits."""
        if self.backend != "auto":
            return super().select_backend(device, dtype, mode)
        short, cfg = self.short_for_flex(), self.config
        if cfg.softcap:
            order = ["flex"]
        elif cfg.prefix:  # SDPA needs an L x L mask for it: Flex from FLEX_MIN_LEN queries
            order = ["sdpa"] if short else ["flex"]
        elif cfg.alibi:  # SDPA needs an H x L x L float mask
            order = ["flex", "sdpa"]
        else:
            order = ["sdpa", "xformers"]
        if short:
            order = [n for n in order if n != "flex"]
        if cfg.alibi or cfg.sink_logit:
            order = [n for n in order if n != "xformers"]
        able = {b.name for b in self.auto_candidates(device, mode) if b.why_not(device, dtype, mode) is None}
        return next((n for n in order if n in able), "reference")

    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        """Causal pairs, plus with a prefix the prefix keys after each query (closed form). ALiBi's bias and the sink
        logit's column are not counted (adds, not matmul work)."""
        pairs = super().pairs(q_len, k_len, causal)
        if causal and self.config.prefix:
            pos = torch.arange(k_len - q_len, k_len, dtype=torch.int64)
            pairs += int((min(self.config.prefix, k_len) - 1 - pos).clamp(min=0).sum())
        return pairs

    def backend_flex(self, q, k, v, causal):
        sink = score_terms.sink_for(self, q)
        block_mask = full_block_mask(q.shape[2], k.shape[2], causal, str(q.device), self.config.prefix if causal else 0,
                                     sink is not None)
        return score_terms.flex_attention(q, k, v, block_mask, self.config.softcap, score_terms.slopes_for(self, q), sink)

    def backend_sdpa(self, q, k, v, causal):
        cfg = self.config
        if cfg.softcap:
            raise UnsupportedBackend("SDPA has no score hook for softcap: use flex or reference")
        if cfg.alibi or cfg.sink_logit:
            Lq, Lk = q.shape[2], k.shape[2]
            fused_causal = causal and Lq == Lk and not cfg.prefix and not cfg.alibi
            # one causal query sees every key: no mask (ALiBi's bias is then SDPA's whole float mask)
            mask = None if fused_causal or (causal and Lq == 1) else self._mask(q, k, causal)
            pos = torch.arange(Lk, device=q.device)
            bias = score_terms.bias_for(self, q, pos[Lk - Lq:], pos)
            return score_terms.sdpa(q, k, v, mask, fused_causal, bias, score_terms.sink_for(self, q))
        if causal and cfg.prefix:
            return gqa.sdpa(q, k, v, attn_mask=self._mask(q, k, causal))
        if causal and q.shape[2] != k.shape[2]:
            # SDPA's is_causal is top-left aligned; decoding needs bottom-right (one query sees every key).
            Lq, P = q.shape[2], k.shape[2] - q.shape[2]
            if 1 < Lq and P < Lq:
                # a prompt continuing a cached prefix: P zero queries in front make it top-left causal, so the fused
                # kernel skips the masked half -- (P + Lq)^2 / 2 pairs instead of the mask's Lq (P + Lq); rows dropped
                return gqa.sdpa(F.pad(q, (0, 0, P, 0)), k, v, is_causal=True)[:, :, P:]
            mask = causal_mask(Lq, k.shape[2], q.device) if Lq > 1 else None
            return gqa.sdpa(q, k, v, attn_mask=mask)
        return gqa.sdpa(q, k, v, is_causal=causal)

    def backend_xformers(self, q, k, v, causal):
        if self.config.softcap or self.config.prefix:
            raise UnsupportedBackend("xformers has no softcap and no prefix-LM mask")
        if self.config.alibi or self.config.sink_logit:
            raise UnsupportedBackend("xformers here runs no ALiBi bias and no sink logit: use sdpa, flex or reference")
        return xformers_attention(q, k, v, causal)


@functools.lru_cache(maxsize=16)
def full_block_mask(q_len: int, k_len: int, causal: bool, device: str, prefix: int = 0,
                    sink_key: bool = False) -> flex.BlockMask:
    """The causal (bottom-right, with a prefix-LM prefix) or empty mask as a BlockMask built from its block layout,
    never from L x L pairs; ``sink_key``: one more key (position k_len) every query sees (the sink logit's)."""
    block = 128
    nq, nk = -(-q_len // block), -(-k_len // block)
    off = k_len - q_len
    qb, kb = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    q_lo, q_hi = qb * block + off, (qb * block + block - 1).clamp(max=q_len - 1) + off
    k_lo, k_hi = kb * block, (kb * block + block - 1).clamp(max=k_len - 1)
    whole = ((qb + 1) * block <= q_len) & ((kb + 1) * block <= k_len)
    any_ = (k_lo <= q_hi) | (k_lo < prefix) if causal else torch.ones(nq, nk, dtype=torch.bool)
    full = ((k_hi <= q_lo) | (k_hi < prefix)) & whole if causal else whole.expand(nq, nk)
    as_t = lambda x: torch.tensor(x, device=device)
    offset, k_end, horizon, p = as_t(off), as_t(k_len), as_t(0 if causal else k_len), as_t(prefix)

    def full_mask(b, h, q_idx, kv_idx):
        return ((kv_idx <= q_idx + offset + horizon) | (kv_idx < p)) & (kv_idx < k_end)

    partial, mask_mod = any_ & ~full, full_mask
    if sink_key:
        partial, full, mask_mod = with_sink_column(partial, full, block, k_len, mask_mod, device)
    return flex.block_mask_from_layout(partial, full, block, q_len, k_len + sink_key, mask_mod).to(device)


__all__ = ["FullAttention", "FullConfig", "causal_mask", "check_softcap", "prefix_mask", "dense_attention", "full_block_mask",
           "softcap_score_mod", "xformers_attention", "xformers_extension_note",
           "xformers_unavailable"]
