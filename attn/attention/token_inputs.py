"""Inputs a variant needs per token besides q, k and v: gates, decays, write strengths.

Gated linear-attention variants (GLA's per-channel decay, Gated DeltaNet's decay and write strength)
read quantities that a layer computes from its input with small projections of its own. A variant
declares them as :class:`TokenInput` s; then

- the backbone gives each layer one extra ``nn.Linear(d_model, H_kv x width)`` per input, applies the
  input's ``activation`` and passes the result to the variant by name (``m(q, k, v, gate=...)``); an input
  with learned weights of its own after the projection (Gated DeltaNet's decay rate A per key head, as fla's
  layer has it) names a ``layer`` instead: a module built per layer with the key-head count;
- an op-scope sweep and the property checks draw them with :meth:`TokenInput.draw` (the activation of a
  standard normal: the values a freshly initialised layer produces).

Every token input has one value set per *key* head, shape (B, H_kv, L, width): gates act on the state a key
head carries, which a GQA group of query heads then reads.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass(frozen=True)
class TokenInput:
    """One per-token input of a variant: its keyword ``name``, ``width`` channels per key head (None = the
    head dim) and the ``activation`` that maps a raw projection into the input's domain (a log decay <= 0,
    a strength in (0, 1)). ``layer``, when given, replaces ``activation``: key heads -> a module mapping the raw
    projection (B, H_kv, L, width) to the input with weights of its own, made freshly initialised per layer."""

    name: str
    width: int | None = None
    activation: Callable[[torch.Tensor], torch.Tensor] = identity
    doc: str = ""
    layer: Callable[[int], nn.Module] | None = None

    def mapping(self, kv_heads: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """Raw projection -> input, for a layer with ``kv_heads`` key heads (a fresh ``layer`` module, or ``activation``)."""
        return self.activation if self.layer is None else self.layer(kv_heads)

    def channels(self, head_dim: int) -> int:
        return head_dim if self.width is None else self.width

    def shape(self, batch: int, kv_heads: int, length: int, head_dim: int) -> tuple[int, int, int, int]:
        return batch, kv_heads, length, self.channels(head_dim)

    def draw(self, batch: int, kv_heads: int, length: int, head_dim: int, *, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random values as a fresh layer would produce them: its mapping of a standard normal."""
        raw = torch.randn(self.shape(batch, kv_heads, length, head_dim), device=device, dtype=torch.float64,
                          generator=generator)
        f = self.mapping(kv_heads)
        if isinstance(f, nn.Module):
            f = f.to(device)
        with torch.no_grad():
            return f(raw).to(dtype)


def draw_inputs(specs: tuple[TokenInput, ...], batch: int, kv_heads: int, length: int, head_dim: int, *,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """name -> random values for every input in ``specs`` (empty for a variant without token inputs)."""
    return {s.name: s.draw(batch, kv_heads, length, head_dim, device=device, dtype=dtype, generator=generator)
            for s in specs}


def sliced(inputs: dict[str, torch.Tensor], start: int, stop: int | None = None) -> dict[str, torch.Tensor]:
    """The token inputs of positions start..stop-1 (their dim 2 is the token axis, like k and v)."""
    return {n: t[:, :, start:stop] for n, t in inputs.items()}


__all__ = ["TokenInput", "draw_inputs", "identity", "sliced"]
