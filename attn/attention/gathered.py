"""Block-sparse attention by gathering each query block's active key blocks: the CPU fast path of ``block_sparse``.

Query-block rows are grouped by how many key blocks they see (padded within 25%), each group's key and value
blocks gathered into one dense tensor and attended with SDPA; few queries (decoding) take a direct path.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attn.attention import gqa
from attn.attention.flex import layout_to_kv_blocks


def _buckets(counts: torch.Tensor) -> list[torch.Tensor]:
    """Group query-block rows by active-block count, each group padded to its largest count.

    Groups span counts within 25% of each other, so padding wastes at most a quarter of the work and
    a few dense rows (bidirectional global blocks) do not make every row dense.
    """
    groups: list[list[int]] = []
    for c in torch.unique(counts[counts > 0]).tolist():
        if groups and c * 4 <= groups[-1][0] * 5:
            groups[-1].append(c)
        else:
            groups.append([c])
    return [torch.nonzero((counts >= g[0]) & (counts <= g[-1])).squeeze(1) for g in groups]


class _GatherBlocks(torch.autograd.Function):
    """``x[:, :, idx]`` whose backward sums the gradients of a block gathered many times in fp32.

    A global key block is gathered by every query block; summing those gradients in bf16 (what
    indexing's backward does) loses digits that a dense matmul, accumulating in fp32, keeps.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        return x[:, :, idx]  # (B, H, *idx.shape, bs, D)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (idx,) = ctx.saved_tensors
        B, H, n, bs, D = ctx.shape
        acc = grad.new_zeros(B, H, n, bs, D, dtype=torch.promote_types(grad.dtype, torch.float32))
        acc.index_add_(2, idx.flatten(), grad.flatten(2, 3).to(acc.dtype))
        return acc.to(grad.dtype), None


def _few_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: torch.Tensor, bs: int,
                 causal: bool) -> torch.Tensor:
    """Decoding: a few queries (at most one block) read only their rows' active key blocks, by position.

    No query padding to whole blocks and no copy of the cache: one fused SDPA call per query block
    over ``active blocks x bs`` keys, so a step costs the same at 1K or 1M tokens of context.
    """
    Lq, Lk = q.shape[2], k.shape[2]
    off = Lk - Lq
    qpos = torch.arange(off, Lk, device=q.device)
    rows = qpos // bs - off // bs  # the layout row of each query
    out = torch.empty_like(q)
    ar = torch.arange(bs, device=q.device)
    for r in torch.unique(rows).tolist():
        sel = torch.nonzero(rows == r).squeeze(1)
        kpos = (torch.nonzero(layout[r]).squeeze(1)[:, None] * bs + ar).flatten()
        kpos = kpos[kpos < Lk]
        if kpos.numel() == 0:
            out[:, :, sel] = 0
            continue
        mask = kpos[None, :] <= qpos[sel][:, None] if causal else None
        o = gqa.sdpa(q[:, :, sel], k[:, :, kpos], v[:, :, kpos], attn_mask=mask)
        out[:, :, sel] = o.nan_to_num(0.0) if causal else o  # a query with no visible key returns 0, as the reference
    return out


def gathered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: torch.Tensor, block_size: int,
                       causal: bool) -> torch.Tensor:
    """Softmax attention that gathers only the active key blocks of each query block (pure torch, differentiable).

    q: (B, H, Lq, D), k, v: (B, H_kv, Lk, D), layout: (R, n) rows of :func:`block_layout` -> (B, H, Lq, D).
    Work and memory are proportional to the number of active blocks, not to Lq * Lk.
    """
    B, H, Lq, D = q.shape
    Hkv, Lk, bs = k.shape[1], k.shape[2], block_size
    g = H // Hkv  # GQA: a key head's g query heads share each gathered key block (folded into its query rows)
    if Lq <= bs and Lq < Lk and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        return _few_queries(q, k, v, layout, bs, causal)
    off = Lk - Lq
    R, n = layout.shape
    start = off - (off // bs) * bs  # offset of query 0 inside the first query block
    qb = F.pad(q, (0, 0, start, R * bs - start - Lq)).view(B, Hkv, g, R, bs, D)
    # Without gradients (a forward cell, a decoding step) keys are gathered by position straight from k:
    # no padded copy of the whole cache, which made each decoding step cost O(context).
    by_position = not (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad))
    if not by_position:
        kb = F.pad(k, (0, 0, 0, n * bs - Lk)).view(B, Hkv, n, bs, D)
        vb = F.pad(v, (0, 0, 0, n * bs - Lk)).view(B, Hkv, n, bs, D)
    qpos = (torch.arange(R * bs, device=q.device) + (off // bs) * bs).view(R, bs)  # absolute, padded rows too
    counts = layout.sum(-1)
    _, order = layout_to_kv_blocks(layout)
    order = order[0, 0].long()  # (R, n) active key blocks first, ascending
    scale = 1.0 / math.sqrt(D)
    parts, part_rows = [], []
    for rows in _buckets(counts.cpu()):
        rows = rows.to(q.device)
        W = int(counts[rows].max())
        idx = order[rows, :W]  # (r, W) key blocks
        kpos = (idx[:, :, None] * bs + torch.arange(bs, device=q.device)).flatten(1)  # (r, W*bs)
        seen = (torch.arange(W, device=q.device) < counts[rows, None]).repeat_interleave(bs, dim=1) & (kpos < Lk)
        mask = seen[:, None, :]  # (r, 1, W*bs)
        if causal:
            mask = mask & (kpos[:, None, :] <= qpos[rows][:, :, None])  # (r, bs, W*bs)
        if by_position:
            at = kpos.clamp(max=Lk - 1)  # past-the-end positions read the last key, masked out below
            kg, vg = k[:, :, at], v[:, :, at]  # (B, H_kv, r, W*bs, D)
        else:
            kg = _GatherBlocks.apply(kb, idx).flatten(3, 4)  # (B, H_kv, r, W*bs, D)
            vg = _GatherBlocks.apply(vb, idx).flatten(3, 4)
        # A query row with no visible key (padding, or a layout row left empty) sees every gathered
        # key instead and its output is zeroed: neither the output nor the gradient meets a NaN.
        any_key = mask.any(-1, keepdim=True)
        mask = mask | ~any_key
        r = len(rows)
        qr = qb[:, :, :, rows].transpose(2, 3).reshape(B, Hkv, r, g * bs, D)  # the group's queries as rows
        scores = (qr * scale) @ kg.transpose(-2, -1)  # (B, H_kv, r, g*bs, W*bs)
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32)).view(B, Hkv, r, g, bs, -1)
        scores = scores.masked_fill(~mask[:, None], float("-inf")).flatten(3, 4)
        o = (torch.softmax(scores, dim=-1).to(q.dtype) @ vg).view(B, Hkv, r, g, bs, D) * any_key[:, None]
        parts.append(o.transpose(2, 3))  # (B, H_kv, g, r, bs, D)
        part_rows.append(rows)
    empty = torch.nonzero(counts == 0).squeeze(1)
    if len(empty):
        parts.append(q.new_zeros(B, Hkv, g, len(empty), bs, D))
        part_rows.append(empty)
    out = torch.cat(parts, dim=3)[:, :, :, torch.argsort(torch.cat(part_rows))]  # (B, H_kv, g, R, bs, D)
    return out.reshape(B, H, R * bs, D)[:, :, start : start + Lq]


__all__ = ["gathered_attention"]
