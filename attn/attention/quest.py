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
from attn.attention.masks import visible_pairs
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
class QuestAttention(bsel.BlockSelectingAttention):
    """Decoding queries attend to their own page and the pages whose key bounds promise them the highest scores."""

    dense_prefill = True

    @property
    def block(self) -> int:
        return self.config.page_size

    @property
    def n_select(self) -> int:
        return self.config.pages

    def summarize(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return page_bounds(blocks)

    def score(self, q: torch.Tensor, summaries: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return score_bound(q, *summaries)

    def dense_call(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        return q.shape[2] == k.shape[2]  # a prefill: full attention, as in the paper

    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        if q_len == k_len:
            return visible_pairs(q_len, k_len, True)
        return super().pairs(q_len, k_len, causal)

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        """A decoding step bounds every complete page: two matmuls of D, 4 D FLOPs per page (the min/max kept per
        page are comparisons, not counted). A prefill (forward, train) is dense: it selects nothing."""
        if mode != "decode":
            return 0
        return 4 * batch * heads * head_dim * bsel.candidate_blocks(1, seq_len + 1, self.config.page_size)

    def selection_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """A decoding step reads the min and max key of every complete page before its own, per key head."""
        return 2 * batch * kv_heads * head_dim * bsel.candidate_blocks(1, seq_len + 1, self.config.page_size)


__all__ = ["QuestAttention", "QuestConfig", "page_bounds", "score_bound"]
