"""Logit softcapping (Gemma 2) in `full` and `sliding_window`: scores -> c * tanh(s / c) before the mask and the
softmax. Every backend against a float64 construction from the definition (forward, gradients, GQA, sinks), decoding
against one forward, `auto` never picking a backend that would ignore the cap, bad caps refused."""

import pytest
import torch
from definitions import decode_in_chunks, float64_attention
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention import flex
from attn.attention.base import UnsupportedBackend


def definition(q, k, v, cap: float, causal: bool, window: int | None = None, sinks: int = 0):
    """softmax(mask(c tanh(q k^T / sqrt(D) / c))) v in float64, the mask written from the definitions."""
    lq, lk = q.shape[2], k.shape[2]
    p = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    seen = (j <= p) if causal else torch.ones(lq, lk, dtype=torch.bool)
    if window is not None:
        near = ((p - window < j) & (j <= p)) if causal else (p - j).abs() < window
        seen = near | (seen & (j < sinks))
    return float64_attention(q, k, v, seen, softcap=cap)


@st.composite
def case(draw, max_len=80):
    kv, g = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    lk = draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([1.0, 4.0]))  # 4: scores well past the cap, where tanh bends
    q = torch.randn(1, kv * g, lq, 8, generator=gen, dtype=torch.float64) * scale
    k, v = (torch.randn(1, kv, lk, 8, generator=gen, dtype=torch.float64) * scale for _ in range(2))
    return q, k, v, draw(st.sampled_from([1.0, 5.0, 30.0]))


@settings(max_examples=12)
@given(case(), st.booleans(), st.booleans(), st.data())
def test_every_cpu_backend_equals_the_definition(inputs, causal, grad, data):
    q, k, v, cap = inputs
    name = data.draw(st.sampled_from(["full", "sliding_window"]), label="variant")
    params = {"softcap": cap}
    window = sinks = None
    if name == "sliding_window":
        window, sinks = data.draw(st.integers(1, k.shape[2] + 2), label="window"), data.draw(st.integers(0, 3))
        params.update(window=window, sinks=sinks)
    backends = ["reference"] + (["blocked"] if name == "sliding_window" else [])
    q, k, v = (t.clone().requires_grad_(grad) for t in (q, k, v))
    expected = definition(q, k, v, cap, causal, window, sinks or 0)
    for backend in [*backends, "auto"]:
        m = attn.build_attention(name, backend=backend, **params).double()
        with torch.set_grad_enabled(grad):
            out = m(q, k, v, causal=causal)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
        if grad:
            dout = torch.randn_like(out)
            for a, b in zip(torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                            torch.autograd.grad(expected, (q, k, v), dout, retain_graph=True), strict=True):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.skipif(flex.flex_unavailable() is not None, reason="needs FlexAttention")
@pytest.mark.parametrize("name, params", [("full", {}), ("sliding_window", {"window": 90, "sinks": 2})])
@pytest.mark.parametrize("causal", [True, False])
def test_flex_applies_the_cap_as_its_score_mod(name, params, causal):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 300, 16, generator=gen) * 3
    k, v = (torch.randn(1, 2, 300, 16, generator=gen) * 3 for _ in range(2))
    m = attn.build_attention(name, backend="flex", softcap=5.0, **params)
    with torch.no_grad():
        out = m(q, k, v, causal=causal)
    expected = definition(q, k, v, 5.0, causal, params.get("window"), params.get("sinks", 0)).float()
    torch.testing.assert_close(out, expected, atol=3e-5, rtol=3e-5)
    auto = attn.build_attention(name, softcap=5.0, **params)
    with torch.no_grad():
        auto(q, k, v, causal=causal)
    assert auto.last_backend == "flex"  # 300 queries: worth the compile


@settings(max_examples=10)
@given(L=st.integers(2, 50), chunks=st.lists(st.integers(1, 7), min_size=1, max_size=8), seed=st.integers(0, 50),
       name=st.sampled_from(["full", "sliding_window"]))
def test_decoding_equals_one_forward(L, chunks, seed, name):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, L, 8, generator=gen, dtype=torch.float64) * 4
    k, v = (torch.randn(1, 2, L, 8, generator=gen, dtype=torch.float64) * 4 for _ in range(2))
    params = {"softcap": 2.0, **({"window": 6, "sinks": 1} if name == "sliding_window" else {})}
    out = decode_in_chunks(attn.build_attention(name, **params), q, k, v, chunks)
    expected = definition(q, k, v, 2.0, True, params.get("window"), params.get("sinks", 0))
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)


def test_backends_without_a_score_hook_refuse_rather_than_ignore_the_cap():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(UnsupportedBackend, match="softcap"):
        attn.build_attention("full", backend="sdpa", softcap=5.0)(q, q, q)
    assert attn.build_attention("full", softcap=0.0).select_backend("cpu", torch.float32, "forward") == "sdpa"
    with pytest.raises(UnsupportedBackend, match="softcap"):
        attn.build_attention("sliding_window", softcap=5.0).backend_xformers(q, q, q, True)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_bad_softcap_is_refused_naming_the_field(bad):
    for name in ("full", "sliding_window"):
        with pytest.raises(ValueError, match="softcap must be a finite number >= 0"):
            attn.build_attention(name, softcap=bad)


@pytest.mark.parametrize("name, params", [("full", {"softcap": 5.0}), ("sliding_window", {"window": 20, "softcap": 5.0})])
def test_the_shared_checker_passes(name, params):
    from attn.checks import check_variant

    findings = check_variant(name, params)
    assert not [f for f in findings if f.status == "mismatch"], [f for f in findings if f.status == "mismatch"]
