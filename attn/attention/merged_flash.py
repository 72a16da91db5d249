"""Static sparse attention as a few dense flash calls merged by log-sum-exp, with their own backward (CPU).

A pattern whose keys for each query chunk are a handful of whole chunks (a sliding window, a block-sparse band and
its global blocks) is split into :class:`Part` s: a range of queries against a range of keys, chunk by chunk or as
one call, causal or not, optionally reversed within each chunk (so that "key offset >= query offset" becomes causal).
Each part runs PyTorch's CPU flash kernel (fused, block-skipping when causal, no mask tensor, no score matrix) and
returns its rows' log-sum-exp; the parts are merged as split-KV decoding (FlashDecoding) merges its splits. The
backward runs each part's flash backward against the *merged* output and log-sum-exp: a part's probabilities are
then its slice of the whole softmax, so every gradient is exact without recomputing the merge.

The parts must cover each query's visible keys exactly once; ``tests/`` hold every user against its reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


@dataclass(frozen=True)
class Part:
    """Queries ``q_start:q_stop`` against keys ``k_start:k_stop``. With ``chunk`` both ranges are cut into as many
    chunks of that many tokens, paired in order (one flash 'head' each); without, one call over the ranges.
    ``reverse``: each chunk's tokens reversed on both sides (with ``causal``: key offset >= query offset)."""

    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    causal: bool
    chunk: int | None = None
    reverse: bool = False

    def inputs(self, x: torch.Tensor, keys: bool) -> torch.Tensor:
        """The flash input (B, H', T, D) of ``x`` (B, H, L, D): its range, chunked and reversed as the part says."""
        x = x[:, :, self.k_start:self.k_stop] if keys else x[:, :, self.q_start:self.q_stop]
        if self.chunk is None:
            return x
        B, H, T, D = x.shape
        x = x.reshape(B, H, T // self.chunk, self.chunk, D)
        if self.reverse:
            x = x.flip(3)
        return x.reshape(B, -1, self.chunk, D)

    def rows(self, y: torch.Tensor) -> torch.Tensor:
        """A flash output (B, H', T, ...) back to (B, H, T_range, ...) in the original order (undoes :meth:`inputs`)."""
        if self.chunk is None:
            return y
        B, c = y.shape[0], self.chunk
        y = y.reshape(B, -1, (self.q_stop - self.q_start) // c, c, *y.shape[3:])  # (B, H, chunks, c, ...)
        if self.reverse:
            y = y.flip(3)
        return y.reshape(B, y.shape[1], -1, *y.shape[4:])


def _lse_layout(lse: torch.Tensor) -> torch.Tensor:
    """A log-sum-exp (B, H', T) in the (B, T, H') memory layout the CPU flash kernel writes and its backward reads."""
    return lse.transpose(1, 2).contiguous().transpose(1, 2)


class _Merged(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, parts: tuple[Part, ...]) -> torch.Tensor:
        B, H, L, D = q.shape
        acc = torch.promote_types(q.dtype, torch.float32)  # the merge in fp32 at least, as the kernel's own
        out = lse = None
        for p in parts:
            o_p, l_p = FLASH(p.inputs(q, False), p.inputs(k, True), p.inputs(v, True), 0.0, p.causal)
            o_p, l_p = p.rows(o_p).to(acc), p.rows(l_p)
            if out is None and (p.q_start, p.q_stop) == (0, L):  # the first part over every query: no zeros to fill
                out, lse = o_p, l_p
                continue
            if out is None:
                out = q.new_zeros(B, H, L, D, dtype=acc)
                lse = torch.full((B, H, L), float("-inf"), dtype=acc, device=q.device)
            s = slice(p.q_start, p.q_stop)
            m = torch.logaddexp(lse[:, :, s], l_p)
            out[:, :, s] = out[:, :, s] * (lse[:, :, s] - m).exp()[..., None] + o_p * (l_p - m).exp()[..., None]
            lse[:, :, s] = m
        out = out.to(q.dtype)
        ctx.parts = parts
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        L, acc = q.shape[2], torch.promote_types(q.dtype, torch.float32)  # gradients summed in fp32 at least
        dq = dk = dv = None
        for p in ctx.parts:
            g_p, q_p, o_p = (p.inputs(x, False) for x in (grad, q, out))
            l_p = _lse_layout(p.inputs(lse[..., None], False)[..., 0])
            dq_p, dk_p, dv_p = FLASH_BACKWARD(g_p, q_p, p.inputs(k, True), p.inputs(v, True), o_p, l_p, 0.0, p.causal)
            if dq is None and (p.q_start, p.q_stop, p.k_start, p.k_stop) == (0, L, 0, L):  # nothing to add to yet
                dq, dk, dv = (p.rows(x).to(acc) for x in (dq_p, dk_p, dv_p))
                continue
            if dq is None:
                dq, dk, dv = (torch.zeros_like(x, dtype=acc) for x in (q, k, v))
            dq[:, :, p.q_start:p.q_stop] += p.rows(dq_p)
            dk[:, :, p.k_start:p.k_stop] += p.rows(dk_p)
            dv[:, :, p.k_start:p.k_stop] += p.rows(dv_p)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def merged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, parts: list[Part]) -> torch.Tensor:
    """Softmax attention of q (B, H, L, D) over k, v (B, H_kv, L, D) (GQA: keys repeated to the query heads, their
    gradients summed back by autograd) where each query sees exactly the keys its ``parts`` give it."""
    if k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
    return _Merged.apply(q.contiguous(), k.contiguous(), v.contiguous(), tuple(parts))


__all__ = ["Part", "merged_attention"]
