"""Attention sinks in `sliding_window` (StreamingLLM): the first ``sinks`` tokens stay visible to every query.
Each backend against a from-the-definition float64 construction (forward and gradients, odd lengths, GQA),
decoding against one forward with memory bounded by window + sinks at any length, FLOPs against explicit masks."""

import pytest
import torch
from definitions import decode_in_chunks, float64_attention
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention import flex


def definition_mask(lq: int, lk: int, w: int, s: int, causal: bool) -> torch.Tensor:
    """Written from the paper's rule, apart from the code: window or sink, never a future key when causal."""
    p = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    near = ((p - w < j) & (j <= p)) if causal else (p - j).abs() < w
    sink = (j < s) & (j <= p) if causal else (j < s).expand(lq, lk)
    return near | sink


def sw(backend: str, w: int, s: int):
    return attn.build_attention("sliding_window", backend=backend, window=w, sinks=s)


@st.composite
def case(draw, max_len=90):
    kv, g = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    lk = draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    w, s = draw(st.integers(1, lk + 3)), draw(st.integers(0, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(1, kv * g, lq, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, kv, lk, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v, w, s


@settings(max_examples=15)
@given(case(), st.booleans(), st.sampled_from(["reference", "blocked"]), st.booleans())
def test_backends_equal_the_definition_forward_and_gradients(inputs, causal, backend, grad):
    q, k, v, w, s = inputs
    q, k, v = (t.clone().requires_grad_(grad) for t in (q, k, v))
    expected = float64_attention(q, k, v, definition_mask(q.shape[2], k.shape[2], w, s, causal))
    m = sw(backend, w, s).double()
    with torch.set_grad_enabled(grad):
        out = m(q, k, v, causal=causal)
    assert m.last_backend == backend
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    if grad:
        dout = torch.randn_like(out)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(expected, (q, k, v), dout),
                        strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.skipif(flex.flex_unavailable() is not None, reason="needs FlexAttention")
@pytest.mark.parametrize("w, s, causal", [(100, 4, True), (60, 140, True), (90, 3, False)])
def test_flex_equals_the_definition(w, s, causal):
    gen = torch.Generator().manual_seed(w)
    q, k, v = (torch.randn(1, 4, 300, 16, generator=gen) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA 4:2
    m = sw("flex", w, s)
    with torch.no_grad():
        out = m(q, k, v, causal=causal)
    assert m.last_backend == "flex"
    expected = float64_attention(q, k, v, definition_mask(300, 300, w, s, causal)).float()
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_flex_block_layout_covers_the_sink_columns():
    from attn.attention.sliding_window import FLEX_BLOCK, band_block_layout

    for lq, lk, w, s, causal in [(400, 400, 100, 4, True), (300, 700, 50, 200, True), (400, 400, 90, 3, False)]:
        partial, full = band_block_layout(lq, lk, w, causal, sinks=s)
        mask = definition_mask(lq, lk, w, s, causal)
        nq, nk = partial.shape
        padded = torch.nn.functional.pad(mask, (0, nk * FLEX_BLOCK - lk, 0, nq * FLEX_BLOCK - lq))
        blocks = padded.view(nq, FLEX_BLOCK, nk, FLEX_BLOCK)
        assert torch.equal(partial | full, blocks.any(3).any(1))
        assert not (full & ~blocks.all(3).all(1)).any()


@settings(max_examples=15)
@given(L=st.integers(2, 80), w=st.integers(1, 12), s=st.integers(0, 5),
       chunks=st.lists(st.integers(1, 9), min_size=1, max_size=10), seed=st.integers(0, 99))
def test_decoding_equals_one_forward_and_memory_stays_bounded(L, w, s, chunks, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, L, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, L, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    sizes = []
    out = decode_in_chunks(sw("auto", w, s), q, k, v, chunks, on_step=lambda state: sizes.append(state.nbytes()))
    expected = float64_attention(q, k, v, definition_mask(L, L, w, s, True))
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    assert max(sizes) <= 2 * 2 * (w + s) * 8 * 8  # k and v, 2 key heads, window + sinks tokens, fp64


def test_token_by_token_decoding_with_rewinds_keeps_the_sinks():
    w, s, L = 5, 3, 40
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, L, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    m = sw("auto", w, s)
    state, outs = m.new_state(), []
    with torch.no_grad():
        for t in range(L):
            new = (q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
            m.run_step(*new, state)
            state.truncate(t)  # the harness's rewind of a timed step
            outs.append(m.run_step(*new, state))
    expected = float64_attention(q, k, v, definition_mask(L, L, w, s, True))
    torch.testing.assert_close(torch.cat(outs, 2), expected, atol=1e-10, rtol=1e-9)


@settings(max_examples=30)
@given(lk=st.integers(1, 120), data=st.data(), causal=st.booleans())
def test_flops_count_exactly_the_visible_pairs(lk, data, causal):
    lq = data.draw(st.integers(1, lk))
    w, s = data.draw(st.integers(1, lk + 3)), data.draw(st.integers(0, 8))
    assert sw("auto", w, s).pairs(lq, lk, causal) == int(definition_mask(lq, lk, w, s, causal).sum())


def test_sinks_must_not_be_negative():
    with pytest.raises(ValueError, match="sinks must be >= 0"):
        sw("auto", 8, -1)


def test_xformers_refuses_sinks_rather_than_ignoring_them():
    from attn.attention.base import UnsupportedBackend

    m = sw("auto", 8, 2)
    with pytest.raises(UnsupportedBackend, match="sink"):
        m.backend_xformers(*(torch.randn(1, 1, 4, 8) for _ in range(3)), True)


def test_the_shared_checker_passes_sliding_window_with_sinks():
    from attn.checks import check_variant

    findings = check_variant("sliding_window", {"window": 20, "sinks": 3})
    bad = [f for f in findings if f.status == "mismatch"]
    assert not bad, bad
    assert {f.backend for f in findings if f.status == "ok"} >= {"flex", "blocked", "decode state"}


@pytest.mark.parametrize("causal", [True, False])
def test_blocked_sinks_in_groups_of_chunks_equal_the_definition(causal, monkeypatch):
    """At long lengths the chunks' spans (with the sinks in front) are copied a group at a time: bounded memory."""
    from attn.attention import blocked_window

    monkeypatch.setattr(blocked_window, "SINK_GROUP_BYTES", 1 << 12)  # many groups, uneven last one
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 1000, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 1000, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = sw("blocked", 50, 3).double()(q, k, v, causal=causal)
    expected = float64_attention(q, k, v, definition_mask(1000, 1000, 50, 3, causal))
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    dout = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(expected, (q, k, v), dout),
                    strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
