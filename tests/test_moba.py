"""MoBA against its definition built here in float64: the gate, the routing, the attention, gradients, decoding."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from tests.definitions import decode_in_chunks, float64_attention


def definition_mask(q: torch.Tensor, k: torch.Tensor, bs: int, topk: int) -> torch.Tensor:
    """(B, H, Lq, Lk): a query sees its own block up to itself and the topk - 1 complete earlier blocks whose mean key
    scores highest against it (MoBA, arXiv:2502.13189, eq. 5-6), written from the paper with loops."""
    B, H, Lq, _ = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g = H // Hkv
    mask = torch.zeros(B, H, Lq, Lk, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for r in range(Lq):
                t = Lk - Lq + r
                own = t // bs
                mask[b, h, r, own * bs: t + 1] = True
                gates = [(float(q[b, h, r].double() @ k[b, h // g, c * bs:(c + 1) * bs].double().mean(0)), c)
                         for c in range(own)]
                for _, c in sorted(gates, reverse=True)[: topk - 1]:
                    mask[b, h, r, c * bs:(c + 1) * bs] = True
    return mask


shapes = st.tuples(st.integers(1, 2), st.sampled_from([(2, 2), (4, 2), (3, 1)]), st.integers(1, 45),
                   st.integers(0, 20), st.integers(1, 7), st.integers(1, 5), st.integers(0, 10**6))


def draw(B, heads, L, extra, dtype=torch.float64, seed=0, grad=False):
    H, Hkv = heads
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, 8, generator=g, dtype=dtype)
    k, v = (torch.randn(B, Hkv, L + extra, 8, generator=g, dtype=dtype) for _ in range(2))
    return [t.requires_grad_(grad) for t in (q, k, v)]


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_routing_and_output_are_the_definition(shape):
    B, heads, L, extra, bs, topk, seed = shape
    q, k, v = draw(B, heads, L, extra, seed=seed, grad=True)
    want_mask = definition_mask(q.detach(), k.detach(), bs, topk)
    want = float64_attention(q, k, v, want_mask)
    go = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), go)
    for backend in ("gathered", "masked"):
        m = attn.build_attention("moba", block_size=bs, topk=topk, backend=backend)
        assert torch.equal(m.kept_keys(q, k), want_mask)
        out = m(q, k, v)
        assert m.last_backend == backend
        torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), go), want_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_auto_masks_short_calls_and_gathers_long_ones():
    m = attn.build_attention("moba", block_size=8, topk=2)
    q, k, v = draw(1, (2, 2), 64, 0, dtype=torch.float32)
    m(q, k, v)
    assert m.last_backend == "masked"
    m.MASKED_MAX_PAIRS = 64 * 64 - 1
    m(q, k, v)
    assert m.last_backend == "gathered"


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
def test_low_precision_gathered_equals_the_reference(dtype, tol):
    q, k, v = draw(2, (4, 2), 70, 0, dtype=dtype, seed=3)
    ref = attn.build_attention("moba", block_size=8, topk=3, backend="reference")
    for backend in ("gathered", "masked"):
        fast = attn.build_attention("moba", block_size=8, topk=3, backend=backend)
        torch.testing.assert_close(fast(q, k, v).float(), ref(q, k, v).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("heads", [(2, 2), (4, 2)])
@pytest.mark.parametrize("chunks", [[1] * 12, [5, 1, 7, 6], [23, 2]])
def test_decoding_equals_one_forward(heads, chunks):
    q, k, v = draw(2, heads, 41, 0, seed=5)
    m = attn.build_attention("moba", block_size=4, topk=3)
    sizes = []
    got = decode_in_chunks(m, q, k, v, chunks, on_step=lambda s: sizes.append((s.length, s.blocks)))
    torch.testing.assert_close(got, m(q, k, v), atol=1e-12, rtol=1e-12)
    assert all(blocks == length // 4 for length, blocks in sizes)  # a block's mean is kept once it is complete


def test_decoding_state_holds_every_key_and_the_block_means():
    m = attn.build_attention("moba", block_size=8, topk=2)
    state = m.new_state()
    k = torch.randn(1, 2, 30, 16)
    m.run_step(torch.randn(1, 4, 30, 16), k, k.clone(), state)
    assert state.nbytes() == 2 * (1 * 2 * 30 * 16 * 4) + 1 * 2 * 3 * 16 * 4  # K, V, and 3 means (float32)
    state.truncate(23)
    assert (state.length, state.blocks) == (23, 2)


def test_topk_one_is_block_local_and_a_large_topk_is_full_causal():
    q, k, v = draw(1, (2, 2), 33, 0, seed=7)
    local = attn.build_attention("moba", block_size=5, topk=1)
    t = torch.arange(33)
    block_local = (t[:, None] // 5 == t[None, :] // 5) & (t[None, :] <= t[:, None])
    torch.testing.assert_close(local(q, k, v), float64_attention(q, k, v, block_local), atol=1e-12, rtol=0)
    every = attn.build_attention("moba", block_size=5, topk=7)
    torch.testing.assert_close(every(q, k, v), float64_attention(q, k, v, t[None, :] <= t[:, None]), atol=1e-12, rtol=0)


@pytest.mark.parametrize("q_len, k_len, bs, topk", [(37, 37, 4, 3), (1, 100, 16, 4), (9, 50, 7, 2), (64, 64, 64, 2)])
def test_counts_are_the_mask_and_a_hand_count(q_len, k_len, bs, topk):
    m = attn.build_attention("moba", block_size=bs, topk=topk)
    q, k = torch.randn(1, 1, q_len, 4), torch.randn(1, 1, k_len, 4)
    assert m.pairs(q_len, k_len, True) == int(m.kept_keys(q, k).sum())
    # the gate: each query scores every block before its own, 2 D FLOPs each
    scored = sum((t // bs) for t in range(k_len - q_len, k_len))
    B, H, D = 2, 3, 8
    if q_len == k_len:
        pooled = B * H * (k_len // bs) * bs * D
        assert m.selection_flops("forward", B, H, k_len, D) == 2 * B * H * D * scored + pooled
        assert m.selection_flops("train", B, H, k_len, D) == m.selection_flops("forward", B, H, k_len, D)
    else:
        assert m.selection_flops("decode", B, H, k_len - 1, D) == 2 * B * H * D * ((k_len - 1) // bs)


def test_a_cost_row_counts_the_gate_apart():
    from harness.cost import Cell, build

    cell = Cell(variant="moba", variant_params={"block_size": 16, "topk": 2}, backend_requested="auto", position="none",
                position_params={}, scope="op", mode="forward", device="cpu", dtype="float32", batch_size=1,
                num_heads=2, head_dim=8, seq_len=64)
    measured = build(cell)
    m = attn.build_attention("moba", block_size=16, topk=2)
    chosen = m.selection_flops("forward", 1, 2, 64, 8)
    assert measured.columns() == {"selection_flops": chosen}
    assert measured.flops == m.mode_flops("forward", 1, 2, 64, 8) + chosen


@pytest.mark.parametrize("params, fragment", [({"block_size": 0}, "block_size must be >= 1"),
                                              ({"topk": 0}, "topk must be >= 1")])
def test_bad_parameters_are_refused(params, fragment):
    with pytest.raises(ValueError, match=fragment):
        attn.build_attention("moba", **params)


def test_no_bidirectional_form():
    q, k, v = draw(1, (2, 2), 8, 0)
    with pytest.raises(ValueError, match="does not support bidirectional"):
        attn.build_attention("moba")(q, k, v, causal=False)


def test_gate_ranks_blocks_by_the_mean_key():
    """Guards the definition above: a block built to match the query wins the routing."""
    D, bs = 8, 4
    q = torch.zeros(1, 1, 1, D, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.randn(1, 1, 21, D, dtype=torch.float64) * 0.1
    k[0, 0, 8:12, 0] = 5.0  # block 2
    mask = attn.build_attention("moba", block_size=bs, topk=2).kept_keys(q, k)[0, 0, 0]
    assert mask.nonzero().squeeze(1).tolist() == [8, 9, 10, 11, 20]
    assert math.isclose(float(mask.sum()), bs + 1)


@pytest.mark.parametrize("name, params", [("moba", {"block_size": 4, "topk": 3}),
                                          ("quest", {"page_size": 4, "token_budget": 12})])
def test_query_chunks_change_nothing(name, params, monkeypatch):
    """Selection and gathering run over chunks of queries at long lengths: many tiny chunks give the same output."""
    from attn.attention import block_selection

    q, k, v = draw(2, (4, 2), 37, 6, seed=9)
    m = attn.build_attention(name, **params)
    whole, kept = m(q, k, v), m.kept_keys(q, k)
    monkeypatch.setattr(block_selection, "GATHER_ELEMENTS", 64)
    assert torch.equal(m(q, k, v), whole) and torch.equal(m.kept_keys(q, k), kept)
