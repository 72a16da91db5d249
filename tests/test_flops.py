"""FLOP counts are what is timed: every built-in variant's ``mode_flops`` against torch's FlopCounterMode.

FlopCounterMode counts matmul-like ops only (mm/bmm/baddbmm/sdpa), 2 FLOPs per MAC. So:
- softmax variants: the ``reference`` backend computes every (query, key) pair densely and masks
  afterwards, so the counter sees 4 B H D Lq Lk per call; our count is the same over the visible
  pairs only: ``ours * Lq * Lk == counter * visible``, exactly. The visible pairs are read off the
  mask the reference really used (a spy on ``dense_attention``), which also checks ``pairs()``.
- linear: the reference is the quadratic form, but the count (and every fast backend) is the linear
  form, so the counter runs on the linear form itself (``recurrent``; its decode ``step``). The
  counter sees its matmuls; our count adds the elementwise work it cannot see (feature maps, the
  rank-1 state update of the recurrence, the normalising division), which is spelt out below.
- train: forward + ``torch.autograd.grad``; the counter sees 2 matmuls per forward matmul in the
  backward pass, so train == 3 x forward exactly, except favor's fixed random projection (a buffer:
  no weight gradient, one backward matmul); the count keeps the documented 3x convention there.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attn
from attn.attention import block_sparse, full, sliding_window
from attn.attention.base import ALL_MODES, Backend
from attn.attention.full import dense_attention
from attn.attention.masks import causal_mask
from harness.cost import Cell, build, linear_weights, model_config, model_flops, op_flops

MODES = ("forward", "train", "decode")
H, D = 2, 16
LENGTHS = (37, 64, 100)
# Softmax variants with parameters that make their masks non-trivial at LENGTHS (windows shorter and
# longer than L; block sizes that do not divide L; global, random and strided blocks).
SOFTMAX = {
    "full": [{}],
    "sliding_window": [{"window": 8}, {"window": 50}, {"window": 128}],
    "block_sparse": [
        {"block_size": 16},
        {"block_size": 16, "local_blocks": 1, "global_blocks": 2, "random_blocks": 1, "seed": 3},
        {"block_size": 8, "local_blocks": 3, "global_blocks": 0, "stride": 3},
    ],
}
FEATURE_MAPS = ("elu1", "relu", "favor")
NUM_FEATURES = 24  # favor: d_phi != D, so a mix-up of the two shows


def counted(fn: Callable[[], Any]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def inputs(B: int, q_len: int, k_len: int, grad: bool = False) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(q_len * 1000 + k_len)
    q = torch.randn(B, H, q_len, D, generator=g, requires_grad=grad)
    k, v = (torch.randn(B, H, k_len, D, generator=g, requires_grad=grad) for _ in range(2))
    # FlopCounterMode's module tracker cannot take leaf tensors in autograd.grad: differentiate copies.
    return tuple(x.clone() for x in (q, k, v)) if grad else (q, k, v)


def forward_and_grad(m: torch.nn.Module, q, k, v, causal: bool) -> None:
    out = m(q, k, v, causal=causal)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


@pytest.fixture
def masks(monkeypatch) -> list[tuple[int, int, int]]:
    """(Lq, Lk, visible pairs) of every dense_attention call the softmax references make."""
    calls: list[tuple[int, int, int]] = []
    for module in (full, sliding_window, block_sparse):
        def spy(q, k, v, mask, scale=None, softcap=0.0, _orig=module.dense_attention):
            lq, lk = q.shape[2], k.shape[2]
            calls.append((lq, lk, lq * lk if mask is None else int(mask.sum())))
            return _orig(q, k, v, mask, scale, softcap)
        monkeypatch.setattr(module, "dense_attention", spy)
    return calls


def test_every_builtin_variant_is_covered():
    builtin = {s["name"] for s in attn.list_attention() if s["source"] == "builtin"}
    # the gated linear family's counts are checked against explicit counts in test_retention/gla/gated_deltanet/
    # mamba2.py, the selecting variants' against their kept keys and a hand count in test_moba/quest/dsa/nsa.py, mla's
    # in test_mla.py, the dynamic prefills' (a count of the pairs each prefill chose) in test_prompt_sparse.py
    assert builtin == set(SOFTMAX) | {"linear", "retention", "gla", "gated_deltanet", "mamba2", "moba", "quest", "dsa",
                                        "nsa", "mla", "vertical_slash", "flexprefill", "xattention"}, \
        "a new built-in variant needs its FLOPs checked here"


# -- softmax variants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant, params", [(v, p) for v, ps in SOFTMAX.items() for p in ps],
                         ids=lambda x: x if isinstance(x, str) else ",".join(f"{k}={v}" for k, v in x.items()) or "-")
def test_softmax_count_is_the_reference_counter_over_visible_pairs(variant, params, mode, L, causal, masks):
    B = 1 if L == 64 else 2
    m = attn.build_attention(variant, backend="reference", **params)
    if mode == "decode":  # one new query against the L + 1 keys in the cache; a step is always causal
        assert m.mode_flops(mode, B, H, L, D, causal) == m.mode_flops(mode, B, H, L, D, True)
        q, k, v = inputs(B, 1, L + 1)
        total = counted(lambda: m(q, k, v, causal=True))
    elif mode == "train":
        q, k, v = inputs(B, L, L, grad=True)
        total = counted(lambda: forward_and_grad(m, q, k, v, causal))
    else:
        q, k, v = inputs(B, L, L)
        total = counted(lambda: m(q, k, v, causal=causal))
    (q_len, k_len, visible), = masks
    assert (q_len, k_len) == ((1, L + 1) if mode == "decode" else (L, L))
    assert m.pairs(q_len, k_len, causal or mode == "decode") == visible  # pairs() is the mask that ran
    factor = 3 if mode == "train" else 1  # the counter: QK^T and PV, and their 2 + 2 backward matmuls
    assert total == factor * 4 * B * H * D * q_len * k_len
    ours = m.mode_flops(mode, B, H, L, D, causal)
    assert ours * q_len * k_len == total * visible


# -- linear attention ---------------------------------------------------------------------------------
# What the linear forms compute, per (batch, head), d = d_phi:
# - features: favor x @ W^T (2 D d, a matmul the counter sees) then exp (d, elementwise);
#   elu1/relu D elementwise ops. For every query and every key.
# - a key joins the state [S | z]: the recurrence does a rank-1 update by broadcasting (elementwise:
#   the counter sees nothing); the bidirectional form does phi(K)^T [V | 1] as one matmul, where the
#   counter sees 2 d (D + 1) per key and the count 2 d D + d (adding phi(k) into z multiplies nothing).
# - a query reads phi(q) [S | z]: a matmul, 2 d (D + 1) seen by both; then D divisions (elementwise).


def linear_terms(m, absorb_by_matmul: bool) -> tuple[int, int, int, int]:
    """(counter per query, counter per key, uncounted per query, uncounted per key), forward."""
    d = m.feature_dim(D)
    proj, feature_elementwise = (2 * D * d, d) if m.config.feature_map == "favor" else (0, D)
    read = 2 * d * (D + 1)
    seen_q, seen_k = proj + read, proj + (read if absorb_by_matmul else 0)
    unseen_q = feature_elementwise + D
    unseen_k = feature_elementwise + (-d if absorb_by_matmul else 2 * d * D + d)
    return seen_q, seen_k, unseen_q, unseen_k


def linear_expected(m, mode: str, B: int, q_len: int, k_len: int, absorb_by_matmul: bool) -> tuple[int, int]:
    """(FlopCounterMode's total, our count) for one call of the linear form in ``mode``."""
    seen_q, seen_k, unseen_q, unseen_k = linear_terms(m, absorb_by_matmul)
    seen = B * H * (q_len * seen_q + k_len * seen_k)
    ours = seen + B * H * (q_len * unseen_q + k_len * unseen_k)
    if mode != "train":
        return seen, ours
    proj = 2 * D * m.feature_dim(D) if m.config.feature_map == "favor" else 0
    # favor's projection W is a buffer: its backward is dX only, one matmul where the convention has two.
    return 3 * seen - B * H * (q_len + k_len) * proj, 3 * ours


def prefilled_state(m, B: int, L: int):
    state = m.new_state(L + 1)
    with torch.no_grad():
        m.step(*inputs(B, L, L), state)
    return state


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("L", LENGTHS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_count_is_the_linear_form_counter_plus_its_elementwise_work(feature_map, mode, L, causal):
    B = 1 if L == 64 else 2
    m = attn.build_attention("linear", feature_map=feature_map, num_features=NUM_FEATURES, backend="recurrent")
    if mode == "decode":  # one token on a state holding L: what build_op times
        if not causal:
            assert m.mode_flops(mode, B, H, L, D, False) == m.mode_flops(mode, B, H, L, D, True)
        state = prefilled_state(m, B, L)
        q, k, v = inputs(B, 1, 1)
        with torch.no_grad():
            total = counted(lambda: m.step(q, k, v, state))
        assert m.last_backend == "recurrent" and state.length == L + 1
        counter, ours = linear_expected(m, mode, B, 1, 1, absorb_by_matmul=False)
        # The old charge, every one of the L + 1 keys absorbed again, fails this test.
        assert m.flops(B, H, 1, L + 1, D) != ours
    else:
        q, k, v = inputs(B, L, L, grad=mode == "train")
        run = (lambda: forward_and_grad(m, q, k, v, causal)) if mode == "train" else (lambda: m(q, k, v, causal=causal))
        total = counted(run)
        counter, ours = linear_expected(m, mode, B, L, L, absorb_by_matmul=not causal)
    assert total == counter  # the counter sees what we say the linear form does
    assert m.mode_flops(mode, B, H, L, D, causal) == ours


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_decode_is_constant_in_length(feature_map):
    m = attn.build_attention("linear", feature_map=feature_map, num_features=NUM_FEATURES)
    B = 2
    short, long = (m.mode_flops("decode", B, H, L, D) for L in (64, 4096))
    assert short == long == m.flops(B, H, 1, 1, D)
    assert short < m.mode_flops("forward", B, H, 2, D)  # one token, cheaper than a two-token forward
    state_short, state_long = prefilled_state(m, B, 64), prefilled_state(m, B, 4096)
    q, k, v = inputs(B, 1, 1)
    with torch.no_grad():
        assert counted(lambda: m.step(q, k, v, state_short)) == counted(lambda: m.step(q, k, v, state_long))
    for L in (64, 4096):
        c = cell("linear", "decode", "op", L, params={"feature_map": feature_map, "num_features": NUM_FEATURES})
        assert op_flops(m, c) == short


# -- what the harness times ---------------------------------------------------------------------------


def cell(variant: str, mode: str, scope: str, L: int, params: dict | None = None, backend: str = "reference",
         B: int = 2, causal: bool = True) -> Cell:
    return Cell(variant=variant, variant_params=params or {}, backend_requested=backend, position="none",
                position_params={}, scope=scope, mode=mode, device="cpu", dtype="float32", batch_size=B,
                num_heads=H, head_dim=D, seq_len=L, causal=causal, layers=2 if scope == "model" else None)


HARNESS = [("full", {}), ("sliding_window", {"window": 8}), ("block_sparse", {"block_size": 16, "random_blocks": 1}),
           *(("linear", {"feature_map": f, "num_features": NUM_FEATURES}) for f in FEATURE_MAPS)]


@pytest.mark.parametrize("scope", ["op", "model"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant, params", HARNESS, ids=[f"{v}-{p.get('feature_map', '')}" for v, p in HARNESS])
def test_harness_cell_flops_match_the_counter_on_its_timed_call(variant, params, mode, scope, masks):
    """Run the very callable a cell times under the counter; its ``flops`` must account for it."""
    L, B = 37, 2
    torch.manual_seed(0)
    c = cell(variant, mode, scope, L, params, backend="recurrent" if variant == "linear" else "reference", B=B)
    measured = build(c)
    if scope == "op" and mode == "train":
        # This step differentiates leaf inputs, which FlopCounterMode's module tracker cannot follow;
        # the tests above count the same step on copies. Here: the train factor is applied once.
        forward = build(cell(variant, "forward", scope, L, params, backend=c.backend_requested, B=B))
        assert measured.flops == 3 * forward.flops
        return
    masks.clear()  # the decode prefill ran outside the timed call
    total = counted(measured.fn)
    weights = 0
    if scope == "model":
        cfg = model_config(c)
        d, ff, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
        model_weights = cfg.n_layers * (4 * d * d + 2 * d * ff) + V * d  # qkv, out proj, FFN; tied LM head
        tokens = B * (1 if mode == "decode" else L)
        weights = (3 if mode == "train" else 1) * 2 * tokens * model_weights
    layers = 2 if scope == "model" else 1
    factor = 3 if mode == "train" else 1
    if variant == "linear":
        m = attn.build_attention("linear", **params)
        q_len, k_len = (1, 1) if mode == "decode" else (L, L)
        counter, ours = linear_expected(m, mode, B, q_len, k_len, absorb_by_matmul=False)
        assert total == weights + layers * counter
        assert measured.flops == weights + layers * ours
    else:
        assert len(masks) == layers
        assert total == weights + factor * 4 * B * H * D * sum(q * k for q, k, _ in masks)
        assert measured.flops == weights + factor * 4 * B * H * D * sum(p for _, _, p in masks)


def test_model_decode_charges_one_token_and_the_variants_decode_step():
    for variant, params in HARNESS:
        c = cell(variant, "decode", "model", 64, params, backend="auto")
        model = attn.Transformer(model_config(c))
        step = model.blocks[0].attn.attn.mode_flops("decode", c.batch_size, H, 64, D)
        assert model_flops(model, c) == 2 * c.batch_size * linear_weights(model) + 2 * step
        longer = cell(variant, "decode", "model", 4096, params, backend="auto")
        grows = model_flops(model, longer) > model_flops(model, c)
        assert grows == (variant == "full"), variant  # window, a fixed number of blocks, a recurrent state: constant


# -- plugins ------------------------------------------------------------------------------------------


class PlainAttention(attn.Attention):
    """A minimal plugin: softmax attention that overrides no cost method."""

    name = "plain_test"
    backends = (Backend("reference", {"cpu": ALL_MODES}),)

    def backend_reference(self, q, k, v, causal):
        return dense_attention(q, k, v, causal_mask(q.shape[2], k.shape[2], q.device) if causal else None)


@pytest.mark.parametrize("mode", MODES)
def test_plugin_without_overrides_gets_the_base_count(mode):
    m, B, L = PlainAttention(None), 2, 37
    pairs = {"forward": L * (L + 1) // 2, "train": L * (L + 1) // 2, "decode": L + 1}[mode]
    expected = (3 if mode == "train" else 1) * 4 * B * H * D * pairs
    assert m.mode_flops(mode, B, H, L, D, True) == expected
    assert op_flops(m, cell("plain_test", mode, "op", L)) == expected
    if mode == "train":
        q, k, v = inputs(B, L, L, grad=True)
        total = counted(lambda: forward_and_grad(m, q, k, v, True))
    else:
        q, k, v = inputs(B, 1 if mode == "decode" else L, L + 1 if mode == "decode" else L)
        total = counted(lambda: m(q, k, v, causal=True))
    q_len, k_len = q.shape[2], k.shape[2]
    assert expected * q_len * k_len == total * m.pairs(q_len, k_len, True)


