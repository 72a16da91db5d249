"""``sliding_window``'s ``split`` backend: a causal window as two causal flash calls per chunk (merged_flash.py).

With query chunks of c = w - 1 tokens, the query at offset a of chunk n sees exactly the keys of its own chunk up to
itself (causal) and those of chunk n - 1 at offsets b >= a: no other chunk, and no mask beyond causality once both
sides of that second part are reversed (b >= a is b' <= a' for b' = c - 1 - b). Both parts run the CPU flash kernel
with ``is_causal`` (no mask tensor, no overlapping key spans whose gradients must be summed, as ``blocked`` has).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attn.attention.merged_flash import Part, merged_attention


def window_chunk(length: int, window: int) -> int:
    """Query chunks of w - 1 tokens (all of them when fewer; one token for a window of 1, each seeing itself)."""
    return max(1, min(window - 1, length))


def window_parts(length: int, window: int) -> list[Part]:
    """The parts of a causal window of ``window`` keys over ``length`` tokens, a whole number of chunks."""
    c = window_chunk(length, window)
    parts = [Part(0, length, 0, length, causal=True, chunk=c)]
    if window > 1 and length > c:
        parts.append(Part(c, length, 0, length - c, causal=True, chunk=c, reverse=True))
    return parts


def split_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Causal sliding-window attention, each query seeing the ``window`` keys up to itself; q: (B, H, L, D),
    k, v: (B, H_kv, L, D) on CPU. The length is padded to whole chunks at the end (after every real query)."""
    L = q.shape[2]
    pad = -L % window_chunk(L, window)
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    return merged_attention(q, k, v, window_parts(L + pad, window))[:, :, :L]
