"""Attention over each query's chosen key blocks, with the (query, block) pairs grouped by block: the long-call path.

Gathering every query's chosen keys (``block_selection.attend_selected``) copies ``(S + 1) * bs`` key and value rows
per query and scores them by matrix-vector products: a 4K prefill of MoBA top-8 in SmolLM2's shape took 27.6 s a
layer that way, 47x SDPA's dense call. Here, as in MoBA's own varlen kernel, the pairs are sorted by block, so each
key block meets all the queries routed to it in one matrix product (and its values the same rows of probabilities),
and each query's own block is a block-diagonal product over the query blocks. One softmax spans both parts per query,
so the result is the gathered path's, to rounding. Differentiable in q, k and v (the chosen blocks are fixed).
"""
from __future__ import annotations

import math

import torch


def _own_blocks(x: torch.Tensor, t0: int, n_q: int, bs: int) -> torch.Tensor:
    """Rows of x (B, H, L, D) for query blocks t0 // bs .. t0 // bs + n_q - 1, zero-padded past L -> (B, H, n_q, bs, D)."""
    B, H, L, D = x.shape
    lo = (t0 // bs) * bs
    part = x[:, :, lo: lo + n_q * bs]
    pad = n_q * bs - part.shape[2]
    if pad:
        part = torch.cat([part, part.new_zeros(B, H, pad, D)], 2)
    return part.reshape(B, H, n_q, bs, D)


def attend_by_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor,
                    bs: int) -> torch.Tensor:
    """q (B, H, Lq, D) over k, v (B, H_kv, Lk, D): each query's chosen complete blocks idx/valid (B, H, Lq, S) and
    its own block up to itself -> (B, H, Lq, D), in q's dtype; computed in at least float32."""
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g, S = H // Hkv, idx.shape[-1]
    f = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf = q.to(f) * (1.0 / math.sqrt(D)), k.to(f), v.to(f)
    t0 = Lk - Lq
    off = t0 % bs  # queries before t0 in its block: padding in front, so query blocks align with key blocks
    n_q = -(-(off + Lq) // bs)
    qp = torch.cat([qf.new_zeros(B, H, off, D), qf, qf.new_zeros(B, H, n_q * bs - off - Lq, D)], 2)
    qb = qp.view(B, Hkv, g, n_q, bs, D)
    own = (qb @ _own_blocks(kf, t0, n_q, bs).unsqueeze(2).transpose(-2, -1))  # (B, Hkv, g, n_q, bs_q, bs_k)
    causal = torch.ones(bs, bs, dtype=torch.bool, device=q.device).tril()
    # causal inside the block (aligned, so key offset <= query offset); the padding past Lk is never visible
    own = own.masked_fill(~causal, float("-inf")).reshape(B, H, n_q * bs, bs)[:, :, off: off + Lq]
    blk = torch.where(valid, idx, 0)  # an invalid slot scores block 0 and is masked
    routed = S and Lk >= bs  # before one complete block, every slot is invalid (and block 0 is short)
    orders = [_pairs(blk, b, j, g) for b in range(B) for j in range(Hkv)] if routed else []
    sel = _routed_scores(qf, kf, blk, orders, bs, g) if routed else own.new_zeros(B, H, Lq, S, bs)
    sel = sel.masked_fill(~valid[..., None], float("-inf"))
    probs = torch.softmax(torch.cat([sel.flatten(-2), own], -1), dim=-1)  # own key always visible: no empty row
    p_sel, p_own = probs[..., : S * bs].unflatten(-1, (S, bs)), probs[..., S * bs:]
    p_own = torch.cat([p_own.new_zeros(B, H, off, bs), p_own, p_own.new_zeros(B, H, n_q * bs - off - Lq, bs)], 2)
    out = (p_own.view(B, Hkv, g, n_q, bs, bs) @ _own_blocks(vf, t0, n_q, bs).unsqueeze(2)).reshape(B, H, n_q * bs, D)
    out = out[:, :, off: off + Lq]
    if routed:
        out = out + _routed_values(p_sel, vf, orders, bs, g)
    return out.to(q.dtype)


def _pairs(blk: torch.Tensor, b: int, j: int, g: int) -> tuple[torch.Tensor, list[int]]:
    """Key head j of sequence b: its (query row, slot) pairs, the G query heads folded in, sorted by block ->
    (order, pairs per block from block 0)."""
    flat = blk[b, j * g:(j + 1) * g].reshape(-1)
    return torch.argsort(flat, stable=True), torch.bincount(flat).tolist()


def _routed_scores(qf: torch.Tensor, kf: torch.Tensor, blk: torch.Tensor, orders: list, bs: int, g: int
                   ) -> torch.Tensor:
    """Scores of every (query, chosen block) pair, one product per block -> (B, H, Lq, S, bs)."""
    B, H, Lq, D = qf.shape
    S, Hkv = blk.shape[-1], kf.shape[1]
    heads = []
    for n, (order, counts) in enumerate(orders):
        b, j = divmod(n, Hkv)
        rows = qf[b, j * g:(j + 1) * g].reshape(-1, D).index_select(0, order // S)
        parts = [r @ kf[b, j, c * bs:(c + 1) * bs].T for c, r in enumerate(rows.split(counts)) if len(r)]
        scores = torch.cat(parts)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(len(order), device=order.device)
        heads.append(scores.index_select(0, inv).view(g, Lq, S, bs))
    return torch.stack(heads).view(B, H, Lq, S, bs)


def _routed_values(p_sel: torch.Tensor, vf: torch.Tensor, orders: list, bs: int, g: int) -> torch.Tensor:
    """Sum over each query's chosen blocks of its probabilities @ the block's values, one product per block
    -> (B, H, Lq, D)."""
    B, H, Lq, S, _ = p_sel.shape
    D, Hkv = vf.shape[-1], vf.shape[1]
    heads = []
    for n, (order, counts) in enumerate(orders):
        b, j = divmod(n, Hkv)
        p = p_sel[b, j * g:(j + 1) * g].reshape(-1, bs).index_select(0, order)
        parts = [r @ vf[b, j, c * bs:(c + 1) * bs] for c, r in enumerate(p.split(counts)) if len(r)]
        heads.append(p.new_zeros(g * Lq, D).index_add(0, order // S, torch.cat(parts)).view(g, Lq, D))
    return torch.stack(heads).view(B, H, Lq, D)


__all__ = ["attend_by_block"]
