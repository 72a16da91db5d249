"""Dilated sliding window (`sliding_window:dilation=d`, Longformer's dilated window, attention-gym's mask): query i
sees the w keys i, i - d, ..., i - (w-1) d (bidirectional: |i - j| = m d, m < w). Backends run it as d plain windows,
one per residue class; each is checked against a float64 construction from the definition (forward, gradients, GQA,
Lq < Lk), decoding against one forward with a cache of (w - 1) d + 1 tokens, FLOPs against the explicit mask."""

import pytest
import torch
from definitions import decode_in_chunks, float64_attention
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention import flex


def definition_mask(lq: int, lk: int, w: int, d: int, causal: bool) -> torch.Tensor:
    p = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    ok = torch.zeros(lq, lk, dtype=torch.bool)
    for m in range(w):  # the w keys, one step of d at a time
        ok |= j == p - m * d
        if not causal:
            ok |= j == p + m * d
    return ok


def dilated(backend: str, w: int, d: int, **extra):
    return attn.build_attention("sliding_window", backend=backend, window=w, dilation=d, **extra)


@st.composite
def case(draw, max_len=70):
    kv, g = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lk = draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(1, kv * g, lq, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, kv, lk, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v, draw(st.integers(1, 9)), draw(st.integers(1, 5))


@settings(max_examples=15)
@given(case(), st.booleans(), st.booleans(), st.sampled_from(["reference", "blocked", "auto"]))
def test_backends_equal_the_definition(inputs, causal, grad, backend):
    q, k, v, w, d = inputs
    q, k, v = (t.clone().requires_grad_(grad) for t in (q, k, v))
    expected = float64_attention(q, k, v, definition_mask(q.shape[2], k.shape[2], w, d, causal))
    with torch.set_grad_enabled(grad):
        out = dilated(backend, w, d).double()(q, k, v, causal=causal)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    if grad:
        dout = torch.randn_like(out)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(expected, (q, k, v), dout),
                        strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.skipif(flex.flex_unavailable() is not None, reason="needs FlexAttention")
@pytest.mark.parametrize("causal", [True, False])
def test_flex_per_residue_class_equals_the_definition(causal):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 600, 16, generator=gen)
    k, v = (torch.randn(1, 2, 600, 16, generator=gen) for _ in range(2))
    m = dilated("flex", 40, 3)
    with torch.no_grad():
        out = m(q, k, v, causal=causal)
    expected = float64_attention(q, k, v, definition_mask(600, 600, 40, 3, causal)).float()
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


@settings(max_examples=15)
@given(L=st.integers(2, 70), w=st.integers(1, 6), d=st.integers(1, 4),
       chunks=st.lists(st.integers(1, 9), min_size=1, max_size=10), seed=st.integers(0, 99))
def test_decoding_equals_one_forward_in_bounded_memory(L, w, d, chunks, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, L, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, L, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    kept = []
    out = decode_in_chunks(dilated("auto", w, d), q, k, v, chunks, on_step=lambda state: kept.append(state.k.shape[2]))
    torch.testing.assert_close(out, float64_attention(q, k, v, definition_mask(L, L, w, d, True)), atol=1e-10, rtol=1e-9)
    assert max(kept) <= (w - 1) * d + 1


@settings(max_examples=30)
@given(lk=st.integers(1, 100), data=st.data(), causal=st.booleans())
def test_flops_count_exactly_the_visible_pairs(lk, data, causal):
    lq = data.draw(st.integers(1, lk))
    w, d = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 5))
    assert dilated("auto", w, d).pairs(lq, lk, causal) == int(definition_mask(lq, lk, w, d, causal).sum())


def test_dilation_one_is_the_plain_window_and_bad_values_are_refused():
    q = torch.randn(1, 2, 50, 8)
    torch.testing.assert_close(dilated("blocked", 7, 1)(q, q, q), attn.build_attention("sliding_window", window=7)(q, q, q))
    with pytest.raises(ValueError, match="dilation must be >= 1"):
        dilated("auto", 4, 0)
    with pytest.raises(ValueError, match="sinks and dilation"):
        dilated("auto", 4, 2, sinks=2)
