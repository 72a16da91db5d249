"""Decoding state of a block-sparse layout made only of global and local blocks (the default layout).

The first ``global_blocks`` blocks and the last ``local_blocks`` blocks are all a future token can see, so a
decoder keeps only those tokens: bounded memory at any length. Layouts with random or strided blocks can
reach any earlier block and keep every token instead (:class:`attn.attention.base.KVCache`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attn.attention.state import OneStepUndo


@dataclass
class BandBlockCache(OneStepUndo):
    """Decoding state for a layout of global and local blocks only (no random or strided blocks): the first
    ``global_blocks`` blocks and the last ``local_blocks`` blocks are all a future token can see, so only those
    tokens are kept (with their absolute positions) and memory is bounded at any length.

    ``truncate`` undoes the last step (the harness rewinds each timed step); further back, evicted tokens are gone.
    """

    UNDO_FIELDS = ("k", "v", "pos")
    KIND = "band-block cache (evicted tokens are gone)"
    block_size: int
    global_blocks: int
    local_blocks: int
    k: torch.Tensor | None = None  # (B, H, kept, D)
    v: torch.Tensor | None = None
    pos: torch.Tensor | None = None  # (kept,) absolute positions, ascending

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add T tokens; return every kept token plus the new ones (what the new queries may see) and positions."""
        new_pos = torch.arange(self.length, self.length + k.shape[2], device=k.device)
        keys = k if self.k is None else torch.cat([self.k, k], 2)
        values = v if self.v is None else torch.cat([self.v, v], 2)
        pos = new_pos if self.pos is None else torch.cat([self.pos, new_pos])
        self.remember()
        self.length += k.shape[2]
        last_block = (self.length - 1) // self.block_size
        block = pos // self.block_size
        keep = (block < self.global_blocks) | (block > last_block - self.local_blocks)
        self.k, self.v, self.pos = keys[:, :, keep], values[:, :, keep], pos[keep]
        return keys, values, pos

    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()


__all__ = ["BandBlockCache"]
