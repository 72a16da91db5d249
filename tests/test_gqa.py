"""Grouped-query attention: every variant and backend, given k, v with H_kv < H heads, equals the same call on
keys repeated to H heads (forward and gradients); decoding with grouped caches equals one forward; caches hold
H_kv heads; a plugin that does not declare GQA gets repeated keys, and FLOPs count what is computed."""
import warnings

import pytest
import torch
from definitions import decode_in_chunks
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention.gqa import repeat_kv

CASES = [  # (variant, params, CPU backends other than the reference; flex: forward only)
    ("full", {}, ["reference", "sdpa"]),
    ("sliding_window", {"window": 9}, ["reference", "blocked", "flex"]),
    ("block_sparse", {"block_size": 16, "random_blocks": 1}, ["reference", "gathered", "flex"]),
    ("linear", {}, ["reference", "chunked", "recurrent"]),
    ("linear", {"feature_map": "favor", "num_features": 16, "chunk_size": 16}, ["reference", "chunked", "recurrent"]),
]
BACKENDS = [(n, p, b) for n, p, bs in CASES for b in bs if b != "flex"]  # flex: its own test (a compile per shape)


@st.composite
def grouped(draw, max_len=70):
    kv = draw(st.integers(1, 3))
    g = draw(st.integers(1, 4))
    lk = draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    B, D = draw(st.integers(1, 2)), draw(st.sampled_from([4, 16]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(B, kv * g, lq, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, kv, lk, D, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v, g


@pytest.mark.parametrize(("name", "params", "backend"), BACKENDS, ids=[f"{n}-{b}-{len(p)}" for n, p, b in BACKENDS])
@settings(max_examples=8)
@given(inputs=grouped(), causal=st.booleans(), grad=st.booleans())
def test_grouped_keys_equal_repeated_keys(name, params, backend, inputs, causal, grad):
    q, k, v, g = inputs
    m = attn.build_attention(name, backend=backend, **params).double()
    grouped_in = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    repeated_in = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    with torch.set_grad_enabled(grad):
        out = m(*grouped_in, causal=causal)
        ran = m.last_backend
        ref = m(repeated_in[0], repeat_kv(repeated_in[1], g), repeat_kv(repeated_in[2], g), causal=causal)
    assert ran == backend
    tol = dict(atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(out, ref, **tol)
    if grad:
        dout = torch.randn_like(out)
        a = torch.autograd.grad(out, grouped_in, dout)
        b = torch.autograd.grad(ref, repeated_in, dout)  # through repeat_interleave: sums over the group
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, **tol)


@pytest.mark.parametrize(("name", "params"), [("full", {}), ("sliding_window", {"window": 50}),
                                              ("block_sparse", {"block_size": 32})])
@pytest.mark.parametrize("shape", [(1, 4, 2, 130, 16), (2, 3, 1, 37, 8)])
@pytest.mark.parametrize("causal", [True, False])
def test_flex_takes_grouped_keys(name, params, shape, causal):
    B, H, Hkv, L, D = shape
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, Hkv, L, D), torch.randn(B, Hkv, L, D)
    m = attn.build_attention(name, backend="flex", **params)
    with torch.no_grad():
        out = m(q, k, v, causal=causal)
        ref = attn.build_attention(name, backend="reference", **params)(q, repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv),
                                                                         causal=causal)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(("name", "params"), [(n, p) for n, p, _ in CASES], ids=[f"{n}-{len(p)}" for n, p, _ in CASES])
@settings(max_examples=8)
@given(data=st.data(), kv=st.integers(1, 2), g=st.integers(2, 3))
def test_grouped_decoding_equals_one_forward_and_the_state_holds_kv_heads(name, params, data, kv, g):
    L = data.draw(st.integers(2, 60), label="length")
    chunks = data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=12), label="chunks")
    gen = torch.Generator().manual_seed(L)
    q = torch.randn(1, kv * g, L, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, kv, L, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    m = attn.build_attention(name, **params).double()
    ref = attn.build_attention(name, backend="reference", **params).double()
    with torch.no_grad():
        expected = ref(q, k, v, causal=True)
    states = []
    torch.testing.assert_close(decode_in_chunks(m, q, k, v, chunks, on_step=states.append), expected, atol=1e-10,
                               rtol=1e-9)
    heads = {x.shape[1] for x in vars(states[-1]).values() if isinstance(x, torch.Tensor) and x.dim() == 4}
    assert heads == {kv}, f"{name}'s decoding state holds {heads} heads, not the {kv} key heads"


@pytest.mark.parametrize(("name", "params"), [("full", {}), ("sliding_window", {"window": 64}),
                                              ("block_sparse", {}), ("linear", {})])
def test_a_grouped_cache_is_the_group_factor_smaller(name, params):
    m = attn.build_attention(name, **params)
    sizes = {}
    for kv in (8, 2):
        state = m.new_state(300)
        with torch.no_grad():
            m.run_step(torch.randn(1, 8, 300, 16), torch.randn(1, kv, 300, 16), torch.randn(1, kv, 300, 16), state)
        sizes[kv] = state.nbytes()
    assert sizes[8] == 4 * sizes[2]


def test_a_model_with_grouped_heads_has_smaller_projections_and_decodes_like_its_forward():
    cfg = dict(d_model=64, n_heads=4, n_layers=2, position="rope")
    mha, gqa = (attn.Transformer(attn.TransformerConfig(**cfg, num_kv_heads=h)).double().eval() for h in (4, 1))
    assert mha.blocks[0].attn.qkv.out_features == 3 * 64 and gqa.blocks[0].attn.qkv.out_features == 64 + 2 * 16
    idx = torch.randint(0, 256, (2, 21))
    state = gqa.init_state(2, 21)
    with torch.no_grad():
        steps = torch.cat([gqa(idx[:, :9], state=state)] + [gqa(idx[:, t:t + 1], state=state) for t in range(9, 21)], 1)
        torch.testing.assert_close(steps, gqa(idx), atol=1e-10, rtol=1e-9)
    assert all(s.k.shape[1] == 1 for s in state.layers)


def test_num_kv_heads_must_divide_the_heads():
    with pytest.raises(ValueError, match="num_kv_heads .3. must divide n_heads .4."):
        attn.TransformerConfig(d_model=64, n_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="H_kv dividing"):
        attn.build_attention("full")(torch.randn(1, 4, 5, 8), torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8))


class NoGroups(attn.Attention):
    """A plugin that knows nothing of GQA: its backend needs as many key heads as query heads."""

    backends = (attn.Backend("reference", {"cpu": frozenset({"forward", "backward", "decode"})}),)

    def backend_reference(self, q, k, v, causal):
        assert k.shape[1] == q.shape[1]
        return attn.build_attention("full", backend="reference")(q, k, v, causal)


def test_a_plugin_without_gqa_gets_repeated_keys_with_a_warning():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Cfg:
        pass

    attn.register_attention("no_groups_test", config=Cfg)(NoGroups)
    try:
        m = attn.build_attention("no_groups_test")
        q, k, v = torch.randn(1, 4, 10, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = m(q, k, v)
            state = m.new_state()
            m.run_step(q, k, v, state)
        assert any("does not declare supports_gqa" in str(w.message) for w in caught)
        torch.testing.assert_close(out, attn.build_attention("full")(q, k, v))
        assert state.k.shape[1] == 4  # its cache holds what its step was given: repeated keys
        assert NoGroups.describe()["gqa"] == "keys repeated to the query heads"
        assert attn.build_attention("full").describe()["gqa"] == "native"
    finally:
        attn.registry.ATTENTION.unregister("no_groups_test")


def test_flops_of_grouped_linear_attention_count_keys_once_per_key_head():
    m = attn.build_attention("linear")
    mha = m.mode_flops("forward", 1, 8, 1024, 64)
    gqa = m.mode_flops("forward", 1, 8, 1024, 64, kv_heads=2)
    per_key = 64 + 2 * 64 * 64 + 64  # elu1 feature + phi(k)^T v + z, per key and head (see LinearAttention.flops)
    assert mha - gqa == 6 * 1024 * per_key
    # softmax attention: every query head forms its own scores, grouped or not
    full = attn.build_attention("full")
    assert full.mode_flops("decode", 1, 8, 1024, 64, kv_heads=2) == full.mode_flops("decode", 1, 8, 1024, 64)
