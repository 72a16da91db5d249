"""Quest, query-aware KV-cache page selection (Tang et al. 2024, arXiv:2406.10774): decoding reads the pages a
query's scores could be largest on.

The cache is cut into pages of ``page_size`` tokens, and each complete page keeps the element-wise minimum ``m`` and
maximum ``M`` of its keys. A decoding query ``q`` bounds its score on any key of a page by
``sum_i max(q_i m_i, q_i M_i)`` (= ``relu(q) . M + min(q, 0) . m``: two matmuls), keeps the pages that fill
``token_budget`` -- its own, still being written, always, as serving implementations keep the newest page -- and
attends to their tokens. The rule and the fast path are shared with MoBA (block_selection.py).

The prompt is full attention, as in the paper: a call whose queries are the whole sequence (a prefill, Lq == Lk)
attends densely, and only calls that extend a context (Lq < Lk: decoding, a question after a document) select
(``dense_prefill``). So decoding equals the forward call by call, and through transformers' cache (``--hf-model``)
the prefill is dense and every generated token selects, as Quest runs. :meth:`kept_keys` gives the selection every
query would make as the newest token (what the selector-fidelity task scores). The paper also leaves the first two
layers dense; here that is the model's choice per layer (a layer-typed spec), not the variant's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attn.attention import block_selection as bsel
from attn.attention import gqa
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.full import causal_mask, dense_attention
from attn.registry import check, register_attention


@dataclass(frozen=True)
class QuestConfig:
    page_size: int = 16  # the paper's page
    token_budget: int = 256  # keys a decoding query reads, in whole pages, its own included (paper: 256 to 4096)

    def __post_init__(self) -> None:
        check(self.page_size >= 1, f"page_size must be >= 1, got {self.page_size}")
        check(self.token_budget >= self.page_size and self.token_budget % self.page_size == 0,
              f"token_budget must be a positive multiple of page_size ({self.page_size}), got {self.token_budget}")

    @property
    def pages(self) -> int:
        """Pages a query reads besides its own."""
        return self.token_budget // self.page_size - 1


def page_bounds(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quest's page metadata: complete pages (B, H_kv, n, ps, D) -> element-wise key minima and maxima (B, H_kv, n, D)."""
    return blocks.amin(-2), blocks.amax(-2)


def score_bound(q: torch.Tensor, minima: torch.Tensor, maxima: torch.Tensor) -> torch.Tensor:
    """Upper bound of q's score on each page: sum_i max(q_i m_i, q_i M_i) -> (B, H, Lq, n) (with m <= M, the positive
    channels of q meet M and the negative ones m)."""
    f = minima.dtype
    qf = q.to(f)
    return bsel.grouped_scores(qf.clamp(min=0), maxima) + bsel.grouped_scores(qf.clamp(max=0), minima)


@register_attention("quest", config=QuestConfig)
class QuestAttention(Attention):
    """Decoding queries attend to their own page and the pages whose key bounds promise them the highest scores."""

    supports_gqa = True
    supports_bidirectional = False
    dense_prefill = True
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="dense mask from the chosen pages"),
        Backend("gathered", {"cpu": ALL_MODES, "cuda": ALL_MODES},
                note="prefill: SDPA; extending calls gather each query's chosen pages"),
    )

    def select(self, q: torch.Tensor, k: torch.Tensor, bounds: tuple[torch.Tensor, ...] = ()
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chosen pages of each query as the newest token: (idx, valid), each (B, H, Lq, budget / page - 1).
        ``bounds``: the complete pages' (minima, maxima) when a decoding state already holds them."""
        ps = self.config.page_size
        minima, maxima = bounds or page_bounds(bsel.block_view(k, ps))  # (B, H_kv, n, D) each
        return bsel.choose(q, k.shape[2], ps, self.config.pages, lambda qc: score_bound(qc, minima, maxima))

    def kept_keys(self, q, k, causal=True, **inputs):
        return bsel.selection_mask(*self.select(q, k), k.shape[2], self.config.page_size)

    def backend_reference(self, q, k, v, causal):
        B, H, Lq, _ = q.shape
        Hkv, Lk = k.shape[1], k.shape[2]
        if Lq == Lk:
            return dense_attention(q, k, v, causal_mask(Lq, Lk, q.device))
        return dense_attention(q, k, v, self.kept_keys(q, k).view(B, Hkv, H // Hkv, Lq, Lk))

    def backend_gathered(self, q, k, v, causal, bounds: tuple[torch.Tensor, ...] = ()):
        if q.shape[2] == k.shape[2]:
            return gqa.sdpa(q, k, v, is_causal=True)
        with torch.no_grad():  # the pages are a fixed index set: no gradient through the bound
            idx, valid = self.select(q, k, bounds)
        return bsel.attend_selected(q, k, v, idx, valid, self.config.page_size)

    # -- cost ------------------------------------------------------------------------------
    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        if q_len == k_len:
            return super().pairs(q_len, k_len, True)
        return bsel.selected_pairs(q_len, k_len, self.config.page_size, self.config.pages)

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        """A decoding step bounds every complete page: two matmuls of D, 4 D FLOPs per page (the min/max kept per
        page are comparisons, not counted). A prefill (forward, train) is dense: it selects nothing."""
        if mode != "decode":
            return 0
        return 4 * batch * heads * head_dim * bsel.candidate_blocks(1, seq_len + 1, self.config.page_size)

    # -- decoding --------------------------------------------------------------------------
    def new_state(self, max_len: int = 0) -> bsel.SummaryCache:
        return bsel.SummaryCache(self.config.page_size, page_bounds, bsel.KVCache(capacity_hint=max_len))

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: bsel.SummaryCache) -> torch.Tensor:
        keys, values, bounds = state.append(k, v)
        if self.backend == "reference" or q.shape[2] == keys.shape[2]:
            return self(q, keys, values, causal=True)
        self.last_backend = "gathered"
        return self.backend_gathered(q, keys, values, True, bounds)


__all__ = ["QuestAttention", "QuestConfig", "page_bounds", "score_bound"]
