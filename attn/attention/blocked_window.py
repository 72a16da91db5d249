"""``sliding_window``'s ``blocked`` backend: exact windowed attention in pure torch, O(L * w) time and memory.

Queries go in chunks, each against its span of keys (an ``unfold`` of the padded keys), attended by SDPA; sinks,
softcap, ALiBi and sink logits go through :func:`attn.attention.chunk_groups.chunk_groups` a group at a time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attn.attention.chunk_groups import chunk_groups

# With sinks (or softcap, ALiBi, sink logits), this many bytes of chunk spans (sinks in front) and of per-head float
# masks or scores are formed and attended at a time.
SINK_GROUP_BYTES = 64 << 20


def blocked_chunk(window: int, q_len: int) -> int:
    """Query chunk c: each chunk scores c + w - 1 keys (causal), so c ~ w/2 wastes ~1/3 of the work
    while keeping the per-chunk matmuls big enough; never more than the queries there are."""
    return max(1, min(q_len, max(64, window // 2)))


def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, causal: bool,
                      chunk: int | None = None, sinks: int = 0, softcap: float = 0.0,
                      slopes: torch.Tensor | None = None, sink: torch.Tensor | None = None) -> torch.Tensor:
    """Exact sliding-window attention in O(L * w): queries in chunks of c, each against its key span.

    q: (B, H, Lq, D), k, v: (B, H_kv, Lk, D), Lq <= Lk (queries are the last Lq positions).
    Chunk n of queries needs keys ``[n*c - (w-1), n*c + c - 1 (+ w-1 if bidirectional)]`` in
    query coordinates; an ``unfold`` of the (padded) keys gives all spans at once (autograd sums
    the overlaps back), and SDPA does the masked softmax per chunk, fused, with its own backward. ``sinks``:
    the first keys are put in front of every chunk's span, visible where the window does not already cover them.
    ``softcap``: the chunks' scores are formed explicitly (SDPA has no score hook), capped, then softmaxed.
    ``slopes`` (H,): ALiBi's bias of each chunk against its span's (and the sinks') positions; ``sink`` (H,): sink
    logits (score_terms.py). With any of these the chunks go a group at a time (see :func:`chunk_groups`).
    """
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g = H // Hkv  # GQA: a key head's g query heads are stacked as g x c rows of each chunk
    w = window
    c = chunk or blocked_chunk(w, Lq)
    n = -(-Lq // c)
    span = c + (w - 1) * (1 if causal else 2)  # keys scored per query chunk
    start = Lk - Lq - (w - 1)  # key index at the start of chunk 0's span
    need = (n - 1) * c + span  # key positions covered by all spans together
    lo, hi = max(start, 0), min(start + need, Lk)
    kk = F.pad(k[:, :, lo:hi], (0, 0, lo - start, start + need - hi))  # (B, H, need, D)
    vv = F.pad(v[:, :, lo:hi], (0, 0, lo - start, start + need - hi))
    # Chunks lead so that one (n, 1, g*c, span) mask broadcasts over batch and key heads.
    qq = F.pad(q, (0, 0, 0, n * c - Lq)).reshape(B * Hkv, g, n, c, D).permute(2, 0, 1, 3, 4)
    qq = qq.reshape(n, B * Hkv, g * c, D)  # (n, B H_kv, g c, D)
    k_spans = kk.unfold(2, span, c).reshape(B * Hkv, n, D, span).permute(1, 0, 3, 2)  # (n, B H_kv, span, D)
    v_spans = vv.unfold(2, span, c).reshape(B * Hkv, n, D, span).permute(1, 0, 3, 2)

    a = torch.arange(c, device=q.device)[:, None]  # query offset in its chunk
    b = torch.arange(span, device=q.device)[None, :]  # key offset in its span
    chunks = torch.arange(n, device=q.device)[:, None, None] * c
    # Query (n, a) is at key position start + n*c + a + (w-1); key (n, b) at start + n*c + b.
    band = (b >= a) & (b <= a + (w - 1) * (1 if causal else 2))  # (c, span)
    key_pos = start + chunks + b  # (n, 1, span)
    # Padded query rows (past Lq) see every key so their (discarded) softmax is not NaN.
    mask = (band & (key_pos >= 0) & (key_pos < Lk)) | (chunks + a >= Lq)  # (n, c, span)
    s = min(sinks, Lk)
    p = (Lk - Lq) + chunks + a  # (n, c, 1) absolute query positions
    if s:  # sink keys before each span; visible to query p when outside its window (causal: j <= p - w)
        j = torch.arange(s, device=q.device)
        seen = j <= p - w  # (n, c, s)
        if not causal:
            seen = seen | (j >= p + w)
        seen = seen | (chunks + a >= Lq)  # padded query rows see everything (discarded)
        mask = torch.cat([seen, mask], dim=-1)  # (n, c, s + span)
        key_pos = torch.cat([j.expand(n, 1, s), key_pos], -1)  # (n, 1, s + span)
    if g > 1:
        mask = mask.repeat(1, g, 1)  # (n, g c, span): the same band for each query head of the group
    if not (s or softcap or slopes is not None or sink is not None):
        out = F.scaled_dot_product_attention(qq, k_spans, v_spans, attn_mask=mask[:, None])
    else:
        sink_kv = tuple(x[:, :, :s].reshape(1, B * Hkv, s, D) for x in (k, v)) if s else None
        out = chunk_groups(qq, k_spans, v_spans, mask, sink_kv, B, SINK_GROUP_BYTES, groups=g, softcap=softcap,
                           positions=(p[..., 0], key_pos[:, 0]) if slopes is not None else None, slopes=slopes,
                           sink=sink)
    out = out.reshape(n, B * Hkv, g, c, D).permute(1, 2, 0, 3, 4)  # (B H_kv, g, n, c, D)
    return out.reshape(B, H, n * c, D)[:, :, :Lq]


__all__ = ["SINK_GROUP_BYTES", "blocked_attention", "blocked_chunk"]
