"""Learnable sink logits (gpt-oss's ``s_aux``) in `full` and `sliding_window`: one logit per query head joins every
softmax as a zero-valued column, out_i = sum_j e^{s_ij} v_j / (e^{s_h} + sum_j e^{s_ij}).

Every CPU backend against a float64 construction of that definition (forward, gradients of q, k, v and of the sink
logits, GQA, odd lengths, Lq < Lk, with ALiBi, softcap, prefix, sink tokens, dilation), fp32/bf16 within the reference's
own error, Flex on a few long inputs, decoding against one forward, transformers' gpt-oss eager attention, the
parameter's life (lazy or sized by ``heads``, zeros, per head count) and a backbone training one step."""

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from definitions import decode_in_chunks, float64_attention
from hypothesis import given, settings
from hypothesis import strategies as st
from test_alibi import definition, definition_mask

import attn
from attn.attention import flex, score_terms
from attn.attention.base import UnsupportedBackend
from attn.checks import mismatches


def with_sink(m, sink: torch.Tensor):
    """The module with its sink logits set to ``sink`` (a copy; gradients land on ``m.sink_logits``)."""
    m.sink_logits = torch.nn.Parameter(sink.detach().clone())
    return m


@st.composite
def case(draw, max_len=60):
    kv, g = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3]))
    lk = draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(2, kv * g, lq, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, kv, lk, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    sink = torch.randn(kv * g, generator=gen, dtype=torch.float64) * draw(st.sampled_from([1.0, 4.0]))
    return q, k, v, sink


@st.composite
def variant(draw, lk: int, causal: bool):
    """(name, params, definition's mask keywords): sink logits and what they combine with."""
    terms = {"alibi": draw(st.booleans()), "softcap": draw(st.sampled_from([0.0, 0.0, 3.0]))}
    if draw(st.booleans()):
        prefix = draw(st.sampled_from([0, 0, 4])) if causal and not terms["softcap"] else 0
        return "full", {"prefix": prefix, **terms}, {"prefix": prefix}
    w, dilation = draw(st.integers(1, lk + 2)), draw(st.sampled_from([1, 1, 2]))
    sinks = 0 if dilation > 1 else draw(st.sampled_from([0, 2]))
    mask = {"window": w, "sinks": sinks, "dilation": dilation}
    return "sliding_window", {**mask, **terms}, mask


@settings(max_examples=25, deadline=None)
@given(case(), st.booleans(), st.booleans(), st.data())
def test_every_cpu_backend_equals_the_definition_forward_and_gradients(inputs, causal, grad, data):
    q, k, v, sink = (t.clone().requires_grad_(grad) for t in inputs)
    name, params, mask = data.draw(variant(k.shape[2], causal), label="variant")
    expected = definition(q, k, v, causal, alibi=params["alibi"], sink=sink, softcap=params["softcap"], **mask)
    fast = ["blocked"] if name == "sliding_window" else ([] if params["softcap"] else ["sdpa"])
    for backend in ["reference", *fast, "auto"]:
        m = with_sink(attn.build_attention(name, backend=backend, sink_logit=True, **params), sink)
        with torch.set_grad_enabled(grad):
            out = m(q, k, v, causal=causal)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9, msg=lambda e, b=backend: f"{b}: {e}")
        if grad:  # the sink logits get theirs too
            dout = torch.randn_like(out)
            got = torch.autograd.grad(out, (q, k, v, m.sink_logits), dout, retain_graph=True)
            for a, b in zip(got, torch.autograd.grad(expected, (q, k, v, sink), dout, retain_graph=True), strict=True):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name, params, backend", [
    ("full", {}, "sdpa"), ("full", {"alibi": True, "prefix": 5}, "sdpa"),
    ("sliding_window", {"window": 9, "sinks": 2}, "blocked"), ("sliding_window", {"window": 7, "alibi": True}, "blocked"),
])
def test_low_precision_backends_are_as_close_as_the_reference_is(name, params, backend, dtype):
    """fp32 and bf16: within 4x the reference's own error at that precision (attn.checks' tolerance), gradients too."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 45, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 45, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    sink = torch.randn(6, generator=gen) * 2
    fast, ref = (with_sink(attn.build_attention(name, backend=b, sink_logit=True, **params), sink)
                 for b in (backend, "reference"))
    for causal in (True, False):
        assert not mismatches(fast, ref, q.to(dtype), k.to(dtype), v.to(dtype), causal, grad=True)
    assert fast.last_backend == backend


@pytest.mark.skipif(flex.flex_unavailable() is not None, reason="needs FlexAttention")
@pytest.mark.parametrize("name, params", [("full", {}), ("sliding_window", {"window": 90, "sinks": 2, "alibi": True})])
def test_flex_scores_the_sink_column_in_its_score_mod(name, params):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 300, 16, generator=gen) * 2
    k, v = (torch.randn(1, 2, 300, 16, generator=gen) * 2 for _ in range(2))
    sink = torch.randn(4, generator=gen) * 3
    m = with_sink(attn.build_attention(name, backend="flex", sink_logit=True, **params), sink)
    mask = {key: params[key] for key in ("window", "sinks") if key in params}
    for causal in (True, False):
        with torch.no_grad():
            out = m(q, k, v, causal=causal)
        expected = definition(q, k, v, causal, alibi=params.get("alibi", False), sink=sink, **mask).float()
        torch.testing.assert_close(out, expected, atol=3e-5, rtol=3e-5)
    with pytest.raises(UnsupportedBackend, match="backward"):  # CPU Flex is forward only: no gradient for the logits
        m(q, k, v)


def test_full_equals_gpt_oss_eager_attention_given_s_aux():
    """transformers' gpt-oss eager path (sinks concatenated as the last logit, then dropped) with s_aux = s."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    gen = torch.Generator().manual_seed(7)
    B, H, Hkv, L, D = 2, 8, 2, 19, 16
    q = torch.randn(B, H, L, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, L, D, generator=gen, dtype=torch.float64) for _ in range(2))
    s_aux = torch.randn(H, generator=gen, dtype=torch.float64) * 2
    causal = torch.zeros(L, L, dtype=torch.float64).masked_fill(~definition_mask(L, L, True), float("-inf"))
    module = SimpleNamespace(num_key_value_groups=H // Hkv, sinks=s_aux, training=False)
    theirs, _ = eager_attention_forward(module, q, k, v, causal.expand(B, 1, L, L), scaling=D**-0.5)
    for backend in ("reference", "sdpa"):
        ours = with_sink(attn.build_attention("full", backend=backend, sink_logit=True), s_aux)(q, k, v, causal=True)
        torch.testing.assert_close(ours.transpose(1, 2), theirs, atol=1e-12, rtol=1e-10)


# -- decoding -----------------------------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(L=st.integers(2, 45), chunks=st.lists(st.integers(1, 7), min_size=1, max_size=8), seed=st.integers(0, 99),
       alibi=st.booleans(), sw=st.sampled_from([None, {"window": 6}, {"window": 5, "sinks": 2}, {"window": 4, "dilation": 2}]))
def test_decoding_equals_one_forward(L, chunks, seed, alibi, sw):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, L, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, L, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    sink = torch.randn(4, generator=gen, dtype=torch.float64) * 2
    m = with_sink(attn.build_attention("full" if sw is None else "sliding_window", sink_logit=True, alibi=alibi,
                                       **(sw or {})), sink)
    expected = definition(q, k, v, True, alibi=alibi, sink=sink, **(sw or {}))
    torch.testing.assert_close(decode_in_chunks(m, q, k, v, chunks), expected, atol=1e-10, rtol=1e-9)


@settings(max_examples=30, deadline=None)
@given(kv=st.integers(1, 2), g=st.sampled_from([1, 2, 3]), lk=st.integers(1, 300), lq=st.sampled_from([1, 1, 2, 5]),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]), alibi=st.booleans(),
       prefix=st.sampled_from([0, 0, 4]), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_a_call_without_gradient_folds_the_sink_in_after_the_kernel(kv, g, lk, lq, dtype, alibi, prefix, causal, seed):
    """No gradient on CPU (a decoding step): SDPA's fused kernel returns each row's log-sum-exp and the output is scaled
    by sigmoid(lse - s_h) after it, so the sink key (a copy of every cached key and value, 16x a plain step at 64K) is
    never built -- except for a causal prefill with GQA, whose grouped keys the kernel cannot take. Equal to the fp64
    definition within the reference's own error in fp64, fp32 and bf16, with ALiBi and a prefix, at odd lengths."""
    lq, prefix = min(lq, lk), prefix if causal else 0
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, kv * g, lq, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, kv, lk, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    sink = torch.randn(kv * g, generator=gen) * 3
    fast, ref = (with_sink(attn.build_attention("full", backend=b, sink_logit=True, alibi=alibi, prefix=prefix), sink)
                 for b in ("sdpa", "reference"))
    with mock.patch.object(score_terms, "with_sink_key", wraps=score_terms.with_sink_key) as sink_key:
        assert not mismatches(fast, ref, q.to(dtype), k.to(dtype), v.to(dtype), causal, grad=False)
    fused_causal = causal and lq == lk and not prefix and not alibi
    assert sink_key.call_count == (fused_causal and g > 1)


def test_the_folded_sink_gives_a_query_that_sees_nothing_zero():
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 3, 8, generator=gen)
    k, v = (torch.randn(1, 2, 5, 8, generator=gen) for _ in range(2))
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    sink = torch.randn(4, generator=gen)
    with torch.no_grad():
        out = score_terms.sdpa(q, k, v, mask, sink=sink)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    torch.testing.assert_close(out, float64_attention(q, k, v, mask, sink=sink).float(), atol=1e-6, rtol=1e-5)


# -- the parameter ------------------------------------------------------------------------------------------------

def test_the_logits_are_zeros_made_at_the_first_call_or_sized_by_heads():
    q = torch.randn(1, 3, 5, 8, dtype=torch.float64)
    lazy = attn.build_attention("full", sink_logit=True)
    assert lazy.sink_logits is None
    lazy(q, q, q)
    assert lazy.sink_logits.shape == (3,) and lazy.sink_logits.dtype == torch.float64 and not lazy.sink_logits.any()
    with pytest.raises(ValueError, match="sink logits are for 3 query heads, the call has 2"):
        lazy(q[:, :2], q[:, :2], q[:, :2])
    sized = attn.build_attention("sliding_window", window=4, sink_logit=True, heads=3)
    assert [n for n, _ in sized.named_parameters()] == ["sink_logits"] and not sized.sink_logits.any()
    assert not list(attn.build_attention("full").parameters())  # no sink logits, no parameter
    # zero logits add e^0 = 1 to every denominator; a very negative one is plain attention
    plain = attn.build_attention("full")(q, q, q)
    assert not torch.allclose(lazy(q, q, q), plain)
    torch.testing.assert_close(with_sink(lazy, torch.full((3,), -1e4, dtype=torch.float64))(q, q, q), plain)


@pytest.mark.parametrize("params, match", [({"heads": 4}, "set sink_logit=true"), ({"sink_logit": True, "heads": -1},
                                                                                    "heads must be >= 0")])
def test_bad_heads_are_refused(params, match):
    for name in ("full", "sliding_window"):
        with pytest.raises(ValueError, match=match):
            attn.build_attention(name, **params)


def test_dispatch_counts_the_logits_gradient_and_xformers_refuses():
    q = torch.randn(1, 2, 300, 8)
    m = attn.build_attention("full", sink_logit=True, alibi=True)
    assert m.mode_of(q, q, q) == "backward"  # q needs no gradient, the logits do: CPU Flex cannot run it
    m(q, q, q)
    assert m.last_backend == "sdpa" and m.sink_logits.requires_grad
    with torch.no_grad():
        assert m.mode_of(q, q, q) == "forward"
    for name, params in [("full", {}), ("sliding_window", {"window": 3})]:
        with pytest.raises(UnsupportedBackend, match="sink logit"):
            attn.build_attention(name, sink_logit=True, **params).backend_xformers(q, q, q, True)


def test_flops_do_not_count_the_sink_column():
    for name, params in [("full", {}), ("sliding_window", {"window": 7})]:
        plain, sunk = attn.build_attention(name, **params), attn.build_attention(name, sink_logit=True, **params)
        assert sunk.flops(2, 4, 50, 80, 16) == plain.flops(2, 4, 50, 80, 16)


@pytest.mark.parametrize("attention, params", [("full", {}), ("sliding_window", {"window": 4, "alibi": True})])
def test_a_model_with_sink_logits_trains_them_and_decodes_as_its_forward(attention, params):
    torch.manual_seed(0)
    config = attn.TransformerConfig.preset("tiny", d_model=32, n_heads=4, num_kv_heads=2, attention=attention,
                                           attention_params={"sink_logit": True, "heads": 4, **params})
    model = attn.Transformer(config).double()
    logits = model.blocks[0].attn.attn.sink_logits
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before any call: `heads` made the logits already
    idx = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(1))
    model.loss(idx[:, :-1], idx[:, 1:]).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    opt.step()
    assert logits.detach().abs().sum() > 0
    with torch.no_grad():
        full = model(idx)
        state, outs, t = model.init_state(2, 13), [], 0
        for n in (5, 1, 1, 3, 3):
            outs.append(model(idx[:, t:t + n], state=state))
            t += n
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-9, rtol=1e-9)


def test_a_query_that_sees_nothing_returns_zero():
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    mask = torch.zeros(3, 3, dtype=torch.bool)
    out = float64_attention(q, q, q, mask, sink=torch.zeros(2))
    assert torch.equal(out, torch.zeros_like(out))
    from attn.attention.full import dense_attention

    assert torch.equal(dense_attention(q, q, q, mask, sink=torch.zeros(2, dtype=torch.float64)), out)


@pytest.mark.parametrize("spec", [("full", {"sink_logit": True}), ("sliding_window", {"window": 8, "sink_logit": True})])
def test_the_backbone_makes_the_logits_before_its_first_call(spec):
    """An optimizer built right after the model (as the accuracy harness builds it) must see the sink logits."""
    name, params = spec
    model = attn.Transformer(attn.TransformerConfig(attention=name, attention_params=params, position="rope",
                                                    vocab_size=32, d_model=32, n_heads=4, n_layers=2, max_seq_len=64))
    logits = [b.attn.attn.sink_logits for b in model.blocks]
    assert all(isinstance(p, torch.nn.Parameter) and p.shape == (4,) for p in logits)
    names = {n for n, _ in model.named_parameters()}
    assert sum(n.endswith("sink_logits") for n in names) == 2
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model.loss(torch.randint(0, 32, (2, 16)), torch.randint(0, 32, (2, 16))).backward()
    opt.step()
    assert all(p.abs().sum() > 0 for p in logits)  # trained by the optimizer made before the first call


def test_the_checker_passes_sink_logits_at_every_head_count():
    """attn.checks builds a module per shape: a module sized for 4 query heads is never called with 2."""
    from attn.checks import check_variant

    found = check_variant("full", {"sink_logit": True}, dtypes=(torch.float32,))
    assert found and not [f for f in found if f.status == "mismatch"]
    assert {f.status for f in found} >= {"ok"}
