"""Vertical-slash sparse prefill (MInference, Jiang et al. 2024, arXiv:2407.02490): each head's attention in a long
prompt concentrates on a few key columns (verticals: sinks, separators) and a few diagonals (slashes: fixed offsets).

The last ``last_q`` queries' attention over every key (causal, softmax in float32) estimates, per query head, the
``vertical_size`` columns and the ``slash_size`` query-key distances with the largest summed probability; the first
30 columns and the 100 nearest distances are always taken (microsoft/MInference ``vertical_and_slash_kernel``). The
prefill computes what MInference's kernel computes for a query block of 64 (``convert_vertical_slash_indexes``): a
chosen distance ``d`` gives the block ``[start, start + 64)`` the 64 keys ``[start - d, start + 64 - d)``, and the
chosen columns are read one by one; then causal. Its kernel also widens merged ranges to whole 64-key steps (a few
more keys); ours keeps the exact union.

MInference's per-head configurations for Llama-3-8B use (1000, 6096) at 128K contexts, the default here; shorter
prompts need far smaller sizes for the same sparsity (rows record the density reached).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attn.attention.base import Backend, UnsupportedBackend, modes
from attn.attention.flex import BlockMask, flex_unavailable, run_flex
from attn.attention.prompt_sparse import PromptSparseAttention, causal_probs, kv_blocks
from attn.registry import check, register_attention

SINK_COLUMNS = 30  # first keys always taken as verticals
LOCAL_DISTANCES = 100  # nearest query-key distances always taken as slashes
BLOCK = 64  # MInference's kernel tiles (BLOCK_M = BLOCK_N = 64)


@dataclass(frozen=True)
class VerticalSlashConfig:
    vertical_size: int = 1000
    slash_size: int = 6096
    last_q: int = 64

    def __post_init__(self) -> None:
        check(self.vertical_size >= SINK_COLUMNS,
              f"vertical_size must be >= {SINK_COLUMNS} (the first {SINK_COLUMNS} columns are always taken), "
              f"got {self.vertical_size}")
        check(self.slash_size >= LOCAL_DISTANCES,
              f"slash_size must be >= {LOCAL_DISTANCES} (the {LOCAL_DISTANCES} nearest distances are always taken), "
              f"got {self.slash_size}")
        check(self.last_q >= 1, f"last_q must be >= 1, got {self.last_q}")


def line_scores(p: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The last queries' probabilities p (B, H, m, L), query t of m at position L - m + t -> vertical (B, H, L), the
    column sums, and slash (B, H, L), the sum over the queries of the key at distance d, by scatter."""
    B, H, m, L = p.shape
    t = torch.arange(length - m, length, device=p.device)[:, None]
    d = (t - torch.arange(L, device=p.device)[None, :]).clamp(min=0, max=L)  # future keys carry 0 probability
    slash = p.new_zeros(B, H, L + 1).scatter_add_(-1, d.flatten().expand(B, H, -1), p.flatten(2))[..., :L]
    return p.sum(-2), slash


def line_scores_by_diagonal(p: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same sums read diagonal by diagonal (the reference)."""
    m = p.shape[2]
    off = length - m
    slash = torch.stack([p.diagonal(offset=off - d, dim1=-2, dim2=-1).sum(-1) for d in range(length)], -1)
    return p.sum(-2), slash


def slash_ranges(slash: torch.Tensor, length: int) -> torch.Tensor:
    """Chosen distances (B, H, L) bool -> (B, H, R, L): for each query block of 64 starting at ``start`` and each
    distance d the keys [start - d, start + 64 - d) (a difference array, then a running sum)."""
    B, H, L = slash.shape
    dev = slash.device
    R = -(-length // BLOCK)
    start = torch.arange(R, device=dev) * BLOCK
    diff = torch.zeros(B, H, R, L + 1, dtype=torch.int32, device=dev)
    b, h, d = slash.nonzero(as_tuple=True)
    lo = (start[None, :] - d[:, None]).clamp(0, L)  # (n, R)
    hi = (start[None, :] + BLOCK - d[:, None]).clamp(0, L)
    rows = torch.arange(R, device=dev).expand_as(lo)
    ones = torch.ones_like(lo, dtype=torch.int32)
    diff.index_put_((b[:, None].expand_as(lo), h[:, None].expand_as(lo), rows, lo), ones, accumulate=True)
    diff.index_put_((b[:, None].expand_as(hi), h[:, None].expand_as(hi), rows, hi), -ones, accumulate=True)
    return diff.cumsum(-1)[..., :L] > 0


@register_attention("vertical_slash", config=VerticalSlashConfig)
class VerticalSlashAttention(PromptSparseAttention):
    """Each head's chosen columns and diagonals, estimated from the last ``last_q`` queries' attention."""

    chooses_keys = True
    backends = (
        *PromptSparseAttention.backends,
        Backend("flex", {"cpu": modes("forward"), "cuda": modes("forward")},
                dtypes=(torch.float32, torch.bfloat16, torch.float16), requires=flex_unavailable,
                note="compiled FlexAttention over [each head's chosen columns; the keys], a BlockMask per call: the "
                     "columns as leading key blocks, the diagonal ranges as the blocks they touch (no CPU backward)"),
    )
    auto_order = {"cpu/forward": ("flex", "gathered")}

    @property
    def block(self) -> int:
        return BLOCK

    def lines(self, q: torch.Tensor, k: torch.Tensor, reference: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's chosen columns (B, H, L) and query-key distances (B, H, L), as bool masks."""
        cfg, L = self.config, q.shape[2]
        m = min(cfg.last_q, L)
        if reference:  # the rows of the dense causal attention, then each diagonal read off
            vertical, slash = line_scores_by_diagonal(causal_probs(q, k)[:, :, L - m:], L)
        else:
            vertical, slash = line_scores(causal_probs(q, k, slice(L - m, L)), L)
        vertical[..., :SINK_COLUMNS] = float("inf")
        slash[..., :LOCAL_DISTANCES] = float("inf")
        return _top(vertical, cfg.vertical_size), _top(slash, cfg.slash_size)

    def choose(self, q: torch.Tensor, k: torch.Tensor, reference: bool) -> torch.Tensor:
        vertical, slash = self.lines(q, k, reference)
        ranges = slash_ranges(slash, q.shape[2])
        self.parts = (vertical, ranges)  # the flex path reads columns and ranges apart
        return ranges | vertical[:, :, None, :]

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        name = super().select_backend(device, dtype, mode)
        return "gathered" if name == "flex" and self.backend == "auto" and self.short_for_flex() else name

    def backend_flex(self, q, k, v, causal):
        return self._run(q, k, v, reference=False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if self.last_backend != "flex":
            return super().attend(q, k, v, keys)
        if q.requires_grad or k.requires_grad or v.requires_grad:
            raise UnsupportedBackend("vertical_slash/flex: forward only")
        return flex_lines(q, k, v, *self.parts)

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        """The estimate: last_q queries against every key (2 per MAC); decoding chooses nothing."""
        if mode == "decode":
            return 0
        return 2 * batch * heads * min(self.config.last_q, seq_len) * seq_len * head_dim


def flex_lines(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vertical: torch.Tensor,
               ranges: torch.Tensor) -> torch.Tensor:
    """The rule in one compiled FlexAttention call: each query head's keys are [its chosen columns, padded to whole
    blocks; all L keys], and the BlockMask lists for a query block the column blocks (a column counts where it lies
    before the block and outside its ranges) and the key blocks its ranges touch (inside the ranges and before the
    diagonal: whole, no mask). q (B, H, L, D), k, v (B, H_kv, L, D), vertical (B, H, L), ranges (B, H, R, L)."""
    B, H, R, L = ranges.shape
    dev, g = q.device, H // k.shape[1]
    start = torch.arange(R, device=dev) * BLOCK
    n_cols = vertical.sum(-1, keepdim=True)  # (B, H, 1)
    Vp = max(BLOCK, -(-int(n_cols.max()) // BLOCK) * BLOCK)
    order = torch.argsort((~vertical).to(torch.int8), dim=-1, stable=True)[..., :Vp]  # chosen columns first
    order = torch.nn.functional.pad(order, (0, Vp - order.shape[-1]), value=L)  # fewer keys than column slots
    colpos = torch.where(torch.arange(Vp, device=dev) < n_cols, order, L)  # (B, H, Vp); L marks padding
    at = colpos.clamp(max=L - 1)
    col_ok = ~ranges.gather(-1, at[:, :, None, :].expand(-1, -1, R, -1)) & (colpos[:, :, None, :] < start[:, None])
    kh, vh = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    idx = at[..., None].expand(-1, -1, -1, k.shape[-1])
    k2, v2 = torch.cat([kh.gather(2, idx), kh], 2), torch.cat([vh.gather(2, idx), vh], 2)  # (B, H, Vp + L, D)
    pad = R * BLOCK - L
    rblk = torch.nn.functional.pad(ranges, (0, pad)).reshape(B, H, R, R, BLOCK)
    r, c = torch.arange(R, device=dev)[:, None], torch.arange(R, device=dev)[None, :]
    whole = rblk.all(-1) & (c < r) & ((r + 1) * BLOCK <= L)
    n_colblk = Vp // BLOCK
    full = torch.cat([torch.zeros(B, H, R, n_colblk, dtype=torch.bool, device=dev), whole], -1)
    partial = torch.cat([col_ok.reshape(B, H, R, n_colblk, BLOCK).any(-1), rblk.any(-1) & (c <= r)], -1) & ~full
    ranges_p = torch.nn.functional.pad(ranges, (0, pad))

    def rule(b, h, q_idx, kv_idx):
        j = (kv_idx - Vp).clamp(min=0)
        ci = kv_idx.clamp(max=Vp - 1)
        in_cols = col_ok[b, h, q_idx // BLOCK, ci]
        in_ranges = ranges_p[b, h, q_idx // BLOCK, j] & (j <= q_idx)
        return torch.where(kv_idx < Vp, in_cols, in_ranges)

    mask = BlockMask.from_kv_blocks(*kv_blocks(partial), *kv_blocks(full), BLOCK_SIZE=BLOCK, mask_mod=rule,
                                    seq_lengths=(L, Vp + L))
    return run_flex(q, k2, v2, mask)


def _top(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Bool mask of the n largest entries of the last dim (all of them when n >= its size)."""
    n = min(n, scores.shape[-1])
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, scores.topk(n, -1).indices, True)


__all__ = ["VerticalSlashAttention", "VerticalSlashConfig", "flex_lines", "line_scores", "slash_ranges"]
