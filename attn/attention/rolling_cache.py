"""The decoding state of a sliding window: a ring of the last w tokens (plus sink tokens), written in place.

Mistral 7B's rolling buffer cache (Jiang et al. 2023): decoding memory is bounded by the window, not the length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RollingKVCache:
    """The last ``keep + 1 = w`` tokens in a ring buffer written in place (Mistral's rolling buffer cache):
    decoding memory is bounded by the window, not the length, and a step copies one token, not the window.

    Token at absolute position p lives in slot p % w. Holding w tokens (one more than the next token
    can see) is what lets the harness rewind a timed step: the previous state's oldest token is still there.
    With sinks, one buffer holds the ``sinks`` first tokens, then the ring: once every sink is outside the
    window a step reads one contiguous slice (sinks + ring), no concatenation.
    """

    keep: int  # w - 1: the cached tokens a new token sees besides itself
    sinks: int = 0  # the first tokens, kept (before the ring) once the ring has moved past them
    store_k: torch.Tensor | None = None  # (B, H, sinks + w, D): sink tokens 0 .. sinks - 1, then the ring
    store_v: torch.Tensor | None = None
    length: int = 0  # tokens seen so far
    top: int = 0  # the furthest length ever written: slots below top - w were overwritten, even after a rewind

    @property
    def capacity(self) -> int:
        return self.keep + 1

    @property
    def k(self) -> torch.Tensor | None:
        """The ring (B, H, w, D)."""
        return None if self.store_k is None else self.store_k[:, :, self.sinks:]

    @property
    def v(self) -> torch.Tensor | None:
        return None if self.store_v is None else self.store_v[:, :, self.sinks:]

    @property
    def sink_k(self) -> torch.Tensor | None:
        """The sink tokens (B, H, sinks, D)."""
        return None if self.store_k is None else self.store_k[:, :, :self.sinks]

    @property
    def sink_v(self) -> torch.Tensor | None:
        return None if self.store_v is None else self.store_v[:, :, :self.sinks]

    def _slots(self, start: int, stop: int) -> torch.Tensor:
        """Buffer slots of positions start .. stop - 1 in the ring."""
        return torch.arange(start, stop, device=self.store_k.device) % self.capacity + self.sinks

    def window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """After writing a token: every key and value it sees, the evicted sinks first, then the ring (any order)."""
        s, n, extra = self.sinks, min(self.length, self.capacity), self.evicted_sinks()
        if 0 < extra < s:  # only some sinks have left the window (a few steps): not one slice
            return (torch.cat([self.store_k[:, :, :extra], self.store_k[:, :, s:s + n]], 2),
                    torch.cat([self.store_v[:, :, :extra], self.store_v[:, :, s:s + n]], 2))
        lo = 0 if extra == s else s  # every sink needed: they sit right before the ring
        return self.store_k[:, :, lo:s + n], self.store_v[:, :, lo:s + n]

    def window_positions(self) -> torch.Tensor:
        """After writing a token: the absolute positions of the keys :meth:`window` returns, in its order (ALiBi's bias
        depends on them). Ring slot r holds the one position p = r (mod w) among the last min(length, w)."""
        n, extra = min(self.length, self.capacity), self.evicted_sinks()
        last = self.length - 1
        ring = last - (last - torch.arange(n, device=self.store_k.device)) % self.capacity
        return ring if not extra else torch.cat([torch.arange(extra, device=ring.device), ring])

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last ``cached`` tokens' keys and values, oldest first (None before the first token)."""
        if self.store_k is None:
            return None
        idx = self._slots(self.length - self.cached, self.length)
        return self.store_k[:, :, idx], self.store_v[:, :, idx]

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens (B, H, T, D) at their slots; only the last ``capacity`` of them can stay."""
        if self.store_k is None:
            B, H, _, D = k.shape
            self.store_k = k.new_empty(B, H, self.sinks + self.capacity, D)
            self.store_v = v.new_empty(B, H, self.sinks + self.capacity, D)
        T = k.shape[2]
        if self.length < self.sinks:  # positions below `sinks` are also kept in their own slots, for good
            m = min(T, self.sinks - self.length)
            self.store_k[:, :, self.length:self.length + m] = k[:, :, :m]
            self.store_v[:, :, self.length:self.length + m] = v[:, :, :m]
        n = min(T, self.capacity)
        idx = self._slots(self.length + T - n, self.length + T)
        self.store_k[:, :, idx] = k[:, :, T - n:]
        self.store_v[:, :, idx] = v[:, :, T - n:]
        self.length += T
        self.top = max(self.top, self.length)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: (B, H, T, D) new tokens -> (cached + new) keys/values in order; then stores the new ones."""
        before = self.ordered()
        keys = k if before is None else torch.cat([before[0], k], dim=2)  # (B, H, cached + T, D)
        values = v if before is None else torch.cat([before[1], v], dim=2)
        self.write(k, v)
        return keys, values

    @property
    def cached(self) -> int:
        return min(self.length, self.keep)

    def evicted_sinks(self) -> int:
        """After writing a token: the sink tokens outside its window (positions below ``length - w``), which the
        ring no longer holds and the token must read from ``sink_k``/``sink_v``."""
        return min(self.sinks, max(0, self.length - self.capacity))

    def truncate(self, length: int) -> None:
        """Forget the newest tokens past ``length``; possible while the ring still holds what that state needs
        (always one step back: the harness rewinds each timed step)."""
        if length >= self.length:
            return
        oldest_held = max(0, self.top - self.capacity)
        if max(0, length - self.keep) < oldest_held:
            raise ValueError(
                f"cannot rewind a rolling cache from {self.length} to {length} tokens: keys it needs were "
                f"evicted (it holds the last {self.capacity}); copy the state before stepping instead"
            )
        self.length = length

    def nbytes(self) -> int:
        if self.store_k is None:
            return 0
        return self.store_k.numel() * self.store_k.element_size() + self.store_v.numel() * self.store_v.element_size()


__all__ = ["RollingKVCache"]
