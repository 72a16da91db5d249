"""Rotary position embedding, RoPE (Su et al. 2021, https://arxiv.org/abs/2104.09864).

q and k are rotated by an angle proportional to their position, so the score <R(m)q, R(n)k>
depends only on m - n. Convention (Hugging Face's ``rotate_half``, so weights and configs copy
across): with r rotary dimensions, dimension i is paired with i + r/2 and the pair is rotated by
position * inv_freq[i], where inv_freq[i] = rope_theta^(-2i/r). Dimensions past r (partial
rotary) pass through unchanged. The scaled variants in ``rope_scaling.py`` only change
``inv_freq`` and the ``attention_factor`` that multiplies cos and sin.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from attn.positions.base import Position
from attn.registry import check, register_position


@dataclass(frozen=True, kw_only=True)
class RopeConfig:
    head_dim: int = 64  # filled from the model by the backbone
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0  # rotate only the first int(head_dim * f) dims (rounded down to even)

    def __post_init__(self) -> None:
        check(self.head_dim > 0 and self.head_dim % 2 == 0, f"head_dim must be a positive even number, got {self.head_dim}")
        check(self.rope_theta > 1.0, f"rope_theta must be > 1, got {self.rope_theta}")
        check(0.0 < self.partial_rotary_factor <= 1.0,
              f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        check(self.rotary_dim >= 2,
              f"partial_rotary_factor={self.partial_rotary_factor} leaves no dimension pair to rotate "
              f"(head_dim={self.head_dim})")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2


def default_inv_freq(base: float, dim: int) -> torch.Tensor:
    """inv_freq[i] = base^(-2i/dim), i = 0 .. dim/2 - 1, in float64 (the tables are built from it)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rope_parameters(config: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Plain RoPE: (inv_freq, attention_factor=1)."""
    return default_inv_freq(config.rope_theta, config.rotary_dim), 1.0


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + r/2) of the first r = 2 * cos.shape[-1] dims of x.

    x: (..., T, D); cos, sin: (T, r/2), attention factor already folded in. Equal to HF's
    ``x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)`` on the rotary part.
    """
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)


class Rotary(Position):
    """Base of the RoPE family: caches cos/sin tables, applies them to q and k."""

    kind = "rotary"
    # (config, seq_len) -> (inv_freq (rotary_dim // 2,), attention_factor); one function per type
    compute: ClassVar[Callable[[Any, int | None], tuple[torch.Tensor, float]]] = staticmethod(rope_parameters)
    _max_tables: ClassVar[int] = 8

    def __init__(self, config: Any):
        super().__init__(config)
        self.rotary_dim = config.rotary_dim
        # (device, dtype, scaling length) -> (cos, sin), each (n, rotary_dim // 2). Plain tensors, not
        # buffers: they are derived, never saved, and are rebuilt per device/dtype on first use.
        self._tables: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        """Inverse frequencies, shape (rotary_dim // 2,); ``seq_len`` matters only to dynamic NTK."""
        return self.compute(self.config, seq_len)[0]

    @property
    def attention_factor(self) -> float:
        """Multiplier folded into cos and sin (YaRN's temperature; 1.0 for the others)."""
        return float(self.compute(self.config, None)[1])

    def scaling_length(self, seq_len: int) -> int | None:
        """The length the frequencies are computed for; None when they do not depend on it."""
        return None

    def cos_sin(self, length: int, seq_len: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables covering positions 0 .. >= length-1; rebuilt only for a longer length, another
        device or dtype, or (dynamic NTK) another scaling length."""
        scale = self.scaling_length(seq_len)
        key = (device, dtype, scale)
        cached = self._tables.get(key)
        if cached is not None and cached[0].shape[0] >= length:
            return cached
        # Cover the announced length at once, rounded up to a power of two so that a generation
        # growing one token at a time rebuilds O(log L) times, not every step.
        n = max(16, 1 << (max(length, seq_len) - 1).bit_length())
        inv_freq, factor = self.compute(self.config, seq_len if scale is None else scale)
        work = torch.float32 if device.type == "mps" else torch.float64  # angles pos * freq need the precision
        angles = torch.outer(torch.arange(n, device=device, dtype=work), inv_freq.to(device, work))  # (n, r/2)
        table = ((angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype))
        if len(self._tables) >= self._max_tables:
            self._tables.clear()
        self._tables[key] = table
        return table

    def rotate(self, x: torch.Tensor, start: int = 0, seq_len: int | None = None) -> torch.Tensor:
        """x: (B, H, T, head_dim) at positions start .. start+T-1 -> same shape, rotated."""
        T = x.shape[-2]
        seq_len = start + T if seq_len is None else seq_len
        cos, sin = self.cos_sin(start + T, seq_len, x.device, x.dtype)
        return apply_rotary(x, cos[start : start + T], sin[start : start + T])


@register_position("rope", config=RopeConfig)
class Rope(Rotary):
    """Rotary embedding (Su et al. 2021): rotate q, k pairs by position * rope_theta^(-2i/d)."""

    compute = staticmethod(rope_parameters)


__all__ = ["Rope", "RopeConfig", "Rotary", "apply_rotary", "default_inv_freq", "rope_parameters"]
