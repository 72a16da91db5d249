"""The short causal convolution on a layer's projections (Zoology's conv + attention hybrid, fla's 4-tap layers), with
its decoding cache: the last ``taps - 1`` inputs of a generation. Shared by the backbone's attention layer and the
layer-level variants that make their own projections (MLA)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class ConvCache:
    """The last (taps - 1) projections of a generation, for the short convolution (None before the first)."""

    inputs: torch.Tensor | None = None  # (B, C, taps - 1)

    def nbytes(self) -> int:
        return 0 if self.inputs is None else self.inputs.numel() * self.inputs.element_size()


def causal_conv(weight: torch.Tensor, h: torch.Tensor, cache: ConvCache | None) -> torch.Tensor:
    """Causal depthwise convolution (``weight``: (C, 1, taps)) + SiLU over (B, T, C) projections; ``cache`` holds the
    last taps - 1 inputs of a generation (zeros before the first token)."""
    taps = weight.shape[-1]
    past = h.new_zeros(h.shape[0], h.shape[2], taps - 1) if cache is None or cache.inputs is None else cache.inputs
    seq = torch.cat([past, h.transpose(1, 2)], 2)  # (B, C, taps - 1 + T)
    if cache is not None:
        cache.inputs = seq[:, :, seq.shape[2] - (taps - 1):]
    return F.silu(F.conv1d(seq, weight, groups=h.shape[2])).transpose(1, 2)


__all__ = ["ConvCache", "causal_conv"]
