"""Packed sequences: several documents in one row, no attention across a document boundary.

The contract's ``documents=`` is a document id per key position, (Lk,) shared by the batch or (B, Lk),
non-decreasing (documents are contiguous runs). A variant whose kernels mask documents themselves sets
``supports_documents``; every other variant gets the exact fallback here: each document is its own call,
and when every document has the same length (the sweep's ``--docs``) they are folded into the batch dimension,
so the whole packed row is one call on (B x n) short rows -- what a varlen kernel computes, without one.
"""
from __future__ import annotations

from typing import Any

import torch

Spans = list[tuple[int, int]]  # [start, stop) of each document, in order


def _spans_of(ids: torch.Tensor) -> Spans:
    change = (torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1).tolist()
    edges = [0, *change, ids.numel()]
    return list(zip(edges[:-1], edges[1:], strict=True))


def document_spans(documents: torch.Tensor, batch: int, length: int) -> Spans | list[Spans]:
    """The documents' spans, shared by every row (a list of spans), or per row (a list of B lists) when rows differ.
    ValueError for a malformed ``documents``."""
    if documents.dtype.is_floating_point or documents.dtype == torch.bool or documents.dim() not in (1, 2):
        raise ValueError(f"documents must be integer ids of shape (L,) or (B, L), got {documents.dtype} "
                         f"{tuple(documents.shape)}")
    rows = documents if documents.dim() == 2 else documents[None]
    if rows.shape[-1] != length or rows.shape[0] not in (1, batch):
        raise ValueError(f"documents has shape {tuple(documents.shape)}; expected ({length},) or ({batch}, {length})")
    if length > 1 and bool((rows[:, 1:] < rows[:, :-1]).any()):
        raise ValueError("document ids must be non-decreasing along the sequence (each document one contiguous run)")
    if rows.shape[0] == 1 or bool((rows == rows[:1]).all()):
        return _spans_of(rows[0].cpu())
    return [_spans_of(r.cpu()) for r in rows]


def lengths(documents: torch.Tensor | None, length: int) -> list[int]:
    """Lengths of the documents of one row (the whole row when ``documents`` is None)."""
    if documents is None:
        return [length]
    ids = documents if documents.dim() == 1 else documents[0]
    return [b - a for a, b in _spans_of(ids.cpu())]


def even_documents(length: int, count: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Ids (length,) of ``count`` documents of (near-)equal length, the sweep's ``--docs`` layout."""
    if not 1 <= count <= length:
        raise ValueError(f"cannot pack {count} documents into {length} tokens")
    return torch.arange(length, device=device) * count // length


def per_document(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 spans: Spans | list[Spans], inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``module``'s output with each document run on its own (exact for every variant: nothing else is visible)."""
    if spans and isinstance(spans[0], list):  # rows packed differently: one row at a time
        return torch.cat([per_document(module, q[b:b + 1], k[b:b + 1], v[b:b + 1], causal, row,
                                       {n: t[b:b + 1] for n, t in inputs.items()}) for b, row in enumerate(spans)])
    Lq, Lk = q.shape[2], k.shape[2]
    sizes = {b - a for a, b in spans}
    if Lq == Lk and len(sizes) == 1:  # equal documents: fold them into the batch
        n, size = len(spans), sizes.pop()
        fold = lambda x: x.unflatten(2, (n, size)).transpose(1, 2).flatten(0, 1)  # (B, H, n l, .) -> (B n, H, l, .)
        out = module(fold(q), fold(k), fold(v), causal, **{name: fold(t) for name, t in inputs.items()})
        return out.unflatten(0, (q.shape[0], n)).transpose(1, 2).flatten(2, 3)
    first = Lk - Lq  # queries are the last Lq key positions (bottom-right)
    outs = []
    for a, b in spans:
        if b <= first:
            continue
        qa = max(a, first)
        outs.append(module(q[:, :, qa - first:b - first], k[:, :, a:b], v[:, :, a:b], causal,
                           **{name: t[:, :, a:b] for name, t in inputs.items()}))
    return torch.cat(outs, 2)


__all__ = ["document_spans", "even_documents", "lengths", "per_document"]
