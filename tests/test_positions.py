"""Position methods, checked against their definitions (papers / HF formulas), not against snapshots."""
from __future__ import annotations

import functools
import itertools
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.positions.rope_scaling import ROPE_PARAMETERS, llama3_scale

PROPS = settings(max_examples=20, deadline=None, derandomize=True)

D = 64  # head_dim of the unit tests
# Every rotary method with its scaling switched on; L0 = 256, so positions past it are extrapolated.
ROTARY = {
    "rope": {},
    "rope_linear": {"factor": 4.0},
    "rope_ntk": {"factor": 4.0},
    "rope_dynamic": {"factor": 4.0, "original_max_position_embeddings": 256},
    "rope_yarn": {"factor": 4.0, "original_max_position_embeddings": 256},
    "rope_llama3": {"factor": 4.0, "original_max_position_embeddings": 256},
}
SCALED = [n for n in ROTARY if n != "rope"]
SEQ_LEN = 1024  # the processing length for the dynamic method (> L0: its base is scaled)


def build(name: str, **params):
    return attn.build_position(name, head_dim=D, **{**ROTARY.get(name, {}), **params})


@functools.cache
def shared(name: str, partial_rotary_factor: float = 1.0):
    """One module per case across hypothesis examples, so its tables are built once."""
    return build(name, partial_rotary_factor=partial_rotary_factor)


def rotate_at(p, x: torch.Tensor, pos: int, seq_len: int = SEQ_LEN) -> torch.Tensor:
    """x: (D,) placed at position ``pos`` -> R(pos) x."""
    return p.rotate(x.view(1, 1, 1, -1), start=pos, seq_len=seq_len).view(-1)


def complex_rotation(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Reference: pairs (x_i, x_{i+r/2}) as complex numbers times exp(j angle_i); the rest unchanged."""
    half = angles.shape[-1]
    z = torch.complex(x[..., :half], x[..., half : 2 * half]) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat((z.real, z.imag, x[..., 2 * half :]), dim=-1)


def vec(seed: int, n: int = D) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# -- rotary: definitions ------------------------------------------------------------------------
@pytest.mark.parametrize("partial", [1.0, 0.5, 0.3])
def test_rope_frequencies_and_rotation_follow_the_definition(partial):
    p = attn.build_position("rope", head_dim=D, rope_theta=500.0, partial_rotary_factor=partial)
    r = int(D * partial) // 2 * 2
    expected = torch.tensor([500.0 ** (-2 * i / r) for i in range(r // 2)], dtype=torch.float64)
    torch.testing.assert_close(p.inv_freq(), expected, rtol=1e-12, atol=0)
    x = torch.randn(2, 3, 7, D, dtype=torch.float64)
    pos = torch.arange(40, 47, dtype=torch.float64)[:, None]  # start = 40
    torch.testing.assert_close(p.rotate(x, start=40), complex_rotation(x, pos * expected))


@pytest.mark.parametrize("name", list(ROTARY))
@PROPS
@given(m=st.integers(0, 4000), n=st.integers(0, 4000), shift=st.integers(0, 4000), seed=st.integers(0, 2**16))
def test_score_depends_only_on_relative_position(name, m, n, shift, seed):
    p = shared(name)
    q, k = vec(seed), vec(seed + 1)
    before = rotate_at(p, q, m) @ rotate_at(p, k, n)
    after = rotate_at(p, q, m + shift) @ rotate_at(p, k, n + shift)
    assert math.isclose(before, after, rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("name", list(ROTARY))
@PROPS
@given(m=st.integers(0, 10000), seed=st.integers(0, 2**16))
def test_rotation_scales_norm_by_attention_factor_only(name, m, seed):
    p = shared(name, 0.75)
    r, x = p.rotary_dim, vec(seed)
    y = rotate_at(p, x, m)
    assert math.isclose(y[:r].norm(), p.attention_factor * x[:r].norm(), rel_tol=1e-12)
    torch.testing.assert_close(y[r:], x[r:], rtol=0, atol=0)  # the pass-through part is untouched


@pytest.mark.parametrize("name", list(ROTARY))
def test_position_zero_is_identity(name):
    p = build(name)
    x = vec(0)
    torch.testing.assert_close(rotate_at(p, x, 0), p.attention_factor * x, rtol=1e-14, atol=0)
    if name != "rope_yarn":
        assert p.attention_factor == 1.0


@PROPS
@given(m=st.integers(0, 20000), s=st.floats(1.0, 64.0))
def test_rope_linear_at_m_is_rope_at_m_over_s(m, s):
    lin, rope = attn.build_position("rope_linear", head_dim=D, factor=s), attn.build_position("rope", head_dim=D)
    x = vec(m)
    torch.testing.assert_close(rotate_at(lin, x, m), complex_rotation(x, (m / s) * rope.inv_freq()), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", SCALED)
def test_factor_one_is_plain_rope(name):
    p, rope = build(name, factor=1.0), build("rope")
    # dynamic NTK with factor 1 still grows its base past L0 (HF: base * (L/L0)^(r/(r-2))), so compare within L0
    seq_len = 256 if name == "rope_dynamic" else SEQ_LEN
    torch.testing.assert_close(p.inv_freq(seq_len), rope.inv_freq(), rtol=1e-12, atol=0)
    assert p.attention_factor == 1.0
    x = torch.randn(1, 2, 9, D, dtype=torch.float64)
    torch.testing.assert_close(p.rotate(x, 100, seq_len), rope.rotate(x, 100, seq_len))


@pytest.mark.parametrize("s", [2.0, 4.0, 17.5])
def test_ntk_keeps_highest_frequency_and_divides_lowest_by_s(s):
    ntk, rope = build("rope_ntk", factor=s).inv_freq(), build("rope").inv_freq()
    assert ntk[0] == rope[0] == 1.0
    assert math.isclose(ntk[-1], rope[-1] / s, rel_tol=1e-12)
    assert torch.all(ntk[1:-1] < rope[1:-1]) and torch.all(ntk[1:-1] > rope[1:-1] / s)


def test_dynamic_is_rope_within_the_original_length_and_grows_the_base_beyond():
    dyn, rope = build("rope_dynamic"), build("rope")
    x = torch.randn(1, 2, 50, D, dtype=torch.float64)
    for seq_len in (None, 1, 100, 256):
        torch.testing.assert_close(dyn.inv_freq(seq_len), rope.inv_freq(), rtol=1e-12, atol=0)
    torch.testing.assert_close(dyn.rotate(x, 200, 256), rope.rotate(x, 200, 256))
    L = 1000  # dynamic NTK: base' = base * (s L / L0 - (s - 1))^(d / (d - 2))
    base = 10000.0 * (4.0 * L / 256 - 3.0) ** (D / (D - 2))
    expected = torch.tensor([base ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    torch.testing.assert_close(dyn.inv_freq(L), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize(("L0", "s"), [(256, 4.0), (2048, 8.0), (1024, 2.5)])
def test_yarn_keeps_fast_dims_interpolates_slow_dims_and_ramps_monotonically(truncate, L0, s):
    p = build("rope_yarn", factor=s, original_max_position_embeddings=L0, truncate=truncate)
    rope = build("rope").inv_freq()
    ratio = p.inv_freq() / rope
    rotations = L0 * rope / (2 * math.pi)  # full turns each dim makes within the original context
    fast, slow = rotations > 32.0, rotations < 1.0  # beta_fast, beta_slow
    assert fast.any() and slow.any() and (~fast & ~slow).any()  # the case exercises all three zones
    torch.testing.assert_close(ratio[fast], torch.ones_like(ratio[fast]), rtol=1e-12, atol=0)
    torch.testing.assert_close(ratio[slow], torch.full_like(ratio[slow], 1 / s), rtol=1e-12, atol=0)
    assert torch.all(ratio[1:] <= ratio[:-1] + 1e-15)  # monotone: from keeping to interpolating
    assert torch.all((ratio >= 1 / s - 1e-15) & (ratio <= 1 + 1e-15))


def test_yarn_attention_factor():
    assert math.isclose(build("rope_yarn", factor=4.0).attention_factor, 0.1 * math.log(4.0) + 1)
    assert round(build("rope_yarn", factor=4.0).attention_factor, 4) == 1.1386
    assert build("rope_yarn", factor=4.0, attention_factor=0.7).attention_factor == 0.7
    mixed = build("rope_yarn", factor=40.0, mscale=1.0, mscale_all_dim=0.707).attention_factor  # DeepSeek-V2
    assert math.isclose(mixed, (0.1 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1))


def test_llama3_keeps_short_divides_long_and_is_continuous_at_both_thresholds():
    L0, s, low, high = 8192, 8.0, 1.0, 4.0
    f = lambda wavelen: llama3_scale(2 * math.pi / wavelen, s, low, high, L0) * wavelen / (2 * math.pi)  # new / old
    w = torch.logspace(0, 6, 2001, dtype=torch.float64)
    torch.testing.assert_close(f(w[w < L0 / high]), torch.ones_like(w[w < L0 / high]), rtol=1e-12, atol=0)
    torch.testing.assert_close(f(w[w > L0 / low]), torch.full_like(w[w > L0 / low], 1 / s), rtol=1e-12, atol=0)
    for threshold in (L0 / high, L0 / low):
        left, right = f(torch.tensor([threshold * (1 - 1e-9), threshold * (1 + 1e-9)], dtype=torch.float64))
        assert abs(left - right) < 1e-7
    p = build("rope_llama3", factor=s, original_max_position_embeddings=L0, low_freq_factor=low, high_freq_factor=high)
    torch.testing.assert_close(p.inv_freq(), llama3_scale(build("rope").inv_freq(), s, low, high, L0))


def test_tables_are_cached_and_rebuilt_only_when_needed():
    p = build("rope_dynamic")
    x = torch.randn(1, 1, 10, D)
    p.rotate(x, 0, 10)
    first = p.cos_sin(10, 10, x.device, x.dtype)
    assert p.cos_sin(5, 200, x.device, x.dtype) is first  # shorter, same scaling (within L0): reused
    assert p.cos_sin(5000, 5000, x.device, x.dtype)[0].shape[0] >= 5000  # longer and rescaled: new
    assert p.cos_sin(5, 5, x.device, torch.float64)[0].dtype == torch.float64  # per dtype


def test_rope_parameters_table_covers_every_rotary_method():
    rotary = {s["name"] for s in attn.list_positions() if s["kind"] == "rotary" and s["source"] == "builtin"}
    assert set(ROPE_PARAMETERS) == rotary == set(ROTARY)


# -- additive methods ----------------------------------------------------------------------------
@PROPS
@given(pos=st.integers(0, 3000), k=st.integers(0, 3000))
def test_sinusoidal_offset_is_a_fixed_rotation_per_pair(pos, k):
    d = 32
    p = attn.build_position("sinusoidal", d_model=d)
    pe = p.embed(torch.zeros(1, pos + k + 1, d, dtype=torch.float64))[0]  # (L, d)
    omega = torch.tensor([10000.0 ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    assert torch.allclose(pe[pos, 0::2], torch.sin(pos * omega)) and torch.allclose(pe[pos, 1::2], torch.cos(pos * omega))
    c, s = torch.cos(k * omega), torch.sin(k * omega)  # [sin(a+b), cos(a+b)] = [[c, s], [-s, c]] [sin a, cos a]
    sin_a, cos_a = pe[pos, 0::2], pe[pos, 1::2]
    torch.testing.assert_close(pe[pos + k, 0::2], c * sin_a + s * cos_a, rtol=0, atol=1e-9)
    torch.testing.assert_close(pe[pos + k, 1::2], -s * sin_a + c * cos_a, rtol=0, atol=1e-9)


def test_sinusoidal_embed_with_start_offset_adds_the_right_rows():
    p = attn.build_position("sinusoidal", d_model=16)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    full = p.embed(torch.zeros(1, 12, 16, dtype=torch.float64))[0]
    torch.testing.assert_close(p.embed(x, start=7), x + full[7:12])


def test_learned_adds_its_table_and_refuses_longer_sequences():
    p = attn.build_position("learned", d_model=8, max_seq_len=10)
    assert 0.01 < p.weight.std().item() < 0.03  # normal(0, 0.02) init
    x = torch.randn(2, 4, 8)
    torch.testing.assert_close(p.embed(x, start=6), x + p.weight[6:10])
    with pytest.raises(ValueError, match="max_seq_len=10"):
        p.embed(torch.randn(1, 11, 8))
    with pytest.raises(ValueError, match="max_seq_len=10"):
        p.embed(torch.randn(1, 1, 8), start=10)


# -- parameters ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "params", "match"), [
    ("rope", {"head_dim": 63}, "head_dim"),
    ("rope", {"partial_rotary_factor": 0.0}, "partial_rotary_factor"),
    ("rope", {"head_dim": 4, "partial_rotary_factor": 0.25}, "partial_rotary_factor"),
    ("rope_linear", {"factor": 0.5}, "factor"),
    ("rope_linear", {}, "factor"),
    ("rope_ntk", {"factor": 0.99}, "factor"),
    ("rope_dynamic", {"factor": 2.0}, "original_max_position_embeddings"),
    ("rope_yarn", {"factor": 2.0}, "original_max_position_embeddings"),
    ("rope_llama3", {"factor": 2.0}, "original_max_position_embeddings"),
    ("rope_yarn", {"factor": 2.0, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ("rope_yarn", {"factor": 2.0, "original_max_position_embeddings": 64, "beta_fast": 1.0}, "beta_fast"),
    ("rope_yarn", {"factor": 2.0, "original_max_position_embeddings": 64, "beta_fast": 2.0, "beta_slow": 3.0}, "beta_fast"),
    ("rope_llama3", {"factor": 2.0, "original_max_position_embeddings": 64, "high_freq_factor": 1.0}, "high_freq_factor"),
    ("rope_yarn", {"factor": "big", "original_max_position_embeddings": 64}, "factor"),
    ("rope_yarn", {"factor": 2.0, "original_max_position_embeddings": 64, "beta": 2.0}, "beta"),
    ("learned", {"max_seq_len": 0}, "max_seq_len"),
    ("learned", {}, "max_seq_len"),
    ("sinusoidal", {"base": 1.0}, "base"),
])
def test_bad_parameters_raise_clear_value_errors(name, params, match):
    with pytest.raises(ValueError, match=match):
        attn.build_position(name, **params)


def test_parameters_flow_through_spec_strings():
    name, params = attn.parse_spec("rope_yarn:factor=4,original_max_position_embeddings=512,truncate=false,attention_factor=none")
    p = attn.build_position(name, head_dim=32, **params)
    assert (p.config.factor, p.config.original_max_position_embeddings, p.config.truncate) == (4.0, 512, False)
    assert math.isclose(p.attention_factor, 0.1 * math.log(4) + 1)


def test_every_method_describes_itself():
    for spec in attn.list_positions():
        assert spec["kind"] in ("none", "additive", "rotary", "bias") and spec["doc"], spec["name"]


# -- the backbone with every attention variant x every position method -----------------------------
ATTENTION_PARAMS = {"sliding_window": {"window": 4}, "block_sparse": {"block_size": 4}}
POSITION_PARAMS = {**ROTARY, **{n: {**p, "factor": 2.0, "original_max_position_embeddings": 8} for n, p in ROTARY.items() if p}}
T = 13  # longer than L0 = 8 (scaled methods extrapolate) and not a multiple of the block size
CHUNKS = (5, 1, 1, 3, 1, 2)
# The model runs in float64, but the reference softmax runs in float32 (~1e-8 noise on the logits); a
# position off by one moves the logits of this model by > 1e-4, so 1e-6 still catches any position error.
CLOSE = {"rtol": 1e-6, "atol": 1e-6}


def tiny_model(attention: str, position: str, backend: str = "reference") -> attn.Transformer:
    torch.manual_seed(0)
    config = attn.TransformerConfig.preset(
        "tiny", d_model=32, attention=attention, attention_params=ATTENTION_PARAMS.get(attention, {}),
        position=position, position_params=POSITION_PARAMS.get(position, {}), backend=backend, max_seq_len=16,
    )
    return attn.Transformer(config).double().eval()


def decode(model: attn.Transformer, idx: torch.Tensor, max_len: int) -> torch.Tensor:
    state, out, start = model.init_state(idx.shape[0], max_len), [], 0
    for n in CHUNKS:
        out.append(model(idx[:, start : start + n], state=state))
        start += n
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("position", [s["name"] for s in attn.list_positions()])
@pytest.mark.parametrize("attention", [s["name"] for s in attn.list_attention()])
def test_backbone_runs_every_attention_with_every_position(attention, position):
    try:
        model = tiny_model(attention, position)
    except ValueError as e:  # a variant added elsewhere with required parameters this file does not know
        if "needs parameter" not in str(e) and "needs an attention variant with parameter" not in str(e):
            raise
        pytest.skip(f"{attention} x {position}: {e}")
    idx = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        assert full.shape == (2, T, 256) and torch.isfinite(full).all()
        if model.blocks[0].attn.attn.supports_decode:
            torch.testing.assert_close(decode(model, idx, max_len=T), full, **CLOSE)
        # the fast backends `auto` picks (same weights), through the positions, forward and decoding
        fast = tiny_model(attention, position, backend="auto")
        torch.testing.assert_close(fast(idx), full, **CLOSE)
        assert fast.blocks[0].attn.attn.last_backend != "reference" or len(fast.blocks[0].attn.attn.backends) == 1
        if fast.blocks[0].attn.attn.supports_decode:
            torch.testing.assert_close(decode(fast, idx, max_len=T), full, **CLOSE)


def test_dynamic_decode_with_announced_length_equals_forward_and_warns_when_it_runs_past():
    model = tiny_model("full", "rope_dynamic")  # L0 = 8 < T
    idx = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # announced: one scaling throughout, no warning
        full = model(idx)
        torch.testing.assert_close(decode(model, idx, max_len=T), full, **CLOSE)
    model = tiny_model("full", "rope_dynamic")
    with torch.no_grad(), pytest.warns(UserWarning, match="init_state"):
        unannounced = decode(model, idx, max_len=0)  # the base grows under the cached keys
    assert (unannounced - full).abs().max() > 1e-5


# -- against transformers' own RoPE initialisers, over a grid (the ramp's transition zone included) ---------

def _hf_config(rope_type: str, head_dim: int, theta: float, prf: float, max_pos: int, **params):
    from transformers import LlamaConfig

    rp = {"rope_type": rope_type, "rope_theta": theta, **params}
    if prf != 1.0:
        rp["partial_rotary_factor"] = prf
    return LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim, rope_parameters=rp,
                       max_position_embeddings=max_pos)


HF_GRID = list(itertools.product([64, 128], [10_000.0, 500_000.0], [1.0, 0.5], [256, 4096, 32_768], [2.0, 4.0, 16.0, 40.0]))


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("betas", [(32.0, 1.0), (16.0, 2.0), (64.0, 0.5)])
def test_yarn_matches_transformers_over_a_grid(truncate, betas):
    """Every frequency and the attention factor, as transformers computes them (its find_correction_range with
    floor/ceil, truncate, the clamped ramp): a swapped floor/ceil or an inverted truncate changes 3-70% of them."""
    R = pytest.importorskip("transformers.modeling_rope_utils")
    from attn.positions.rope_scaling import YarnConfig, yarn_parameters

    fast, slow = betas
    for head_dim, theta, prf, L0, s in HF_GRID:
        hf = _hf_config("yarn", head_dim, theta, prf, int(L0 * s), factor=s, original_max_position_embeddings=L0,
                        beta_fast=fast, beta_slow=slow, truncate=truncate)
        expected, factor = R._compute_yarn_parameters(hf)
        ours, our_factor = yarn_parameters(YarnConfig(head_dim=head_dim, rope_theta=theta, partial_rotary_factor=prf,
                                                      factor=s, original_max_position_embeddings=L0, beta_fast=fast,
                                                      beta_slow=slow, truncate=truncate))
        where = (head_dim, theta, prf, L0, s)
        # transformers works in fp32 (ours in fp64): 2e-6 apart at worst where the ramp is fractional
        torch.testing.assert_close(ours.float(), expected, rtol=1e-5, atol=0, msg=f"inv_freq at {where}")
        assert math.isclose(our_factor, factor, rel_tol=1e-12), where


def test_llama3_linear_and_dynamic_match_transformers_over_a_grid():
    R = pytest.importorskip("transformers.modeling_rope_utils")
    from attn.positions.rope_scaling import (
        DynamicConfig,
        Llama3Config,
        ScaledConfig,
        dynamic_parameters,
        linear_parameters,
        llama3_parameters,
    )

    for head_dim, theta, prf, L0, s in HF_GRID:
        common = dict(head_dim=head_dim, rope_theta=theta, partial_rotary_factor=prf, factor=s)
        for low, high in ((1.0, 4.0), (0.5, 2.0)):
            hf = _hf_config("llama3", head_dim, theta, prf, int(L0 * s), factor=s, original_max_position_embeddings=L0,
                            low_freq_factor=low, high_freq_factor=high)
            ours = llama3_parameters(Llama3Config(**common, original_max_position_embeddings=L0, low_freq_factor=low,
                                                  high_freq_factor=high))[0]
            torch.testing.assert_close(ours.float(), R._compute_llama3_parameters(hf)[0], rtol=1e-6, atol=0)
        hf = _hf_config("linear", head_dim, theta, prf, L0, factor=s)
        torch.testing.assert_close(linear_parameters(ScaledConfig(**common))[0].float(),
                                   R._compute_linear_scaling_rope_parameters(hf)[0], rtol=1e-6, atol=0)
        for seq_len in (L0 // 2, L0, 3 * L0):  # unchanged within L0, growing past it
            hf = _hf_config("dynamic", head_dim, theta, prf, L0, factor=s)
            expected = R._compute_dynamic_ntk_parameters(hf, seq_len=seq_len)[0]
            ours = dynamic_parameters(DynamicConfig(**common, original_max_position_embeddings=L0), seq_len)[0]
            torch.testing.assert_close(ours.float(), expected, rtol=1e-5, atol=0, msg=f"dynamic at {seq_len}")
