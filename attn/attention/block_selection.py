"""Attention that each query restricts to the key blocks it scores highest: what MoBA and Quest share.

Keys are cut into absolute blocks of ``bs`` tokens (block ``c`` = positions ``[c * bs, (c + 1) * bs)``). A query at
position ``t`` lies in block ``b = t // bs``; every earlier block is complete, and those are its candidates. A variant
scores them (MoBA: the query against each block's mean key; Quest: an upper bound from each page's key minima and
maxima), keeps the ``n`` best, and attends to their tokens plus its own block up to itself (causal). Ties in the
scores go to whatever ``torch.topk`` picks; the reference and the fast path share :func:`top_blocks`, so they agree.

Rule, per query ``t`` and key ``j``: visible iff ``j // bs`` is one of ``t``'s chosen blocks, or ``j // bs == b`` and
``j <= t``. Queries are the last ``Lq`` of ``Lk`` positions (bottom-right aligned), so a decoding step equals the row
of a forward whenever the summaries it scores are the same.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from attn.attention import gqa
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.full import dense_attention
from attn.attention.masks import causal_mask
from attn.attention.routed_blocks import attend_by_block
from attn.attention.state import KVCache

# Gathered keys per query chunk of the fast path, in elements (B * H * C * W * D): bounds its temporaries at ~64 MB.
GATHER_ELEMENTS = 1 << 24
# Up to this many queries (decoding steps) each query gathers its keys; above, the pairs are grouped by block
# (routed_blocks.py): a 4K MoBA prefill in SmolLM2's shape, 27.6 s a layer by gathering, 1.1 s by block.
ROW_GATHER_MAX_QUERIES = 16


def query_blocks(q_len: int, k_len: int, bs: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Block of each query (Lq,), the queries being the last ``q_len`` of ``k_len`` positions."""
    return torch.arange(k_len - q_len, k_len, device=device) // bs


def block_view(k: torch.Tensor, bs: int) -> torch.Tensor:
    """The complete blocks of k (B, H_kv, Lk, D) -> (B, H_kv, Lk // bs, bs, D), promoted to at least float32."""
    B, H, L, D = k.shape
    n = L // bs
    return k[:, :, : n * bs].reshape(B, H, n, bs, D).to(torch.promote_types(k.dtype, torch.float32))


def grouped_scores(q: torch.Tensor, summary: torch.Tensor) -> torch.Tensor:
    """q (B, H, Lq, D) against per-key-head block summaries (B, H_kv, n, D) -> (B, H, Lq, n), in float32 or wider.
    A key head's G query heads are folded into its rows (GQA), so the summary is never repeated."""
    B, H, Lq, D = q.shape
    Hkv, n = summary.shape[1], summary.shape[2]
    g = H // Hkv
    qf = q.to(summary.dtype).reshape(B, Hkv, g * Lq, D)
    return (qf @ summary.transpose(-2, -1)).reshape(B, H, Lq, n)


def top_blocks(scores: torch.Tensor, q_block: torch.Tensor, n_select: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n_select`` best candidate blocks of each query: scores (B, H, Lq, n) over complete blocks, q_block (Lq,)
    -> indices (B, H, Lq, S) and valid (B, H, Lq, S), S = min(n_select, n). Candidates are blocks before the query's
    own; a query with fewer than S candidates has its extra slots invalid."""
    n = scores.shape[-1]
    S = min(n_select, n)
    if S == 0:
        empty = scores.new_zeros(*scores.shape[:-1], 0)
        return empty.long(), empty.bool()
    future = torch.arange(n, device=scores.device)[None, :] >= q_block[:, None]  # (Lq, n): own block and later
    vals, idx = scores.masked_fill(future, float("-inf")).topk(S, dim=-1)
    return idx, torch.isfinite(vals)


def stable_topk(s: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` entries of s's last dim that a stable descending sort puts first (ties to the lower index), without
    sorting the row -> (values, indices): topk's, except in rows where an entry outside it ties the k-th best (the
    (k+1)-th equals it). There: every entry above it and then the lowest-index ties, in index order."""
    vals, idx = s.topk(min(k + 1, s.shape[-1]), dim=-1)
    if k == 0 or k >= s.shape[-1]:
        return vals[..., :k], idx[..., :k]
    bad = vals[..., k] == vals[..., k - 1]
    vals, idx = vals[..., :k], idx[..., :k]
    if bad.any():
        sb, tb = s[bad], vals[bad][:, -1:]
        above, tie = sb > tb, sb == tb
        take = above | (tie & (tie.cumsum(-1) <= k - above.sum(-1, keepdim=True)))
        pick = take.nonzero()[:, -1].view(-1, k)
        idx[bad], vals[bad] = pick, sb.gather(-1, pick)
    return vals, idx


def choose(q: torch.Tensor, k_len: int, bs: int, n_select: int, score: Callable[[torch.Tensor], torch.Tensor]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`top_blocks` of ``score(q_chunk)`` (B, H, C, n) over chunks of the queries: the (B, H, Lq, n) scores of a
    long prefill (8 GB for 8 heads at 256K tokens in 64-token blocks) never exist at once."""
    B, H, Lq, _ = q.shape
    blocks = query_blocks(Lq, k_len, bs, q.device)
    step = max(1, GATHER_ELEMENTS // max(1, B * H * (k_len // bs)))
    parts = [top_blocks(score(q[:, :, a:a + step]), blocks[a:a + step], n_select) for a in range(0, Lq, step)]
    return torch.cat([i for i, _ in parts], 2), torch.cat([v for _, v in parts], 2)


def selection_mask(idx: torch.Tensor, valid: torch.Tensor, k_len: int, bs: int) -> torch.Tensor:
    """Dense (B, H, Lq, Lk) bool mask of the rule above, from the chosen blocks (references and kept_keys)."""
    B, H, Lq, _ = idx.shape
    n_all = -(-k_len // bs)
    chosen = torch.zeros(B, H, Lq, n_all + 1, dtype=torch.bool, device=idx.device)
    chosen.scatter_(-1, torch.where(valid, idx, n_all), True)  # invalid slots land in a spare column
    t = torch.arange(k_len - Lq, k_len, device=idx.device)[:, None]
    j = torch.arange(k_len, device=idx.device)[None, :]
    own = (j // bs == t // bs) & (j <= t)  # (Lq, Lk)
    return chosen[..., :n_all].repeat_interleave(bs, dim=-1)[..., :k_len] | own


def attend_selected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor,
                    bs: int) -> torch.Tensor:
    """Softmax attention over each query's chosen blocks and its own block, gathering only those keys.

    q (B, H, Lq, D), k, v (B, H_kv, Lk, D), idx/valid (B, H, Lq, S) -> (B, H, Lq, D). Each query reads
    ``(S + 1) * bs`` gathered keys, so work is linear in Lq and a decoding step reads the same amount at any context.
    Calls of more than ROW_GATHER_MAX_QUERIES queries group the pairs by block instead (:func:`attend_by_block`).
    Queries go in chunks that bound the temporaries (GATHER_ELEMENTS). Differentiable in q, k and v (the
    chosen blocks are a fixed index set); keys are gathered in at least float32, so a block gathered by many queries
    sums its gradient in float32.
    """
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g, S = H // Hkv, idx.shape[-1]
    f = torch.promote_types(q.dtype, torch.float32)
    W = (S + 1) * bs
    if Lq > ROW_GATHER_MAX_QUERIES:  # a long call: pairs grouped by block (routed_blocks.py), queries in chunks
        step = max(1, GATHER_ELEMENTS // max(1, B * H * W))
        return torch.cat([attend_by_block(q[:, :, a:a + step], k[:, :, :Lk - Lq + min(Lq, a + step)],
                                          v[:, :, :Lk - Lq + min(Lq, a + step)], idx[:, :, a:a + step],
                                          valid[:, :, a:a + step], bs) for a in range(0, Lq, step)], 2)
    t = torch.arange(Lk - Lq, Lk, device=q.device)  # absolute query positions
    ar = torch.arange(bs, device=q.device)
    own = (t // bs)[:, None] * bs + ar  # (Lq, bs)
    own_ok = own <= t[:, None]
    own = own.clamp(max=Lk - 1)  # past-the-end slots of a partial block: masked, read in bounds
    kf, vf = k.to(f), v.to(f)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    scale = 1.0 / math.sqrt(D)
    step = max(1, GATHER_ELEMENTS // max(1, B * H * W * D))
    outs = []
    for a in range(0, Lq, step):
        e = min(Lq, a + step)
        C = e - a
        sel = (idx[:, :, a:e, :, None] * bs + ar).flatten(-2)  # (B, H, C, S*bs)
        sel_ok = valid[:, :, a:e, :, None].expand(-1, -1, -1, -1, bs).flatten(-2)
        pos = torch.cat([torch.where(sel_ok, sel, 0), own[a:e].expand(B, H, C, bs)], -1)  # (B, H, C, W)
        ok = torch.cat([sel_ok, own_ok[a:e].expand(B, H, C, bs)], -1)
        pos = pos.view(B, Hkv, g * C * W)  # query head h reads key head h // g
        # rows of each (sequence, key head) by index_select: contiguous copies of D floats, where a gather with an
        # index expanded over D reads one index per element (7x slower here); no copy of the whole cache either
        kg, vg = gather_rows(kf, pos, grad), gather_rows(vf, pos, grad)  # (B, H_kv, G*C*W, D)
        kg, vg = kg.view(B * H * C, W, D), vg.view(B * H * C, W, D)
        scores = torch.bmm(q[:, :, a:e].to(f).reshape(B * H * C, 1, D), kg.transpose(1, 2)).view(B, H, C, W) * scale
        probs = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=-1)  # own key always visible: no empty row
        outs.append(torch.bmm(probs.view(B * H * C, 1, W), vg).view(B, H, C, D))
    return torch.cat(outs, 2).to(q.dtype)


def gather_rows(x: torch.Tensor, pos: torch.Tensor, grad: bool) -> torch.Tensor:
    """x (B, H_kv, L, D) rows at pos (B, H_kv, N) -> (B, H_kv, N, D): one index_select per (sequence, key head), straight
    into the output when no gradient is needed (a stack would copy every gathered row once more)."""
    B, Hkv, N = pos.shape
    if grad:
        return torch.stack([torch.stack([x[b, j].index_select(0, pos[b, j]) for j in range(Hkv)]) for b in range(B)])
    out = x.new_empty(B, Hkv, N, x.shape[-1])
    for b in range(B):
        for j in range(Hkv):
            torch.index_select(x[b, j], 0, pos[b, j], out=out[b, j])
    return out


def selected_pairs(q_len: int, k_len: int, bs: int, n_select: int) -> int:
    """Visible (query, key) pairs under the rule, counted per query in O(Lq): min(S, b) whole blocks plus its own."""
    t = torch.arange(k_len - q_len, k_len, dtype=torch.int64)
    b = t // bs
    return int((b.clamp(max=n_select) * bs + t % bs + 1).sum())


def candidate_blocks(q_len: int, k_len: int, bs: int) -> int:
    """(query, candidate block) pairs a selector scores: each query scores every block before its own."""
    return int((torch.arange(k_len - q_len, k_len, dtype=torch.int64) // bs).sum())


@dataclass
class SummaryCache:
    """Every key and value (selection may pick any block) plus per-block summaries of the complete blocks, kept as
    blocks complete so a decoding step scores n summaries without touching the keys it does not choose.

    ``summarize``: complete blocks (B, H_kv, n, bs, D) -> a tuple of (B, H_kv, n, D) tensors (MoBA: the mean key;
    Quest: the minima and maxima)."""

    block_size: int
    summarize: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    kv: KVCache = field(default_factory=KVCache)
    summaries: tuple[torch.Tensor, ...] = ()

    @property
    def length(self) -> int:
        return self.kv.length

    @property
    def blocks(self) -> int:
        return self.summaries[0].shape[2] if self.summaries else 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Take new tokens -> (all keys, all values, summaries of every complete block)."""
        keys, values = self.kv.append(k, v)
        done, bs = self.length // self.block_size, self.block_size
        if done > self.blocks:
            new = self.summarize(block_view(keys[:, :, self.blocks * bs: done * bs], bs))
            self.summaries = new if not self.summaries else tuple(
                torch.cat([old, n], 2) for old, n in zip(self.summaries, new, strict=True))
        return keys, values, self.summaries

    def truncate(self, length: int) -> None:
        self.kv.truncate(length)
        keep = self.length // self.block_size
        if self.summaries and keep < self.blocks:
            self.summaries = tuple(s[:, :, :keep] for s in self.summaries)

    def nbytes(self) -> int:
        return self.kv.nbytes() + sum(s.numel() * s.element_size() for s in self.summaries)


MASKED_MAX_PAIRS = 1 << 20


def masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One fused SDPA call of q (B, H, Lq, D) over k, v (B, H_kv, Lk, D) under a per-head bool mask (B, H, Lq, Lk),
    every row holding a key: the selectors' ``masked`` backends (gqa.sdpa takes only a mask shared by every head)."""
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, gqa.repeat_kv(k, g), gqa.repeat_kv(v, g), attn_mask=mask)


def short_calls_masked(module: Attention, name: str) -> str:
    """``auto``'s pick for a selector that has a ``masked`` backend: ``masked`` for a call of up to MASKED_MAX_PAIRS
    (query, key) pairs (training at our lengths: fused calls where gathering loops over key heads), else ``name``."""
    pairs = (module.dispatch_queries or 0) * (module.dispatch_keys or 0)
    limit = getattr(module, "MASKED_MAX_PAIRS", MASKED_MAX_PAIRS)
    return "masked" if name == "gathered" and module.backend == "auto" and 0 < pairs <= limit else name


class BlockSelectingAttention(Attention):
    """Base of the variants that pick key blocks per query (MoBA, Quest): a subclass says how big a block is, how many
    it picks, what it keeps of each complete block (``summarize``) and how a query scores those summaries (``score``);
    the rule, the backends, the decoding state and the counts are shared here.

    Backends: ``reference`` (a dense mask from the chosen blocks), ``masked`` (the same mask through SDPA: one fused
    call, O(Lq Lk)), ``gathered`` (each query's chosen blocks gathered: linear in length). ``auto`` runs ``masked``
    up to MASKED_MAX_PAIRS (query, key) pairs -- training at MQAR's lengths -- and ``gathered`` above; a decoding
    step always gathers (it reads the chosen blocks only)."""

    supports_gqa = True
    supports_bidirectional = False
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="dense mask from the chosen blocks"),
        Backend("gathered", {"cpu": ALL_MODES, "cuda": ALL_MODES},
                note="gathers each query's chosen blocks: linear in length"),
        Backend("masked", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="the chosen blocks as a mask through SDPA"),
    )
    MASKED_MAX_PAIRS: ClassVar[int] = MASKED_MAX_PAIRS

    # -- what a subclass says --------------------------------------------------------------------------
    @property
    def block(self) -> int:
        raise NotImplementedError

    @property
    def n_select(self) -> int:
        """Blocks chosen besides a query's own."""
        raise NotImplementedError

    def summarize(self, blocks: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Complete blocks (B, H_kv, n, bs, D) -> what a query scores, each (B, H_kv, n, D)."""
        raise NotImplementedError

    def score(self, q: torch.Tensor, summaries: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """q (B, H, C, D) against the summaries -> (B, H, C, n)."""
        raise NotImplementedError

    def dense_call(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether this call attends densely instead of selecting (Quest's prefill)."""
        return False

    # -- shared --------------------------------------------------------------------------------------------
    def select(self, q: torch.Tensor, k: torch.Tensor, summaries: tuple[torch.Tensor, ...] = ()
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chosen blocks of each query as the newest token: (idx, valid), each (B, H, Lq, n_select). ``summaries``: the
        complete blocks' summaries when a decoding state already holds them."""
        summaries = summaries or self.summarize(block_view(k, self.block))
        return choose(q, k.shape[2], self.block, self.n_select, lambda qc: self.score(qc, summaries))

    def kept_keys(self, q, k, causal=True, **inputs):
        return selection_mask(*self.select(q, k), k.shape[2], self.block)

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        return short_calls_masked(self, super().select_backend(device, dtype, mode))

    def backend_reference(self, q, k, v, causal):
        B, H, Lq, _ = q.shape
        Hkv, Lk = k.shape[1], k.shape[2]
        if self.dense_call(q, k):
            return dense_attention(q, k, v, causal_mask(Lq, Lk, q.device))
        return dense_attention(q, k, v, self.kept_keys(q, k).view(B, Hkv, H // Hkv, Lq, Lk))

    def backend_masked(self, q, k, v, causal, summaries: tuple[torch.Tensor, ...] = ()):
        if self.dense_call(q, k):
            return gqa.sdpa(q, k, v, is_causal=True)
        with torch.no_grad():  # the choice is a fixed index set: no gradient through the scores
            mask = selection_mask(*self.select(q, k, summaries), k.shape[2], self.block)  # (B, H, Lq, Lk)
        return masked_sdpa(q, k, v, mask)

    def backend_gathered(self, q, k, v, causal, summaries: tuple[torch.Tensor, ...] = ()):
        if self.dense_call(q, k):
            return gqa.sdpa(q, k, v, is_causal=True)
        with torch.no_grad():
            idx, valid = self.select(q, k, summaries)
        return attend_selected(q, k, v, idx, valid, self.block)

    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        return selected_pairs(q_len, k_len, self.block, self.n_select)

    def new_state(self, max_len: int = 0) -> SummaryCache:
        return SummaryCache(self.block, self.summarize, KVCache(capacity_hint=max_len))

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: SummaryCache) -> torch.Tensor:
        keys, values, summaries = state.append(k, v)
        if self.backend == "reference" or self.dense_call(q, keys):
            return self(q, keys, values, causal=True)
        name = "masked" if self.backend == "masked" else "gathered"
        self.last_backend = name
        return getattr(self, f"backend_{name}")(q, keys, values, True, summaries)


__all__ = [
    "BlockSelectingAttention", "SummaryCache", "attend_selected", "block_view", "candidate_blocks", "choose",
    "gather_rows", "grouped_scores", "query_blocks", "selected_pairs", "selection_mask", "top_blocks",
]
