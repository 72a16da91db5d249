"""DSA, DeepSeek Sparse Attention (DeepSeek-V3.2, arXiv:2512.02556, sec. 2.1): each query attends to the ``topk`` keys
a lightning indexer scores highest.

The indexer has its own per-token projections (token inputs, made by the backbone from the layer input): index queries
``q_I`` (``index_heads`` x ``index_dim``), one index key ``k_I`` (``index_dim``) and head weights ``w``
(``index_heads``). Its score of key s for the query at t is

    I[t, s] = sum_j w[t, j] * relu(q_I[t, j] . k_I[s])        (the paper's eq. 1)

over the visible keys s <= t (causal, bottom-right aligned: query row r of Lq is position Lk - Lq + r). Each query
keeps the ``topk`` visible keys of highest I (all of them when fewer are visible) and attends to those only, with the
main softmax scale 1 / sqrt(D). Ties go to the lower key index (the set a stable descending sort keeps; a relu that
zeroes every head ties exactly, -0.0 == +0.0). As DSA shares one indexer across its heads, the choice is per *key
head* here: the G query heads of a GQA group share it (the token inputs are per key head, as all of them are).

The choice is a fixed index set: no gradient reaches the indexer through the main attention. The indexer is trained
by the paper's KL loss instead (:func:`indexer_kl`, its dense warm-up form: ``KL(p || softmax(I))`` over all visible
keys, p = the main attention summed over the group's heads and L1-normalised, the main model detached); a layer with
``kl_weight > 0`` leaves ``kl_weight * KL`` in ``aux_loss`` after each training forward, which the training loop adds.

Decoding keeps every key, value and index key (any of them may be chosen later): a step scores its token against all
cached index keys and reads ``topk`` keys, so its attention is flat in context while the indexer's work is linear.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from attn.attention import block_selection as bsel
from attn.attention.base import ALL_MODES, Attention, Backend, UnsupportedBackend
from attn.attention.full import dense_attention
from attn.attention.masks import causal_mask, visible_pairs
from attn.attention.state import KVCache
from attn.attention.token_inputs import TokenInput
from attn.registry import check, register_attention


@dataclass(frozen=True)
class DsaConfig:
    topk: int = 64  # keys per query (the paper: 2048 at 128K context)
    index_heads: int = 4  # indexer heads H_I (the paper: 64)
    index_dim: int = 16  # indexer head dim d_I (the paper: 128)
    kl_weight: float = 0.0  # weight of the indexer's KL loss in training (0: the indexer is not trained)

    def __post_init__(self) -> None:
        check(self.topk >= 1, f"topk must be >= 1, got {self.topk}")
        check(self.index_heads >= 1, f"index_heads must be >= 1, got {self.index_heads}")
        check(self.index_dim >= 1, f"index_dim must be >= 1, got {self.index_dim}")
        check(self.kl_weight >= 0, f"kl_weight must be >= 0, got {self.kl_weight}")


def index_inputs(cfg: DsaConfig) -> tuple[TokenInput, ...]:
    return (TokenInput("index_q", cfg.index_heads * cfg.index_dim, doc="indexer queries, index_heads x index_dim"),
            TokenInput("index_k", cfg.index_dim, doc="indexer key, shared by the indexer heads"),
            TokenInput("index_w", cfg.index_heads, doc="indexer head weights"))


def index_scores(iq: torch.Tensor, ik: torch.Tensor, iw: torch.Tensor) -> torch.Tensor:
    """I = sum_j w_j relu(q_I,j . k_I): iq (B, H_kv, C, H_I * d_I), ik (B, H_kv, Lk, d_I), iw (B, H_kv, C, H_I)
    -> (B, H_kv, C, Lk), in at least float32 (no mask)."""
    f = torch.promote_types(iq.dtype, torch.float32)
    B, Hkv, C, _ = iq.shape
    hi = iw.shape[-1]
    dots = iq.to(f).reshape(B, Hkv, C * hi, -1) @ ik.to(f).transpose(-2, -1)  # (B, H_kv, C * H_I, Lk)
    relu = F.relu_(dots) if not torch.is_grad_enabled() else F.relu(dots)
    lk = dots.shape[-1]  # the weighted sum over the heads as a product: no (C, H_I, Lk) temporary
    return torch.bmm(iw.to(f).reshape(B * Hkv * C, 1, hi), relu.view(B * Hkv * C, hi, lk)).view(B, Hkv, C, lk)


def top_keys(scores: torch.Tensor, start: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``topk`` best visible keys of each query: scores (B, H_kv, C, Lk) of the queries at positions start..start+C-1
    -> (idx, valid), each (B, H_kv, C, S), S = min(topk, Lk); ties to the lower index, slots past the visible keys
    invalid (their idx points at some key, in bounds)."""
    C, Lk = scores.shape[2], scores.shape[3]
    S = min(topk, Lk)
    t = torch.arange(start, start + C, device=scores.device)  # absolute query positions
    future = torch.arange(Lk, device=scores.device)[None, :] > t[:, None]  # (C, Lk)
    s = scores.masked_fill(future, float("-inf"))  # -0.0 == +0.0 in every comparison: they tie
    # a short row (fewer than S visible keys) ties -inf at the cut: its visible keys, then the first future ones as
    # its invalid slots
    idx = bsel.stable_topk(s, S)[1]
    valid = torch.arange(S, device=scores.device) <= t[:, None]  # (C, S): t + 1 keys visible, first in index order
    return idx, valid.expand(*scores.shape[:2], C, S)


def select(iq: torch.Tensor, ik: torch.Tensor, iw: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`top_keys` of the indexer over chunks of queries (the (B, H_kv, C * H_I, Lk) dots bounded by
    GATHER_ELEMENTS): iq, iw of the last Lq positions, ik of all Lk -> idx, valid (B, H_kv, Lq, S)."""
    B, Hkv, Lq, _ = iq.shape
    Lk = ik.shape[2]
    if topk >= Lk:  # every visible key is kept (training at or below topk tokens: the dense warm-up): nothing to rank
        t = torch.arange(Lk - Lq, Lk, device=iq.device)[:, None]
        idx = torch.arange(Lk, device=iq.device).expand(B, Hkv, Lq, Lk)
        return idx, (idx <= t).expand(B, Hkv, Lq, Lk)
    step = max(1, bsel.GATHER_ELEMENTS // max(1, B * Hkv * iw.shape[-1] * Lk))
    # a chunk scores only the keys its last query sees (at least S of them, so every chunk keeps S slots)
    seen = [max(Lk - Lq + min(Lq, a + step), min(topk, Lk)) for a in range(0, Lq, step)]
    parts = [top_keys(index_scores(iq[:, :, a:a + step], ik[:, :, :n], iw[:, :, a:a + step]), Lk - Lq + a, topk)
             for a, n in zip(range(0, Lq, step), seen, strict=True)]
    return torch.cat([i for i, _ in parts], 2), torch.cat([v for _, v in parts], 2)


def selection_mask(idx: torch.Tensor, valid: torch.Tensor, k_len: int) -> torch.Tensor:
    """Dense (B, H_kv, Lq, Lk) bool mask of the chosen keys."""
    mask = torch.zeros(*idx.shape[:3], k_len + 1, dtype=torch.bool, device=idx.device)
    return mask.scatter_(-1, torch.where(valid, idx, k_len), True)[..., :k_len]  # invalid slots: a spare column


def attend_chosen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor
                  ) -> torch.Tensor:
    """Softmax attention over each query's chosen keys only. q (B, H, Lq, D), k, v (B, H_kv, Lk, D), idx/valid
    (B, H_kv, Lq, S) -> (B, H, Lq, D). The G query heads of a key head share its gathered keys; queries go in chunks
    that bound the gathered temporaries (GATHER_ELEMENTS). Differentiable in q, k, v; keys gathered in >= float32."""
    B, H, Lq, D = q.shape
    Hkv, S = k.shape[1], idx.shape[-1]
    g = H // Hkv
    f = torch.promote_types(q.dtype, torch.float32)
    kf, vf = k.to(f), v.to(f)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    step = max(1, bsel.GATHER_ELEMENTS // max(1, B * max(H, Hkv * D) * S))
    outs = []
    for a in range(0, Lq, step):
        e = min(Lq, a + step)
        C = e - a
        pos = idx[:, :, a:e].reshape(B, Hkv, C * S)
        kg, vg = (bsel.gather_rows(x, pos, grad).view(B, Hkv, C, S, D) for x in (kf, vf))  # (B, H_kv, C, S, D)
        qc = q[:, :, a:e].to(f).view(B, Hkv, g, C, D)
        scores = torch.einsum("bhgcd,bhcsd->bhgcs", qc, kg) / math.sqrt(D)
        probs = torch.softmax(scores.masked_fill(~valid[:, :, None, a:e], float("-inf")), -1)  # slot 0 always valid
        outs.append(torch.einsum("bhgcs,bhcsd->bhgcd", probs, vg).reshape(B, H, C, D))
    return torch.cat(outs, 2).to(q.dtype)


def kl_terms(q: torch.Tensor, k: torch.Tensor, causal: bool, index_q: torch.Tensor, index_k: torch.Tensor,
             index_w: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(sum over the (B, H_kv, Lq) query rows of KL(p || softmax(I)), number of rows); see :func:`indexer_kl`."""
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    visible = causal_mask(Lq, Lk, q.device, causal=causal)
    with torch.no_grad():  # the main attention is the target: detached
        f = torch.promote_types(q.dtype, torch.float32)
        s = q.to(f).view(B, Hkv, H // Hkv, Lq, D) @ k.to(f)[:, :, None].transpose(-2, -1) / math.sqrt(D)
        p = torch.softmax(s.masked_fill(~visible, float("-inf")), -1).sum(2)  # (B, H_kv, Lq, Lk), summed over heads
        p = p / p.sum(-1, keepdim=True)
    scores = index_scores(index_q[:, :, Lk - Lq:], index_k, index_w[:, :, Lk - Lq:])
    logq = torch.log_softmax(scores.masked_fill(~visible, float("-inf")), -1)
    kl = torch.where(p > 0, p * (p.clamp(min=1e-300).log() - logq.clamp(min=-1e30)), 0.0)
    return kl.sum(), B * Hkv * Lq


def indexer_kl(q: torch.Tensor, k: torch.Tensor, causal: bool, index_q: torch.Tensor, index_k: torch.Tensor,
               index_w: torch.Tensor) -> torch.Tensor:
    """The indexer's warm-up loss (DeepSeek-V3.2 sec. 2.1): mean over queries and key heads of KL(p || softmax(I))
    over the visible keys, p = the main attention of the key head's G query heads, summed and L1-normalised.
    Gradients reach only the index inputs. q (B, H, Lq, D), k (B, H_kv, Lk, D), index inputs over Lk -> scalar."""
    total, rows = kl_terms(q, k, causal, index_q, index_k, index_w)
    return total / rows


@dataclass
class IndexedCache:
    """Every key and value (a KVCache) and every index key (a KVCache of width-0 values), for a decoding step."""

    kv: KVCache = field(default_factory=KVCache)
    index: KVCache = field(default_factory=KVCache)

    @property
    def length(self) -> int:
        return self.kv.length

    def append(self, k: torch.Tensor, v: torch.Tensor, index_k: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values = self.kv.append(k, v)
        return keys, values, self.index.append(index_k, index_k[..., :0])[0]

    def truncate(self, length: int) -> None:
        self.kv.truncate(length)
        self.index.truncate(length)

    def nbytes(self) -> int:
        ik = self.index.k
        return self.kv.nbytes() + (0 if ik is None else ik[:, :, :self.length].numel() * ik.element_size())


@register_attention("dsa", config=DsaConfig)
class DsaAttention(Attention):
    """Each query attends to the topk keys a lightning indexer (relu'd, weighted multi-head dots) scores highest.

    Backends: ``reference`` (a dense mask of the choice), ``gathered`` (gathers only the chosen keys: linear in length),
    ``masked`` (the mask through SDPA: O(Lq Lk), what ``auto`` runs for calls of up to 1M (query, key) pairs, i.e.
    training here, where gathering loops over key heads).
    """

    supports_gqa = True
    supports_bidirectional = False
    token_inputs = index_inputs(DsaConfig())  # the defaults' widths; an instance holds its config's
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="dense mask of the chosen keys"),
        Backend("gathered", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="gathers each query's topk keys"),
        Backend("masked", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="the chosen keys as a mask through SDPA"),
    )
    MASKED_MAX_PAIRS: ClassVar[int] = bsel.MASKED_MAX_PAIRS
    aux_loss: torch.Tensor | None
    _kl_parts: list | None

    def __init__(self, config: DsaConfig, backend: str = "auto"):
        super().__init__(config, backend)
        self.token_inputs = index_inputs(config)
        self.aux_loss = None
        self._kl_parts = None

    def kept_keys(self, q, k, causal=True, **inputs):
        if "index_q" not in inputs:
            raise UnsupportedBackend("dsa chooses by its indexer's token inputs (index_q, index_k, index_w): none given "
                                     "(a model trained with it has them)")
        Lq, Lk = q.shape[2], k.shape[2]
        with torch.no_grad():
            idx, valid = select(inputs["index_q"][:, :, Lk - Lq:], inputs["index_k"], inputs["index_w"][:, :, Lk - Lq:],
                                self.config.topk)
        return selection_mask(idx, valid, Lk).repeat_interleave(q.shape[1] // k.shape[1], 1)

    def forward(self, q, k, v, causal=True, *, documents=None, **inputs):
        collect = self.training and self.config.kl_weight > 0 and self._kl_parts is None
        if collect:
            self._kl_parts = []  # one part per call a packed batch is split into (base.per_document)
        try:
            out = super().forward(q, k, v, causal, documents=documents, **inputs)
            if collect:
                total = sum(s for s, _ in self._kl_parts)
                self.aux_loss = self.config.kl_weight * total / sum(n for _, n in self._kl_parts)
        finally:
            if collect:
                self._kl_parts = None
        return out

    def _attend(self, q, k, v, causal, name, iq, ik, iw):
        """The backend ``name`` on queries whose index inputs iq, iw are (B, H_kv, Lq, .), ik over all Lk keys."""
        with torch.no_grad():  # the choice is a fixed index set
            idx, valid = select(iq, ik, iw, self.config.topk)
        if name == "reference":
            mask = selection_mask(idx, valid, k.shape[2])[:, :, None]  # (B, H_kv, 1, Lq, Lk): shared by the group
            return dense_attention(q, k, v, mask)
        if name == "masked":  # slot 0 is always valid: no empty row
            mask = selection_mask(idx, valid, k.shape[2]).repeat_interleave(q.shape[1] // k.shape[1], 1)
            return bsel.masked_sdpa(q, k, v, mask)  # (B, H, Lq, Lk)
        return attend_chosen(q, k, v, idx, valid)

    def _call(self, q, k, v, causal, name, index_q, index_k, index_w):
        Lq, Lk = q.shape[2], k.shape[2]
        if self._kl_parts is not None:
            self._kl_parts.append(kl_terms(q, k, causal, index_q, index_k, index_w))
        out = self._attend(q, k, v, causal, name, index_q[:, :, Lk - Lq:], index_k, index_w[:, :, Lk - Lq:])
        if torch.is_grad_enabled() and any(t.requires_grad for t in (index_q, index_k, index_w)):
            # the choice is piecewise constant in the index inputs: their gradient is 0 (not None, so callers that
            # differentiate every token input, as attn/checks.py does, get one); an empty sum adds exactly 0
            out = out + sum(t.flatten()[:0].sum() for t in (index_q, index_k, index_w))
        return out

    def backend_reference(self, q, k, v, causal, **inputs):
        return self._call(q, k, v, causal, "reference", **inputs)

    def backend_gathered(self, q, k, v, causal, **inputs):
        return self._call(q, k, v, causal, "gathered", **inputs)

    def backend_masked(self, q, k, v, causal, **inputs):
        return self._call(q, k, v, causal, "masked", **inputs)

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        """``auto``: ``masked`` up to MASKED_MAX_PAIRS (query, key) pairs, ``gathered`` above (and for decoding steps,
        which gather in :meth:`step`)."""
        return bsel.short_calls_masked(self, super().select_backend(device, dtype, mode))

    def new_state(self, max_len: int = 0) -> IndexedCache:
        return IndexedCache(KVCache(capacity_hint=max_len), KVCache(capacity_hint=max_len))

    def step(self, q, k, v, state: IndexedCache, index_q, index_k, index_w):
        keys, values, index_keys = state.append(k, v, index_k)
        name = "reference" if self.backend == "reference" else "gathered"
        self.last_backend = name
        return self._attend(q, keys, values, True, name, index_q, index_keys, index_w)

    # -- counts ---------------------------------------------------------------------------------------------
    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        """Chosen (query, key) pairs: min(topk, t + 1) for the query at position t."""
        t = torch.arange(k_len - q_len, k_len, dtype=torch.int64)
        return int((t + 1).clamp(max=self.config.topk).sum())

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        """The indexer, per key head (its G query heads share it) and per (query, visible key) pair: H_I dots of d_I
        (2 H_I d_I) and the weighted sum over the heads, H_I MACs (2 H_I); the relu and the sort are not counted.
        So 2 H_I (d_I + 1) per pair, over L(L+1)/2 causal pairs (forward), or a decoding step's one query against
        its L + 1 keys. Training adds nothing unless the KL loss is on (``kl_weight > 0``): then the indexer's
        backward (2x its forward, as for any matmul) and the detached main scores the loss reads, 2 D per (query
        head, visible pair); the softmaxes are not counted."""
        hkv = kv_heads or heads
        per_pair = 2 * self.config.index_heads * (self.config.index_dim + 1)
        if mode == "decode":
            return batch * hkv * per_pair * (seq_len + 1)
        n = visible_pairs(seq_len, seq_len, True)
        indexer = batch * hkv * per_pair * n
        if mode == "train" and self.config.kl_weight > 0:
            return 3 * indexer + 2 * batch * heads * head_dim * n
        return indexer

    def selection_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """The indexer keys of the L cached tokens, per key head (the new token's come with the call)."""
        return batch * kv_heads * seq_len * self.config.index_dim


__all__ = ["DsaAttention", "DsaConfig", "IndexedCache", "attend_chosen", "index_scores", "indexer_kl", "select",
           "selection_mask", "top_keys"]
