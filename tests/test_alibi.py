"""ALiBi (Press et al. 2022) in `full` and `sliding_window`, and as the position method `alibi`.

Slopes against the paper's rule and Hugging Face BLOOM's; every CPU backend against a float64 construction of the
definition (score(i, j) += -m_h |i - j|, absolute positions, bottom-right), forward and gradients, with the parameters
it combines with (softcap, prefix, sink tokens, dilation, sink logits); Flex on a few long inputs; decoding against one
forward; a backbone with `position="alibi"` training a step and decoding; refusals."""

import contextlib
import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from definitions import decode_in_chunks, float64_attention
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend

import attn
from attn.attention import flex
from attn.attention.alibi import alibi_slopes
from attn.attention.base import UnsupportedBackend
from attn.checks import mismatches


def paper_slopes(heads: int) -> list[float]:
    """The paper's slopes, from its description: for 2^a heads the geometric sequence starting at 2^(-8/H) with that
    ratio; otherwise those of the closest power of two below, then every other slope of twice that many heads."""
    if math.log2(heads).is_integer():
        start = 2 ** (-8 / heads)
        return [start ** (h + 1) for h in range(heads)]
    n = 2 ** int(math.log2(heads))
    return paper_slopes(n) + paper_slopes(2 * n)[::2][: heads - n]


def definition_mask(lq: int, lk: int, causal: bool, window: int | None = None, sinks: int = 0, dilation: int = 1,
                    prefix: int = 0) -> torch.Tensor:
    """Which keys each query sees, from the variants' definitions (DESIGN.md), queries the last lq positions."""
    p = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    seen = ((j <= p) | (j < prefix)) if causal else torch.ones(lq, lk, dtype=torch.bool)
    if window is None:
        return seen
    d = (p - j) if causal else (p - j).abs()
    near = (d >= 0) & (d < window * dilation) & (d % dilation == 0)
    return near | (seen & (j < sinks))


def definition(q, k, v, causal: bool, alibi: bool = True, sink=None, softcap: float = 0.0, **mask):
    """softmax(cap(q k^T / sqrt(D)) - m_h |i - j|, masked [, sink]) v in float64, m_h the paper's slopes."""
    lq, lk = q.shape[2], k.shape[2]
    p = torch.arange(lq)[:, None] + (lk - lq)
    m = torch.tensor(paper_slopes(q.shape[1]), dtype=torch.float64)
    bias = -m[:, None, None] * (p - torch.arange(lk)[None, :]).abs() if alibi else None
    return float64_attention(q, k, v, definition_mask(lq, lk, causal, **mask), softcap, bias=bias, sink=sink)


# -- slopes -------------------------------------------------------------------------------------------------------

def test_slopes_are_the_papers_and_bloom_s():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    assert alibi_slopes(8) == [2.0 ** -(h + 1) for h in range(8)]  # the paper's example: 1/2, 1/4, ..., 1/256
    for heads in range(1, 49):
        assert alibi_slopes(heads) == pytest.approx(paper_slopes(heads), rel=1e-12), heads
        bloom = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)  # (H, 1, 2): m_h * pos
        assert torch.allclose(bloom[:, 0, 1].double(), torch.tensor(alibi_slopes(heads), dtype=torch.float64),
                              rtol=1e-6, atol=0), heads


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_full_equals_bloom_s_bias_up_to_a_constant_per_row(backend):
    """BLOOM adds m_h * j (softmax is shift invariant, so causally it is -m_h (i - j)); with Lq < Lk too."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    gen = torch.Generator().manual_seed(0)
    B, H, lk, lq = 2, 6, 23, 9
    q = torch.randn(B, H, lq, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, 3, lk, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    bloom = build_alibi_tensor(torch.ones(B, lk, dtype=torch.long), H, torch.float64).view(B, H, 1, lk)
    expected = float64_attention(q, k, v, definition_mask(lq, lk, True), bias=bloom)
    out = attn.build_attention("full", backend=backend, alibi=True)(q, k, v, causal=True)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)


# -- every CPU backend against the definition ---------------------------------------------------------------------

@st.composite
def case(draw, max_len=60):
    kv, g = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3]))  # H = 1..6 query heads: odd counts too
    lk = draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(2, kv * g, lq, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, kv, lk, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v


@st.composite
def variant(draw, lk: int, causal: bool):
    """(name, params, definition's mask keywords, softcap): ALiBi and what it combines with."""
    softcap = draw(st.sampled_from([0.0, 0.0, 3.0]))
    if draw(st.booleans()):
        prefix = draw(st.sampled_from([0, 0, 4])) if causal and not softcap else 0
        return "full", {"prefix": prefix, "softcap": softcap}, {"prefix": prefix}, softcap
    w = draw(st.integers(1, lk + 2))
    dilation = draw(st.sampled_from([1, 1, 2, 3]))
    sinks = 0 if dilation > 1 else draw(st.sampled_from([0, 2]))
    return ("sliding_window", {"window": w, "sinks": sinks, "dilation": dilation, "softcap": softcap},
            {"window": w, "sinks": sinks, "dilation": dilation}, softcap)


@settings(max_examples=25, deadline=None)
@given(case(), st.booleans(), st.booleans(), st.data())
def test_every_cpu_backend_equals_the_definition_forward_and_gradients(inputs, causal, grad, data):
    q, k, v = (t.clone().requires_grad_(grad) for t in inputs)
    name, params, mask, softcap = data.draw(variant(k.shape[2], causal), label="variant")
    expected = definition(q, k, v, causal, softcap=softcap, **mask)
    fast = ["blocked"] if name == "sliding_window" else ([] if softcap else ["sdpa"])
    for backend in ["reference", *fast, "auto"]:
        m = attn.build_attention(name, backend=backend, alibi=True, **params).double()
        with torch.set_grad_enabled(grad):
            out = m(q, k, v, causal=causal)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9, msg=lambda e, b=backend: f"{b}: {e}")
        if grad:
            dout = torch.randn_like(out)
            for a, b in zip(torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                            torch.autograd.grad(expected, (q, k, v), dout, retain_graph=True), strict=True):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name, params, backend", [
    ("full", {}, "sdpa"), ("full", {"prefix": 5}, "sdpa"),
    ("sliding_window", {"window": 9, "sinks": 2}, "blocked"), ("sliding_window", {"window": 7, "dilation": 2}, "blocked"),
])
def test_low_precision_backends_are_as_close_as_the_reference_is(name, params, backend, dtype):
    """fp32 and bf16: within 4x the reference's own error at that precision (attn.checks' tolerance), gradients too."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 45, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 45, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    fast, ref = (attn.build_attention(name, backend=b, alibi=True, **params) for b in (backend, "reference"))
    for causal in (True, False):
        assert not mismatches(fast, ref, q.to(dtype), k.to(dtype), v.to(dtype), causal, grad=True)
    assert fast.last_backend == backend


@pytest.mark.skipif(flex.flex_unavailable() is not None, reason="needs FlexAttention")
@pytest.mark.parametrize("name, params", [("full", {}), ("full", {"prefix": 40, "softcap": 5.0}),
                                          ("sliding_window", {"window": 90, "sinks": 2}),
                                          ("sliding_window", {"window": 50, "dilation": 2})])
def test_flex_adds_the_bias_in_its_score_mod(name, params):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 300, 16, generator=gen) * 2
    k, v = (torch.randn(1, 2, 300, 16, generator=gen) * 2 for _ in range(2))
    m = attn.build_attention(name, backend="flex", alibi=True, **params)
    mask = {key: params[key] for key in ("window", "sinks", "dilation", "prefix") if key in params}
    for causal in (True, False) if "prefix" not in params else (True,):
        with torch.no_grad():
            out = m(q, k, v, causal=causal)
        expected = definition(q, k, v, causal, softcap=params.get("softcap", 0.0), **mask).float()
        torch.testing.assert_close(out, expected, atol=3e-5, rtol=3e-5)
    if name == "full" and not params:
        auto = attn.build_attention("full", alibi=True)
        with torch.no_grad():
            auto(q, k, v)
        assert auto.last_backend == "flex"  # 300 queries: Flex's score_mod, not SDPA with an H x L x L float mask


# -- decoding -----------------------------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(L=st.integers(2, 45), chunks=st.lists(st.integers(1, 7), min_size=1, max_size=8), seed=st.integers(0, 99),
       sw=st.sampled_from([None, {"window": 6}, {"window": 5, "sinks": 2}, {"window": 4, "dilation": 2}]))
def test_decoding_equals_one_forward(L, chunks, seed, sw):
    """The cache counts positions (the ring's slots are out of order): the bias of every step is the forward's."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 6, L, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, L, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    m = attn.build_attention("full" if sw is None else "sliding_window", alibi=True, **(sw or {}))
    torch.testing.assert_close(decode_in_chunks(m, q, k, v, chunks), definition(q, k, v, True, **(sw or {})),
                               atol=1e-10, rtol=1e-9)


def test_token_by_token_decoding_with_rewinds_keeps_positions():
    w, s, L = 5, 2, 30
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, L, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    m = attn.build_attention("sliding_window", window=w, sinks=s, alibi=True)
    state, outs = m.new_state(), []
    with torch.no_grad():
        for t in range(L):
            new = (q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
            m.run_step(*new, state)
            state.truncate(t)  # the harness's rewind of a timed step
            outs.append(m.run_step(*new, state))
    torch.testing.assert_close(torch.cat(outs, 2), definition(q, k, v, True, window=w, sinks=s), atol=1e-10, rtol=1e-9)


@contextlib.contextmanager
def sdpa_choices():
    """The kernel SDPA's dispatch picks (``torch._fused_sdp_choice`` on the same arguments) for each call inside."""
    real, chosen = F.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        chosen.append(SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                                                         enable_gqa=enable_gqa)))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    with mock.patch.object(F, "scaled_dot_product_attention", spy):
        yield chosen


@settings(max_examples=30, deadline=None)
@given(kv=st.integers(1, 2), g=st.sampled_from([1, 2, 3]), lk=st.integers(1, 300), lq=st.sampled_from([1, 1, 2, 5]),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]), prefix=st.sampled_from([0, 0, 4]),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_a_step_hands_sdpa_the_bias_as_a_mask_its_fused_cpu_kernel_takes(kv, g, lk, lq, dtype, prefix, causal, seed):
    """One or a few queries over a cache (decoding; with GQA folded into their key head's rows): the per-head bias goes
    to SDPA in 4-D, which its fused CPU kernel takes (a 3-D mask sent it to the math path: 5x a plain step at 64K
    keys), and the output equals the fp64 definition within the reference's own error in fp64, fp32 and bf16."""
    lq, prefix = min(lq, lk), prefix if causal else 0
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, kv * g, lq, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, kv, lk, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    fast, ref = (attn.build_attention("full", backend=b, alibi=True, prefix=prefix) for b in ("sdpa", "reference"))
    with sdpa_choices() as chosen:
        assert not mismatches(fast, ref, q.to(dtype), k.to(dtype), v.to(dtype), causal, grad=False)
    assert chosen and set(chosen) == {SDPBackend.FLASH_ATTENTION}


# -- the position method in the backbone --------------------------------------------------------------------------

def tiny(attention: str, **params) -> attn.Transformer:
    torch.manual_seed(0)
    config = attn.TransformerConfig.preset("tiny", d_model=32, n_heads=4, num_kv_heads=2, attention=attention,
                                           attention_params=params, position="alibi", max_seq_len=32)
    return attn.Transformer(config).double()


@pytest.mark.parametrize("attention, params", [("full", {}), ("sliding_window", {"window": 4, "sinks": 1})])
def test_a_model_with_alibi_positions_trains_a_step_and_decodes_as_its_forward(attention, params):
    model = tiny(attention, **params)
    assert model.blocks[0].attn.attn.config.alibi
    idx = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = model.loss(idx[:, :-1], idx[:, 1:])
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and model.loss(idx[:, :-1], idx[:, 1:]) < loss
    with torch.no_grad():
        full = model(idx)
        state, outs, t = model.init_state(2, 13), [], 0
        for n in (5, 1, 1, 3, 3):
            outs.append(model(idx[:, t:t + n], state=state))
            t += n
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-9, rtol=1e-9)


def test_the_position_method_is_a_bias_that_sets_the_variant_parameter():
    p = attn.build_position("alibi")
    x = torch.randn(1, 2, 5, 8)
    assert p.kind == "bias" and p.attention_params == {"alibi": True}
    assert torch.equal(p.rotate(x, 3), x) and torch.equal(p.embed(x[0], 3), x[0])
    with pytest.raises(ValueError, match="alibi"):
        attn.TransformerConfig(position="alibi", attention="linear")


# -- what it costs, and what refuses ------------------------------------------------------------------------------

def test_flops_are_those_without_the_bias():
    for name, params in [("full", {}), ("sliding_window", {"window": 7})]:
        plain, biased = attn.build_attention(name, **params), attn.build_attention(name, alibi=True, **params)
        assert biased.flops(2, 4, 50, 80, 16) == plain.flops(2, 4, 50, 80, 16)


def test_backends_that_cannot_add_the_bias_refuse_and_bad_values_are_refused():
    q = torch.randn(1, 2, 4, 8)
    for name, params in [("full", {}), ("sliding_window", {"window": 3})]:
        with pytest.raises(UnsupportedBackend, match="ALiBi"):
            attn.build_attention(name, alibi=True, **params).backend_xformers(q, q, q, True)
    name, params = attn.parse_spec("full:alibi=maybe")
    with pytest.raises(ValueError, match="alibi must be a bool"):
        attn.build_attention(name, **params)
    with pytest.raises(ValueError, match="at least one head"):
        alibi_slopes(0)
