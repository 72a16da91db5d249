"""What `full` and `sliding_window` add to softmax attention's scores, per backend: a softcap (Gemma 2), ALiBi's bias
(:mod:`attn.attention.alibi`) and a learnable sink logit (:mod:`attn.attention.sink_logit`).

Order, in every backend: ``softmax([cap(q k^T * scale) + bias, masked | s_h])``. The bias is added *after* the cap:
ALiBi's papers add it to the raw scores, but a capped bias would saturate at -c, and far keys would stop fading
(with a cap, a distant key could never be suppressed more than c); capping only the content score keeps the cap's
purpose (bounded q.k logits) and ALiBi's (linear decay). The sink logit joins the softmax as it is: no cap, no bias.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attn.attention import flex
from attn.attention.alibi import alibi_bias, alibi_score_mod_terms, slopes_tensor
from attn.attention.gqa import FOLD_MAX_QUERIES, fold, unfold
from attn.attention.sink_logit import sink_logits_for, with_sink_key, with_sink_share, zero_key


def slopes_for(module, q: torch.Tensor) -> torch.Tensor | None:
    """ALiBi slopes (H,) for q's query heads when ``module.config.alibi``, else None."""
    return slopes_tensor(q.shape[1], str(q.device)) if module.config.alibi else None


def sink_for(module, q: torch.Tensor) -> torch.Tensor | None:
    """The module's sink logits (H,) when ``module.config.sink_logit``, else None."""
    return sink_logits_for(module, q) if module.config.sink_logit else None


def bias_for(module, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
    """ALiBi's bias (H, Lq, Lk) for queries at ``q_pos`` and keys at ``k_pos`` when ``module.config.alibi``, else None."""
    return alibi_bias(slopes_for(module, q), q_pos, k_pos) if module.config.alibi else None


def reference_terms(module, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> dict[str, torch.Tensor]:
    """The keyword arguments of ``dense_attention`` for the module's terms (none when it has none): ``bias`` (H, Lq, Lk)
    from the queries' and keys' positions, ``sink`` (H,)."""
    terms = {}
    if module.config.alibi:
        terms["bias"] = bias_for(module, q, q_pos, k_pos)
    if module.config.sink_logit:
        terms["sink"] = sink_for(module, q)
    return terms


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                      softcap: float = 0.0, bias: torch.Tensor | None = None,
                      sink: torch.Tensor | None = None) -> torch.Tensor:
    """softmax([cap(q k^T * scale) + bias, masked | sink]) v with explicit matmuls, any batch dims.

    q (..., Lq, D), k, v (..., Lk, D); ``mask`` bool (True = visible), ``bias`` float and ``sink`` (one logit per
    row) each broadcastable to (..., Lq, Lk) / (..., Lq, 1). Scores are formed in q's dtype and softmaxed in at least
    float32; rows with nothing visible return 0."""
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., Lq, Lk)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sink is not None:
        scores = torch.cat([scores, sink.to(scores.dtype).expand(*scores.shape[:-1], 1)], -1)
    probs = torch.softmax(scores, dim=-1)
    if sink is not None:
        probs = probs[..., :-1]  # the sink's share is dropped: its value is zero
    return probs.nan_to_num(0.0).to(q.dtype) @ v


def _grouped(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
             ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """q and the mask as SDPA takes them for k with H_kv <= H heads, and the G folded: few queries are folded into their
    key head's rows (as ``gqa.sdpa`` does; G = 1: not folded, ``enable_gqa`` serves the groups). A float mask is cast to
    q's dtype; a per-head one goes in 4-D: with a 3-D mask SDPA's CPU dispatch takes its unfused math path (measured,
    one query over 16K keys, H=8, fp32: 17 ms against 3.9 ms for the same mask in 4-D)."""
    g = q.shape[1] // k.shape[1]
    folded = g > 1 and q.shape[2] <= FOLD_MAX_QUERIES and not is_causal
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    if mask is not None and mask.dim() == 3:  # (H, Lq, Lk) -> (1, H_kv, G * Lq, Lk) folded, else (1, H, Lq, Lk)
        mask = mask.reshape(1, k.shape[1] if folded else q.shape[1], -1, mask.shape[-1])
    elif mask is not None and folded:  # (Lq, Lk) -> (G * Lq, Lk)
        mask = mask.repeat(g, 1)
    return (fold(q, g), mask, g) if folded else (q, mask, 1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
          scale: float) -> torch.Tensor:
    """SDPA for k, v with H_kv <= H heads and a mask that may differ per query head: (Lq, Lk) or (H, Lq, Lk)."""
    qf, mask, g = _grouped(q, k, mask, is_causal)  # rows of head h = kv * g + i sit at i * Lq .. in key head kv's
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                         enable_gqa=qf.shape[1] != k.shape[1])
    return unfold(out, g)


def _lse_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor, is_causal: bool):
    """SDPA's fused CPU kernel that also returns each row's log-sum-exp (aten
    ``_scaled_dot_product_flash_attention_for_cpu``), or None where it cannot serve: off CPU, when a gradient must flow
    (its log-sum-exp has none, and the sink logit's gradient would need it), when grouped keys cannot be folded (it
    takes no groups), or in a torch without it."""
    if q.device.type != "cpu" or torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, sink)):
        return None
    if q.shape[1] != k.shape[1] and (is_causal or q.shape[2] > FOLD_MAX_QUERIES):
        return None
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _sdpa_lse(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``_sdpa`` through :func:`_lse_kernel`'s ``kernel``: (out (B, H, Lq, D), its rows' log-sum-exp (B, H, Lq), at
    least float32). A row that sees no key comes back as out 0 (and lse 0)."""
    qf, mask, g = _grouped(q, k, mask, is_causal)
    if mask is not None and mask.dtype == torch.bool:  # the kernel takes additive masks only
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    out, lse = kernel(qf, k, v, is_causal=is_causal, attn_mask=mask, scale=scale)  # (B, H|H_kv, G * Lq, D|-)
    return unfold(out, g), lse.reshape(q.shape[:3])


def _prepend_column(mask: torch.Tensor) -> torch.Tensor:
    """The sink key's column in front of a bool (visible) or additive (0) mask."""
    first = torch.ones if mask.dtype == torch.bool else torch.zeros
    return torch.cat([first(*mask.shape[:-1], 1, dtype=mask.dtype, device=mask.device), mask], -1)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, is_causal: bool = False,
         bias: torch.Tensor | None = None, sink: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA with ALiBi's bias and a sink logit: q (B, H, Lq, D), k, v (B, H_kv, Lk, D) -> (B, H, Lq, D).

    ``mask``: bool (Lq, Lk), True = visible; ``is_causal``: SDPA's own (top-left, so Lq == Lk); ``bias`` (H, Lq, Lk)
    float32: added with the mask as one float mask (H x Lq x Lk: SDPA has no score hook); ``sink`` (H,): without a
    gradient on CPU, folded in after the kernel from its log-sum-exp (:func:`sink_logit.with_sink_share`: no copy of
    the keys, so a decoding step costs what one without the sink does); else one extra channel
    (:func:`sink_logit.with_sink_key`), so a causal call keeps the fused causal kernel and its backward."""
    B, H, Lq, D = q.shape
    scale = 1.0 / math.sqrt(D)
    if bias is not None:
        if is_causal:
            mask, is_causal = torch.ones(Lq, Lq, dtype=torch.bool, device=q.device).tril(), False
        mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))  # (H, Lq, Lk)
    if sink is None:
        return _sdpa(q, k, v, mask, is_causal, scale)
    kernel = _lse_kernel(q, k, v, sink, is_causal)
    if kernel is not None:
        out, lse = _sdpa_lse(kernel, q, k, v, mask, is_causal, scale)
        return with_sink_share(out, lse, sink.view(1, H, 1))
    q, k, v = with_sink_key(q, k, v, sink.view(1, H, 1, 1), scale)  # the sink is key 0
    if is_causal:  # one dummy query in front: top-left causal over (Lq + 1, Lk + 1) is then query i seeing keys <= i
        q = F.pad(q, (0, 0, 1, 0))
    elif mask is not None:
        mask = _prepend_column(mask)
    out = _sdpa(q, k, v, mask, is_causal, scale)
    return out[:, :, 1:, :D] if is_causal else out[..., :D]


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     bias: torch.Tensor | None = None, sink_rows: torch.Tensor | None = None,
                     softcap: float = 0.0) -> torch.Tensor:
    """One call of any batch dims with per-row terms (the blocked kernel's chunks): q (..., Lq, D), k, v (..., Lk, D),
    ``mask`` bool, ``bias`` float32 broadcastable to (..., Lq, Lk), ``sink_rows`` to (..., Lq, 1). Explicit with a
    softcap (SDPA has no score hook), else SDPA with the bias as a float mask and the sink as a key."""
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    if softcap:
        return softmax_attention(q, k, v, mask, scale, softcap, bias, sink_rows)
    if bias is not None:
        mask = bias.masked_fill(~mask, float("-inf")).to(q.dtype)
    if sink_rows is not None:
        q, k, v = with_sink_key(q, k, v, sink_rows, scale)
        mask = _prepend_column(mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)[..., :D]


def flex_score_mod(softcap: float, slopes: torch.Tensor | None, offset: int, sink: torch.Tensor | None, k_len: int,
                   device: str):
    """Flex ``score_mod`` of the terms, or None without any: cap, then ALiBi (``offset`` = Lk - Lq), then the sink
    key at position ``k_len`` (appended by :func:`flex_attention`) scored exactly s_h. Captured tensors, so one
    compile per shape and combination."""
    if not softcap and slopes is None and sink is None:
        return None
    cap = torch.tensor(softcap, device=device)
    alibi = alibi_score_mod_terms(slopes, offset) if slopes is not None else None
    sink_at = torch.tensor(k_len, device=device)
    sink = None if sink is None else sink.float()  # Flex scores are fp32; the cast keeps the gradient

    def scores(score, b, h, q_idx, kv_idx):
        if softcap:
            score = cap * torch.tanh(score / cap)
        if alibi is not None:
            score = alibi(score, b, h, q_idx, kv_idx)
        if sink is not None:
            score = torch.where(kv_idx == sink_at, sink[h], score)
        return score

    scores.__name__ = "_".join(n for n, on in (("softcap", softcap), ("alibi", alibi is not None),
                                               ("sink_logit", sink is not None)) if on)
    return scores


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, softcap: float = 0.0,
                   slopes: torch.Tensor | None = None, sink: torch.Tensor | None = None) -> torch.Tensor:
    """``flex.run_flex`` with the terms. With a sink, ``block_mask`` must be built for Lk + 1 keys with the last
    visible to every query (:func:`sink_logit.with_sink_column`): the sink is a zero key there."""
    Lq, Lk = q.shape[2], k.shape[2]
    score_mod = flex_score_mod(softcap, slopes, Lk - Lq, sink, Lk, str(q.device))
    if sink is not None:
        k, v = zero_key(k, v)
    return flex.run_flex(q, k, v, block_mask, enable_gqa=q.shape[1] != k.shape[1], score_mod=score_mod)


def softcap_score_mod(softcap: float, device: str):
    """Flex ``score_mod`` of logit softcapping alone, the cap a captured tensor (one compile for every cap)."""
    return flex_score_mod(softcap, None, 0, None, 0, device)


__all__ = ["bias_for", "flex_attention", "flex_score_mod", "masked_attention", "reference_terms", "sdpa", "sink_for",
           "slopes_for", "softcap_score_mod", "softmax_attention"]
