"""Fixed sinusoidal positions (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762, section 3.5).

PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(pos / base^(2i/d)), added to the token
embeddings. For any offset k, PE[pos + k] is a fixed rotation of each (2i, 2i+1) pair of PE[pos],
which is why the paper expected relative positions to be easy to attend to.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attn.positions.base import Position
from attn.registry import check, register_position


@dataclass(frozen=True)
class SinusoidalConfig:
    d_model: int = 512  # filled from the model by the backbone
    base: float = 10000.0

    def __post_init__(self) -> None:
        check(self.d_model > 0, f"d_model must be > 0, got {self.d_model}")
        check(self.base > 1.0, f"base must be > 1, got {self.base}")


def sinusoidal_table(length: int, d_model: int, base: float = 10000.0, device: torch.device | None = None) -> torch.Tensor:
    """(length, d_model) float64 table of the paper's encoding (an odd d_model drops the last cos)."""
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)  # (ceil(d/2),)
    angles = torch.outer(torch.arange(length, dtype=torch.float64, device=device), inv_freq)  # (L, ceil(d/2))
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :d_model]  # sin on even, cos on odd


@register_position("sinusoidal", config=SinusoidalConfig)
class Sinusoidal(Position):
    """Fixed sin/cos encoding added to embeddings (Vaswani et al. 2017); no parameters, any length."""

    kind = "additive"

    def __init__(self, config: SinusoidalConfig):
        super().__init__(config)
        self._tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # derived, never saved

    def table(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Encoding of positions 0 .. >= length-1, cached per device and dtype, grown by doubling."""
        cached = self._tables.get((device, dtype))
        if cached is None or cached.shape[0] < length:
            work = device if device.type != "mps" else torch.device("cpu")  # MPS has no float64
            n = max(16, 1 << (length - 1).bit_length())
            cached = sinusoidal_table(n, self.config.d_model, self.config.base, work).to(device, dtype)
            self._tables[(device, dtype)] = cached
        return cached

    def embed(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x: (B, T, d_model) -> x + PE[start : start + T]."""
        T = x.shape[1]
        return x + self.table(start + T, x.device, x.dtype)[start : start + T]
