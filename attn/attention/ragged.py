"""Ragged decoding: one batched step over sequences whose contexts differ, as a server batches its users.

Each sequence is prefilled on its own one-sequence state; :func:`stacked` or a ragged cache below joins them into
one batched state whose step runs every sequence exactly as its own state would (tests/test_ragged.py holds each
row against that sequence's own step). A variant says how through :meth:`attn.Attention.ragged_state`:

- a constant-size state (the recurrences): its per-sequence tensors stacked, since a step never reads the length;
- a KV cache (plain ``full``): :class:`RaggedKVCache`, keys padded to the longest context and masked per sequence:
  the step reads B x the longest context, where a varlen kernel (FlashAttention's ``cu_seqlens``) reads their sum;
- a window's ring (plain ``sliding_window``, one token a step): :class:`RaggedRing`, each sequence writing its own
  slot (position mod w), the slots a short sequence has not filled masked.

Both caches attend themselves (:meth:`RaggedKVCache.attend`): masked SDPA is all of plain full's and plain window's
step. Every sequence takes the same number of tokens a step, so ``truncate`` rewinds each by the same count.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def _masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q (B, H, T, D) over k, v (B, H_kv, S, D) with a per-sequence mask (B, 1, T, S) (True = may attend)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


@dataclass
class RaggedKVCache:
    """Keys and values of B sequences of different lengths, padded to the longest: ``k``, ``v`` (B, H_kv, capacity,
    D); sequence b holds ``lengths[b]`` tokens at positions 0 .. lengths[b] - 1."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor  # (B,) int64

    @classmethod
    def joined(cls, caches: list[Any], extra: int) -> RaggedKVCache:
        """One padded cache from one-sequence caches (``k``, ``v``: (1, H_kv, >= length, D)), with room for
        ``extra`` more tokens each."""
        lengths = [c.length for c in caches]
        first = caches[0].k
        B, (_, H, _, D) = len(caches), first.shape
        k, v = first.new_zeros(B, H, max(lengths) + extra, D), first.new_zeros(B, H, max(lengths) + extra, D)
        for b, (c, n) in enumerate(zip(caches, lengths, strict=True)):
            k[b, :, :n], v[b, :, :n] = c.k[0, :, :n], c.v[0, :, :n]
        return cls(k, v, torch.tensor(lengths, device=first.device))

    @property
    def length(self) -> int:
        """The longest sequence's tokens (what the harness rewinds to; each sequence goes back as far)."""
        return int(self.lengths.max())

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write T new tokens (B, H_kv, T, D) after each sequence's own last token; queries (B, H, T, D) see their
        sequence's keys up to themselves."""
        B, H, T, D = k.shape
        if self.length + T > self.k.shape[2]:
            raise ValueError(f"a ragged cache sized for {self.k.shape[2]} tokens cannot take {T} more after "
                             f"{self.length}")
        at = self.lengths[:, None] + torch.arange(T, device=k.device)  # (B, T): each new token's position
        index = at[:, None, :, None].expand(B, H, T, D)
        self.k.scatter_(2, index, k)
        self.v.scatter_(2, index, v)
        self.lengths += T
        S = self.length
        mask = torch.arange(S, device=k.device) <= at[:, :, None]  # (B, T, S): key j visible to new token t
        return _masked_sdpa(q, self.k[:, :, :S], self.v[:, :, :S], mask[:, None])

    def truncate(self, length: int) -> None:
        """Forget the newest ``self.length - length`` tokens of every sequence."""
        if length < self.length:
            self.lengths -= self.length - length

    def nbytes(self) -> int:
        """What the sequences hold (their summed lengths), as :class:`KVCache` counts its length, not its capacity."""
        _, H, _, D = self.k.shape
        return 2 * int(self.lengths.sum()) * H * D * self.k.element_size()


@dataclass
class RaggedRing:
    """The rings of B sliding windows of ``w`` slots (B, H_kv, w, D), token p of sequence b in slot p % w, as
    attn.attention.rolling_cache.RollingKVCache keeps one; decodes one token a step."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor  # (B,) int64
    _undo: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # the slots the last step overwrote

    @classmethod
    def joined(cls, rings: list[Any]) -> RaggedRing:
        """One ring from one-sequence rings (attn.attention.rolling_cache.RollingKVCache without sinks)."""
        k, v = torch.cat([r.k for r in rings]), torch.cat([r.v for r in rings])
        for b, r in enumerate(rings):  # a ring not yet full: its empty slots zeroed (masked, but never NaN)
            k[b, :, r.length:], v[b, :, r.length:] = 0, 0
        return cls(k, v, torch.tensor([r.length for r in rings], device=k.device))

    @property
    def length(self) -> int:
        return int(self.lengths.max())

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One new token (B, H_kv, 1, D) per sequence into its slot; it sees its sequence's ring (the last w tokens,
        itself included, in any order), the slots a sequence shorter than w has not filled masked."""
        if k.shape[2] != 1:
            raise ValueError(f"a ragged window decodes one token a step, not {k.shape[2]}")
        B, w = k.shape[0], self.k.shape[2]
        rows, slot = torch.arange(B, device=k.device), self.lengths % w
        self._undo = (slot, self.k[rows, :, slot].clone(), self.v[rows, :, slot].clone())
        self.k[rows, :, slot], self.v[rows, :, slot] = k[:, :, 0], v[:, :, 0]
        self.lengths += 1
        full = bool((self.lengths >= w).all())
        mask = None if full else (torch.arange(w, device=k.device) < self.lengths[:, None])[:, None, None]
        return _masked_sdpa(q, self.k, self.v, mask)

    def truncate(self, length: int) -> None:
        """Undo the last step (every sequence one token back): the one rewind a ring can make."""
        if length >= self.length:
            return
        if self._undo is None or self.length - length != 1:
            raise ValueError(f"a ragged ring rewinds one step only, not from {self.length} to {length}")
        slot, k, v = self._undo
        rows = torch.arange(len(slot), device=slot.device)
        self.k[rows, :, slot], self.v[rows, :, slot] = k, v
        self.lengths -= 1
        self._undo = None

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


RAGGED_CACHES = (RaggedKVCache, RaggedRing)


def stacked(states: list[Any]) -> Any:
    """One batched state from one-sequence states of equal shape (a recurrence's, or one state repeated): every
    per-sequence tensor (leading dimension 1, then heads or channels) concatenated in new memory, in tuples and lists
    and nested states likewise; ``length`` the longest (a step does not read it); a one-step undo dropped (the batch
    has taken no step yet). Other values (1-D positions, scalars, frozen configs) are the first state's, shared."""
    out = copy.copy(states[0])
    for name in vars(states[0]):
        values = [vars(s)[name] for s in states]
        setattr(out, name, max(values) if name == "length" else None if name == "_undo" else _joined(name, values))
    return out


def _joined(name: str, values: list[Any]) -> Any:
    """One field of :func:`stacked` across the sequences' states."""
    value = values[0]
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == 1:  # (1, heads, ...)
        if any(x.shape != value.shape for x in values):
            raise ValueError(f"cannot stack {name}: shapes differ across sequences")
        return torch.cat(values)
    if isinstance(value, (tuple, list)):
        return type(value)(_joined(name, list(items)) for items in zip(*values, strict=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and not value.__dataclass_params__.frozen:
        return stacked(values)
    return value


__all__ = ["RAGGED_CACHES", "RaggedKVCache", "RaggedRing", "stacked"]
