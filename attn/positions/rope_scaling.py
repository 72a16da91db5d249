"""RoPE context extension: position interpolation, NTK, dynamic NTK, YaRN, Llama 3.

One function per type with one signature, ``(config, seq_len) -> (inv_freq, attention_factor)``,
as in Hugging Face's ``modeling_rope_utils`` (same formulas, same parameter names, so a model's
``rope_scaling`` dict copies across). Each type's validation sits in its config, next to it.
s = ``factor``, L0 = ``original_max_position_embeddings``, r = rotary dims, theta_i = rope_theta^(-2i/r).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch

from attn.positions.rope import Rope, RopeConfig, Rotary, default_inv_freq, rope_parameters
from attn.registry import check, register_position


# -- configs ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ScaledConfig(RopeConfig):
    factor: float
    original_max_position_embeddings: int | None = None  # optional here: linear and NTK do not use it

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.factor >= 1.0, f"factor must be >= 1 (1 = no scaling), got {self.factor}")
        L0 = self.original_max_position_embeddings
        check(L0 is None or L0 > 0, f"original_max_position_embeddings must be > 0, got {L0}")


@dataclass(frozen=True, kw_only=True)
class NtkConfig(ScaledConfig):
    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.rotary_dim > 2, f"NTK scaling needs more than 2 rotary dims (exponent r/(r-2)), got {self.rotary_dim}")


@dataclass(frozen=True, kw_only=True)
class DynamicConfig(NtkConfig):
    original_max_position_embeddings: int = field()  # required: the base starts growing past this length


@dataclass(frozen=True, kw_only=True)
class YarnConfig(ScaledConfig):
    original_max_position_embeddings: int = field()  # required (field() overrides the inherited default)
    beta_fast: float = 32.0  # dims rotating more than beta_fast times in L0 keep their frequency
    beta_slow: float = 1.0  # dims rotating fewer than beta_slow times in L0 are interpolated by s
    attention_factor: float | None = None  # None -> get_mscale(s) (= 0.1 ln s + 1) or the mscale ratio
    mscale: float | None = None  # DeepSeek-V2/V3: attention_factor = get_mscale(s, mscale) / get_mscale(s, mscale_all_dim)
    mscale_all_dim: float | None = None
    truncate: bool = True  # round the ramp bounds to whole dims, as the YaRN reference code does

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.beta_slow > 0, f"beta_slow must be > 0, got {self.beta_slow}")
        check(self.beta_fast > self.beta_slow, f"beta_fast ({self.beta_fast}) must be > beta_slow ({self.beta_slow})")
        check(self.attention_factor is None or self.attention_factor > 0,
              f"attention_factor must be > 0, got {self.attention_factor}")


@dataclass(frozen=True, kw_only=True)
class Llama3Config(ScaledConfig):
    original_max_position_embeddings: int = field()  # required
    low_freq_factor: float = 1.0  # wavelengths above L0 / low_freq_factor are divided by s
    high_freq_factor: float = 4.0  # wavelengths below L0 / high_freq_factor are kept

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.low_freq_factor > 0, f"low_freq_factor must be > 0, got {self.low_freq_factor}")
        check(self.high_freq_factor > self.low_freq_factor,
              f"high_freq_factor ({self.high_freq_factor}) must be > low_freq_factor ({self.low_freq_factor})")


# -- one function per type ------------------------------------------------------------------
def linear_parameters(c: ScaledConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al. 2023): theta_i / s, i.e. position m is read as m / s."""
    inv_freq, _ = rope_parameters(c)
    return inv_freq / c.factor, 1.0


def ntk_parameters(c: NtkConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """NTK-aware base change (bloc97, 2023): base * s^(r/(r-2)); the lowest frequency becomes
    exactly theta_last / s while the highest (i = 0) is untouched."""
    r = c.rotary_dim
    return default_inv_freq(c.rope_theta * c.factor ** (r / (r - 2)), r), 1.0


def dynamic_parameters(c: DynamicConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Dynamic NTK (emozilla, 2023): base * (s L / L0 - (s - 1))^(r/(r-2)) with L = max(seq_len, L0),
    so nothing changes within the original length."""
    r, L0 = c.rotary_dim, c.original_max_position_embeddings
    L = max(seq_len or L0, L0)
    return default_inv_freq(c.rope_theta * (c.factor * L / L0 - (c.factor - 1)) ** (r / (r - 2)), r), 1.0


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature sqrt(1/t) = 0.1 * mscale * ln(s) + 1 (1 for s <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_ramp(c: YarnConfig) -> torch.Tensor:
    """Per frequency, 0 = keep theta_i (extrapolate), 1 = theta_i / s (interpolate), linear in between.

    The bounds are the dims that rotate beta_fast and beta_slow times within L0:
    d(b) = r ln(L0 / (2 pi b)) / (2 ln rope_theta).
    """
    r, L0, base = c.rotary_dim, c.original_max_position_embeddings, c.rope_theta

    def dim_for(rotations: float) -> float:
        return r * math.log(L0 / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_for(c.beta_fast), dim_for(c.beta_slow)
    if c.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, r - 1)
    if low == high:
        high += 0.001  # avoid dividing by zero (as the reference code)
    return ((torch.arange(r // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)


def yarn_parameters(c: YarnConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071): NTK-by-parts interpolation
    theta_i ((1 - ramp_i) + ramp_i / s), plus a temperature folded into cos and sin."""
    inv_freq, _ = rope_parameters(c)
    ramp = yarn_ramp(c)
    factor = c.attention_factor
    if factor is None:
        if c.mscale and c.mscale_all_dim:
            factor = get_mscale(c.factor, c.mscale) / get_mscale(c.factor, c.mscale_all_dim)
        else:
            factor = get_mscale(c.factor)
    return inv_freq * (1 - ramp) + inv_freq / c.factor * ramp, float(factor)


def llama3_scale(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                 original_max_position_embeddings: int) -> torch.Tensor:
    """Llama 3.1's rule on given frequencies: keep short wavelengths (< L0 / high_freq_factor), divide
    long ones (> L0 / low_freq_factor) by s, blend in between with weight L0/wavelen (continuous)."""
    L0 = original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    smooth = ((L0 / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0, 1)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def llama3_parameters(c: Llama3Config, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Llama 3.1 (Meta 2024): per-wavelength choice between keeping and interpolating."""
    inv_freq, _ = rope_parameters(c)
    return llama3_scale(inv_freq, c.factor, c.low_freq_factor, c.high_freq_factor, c.original_max_position_embeddings), 1.0


# -- registered classes -------------------------------------------------------------------------
@register_position("rope_linear", config=ScaledConfig)
class RopeLinear(Rotary):
    """Position interpolation (Chen et al. 2023): RoPE at position m / factor."""

    compute = staticmethod(linear_parameters)


@register_position("rope_ntk", config=NtkConfig)
class RopeNtk(Rotary):
    """Static NTK-aware RoPE: base * factor^(d/(d-2)); high frequencies kept, lowest divided by factor."""

    compute = staticmethod(ntk_parameters)


@register_position("rope_dynamic", config=DynamicConfig)
class RopeDynamic(Rotary):
    """Dynamic NTK RoPE: the base grows with the processed length past original_max_position_embeddings.

    The length is the one the backbone passes as ``seq_len``: the full length in a forward pass,
    the ``max_len`` announced in ``init_state`` when decoding, so a decode equals the forward pass
    at that length. A generation that runs past the announced length (or announces none) gets a
    growing base while the cached keys keep the old one; that mismatch is warned about once.
    """

    compute = staticmethod(dynamic_parameters)

    def __init__(self, config: DynamicConfig):
        super().__init__(config)
        self._scale_at_start: int | None = None  # the scaling length the cached keys were rotated with
        self._warned = False

    def scaling_length(self, seq_len: int) -> int:
        return max(seq_len, self.config.original_max_position_embeddings)

    def rotate(self, x: torch.Tensor, start: int = 0, seq_len: int | None = None) -> torch.Tensor:
        seq_len = start + x.shape[-2] if seq_len is None else seq_len
        scale = self.scaling_length(seq_len)
        if start == 0 or self._scale_at_start is None:
            self._scale_at_start = scale
        elif scale != self._scale_at_start and not self._warned:
            self._warned = True
            warnings.warn(
                f"rope_dynamic: the sequence reached length {seq_len}, past the length its first tokens were "
                f"rotated for ({self._scale_at_start}); new tokens get a larger NTK base than the cached keys, "
                "so decoding no longer equals a forward pass. Announce the final length with "
                "model.init_state(batch, max_len=...) to keep one scaling.",
                stacklevel=2,
            )
        return super().rotate(x, start, seq_len)


@register_position("rope_yarn", config=YarnConfig)
class RopeYarn(Rotary):
    """YaRN (Peng et al. 2023): NTK-by-parts interpolation plus attention temperature 0.1 ln(factor) + 1."""

    compute = staticmethod(yarn_parameters)


@register_position("rope_llama3", config=Llama3Config)
class RopeLlama3(Rotary):
    """Llama 3.1 RoPE scaling: keep short wavelengths, divide long ones by factor, blend in between."""

    compute = staticmethod(llama3_parameters)


# The single table of types -> parameter functions, derived from the classes so the two cannot drift.
ROPE_PARAMETERS = {cls.name: cls.compute for cls in (Rope, RopeLinear, RopeNtk, RopeDynamic, RopeYarn, RopeLlama3)}

__all__ = [
    "ROPE_PARAMETERS", "DynamicConfig", "Llama3Config", "NtkConfig", "RopeDynamic", "RopeLinear", "RopeLlama3",
    "RopeNtk", "RopeYarn", "ScaledConfig", "YarnConfig", "dynamic_parameters", "get_mscale", "linear_parameters",
    "llama3_parameters", "llama3_scale", "ntk_parameters", "yarn_parameters", "yarn_ramp",
]
