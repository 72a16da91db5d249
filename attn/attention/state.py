"""The decoding-state contract: what a variant's ``new_state`` returns, and what the backbone and the harness use.

Every decoding state (a KV cache, a ring of the last window, a recurrent matrix) has

- ``length``: the tokens it has seen;
- a way to take new tokens, whose arguments are the variant's own (``append(k, v)`` for caches of keys and values,
  ``update(state, new_tokens)`` for recurrences), called only by that variant's ``step``;
- ``truncate(length)``: forget the tokens past ``length``. The harness rewinds each timed decoding step with it, so
  every repeat decodes at the same context length; a state that cannot go back that far raises ``ValueError``;
- ``nbytes()``: the bytes it holds now (the decode memory rows report).

A state that cannot forget tokens (a recurrence, a cache that evicts) keeps what it had before its last step:
:class:`OneStepUndo` is that undo, written once. :func:`checked` refuses a state without the contract where it is
made, rather than letting it advance unrewound through a timed loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch


@runtime_checkable
class DecodingState(Protocol):
    length: int

    def truncate(self, length: int) -> None: ...

    def nbytes(self) -> int: ...


REQUIRED = ("length", "truncate", "nbytes")


def checked(state: Any, owner: str) -> Any:
    """``state`` if it follows :class:`DecodingState`, else ``TypeError`` naming what it lacks."""
    missing = [n for n in REQUIRED if not hasattr(state, n) or (n != "length" and not callable(getattr(state, n)))]
    if missing:
        raise TypeError(f"{owner}.new_state returned a {type(state).__name__} without {', '.join(missing)}: a decoding "
                        "state needs length, truncate(length) and nbytes() (attn/attention/state.py)")
    return state


@dataclass
class OneStepUndo:
    """Base of states that can go back one step only: ``remember()`` before changing ``UNDO_FIELDS``, and
    ``truncate`` restores them (and ``length``) when asked for the length before that step.

    Subclasses declare ``UNDO_FIELDS`` (the attributes one step changes) and ``KIND`` (for the error message).
    """

    UNDO_FIELDS: ClassVar[tuple[str, ...]] = ()
    KIND: ClassVar[str] = "decoding state"
    length: int = field(default=0, kw_only=True)
    _undo: tuple | None = field(default=None, repr=False, kw_only=True)

    def remember(self) -> None:
        self._undo = (*(getattr(self, f) for f in self.UNDO_FIELDS), self.length)

    def truncate(self, length: int) -> None:
        if length >= self.length:
            return
        if self._undo is None or self._undo[-1] != length:
            last = "nothing" if self._undo is None else f"only to {self._undo[-1]}"
            raise ValueError(f"a {self.KIND} cannot forget tokens: at {self.length}, it can rewind {last}, "
                             f"not to {length}")
        *values, self.length = self._undo
        for name, value in zip(self.UNDO_FIELDS, values, strict=True):
            setattr(self, name, value)
        self._undo = None


@dataclass
class KVCache:
    """Keys and values of every past token, preallocated and grown by doubling (gpt-fast style)."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    length: int = 0
    capacity_hint: int = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: (B, H, T, D) -> all cached keys/values (B, H, length, D)
        t = k.shape[2]
        if self.k is None or self.length + t > self.k.shape[2]:
            need = self.length + t  # the hint when it holds them (a prefill of L for L + 1 tokens: no doubling)
            cap = self.capacity_hint if self.capacity_hint >= need else 2 * need
            new_k = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
            new_v = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
            if self.k is not None:
                new_k[:, :, : self.length] = self.k[:, :, : self.length]
                new_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = new_k, new_v
        self.k[:, :, self.length : self.length + t] = k
        self.v[:, :, self.length : self.length + t] = v
        self.length += t
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def truncate(self, length: int) -> None:
        """Forget tokens past ``length`` (the harness rewinds after each timed decode step)."""
        self.length = min(self.length, length)

    def nbytes(self) -> int:
        if self.k is None:
            return 0
        B, H, _, D = self.k.shape
        return 2 * B * H * self.length * D * self.k.element_size()


__all__ = ["DecodingState", "KVCache", "OneStepUndo", "checked"]
