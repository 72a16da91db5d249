"""`sliding_window`: every CPU backend equals the reference, and the window convention of DESIGN.md
(causal ``i - w < j <= i``, bidirectional ``|i - j| < w``) is pinned against its own definition."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention import flex
from attn.attention.base import UnsupportedBackend
from attn.attention.blocked_window import blocked_attention

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=4e-2, rtol=4e-2)}


def window_mask(lq: int, lk: int, w: int, causal: bool) -> torch.Tensor:
    """DESIGN.md's rule; query i is absolute position i + lk - lq (bottom-right aligned)."""
    p = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    return ((p - w < j) & (j <= p)) if causal else (p - j).abs() < w


def float64_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(D)) v in float64 under ``mask``, written apart from the code under test."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
    return torch.softmax(s, -1) @ v


@st.composite
def qkv(draw, max_len=150):
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    D = draw(st.sampled_from([1, 8, 16]))
    lk = draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    make = lambda L: torch.randn(B, H, L, D, generator=g).to(dtype)
    return make(lq), make(lk), make(lk), dtype


def sw(backend: str, window: int):
    return attn.build_attention("sliding_window", backend=backend, window=window)


@settings(max_examples=20)
@given(qkv(max_len=130), st.data(), st.booleans(), st.one_of(st.none(), st.integers(7, 40)))
def test_blocked_matches_reference_forward_and_grads(inputs, data, causal, chunk):
    q, k, v, dtype = inputs
    w = data.draw(st.integers(1, k.shape[2] + 5), label="window")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ref = sw("reference", w)(q, k, v, causal=causal)
    if chunk is None:
        m = sw("blocked", w)
        out = m(q, k, v, causal=causal)
        assert m.last_backend == "blocked"
    else:
        out = blocked_attention(q, k, v, w, causal, chunk=chunk)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    grad = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])


@settings(max_examples=25, deadline=None)
@given(qkv(max_len=140), st.data(), st.booleans(), st.booleans())
def test_split_matches_reference_forward_and_grads(inputs, data, grouped, dilated):
    """Square causal calls (each chunk against itself and the one before, merged by log-sum-exp; its own backward),
    grouped keys, dilated windows, windows shorter and longer than a chunk of the length."""
    q, k, v, dtype = inputs
    q = torch.randn(k.shape).to(dtype)  # as many queries as keys: what split runs
    w = data.draw(st.integers(1, k.shape[2] + 3), label="window")
    if grouped:
        k, v = k[:, :1], v[:, :1]  # one key head for every query head (GQA when H > 1)
    kw = dict(window=w, dilation=2 if dilated and w > 1 else 1)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    ref = attn.build_attention("sliding_window", backend="reference", **kw)(q, k, v)
    m = attn.build_attention("sliding_window", backend="split", **kw)
    out = m(q, k, v)
    assert m.last_backend == "split"
    torch.testing.assert_close(out, ref, **TOL[dtype])
    grad = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])


def test_auto_trains_with_split_from_the_measured_window_on():
    from attn.attention.sliding_window import SPLIT_MIN_WINDOW

    for w, expected in ((SPLIT_MIN_WINDOW - 1, "blocked"), (SPLIT_MIN_WINDOW, "split")):
        assert sw("auto", w).select_backend("cpu", torch.float32, "backward") == expected


def test_split_refuses_what_it_does_not_run_and_auto_falls_through_to_blocked():
    q = torch.randn(1, 2, 20, 8, requires_grad=True)
    with pytest.raises(UnsupportedBackend, match="plain causal windows"):
        attn.build_attention("sliding_window", backend="split", window=4, sinks=2)(q, q, q)
    with pytest.raises(UnsupportedBackend, match="plain causal windows"):
        attn.build_attention("sliding_window", backend="split", window=4)(q[:, :, 5:], q, q)
    m = attn.build_attention("sliding_window", window=2048, sinks=2)
    m(q, q, q)
    assert m.last_backend == "blocked"


@settings(max_examples=10)
@given(qkv(max_len=40), st.data(), st.booleans())
def test_reference_is_the_design_definition(inputs, data, causal):
    q, k, v, _ = inputs
    q, k, v = q.double(), k.double(), v.double()
    w = data.draw(st.integers(1, k.shape[2] + 5), label="window")
    expected = float64_attention(q, k, v, window_mask(q.shape[2], k.shape[2], w, causal))
    torch.testing.assert_close(sw("reference", w)(q, k, v, causal=causal), expected)
    torch.testing.assert_close(sw("blocked", w)(q, k, v, causal=causal), expected, atol=1e-6, rtol=1e-6)


@settings(max_examples=15)
@given(qkv(max_len=100), st.integers(0, 5), st.booleans())
def test_window_at_least_length_equals_full(inputs, extra, causal):
    q, k, v, dtype = inputs
    full = attn.build_attention("full", backend="sdpa")(q, k, v, causal=causal)
    for backend in ("reference", "blocked"):
        out = sw(backend, k.shape[2] + extra)(q, k, v, causal=causal)
        torch.testing.assert_close(out, full, **TOL[dtype])


@settings(max_examples=10)
@given(qkv(max_len=100))
def test_window_one_causal_returns_v(inputs):
    q, k, v, dtype = inputs
    for backend in ("reference", "blocked"):
        out = sw(backend, 1)(q, k, v, causal=True)
        torch.testing.assert_close(out, v[:, :, k.shape[2] - q.shape[2]:], **TOL[dtype])


# Flex: fixed shapes, as each new shape costs a compile (window and direction do not: they are
# captured tensors). Lengths not multiples of the 128 block, windows shorter than the sequence whose
# edges cut blocks (a window wider than the sequence would test no edge); both cases have some full
# blocks, so they share one kernel.
@pytest.mark.skipif(flex.flex_unavailable() is not None, reason="needs FlexAttention")
@pytest.mark.parametrize("w, causal", [(260, True), (150, False)])
def test_flex_matches_reference(w, causal):
    g = torch.Generator().manual_seed(w)
    q, k, v = torch.randn(3, 1, 2, 400, 16, generator=g)
    m = sw("flex", w)
    with torch.no_grad():
        out = m(q, k, v, causal=causal)
    assert m.last_backend == "flex"
    torch.testing.assert_close(out, sw("reference", w)(q, k, v, causal=causal), atol=2e-5, rtol=2e-5)


def test_auto_skips_the_flex_compile_for_short_inputs():
    from attn.attention.flex import FLEX_MIN_LEN

    m = sw("auto", 8)
    q = torch.randn(1, 2, FLEX_MIN_LEN - 1, 16)
    with torch.no_grad():
        m(q, q, q)
    assert m.last_backend == "blocked"


# The BlockMask itself, for any lengths (Lq < Lk included) without compiling: the block layout
# covers exactly the blocks with visible pairs, full blocks need no mask, and the mask_mod applied
# to partial blocks is the design's rule with padded keys excluded.
@pytest.mark.parametrize("lq, lk, w, causal", [(400, 400, 260, True), (400, 400, 450, False), (300, 400, 360, True),
                                               (100, 333, 130, True), (256, 256, 128, True), (129, 1000, 1, False),
                                               (1, 700, 200, True)])
def test_flex_block_mask_is_the_window(lq, lk, w, causal):
    from attn.attention.sliding_window import FLEX_BLOCK, band_block_layout, band_mask_mod

    partial, full = band_block_layout(lq, lk, w, causal)
    assert not (partial & full).any()
    mask = window_mask(lq, lk, w, causal)
    nq, nk = partial.shape
    padded = F.pad(mask, (0, nk * FLEX_BLOCK - lk, 0, nq * FLEX_BLOCK - lq)).view(nq, FLEX_BLOCK, nk, FLEX_BLOCK)
    any_visible, all_visible = padded.any(3).any(1), padded.all(3).all(1)
    assert torch.equal(partial | full, any_visible)  # no visible pair is skipped, no empty block is visited
    assert not (full & ~all_visible).any()
    q_idx, kv_idx = torch.arange(nq * FLEX_BLOCK)[:, None], torch.arange(nk * FLEX_BLOCK)[None, :]
    mask_mod = band_mask_mod(lq, lk, w, causal)(0, 0, q_idx, kv_idx)
    assert torch.equal(mask_mod[:lq], F.pad(mask, (0, nk * FLEX_BLOCK - lk)))


@settings(max_examples=400, deadline=None)
@given(lq=st.integers(1, 40), extra=st.integers(0, 30), w=st.integers(1, 75), causal=st.booleans(),
       block=st.sampled_from([1, 2, 3, 4, 5, 8, 16]))
def test_band_block_layout_is_exactly_the_definition(lq, extra, w, causal, block):
    """At small blocks, over many shapes: a block is full iff every pair in it is visible and it lies inside
    both lengths; partial iff some pair is visible and it is not full. (A one-off edge -- a partial block
    marked full -- passed the fixed shapes above and made flex differ from the reference by 7.5e-3.)"""
    from attn.attention.sliding_window import band_block_layout

    lk = lq + extra
    partial, full = band_block_layout(lq, lk, w, causal, block=block)
    nq, nk = partial.shape
    mask = F.pad(window_mask(lq, lk, w, causal), (0, nk * block - lk, 0, nq * block - lq)).view(nq, block, nk, block)
    inside = (torch.arange(1, nq + 1)[:, None] * block <= lq) & (torch.arange(1, nk + 1)[None, :] * block <= lk)
    assert torch.equal(full, mask.all(3).all(1) & inside)
    assert torch.equal(partial, mask.any(3).any(1) & ~full)


def test_flex_refuses_cpu_backward_and_xformers_refuses_cpu():
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pytest.raises(UnsupportedBackend, match="backward"):
        sw("flex", 4)(q, q, q)
    with pytest.raises(UnsupportedBackend, match="CUDA"):
        sw("xformers", 4)(q.detach(), q.detach(), q.detach())


@settings(max_examples=20)
@given(st.integers(1, 60), st.data(), st.booleans())
def test_flops_count_exactly_the_visible_pairs(lk, data, causal):
    lq = data.draw(st.integers(1, lk), label="lq")
    w = data.draw(st.integers(1, lk + 5), label="window")
    m = sw("auto", w)
    pairs = int(window_mask(lq, lk, w, causal).sum())
    assert m.flops(2, 3, lq, lk, 16, causal) == 4 * 2 * 3 * 16 * pairs
    full = attn.build_attention("full").flops(2, 3, lq, lk, 16, causal)
    assert m.flops(2, 3, lq, lk, 16, causal) < full if w < lk else m.flops(2, 3, lq, lk, 16, causal) == full


@pytest.mark.parametrize("bad", [0, -1, "abc", 2.5])
def test_bad_window_is_rejected_naming_the_field(bad):
    with pytest.raises(ValueError, match="window"):
        attn.build_attention("sliding_window", window=bad)


@settings(max_examples=12)
@given(st.integers(1, 40), st.integers(1, 12), st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(0, 99))
def test_rolling_cache_decoding_equals_forward_and_stays_within_the_window(L, w, chunks, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 2, 2, L, 8, generator=g)
    expected = sw("reference", w)(q, k, v, causal=True)
    m = sw("auto", w)
    state = m.new_state(L)
    outs, t, i = [], 0, 0
    while t < L:  # chunk sizes cycle through `chunks`; [1] is token by token
        T = min(chunks[i % len(chunks)], L - t)
        outs.append(m.step(q[:, :, t:t + T], k[:, :, t:t + T], v[:, :, t:t + T], state))
        assert m.last_backend == "blocked"
        t, i = t + T, i + 1
        assert state.cached == min(t, w - 1)
        assert state.nbytes() == 2 * 2 * 2 * w * 8 * 4  # the ring of w tokens, whatever the length
    torch.testing.assert_close(torch.cat(outs, dim=2), expected, atol=2e-5, rtol=2e-5)


def test_rolling_cache_rewinds_only_what_it_still_holds():
    m = sw("auto", 4)
    state = m.new_state()
    x = torch.randn(1, 1, 2, 8)
    m.step(x, x, x, state)
    state.truncate(1)  # nothing evicted yet
    assert (state.length, state.cached) == (1, 1)
    for _ in range(4):
        m.step(x[:, :, :1], x[:, :, :1], x[:, :, :1], state)
    state.truncate(4)  # one step back: the ring (w tokens) still holds what that state needs
    with pytest.raises(ValueError, match="evicted"):
        state.truncate(2)


@settings(max_examples=8)
@given(st.integers(1, 9), st.integers(0, 99))
def test_ring_cache_over_long_random_decoding_with_rewinds_equals_forward(w, seed):
    """Token by token over 60 tokens, each step sometimes timed twice as the harness does (step, rewind one,
    step again): every output equals the one full forward, and the ring never grows."""
    g = torch.Generator().manual_seed(seed)
    L = 60
    q, k, v = torch.randn(3, 1, 2, L, 8, generator=g, dtype=torch.float64)
    expected = sw("reference", w)(q, k, v, causal=True)
    m = sw("auto", w)
    state = m.new_state()
    outs = []
    for t in range(L):
        args = (q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], state)
        if torch.rand(1, generator=g).item() < 0.5:
            m.step(*args)
            state.truncate(t)
        outs.append(m.step(*args))
        assert state.nbytes() == 2 * 2 * w * 8 * 8
    torch.testing.assert_close(torch.cat(outs, dim=2), expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_backbone_runs_with_sliding_window_and_decoding_equals_forward(causal):
    torch.manual_seed(0)
    config = attn.TransformerConfig.preset("tiny", attention="sliding_window", attention_params={"window": 8}, causal=causal)
    model = attn.Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 21))
    logits = model(idx)  # parameters need grad: the CPU path is `blocked`
    assert model.blocks[0].attn.attn.last_backend == "blocked"
    with torch.no_grad():
        ref = attn.Transformer(
            attn.TransformerConfig.preset("tiny", attention="sliding_window", attention_params={"window": 8},
                                          causal=causal, backend="reference"))
        ref.load_state_dict(model.state_dict())
        torch.testing.assert_close(logits, ref(idx), atol=1e-5, rtol=1e-5)
        if not causal:
            return
        state = model.init_state(2, 21)
        steps = [model(idx[:, :5], state=state)] + [model(idx[:, t:t + 1], state=state) for t in range(5, 21)]
    torch.testing.assert_close(torch.cat(steps, dim=1), logits, atol=1e-5, rtol=1e-5)
