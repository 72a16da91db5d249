"""`full` attention: every backend equals the reference; conventions pinned against SDPA's definition."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attn
from attn.attention.base import UnsupportedBackend
from attn.attention.masks import causal_mask, visible_pairs

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


@st.composite
def qkv(draw, decode=True):
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    D = draw(st.sampled_from([1, 8, 16, 33]))
    lk = draw(st.integers(1, 70))
    lq = draw(st.integers(1, lk)) if decode and draw(st.booleans()) else lk
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    make = lambda L: torch.randn(B, H, L, D, generator=g).to(dtype)
    return make(lq), make(lk), make(lk), dtype


def float64_attention(q, k, v, causal):
    """The textbook definition, in float64, written independently of the code under test."""
    q, k, v = q.double(), k.double(), v.double()
    lq, lk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        for i in range(lq):
            s[:, :, i, i + (lk - lq) + 1 :] = -math.inf
    return torch.softmax(s, -1) @ v


@given(qkv(), st.booleans())
def test_every_backend_matches_the_float64_definition_forward_and_grad(inputs, causal):
    q, k, v, dtype = inputs
    expected = float64_attention(q, k, v, causal)
    for backend in ["reference", "sdpa"]:
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        m = attn.build_attention("full", backend=backend)
        out = m(qq, kk, vv, causal=causal)
        assert m.last_backend == backend
        torch.testing.assert_close(out.double(), expected, **TOL[dtype])
        if dtype == torch.float32:
            g = torch.randn_like(out)
            out.backward(g)
            q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
            float64_attention(q64, k64, v64, causal).backward(g.double())
            for a, b in [(qq, q64), (kk, k64), (vv, v64)]:
                torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-4, rtol=1e-4)


def test_causal_mask_is_bottom_right_aligned_when_decoding():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]
    assert causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


@given(st.integers(1, 40), st.integers(0, 40), st.booleans(), st.one_of(st.none(), st.integers(1, 50)))
def test_visible_pairs_counts_the_mask(lq, extra, causal, window):
    lk = lq + extra
    assert visible_pairs(lq, lk, causal, window) == int(causal_mask(lq, lk, window=window, causal=causal).sum())


def test_flops_count_only_visible_pairs():
    m = attn.build_attention("full")
    L, D = 1000, 64
    assert m.flops(2, 3, L, L, D, causal=False) == 4 * 2 * 3 * D * L * L
    assert m.flops(2, 3, L, L, D, causal=True) == 4 * 2 * 3 * D * L * (L + 1) // 2


def test_auto_picks_sdpa_on_cpu_and_xformers_says_why():
    m = attn.build_attention("full")
    q = torch.randn(1, 1, 4, 8)
    m(q, q, q)
    assert m.last_backend == "sdpa"
    with pytest.raises(UnsupportedBackend, match="CUDA"):
        attn.build_attention("full", backend="xformers")(q, q, q)


def test_shape_errors_are_clear():
    m = attn.build_attention("full")
    with pytest.raises(ValueError, match=r"\(B, H, L, D\)"):
        m(torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="more queries"):
        m(torch.randn(1, 1, 5, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8))
