"""Learnable sink logits (gpt-oss's ``s_aux``; "attention sinks" in OpenAI's gpt-oss model card, 2025): one learned logit
s_h per query head joins every softmax of that head as an extra column and is then dropped, so a query may put weight
on "nothing":

    out_i = sum_j exp(s_ij) v_j / (exp(s_h) + sum_j exp(s_ij))

Unlike StreamingLLM's sink *tokens* (``sliding_window``'s ``sinks``) there is no sink key or value, only the
denominator's extra term. The sink logit is not softcapped and gets no ALiBi bias: it is a logit of its own, not a
score. A query that sees no key returns 0 (all its weight on the sink), as the references return 0 for such rows.

Backends carry it as one more key whose value is zero and whose score is exactly s_h, or fold it in after the softmax:

- explicit softmax (references, softcap paths): an extra column of the scores;
- SDPA without a gradient on CPU (decoding): no sink key at all -- the fused kernel also returns each row's
  log-sum-exp log Z, and the output is scaled by Z / (Z + e^{s_h}) after it (:func:`with_sink_share`), so no key
  is copied;
- SDPA otherwise: one extra channel -- queries of head h hold ``s_h / scale`` there, the sink key holds 1 and every
  real key 0 -- so the fused kernels, their causal path and their backward run unchanged, and s_h gets its gradient
  through q (a copy of the keys with the sink in front: fine for a prefill or training, 16x a decoding step at 64K);
- Flex: a zero key after the last one, its score set to s_h by the ``score_mod`` (a captured tensor Flex
  differentiates), its column visible to every query block (see :func:`with_sink_column`).

Cost: one more key per query (or one scale per row); not counted in FLOPs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn.registry import check


def check_heads(heads: int, sink_logit: bool) -> None:
    check(heads >= 0, f"heads must be >= 0 (0 = the sink logits are created at the first call), got {heads}")
    check(heads == 0 or sink_logit, "heads sizes the sink logits: set sink_logit=true, or leave heads at 0")


def init_sink_logits(module: nn.Module, sink_logit: bool, heads: int) -> None:
    """Register ``module.sink_logits``: zeros (heads,) when ``heads`` is known, else None until the first call (an
    optimizer built before that call would miss it: give ``heads``, or run a forward first)."""
    param = nn.Parameter(torch.zeros(heads)) if sink_logit and heads else None
    module.register_parameter("sink_logits", param)


def sink_logits_for(module: nn.Module, q: torch.Tensor) -> torch.Tensor:
    """The module's sink logits (H,) for queries q (B, H, L, D), created (zeros, on q's device) at the first call."""
    heads = q.shape[1]
    if module.sink_logits is None:
        dtype = torch.promote_types(q.dtype, torch.float32)
        module.sink_logits = nn.Parameter(torch.zeros(heads, device=q.device, dtype=dtype))
    if module.sink_logits.shape[0] != heads:
        raise ValueError(f"{module.name}: the sink logits are for {module.sink_logits.shape[0]} query heads, the call "
                         f"has {heads} (one module serves one head count: build another)")
    return module.sink_logits


def needs_grad(module: nn.Module) -> bool:
    """Whether a call now would have to carry a gradient to the sink logits (made at the first call: they will): such a
    call is a backward call for dispatch even when q, k, v need no gradient (CPU Flex runs forward only)."""
    if not module.config.sink_logit or not torch.is_grad_enabled():
        return False
    return module.sink_logits is None or module.sink_logits.requires_grad


def channel_pad(head_dim: int) -> int:
    """Channels added for the sink: one, rounded up so the head dim stays a multiple of 8 (the fused CUDA kernels')."""
    return 8 - head_dim % 8


def with_sink_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink_rows: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (..., Lq, D), k, v (..., Lk, D) -> the same with the sink as key 0 (so Lk + 1 keys) and ``channel_pad`` more
    channels: ``sink_rows`` (broadcastable to q's (..., Lq, 1)) / scale in the first new channel of the queries, 1 in
    the sink key's, 0 everywhere else; the sink's value is 0. Its score (``scale`` times the dot product) is then
    the sink logit, and a real key's score is unchanged. Call SDPA with ``scale`` (the head dim grew)."""
    D, pad = q.shape[-1], channel_pad(q.shape[-1])
    col = (sink_rows / scale).expand(*q.shape[:-1], 1).to(q.dtype)  # cast after expand: the sum of dq stays fp32
    q2 = torch.cat([q, col, q.new_zeros(*q.shape[:-1], pad - 1)], -1)
    sink_key = k.new_zeros(*k.shape[:-2], 1, D + pad)
    sink_key[..., D] = 1
    k2 = torch.cat([sink_key, F.pad(k, (0, pad))], -2)
    v2 = F.pad(v, (0, pad, 1, 0))  # zero value for the sink, zero channels
    return q2, k2, v2


def with_sink_share(out: torch.Tensor, lse: torch.Tensor, sink_rows: torch.Tensor) -> torch.Tensor:
    """out (..., Lq, D) of a softmax without the sink and lse (..., Lq) its rows' log-sum-exp log Z -> the output with
    the sink in the softmax (``sink_rows`` broadcastable to lse): every weight e^s / Z becomes e^s / (Z + e^{s_h}), and
    the sink's value is zero, so out scales by Z / (Z + e^{s_h}) = sigmoid(lse - s_h). Exact, in lse's precision."""
    share = torch.sigmoid(lse - sink_rows.to(lse.dtype))[..., None]  # (..., Lq, 1)
    return (out.to(share.dtype) * share).to(out.dtype)


def zero_key(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v (B, H_kv, Lk, D) with one zero key and value appended (Flex's sink column, position Lk)."""
    return F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))


def with_sink_column(partial: torch.Tensor, full: torch.Tensor | None, block: int, k_len: int, mask_mod,
                     device: str = "cpu"):
    """A Flex block layout and mask for ``k_len`` keys -> the same for ``k_len + 1`` keys, the last (the sink) visible to
    every query: its key block becomes partial for every query block (it may hold real keys too, checked exactly).
    Returns (partial, full, mask_mod)."""
    nq, nk = partial.shape
    if -(-(k_len + 1) // block) > nk:  # the sink starts a new key block
        partial = torch.cat([partial, torch.ones(nq, 1, dtype=torch.bool)], 1)
        full = None if full is None else torch.cat([full, torch.zeros(nq, 1, dtype=torch.bool)], 1)
    else:
        partial = partial.clone()
        partial[:, -1] = True
        if full is not None:
            full = full.clone()
            full[:, -1] = False
    sink = torch.tensor(k_len, device=device)

    def with_sink(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx) | (kv_idx == sink)

    with_sink.__name__ = f"{getattr(mask_mod, '__name__', 'mask')}_with_sink"
    return partial, full, with_sink


__all__ = ["channel_pad", "check_heads", "init_sink_logits", "needs_grad", "sink_logits_for", "with_sink_column", "with_sink_key",
           "with_sink_share", "zero_key"]
