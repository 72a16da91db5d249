"""Padding for variants whose contract has no mask: each batch row runs on its one run of real tokens.

Our contract is ``m(q, k, v, causal)`` with no mask, so transformers' 4-D masks cannot reach a variant.
Instead the mask function registered beside the attention function (:func:`padding_mask`) hands the
attention a 2-D bool mask, ``(B, Lw)``: True = a real key, over the keys the cache has *written*
(``Lw <= Lk``; a static cache also returns its empty slots, which are cut off), or None when no row
has padding. The queries are the last ``Lq`` written positions (the cache's bottom-right alignment).

:func:`run_padded` then runs each row on its contiguous run of real keys ``[s, e)`` -- left padding
(``s > 0``, what ``generate`` uses) or right padding (``e < Lw``) -- with the row's real queries
mapped to the end of that run, so the causal rule and any positional pattern (window, blocks) count
from the first real token: padding changes nothing. Padded query rows output 0. A row whose real
tokens are not one run (packed documents, right padding while generating) is refused.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch


def padding_mask(
    batch_size: int,
    q_length: int | None = None,
    kv_length: int = 0,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    use_vmap: bool = False,
    device: torch.device | str = "cpu",
    cache_position: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor | None:
    """transformers' mask-interface signature -> (B, Lw) bool padding mask of the written keys, or None.

    transformers' 2-D ``attention_mask`` covers every position seen so far (``(B, past + Lq)``); the keys
    of this layer are positions ``kv_offset .. kv_offset + kv_length - 1`` (a sliding-window cache keeps
    only the last ones), of which the first ``Lw = q_offset + q_length - kv_offset`` are written.

    transformers 5.2 passes the queries' positions as ``cache_position`` (``(Lq,)``, consecutive) instead of
    ``q_length``, ``q_offset`` and ``device`` (newer releases): they are read from it.
    """
    if q_length is None:
        if cache_position is None:
            raise TypeError("padding_mask needs q_length or cache_position (transformers 5.2)")
        q_length, q_offset, device = cache_position.shape[0], cache_position[0], cache_position.device
    if use_vmap:  # set only when a model overlays its own mask function (or_/and_mask_function)
        raise ValueError("this model overlays its own mask pattern on the causal mask (e.g. bidirectional image "
                         "tokens); attn-bench variants take no mask, so they cannot run it")
    written = int(q_offset) + q_length - kv_offset  # keys up to the last query; the rest are empty cache slots
    if not 0 < written <= kv_length:
        raise ValueError(f"cannot place {q_length} queries at offset {int(q_offset)} among {kv_length} keys "
                         f"from offset {kv_offset}: this cache layout is not supported")
    if attention_mask is None:
        return None if written == kv_length else torch.ones(batch_size, written, dtype=torch.bool, device=device)
    mask = attention_mask.to(device=device, dtype=torch.bool)[:, kv_offset : kv_offset + written]  # (B, <= Lw)
    if mask.shape[1] < written:  # positions past the 2-D mask are not real tokens (transformers pads with 0 too)
        mask = torch.nn.functional.pad(mask, (0, written - mask.shape[1]), value=False)
    if written == kv_length and bool(mask.all()):
        return None
    return mask


def real_runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """(B, L) bool -> per row the run ``[s, e)`` of real tokens (``(L, L)`` for a row without any).

    ValueError when a row's real tokens are not contiguous (packed documents, right padding in a cache).
    """
    L = mask.shape[1]
    count = mask.sum(1)
    first = mask.int().argmax(1)
    end = L - mask.flip(1).int().argmax(1)
    gaps = (count > 0) & (count != end - first)
    if bool(gaps.any()):
        row = int(gaps.nonzero()[0, 0])
        raise ValueError(f"batch row {row}'s attention mask has padding between real tokens (packed sequences, or "
                         "right padding while generating); attn-bench variants need each row's real tokens in one "
                         "run: use left padding (tokenizer.padding_side='left')")
    empty = count == 0
    return list(zip(torch.where(empty, L, first).tolist(), torch.where(empty, L, end).tolist(), strict=True))


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def run_padded(attend: Attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``attend`` on each row's real run; q: (B, H, Lq, D), k, v: (B, H_kv, Lk, D), mask: (B, Lw) or None.

    Rows with the same run go together, so a batch without padding is one call.
    """
    if mask is None:
        return attend(q, k, v)
    Lq, Lw = q.shape[2], mask.shape[1]
    if Lw > k.shape[2] or Lw < Lq:
        raise ValueError(f"padding mask covers {Lw} keys but the layer has {k.shape[2]} keys and {Lq} queries")
    k, v = k[:, :, :Lw], v[:, :, :Lw]  # drop a static cache's unwritten slots
    q0 = Lw - Lq  # position of query 0 among the keys (bottom-right alignment)
    rows: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b, run in enumerate(real_runs(mask)):
        rows[run].append(b)
    if list(rows) == [(0, Lw)]:
        return attend(q, k, v)
    out = q.new_zeros(q.shape)  # padded query rows stay 0
    for (s, e), batch in rows.items():
        a = max(s, q0)  # first real query position
        if e <= a:
            continue  # no real query in these rows
        idx = torch.tensor(batch, device=q.device)
        # queries a..e-1 are the last e - a of keys s..e-1: bottom-right aligned, as our contract reads them
        out[idx, :, a - q0 : e - q0] = attend(q[idx, :, a - q0 : e - q0], k[idx, :, s:e], v[idx, :, s:e])
    return out


__all__ = ["padding_mask", "real_runs", "run_padded"]
