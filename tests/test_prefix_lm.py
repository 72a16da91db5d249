"""Prefix-LM (`full:prefix=P`, T5 / UniLM, attention-gym's prefix_lm mask): the first P tokens see each other both ways,
the rest is causal. Every backend against a float64 construction from the definition (forward, gradients, GQA), FLOPs
against the explicit mask, decoding when the prefix arrives in the first step, refusals."""

import pytest
import torch
from definitions import float64_attention
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention import flex
from attn.attention.base import UnsupportedBackend


def definition(q, k, v, prefix: int):
    lq, lk = q.shape[2], k.shape[2]
    p = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    return float64_attention(q, k, v, (j <= p) | (j < prefix))


@settings(max_examples=15)
@given(data=st.data(), grad=st.booleans(), backend=st.sampled_from(["reference", "sdpa", "auto"]))
def test_backends_equal_the_definition(data, grad, backend):
    lk = data.draw(st.integers(1, 60))
    lq = data.draw(st.integers(1, lk)) if data.draw(st.booleans()) else lk
    prefix, kv, g = data.draw(st.integers(0, lk + 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    gen = torch.Generator().manual_seed(lk * 7 + lq)
    q = torch.randn(1, kv * g, lq, 8, generator=gen, dtype=torch.float64, requires_grad=grad)
    k, v = (torch.randn(1, kv, lk, 8, generator=gen, dtype=torch.float64, requires_grad=grad) for _ in range(2))
    expected = definition(q, k, v, prefix)
    with torch.set_grad_enabled(grad):
        out = attn.build_attention("full", backend=backend, prefix=prefix).double()(q, k, v)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    if grad:
        dout = torch.randn_like(out)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(expected, (q, k, v), dout),
                        strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.skipif(flex.flex_unavailable() is not None, reason="needs FlexAttention")
@pytest.mark.parametrize("prefix", [100, 300])
def test_flex_equals_the_definition_and_auto_picks_it(prefix):
    gen = torch.Generator().manual_seed(prefix)
    q = torch.randn(1, 4, 400, 16, generator=gen)
    k, v = (torch.randn(1, 2, 400, 16, generator=gen) for _ in range(2))
    m = attn.build_attention("full", prefix=prefix)
    with torch.no_grad():
        out = m(q, k, v)
    assert m.last_backend == "flex"  # 400 queries: Flex, not SDPA with a 400 x 400 mask
    torch.testing.assert_close(out, definition(q, k, v, prefix).float(), atol=2e-5, rtol=2e-5)


@settings(max_examples=30)
@given(lk=st.integers(1, 90), data=st.data())
def test_flops_count_exactly_the_visible_pairs(lk, data):
    lq, prefix = data.draw(st.integers(1, lk)), data.draw(st.integers(0, lk + 3))
    p = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    assert attn.build_attention("full", prefix=prefix).pairs(lq, lk, True) == int(((j <= p) | (j < prefix)).sum())


def test_decoding_after_a_prefix_given_at_once_equals_one_forward():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 30, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    m = attn.build_attention("full", prefix=12)
    state = m.new_state(30)
    with torch.no_grad():
        outs = [m.run_step(q[:, :, :12], k[:, :, :12], v[:, :, :12], state)]
        outs += [m.run_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], state) for t in range(12, 30)]
    torch.testing.assert_close(torch.cat(outs, 2), definition(q, k, v, 12), atol=1e-10, rtol=1e-9)


def test_bad_prefix_and_xformers_are_refused():
    with pytest.raises(ValueError, match="prefix must be >= 0"):
        attn.build_attention("full", prefix=-1)
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(UnsupportedBackend, match="prefix"):
        attn.build_attention("full", prefix=2).backend_xformers(q, q, q, True)
