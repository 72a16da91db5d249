"""DSA against its definition built here in float64: the indexer's choice, the attention, gradients, decoding, the
counts, and the indexer's KL loss."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention.dsa import indexer_kl
from tests.definitions import decode_in_chunks, fla_naive, float64_attention


def definition_mask(iq, ik, iw, q_len: int, topk: int) -> torch.Tensor:
    """(B, H_kv, Lq, Lk): the query at t keeps the topk keys s <= t of highest I[t, s] = sum_j w[t, j] relu(q_I[t, j] .
    k_I[s]) (DeepSeek-V3.2, arXiv:2512.02556, eq. 1), ties to the lower s; written with loops."""
    B, Hkv, Lk, hi = iw.shape
    mask = torch.zeros(B, Hkv, q_len, Lk, dtype=torch.bool)
    for b in range(B):
        for j in range(Hkv):
            for r in range(q_len):
                t = Lk - q_len + r
                dots = (iq[b, j, t].double().view(hi, -1) @ ik[b, j, : t + 1].double().T).tolist()  # (H_I, t + 1)
                w = iw[b, j, t].double().tolist()
                scores = [(-sum(w[h] * max(0.0, dots[h][s]) for h in range(hi)), s) for s in range(t + 1)]
                for _, s in sorted(scores)[:topk]:
                    mask[b, j, r, s] = True
    return mask


def draw(B, heads, L, extra, hi, di, dtype=torch.float64, seed=0, grad=False, D=8):
    H, Hkv = heads
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=dtype)
    k, v = (torch.randn(B, Hkv, L + extra, D, generator=g, dtype=dtype) for _ in range(2))
    inputs = {n: torch.randn(B, Hkv, L + extra, w, generator=g, dtype=dtype)
              for n, w in (("index_q", hi * di), ("index_k", di), ("index_w", hi))}
    return [t.requires_grad_(grad) for t in (q, k, v)], {n: t.requires_grad_(grad) for n, t in inputs.items()}


shapes = st.tuples(st.integers(1, 2), st.sampled_from([(2, 2), (4, 2), (3, 1)]), st.integers(1, 40),
                   st.integers(0, 20), st.integers(1, 12), st.integers(1, 3), st.integers(1, 4), st.integers(0, 10**6))


@settings(max_examples=20, deadline=None)
@given(shapes)
def test_choice_output_and_gradients_are_the_definition(shape):
    """index_heads = 1 ties half the keys at I = 0 (the relu): the tie rule is exercised too."""
    B, heads, L, extra, topk, hi, di, seed = shape
    (q, k, v), inputs = draw(B, heads, L, extra, hi, di, seed=seed, grad=True)
    g = heads[0] // heads[1]
    want_mask = definition_mask(*(inputs[n].detach() for n in ("index_q", "index_k", "index_w")), L, topk)
    want_mask = want_mask.repeat_interleave(g, 1)  # a key head's query heads share its choice
    want = float64_attention(q, k, v, want_mask)
    go = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), go)
    for backend in ("reference", "gathered", "masked"):
        m = attn.build_attention("dsa", topk=topk, index_heads=hi, index_dim=di, backend=backend)
        assert torch.equal(m.kept_keys(q, k, **inputs), want_mask)
        out = m(q, k, v, **inputs)
        assert m.last_backend == backend
        torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
        grads = torch.autograd.grad(out, (q, k, v, *inputs.values()), go)
        for a, b in zip(grads, want_grads, strict=False):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
        assert all(not t.any() for t in grads[3:])  # a fixed index set: no gradient into the indexer


def test_float32_is_close_and_auto_masks_short_calls_and_gathers_long_ones(monkeypatch):
    (q, k, v), inputs = draw(2, (4, 2), 50, 7, 2, 4, dtype=torch.float32, seed=3)
    m = attn.build_attention("dsa", topk=9, index_heads=2, index_dim=4)
    masked = m(q, k, v, **inputs)
    assert m.last_backend == "masked"
    monkeypatch.setattr(type(m), "MASKED_MAX_PAIRS", 50 * 57 - 1)
    out = m(q, k, v, **inputs)
    assert m.last_backend == "gathered"
    torch.testing.assert_close(masked, out, atol=2e-6, rtol=2e-6)
    want = float64_attention(q, k, v, m.kept_keys(q, k, **inputs))
    torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=2e-6)
    ref = attn.build_attention("dsa", topk=9, index_heads=2, index_dim=4, backend="reference")
    torch.testing.assert_close(out, ref(q, k, v, **inputs), atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("backend", ["gathered", "reference", "masked"])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2)])
@pytest.mark.parametrize("chunks", [[1] * 12, [5, 1, 7, 6], [23, 2]])
def test_decoding_equals_one_forward(backend, heads, chunks):
    (q, k, v), inputs = draw(2, heads, 41, 0, 2, 3, seed=5)
    m = attn.build_attention("dsa", topk=6, index_heads=2, index_dim=3, backend=backend)
    got = decode_in_chunks(m, q, k, v, chunks, inputs=inputs)
    torch.testing.assert_close(got, m(q, k, v, **inputs), atol=1e-12, rtol=1e-12)


def test_decoding_state_holds_keys_values_and_index_keys():
    m = attn.build_attention("dsa", topk=4, index_heads=2, index_dim=3)
    (q, k, v), inputs = draw(1, (4, 2), 30, 0, 2, 3, dtype=torch.float32)
    state = m.start_state()
    m.run_step(q, k, v, state, **inputs)
    assert state.nbytes() == 2 * (1 * 2 * 30 * 8 * 4) + 1 * 2 * 30 * 3 * 4  # K, V and the index keys (float32)
    state.truncate(23)
    assert state.length == 23 and state.index.length == 23


@pytest.mark.parametrize("q_len, k_len, topk", [(10, 10, 4), (1, 30, 8), (9, 20, 50)])
def test_counts_are_the_mask_and_a_hand_count(q_len, k_len, topk):
    B, H, Hkv, D, hi, di = 2, 4, 2, 8, 2, 3
    m = attn.build_attention("dsa", topk=topk, index_heads=hi, index_dim=di)
    (q, k, _), inputs = draw(1, (1, 1), q_len, k_len - q_len, hi, di)
    chosen = sum(min(topk, t + 1) for t in range(k_len - q_len, k_len))
    assert m.pairs(q_len, k_len, True) == int(m.kept_keys(q, k, **inputs).sum()) == chosen
    assert m.flops(B, H, q_len, k_len, D) == 4 * B * H * D * chosen
    L = k_len
    per_pair = 2 * hi * di + 2 * hi  # H_I dots of d_I, then the H_I-term weighted sum, 2 FLOPs per MAC
    assert m.mode_flops("decode", B, H, L, D) == 4 * B * H * D * min(topk, L + 1)
    assert m.selection_flops("decode", B, H, L, D, Hkv) == B * Hkv * per_pair * (L + 1)
    assert m.selection_flops("forward", B, H, L, D, Hkv) == B * Hkv * per_pair * L * (L + 1) // 2
    assert m.selection_flops("train", B, H, L, D, Hkv) == m.selection_flops("forward", B, H, L, D, Hkv)
    kl = attn.build_attention("dsa", topk=topk, index_heads=hi, index_dim=di, kl_weight=1.0)
    # with the KL loss: the indexer forward + its backward (2x), and the main scores the loss reads
    assert kl.selection_flops("train", B, H, L, D, Hkv) == (3 * B * Hkv * per_pair + 2 * B * H * D) * L * (L + 1) // 2


def test_a_cost_row_counts_the_indexer_apart():
    from harness.cost import Cell, build

    params = {"topk": 8, "index_heads": 2, "index_dim": 4}  # widths other than the defaults': the instance's are drawn
    cell = Cell(variant="dsa", variant_params=params, backend_requested="auto", position="none", position_params={},
                scope="op", mode="forward", device="cpu", dtype="float32", batch_size=1, num_heads=2, head_dim=8,
                seq_len=64)
    measured = build(cell)
    m = attn.build_attention("dsa", **params)
    chosen = m.selection_flops("forward", 1, 2, 64, 8)
    assert measured.columns() == {"selection_flops": chosen}
    assert measured.flops == m.mode_flops("forward", 1, 2, 64, 8) + chosen


@pytest.mark.parametrize("params, fragment", [({"topk": 0}, "topk must be >= 1"),
                                              ({"index_heads": 0}, "index_heads must be >= 1"),
                                              ({"index_dim": 0}, "index_dim must be >= 1"),
                                              ({"kl_weight": -1.0}, "kl_weight must be >= 0")])
def test_bad_parameters_are_refused(params, fragment):
    with pytest.raises(ValueError, match=fragment):
        attn.build_attention("dsa", **params)


def test_no_bidirectional_form_and_the_index_inputs_are_required():
    (q, k, v), inputs = draw(1, (2, 2), 8, 0, 4, 16)
    m = attn.build_attention("dsa")
    with pytest.raises(ValueError, match="does not support bidirectional"):
        m(q, k, v, causal=False, **inputs)
    with pytest.raises(ValueError, match="index_q, index_k, index_w"):
        m(q, k, v)


def test_the_indexer_ranks_by_the_weighted_relu_dots():
    """Guards the definition above: the keys built to match the index query win; a negative head weight loses."""
    hi, di, L = 2, 4, 12
    iq, ik, iw = torch.zeros(1, 1, L, hi * di), torch.randn(1, 1, L, di) * 0.01, torch.ones(1, 1, L, hi)
    iq[0, 0, -1, 0] = 1.0  # head 0 looks along channel 0
    iq[0, 0, -1, di + 1] = 1.0  # head 1 along channel 1
    ik[0, 0, 3, 0], ik[0, 0, 7, 1], ik[0, 0, 5, 1] = 5.0, 3.0, 4.0
    iw[0, 0, -1, 1] = -1.0  # head 1 counts against: key 5 and 7 sink to the bottom
    q = torch.randn(1, 1, 1, 8)
    mask = attn.build_attention("dsa", topk=1, index_heads=hi, index_dim=di).kept_keys(
        q, torch.randn(1, 1, L, 8), index_q=iq, index_k=ik, index_w=iw)  # token inputs span the keys
    assert mask[0, 0, 0].nonzero().squeeze(1).tolist() == [3]


def test_query_chunks_change_nothing(monkeypatch):
    from attn.attention import block_selection

    (q, k, v), inputs = draw(2, (4, 2), 37, 6, 2, 3, seed=9)
    m = attn.build_attention("dsa", topk=5, index_heads=2, index_dim=3)
    whole, kept = m(q, k, v, **inputs), m.kept_keys(q, k, **inputs)
    monkeypatch.setattr(block_selection, "GATHER_ELEMENTS", 64)
    assert torch.equal(m.kept_keys(q, k, **inputs), kept)  # the same keys; gathered in another order per chunk
    torch.testing.assert_close(m(q, k, v, **inputs), whole, atol=1e-13, rtol=1e-13)


def test_kl_is_the_definition_and_reaches_only_the_indexer():
    (q, k, _), inputs = draw(1, (4, 2), 6, 3, 2, 3, grad=True, seed=2)
    kl = indexer_kl(q, k, True, **inputs)
    Lq, Lk = 6, 9
    total = 0.0
    for j in range(2):
        for r in range(Lq):
            t = Lk - Lq + r
            s = q[0, 2 * j: 2 * j + 2, r].detach() @ k[0, j, : t + 1].detach().T / 8 ** 0.5  # (G, t + 1)
            p = torch.softmax(s, -1).sum(0) / 2
            dots = inputs["index_q"][0, j, t].view(2, 3) @ inputs["index_k"][0, j, : t + 1].T
            logq = torch.log_softmax((inputs["index_w"][0, j, t][:, None] * dots.relu()).sum(0), -1)
            total = total + (p * (p.log() - logq)).sum()
    torch.testing.assert_close(kl, total / (2 * Lq), atol=1e-12, rtol=1e-12)
    grads = torch.autograd.grad(kl, (q, k, *inputs.values()), allow_unused=True)
    assert grads[0] is None and grads[1] is None and all(g is not None and g.abs().sum() > 0 for g in grads[2:])


def test_training_forward_leaves_the_kl_and_steps_lower_it():
    torch.manual_seed(0)
    B, H, L, D, d, hi, di = 2, 2, 24, 8, 16, 2, 4
    x = torch.randn(B, L, d)
    q, k = torch.randn(B, H, L, D), torch.randn(B, H, L, D)
    v = torch.randn(B, H, L, D)
    proj = torch.nn.Linear(d, H * (hi * di + di + hi))  # the index inputs' projection, per key head
    m = attn.build_attention("dsa", topk=4, index_heads=hi, index_dim=di, kl_weight=1.0)
    opt = torch.optim.Adam(proj.parameters(), lr=3e-2)

    def forward():
        iq, ik, iw = proj(x).view(B, L, H, -1).transpose(1, 2).split([hi * di, di, hi], -1)
        m(q, k, v, index_q=iq, index_k=ik, index_w=iw)
        loss, m.aux_loss = m.aux_loss, None
        return loss

    first = forward()
    for _ in range(30):
        opt.zero_grad()
        forward().backward()
        opt.step()
    assert float(forward().detach()) < 0.7 * float(first.detach())
    m.eval()
    m(q, k, v, **draw(B, (H, H), L, 0, hi, di, dtype=torch.float32)[1])
    assert m.aux_loss is None  # evaluation leaves no loss


def test_packed_documents_average_the_kl_over_every_query():
    (q, k, v), inputs = draw(1, (2, 2), 10, 0, 2, 3, seed=4)
    m = attn.build_attention("dsa", topk=3, index_heads=2, index_dim=3, kl_weight=2.0)
    m(q, k, v, documents=torch.tensor([0] * 4 + [1] * 6), **inputs)
    parts = [indexer_kl(q[:, :, a:e], k[:, :, a:e], True, **{n: t[:, :, a:e] for n, t in inputs.items()}) * (e - a)
             for a, e in ((0, 4), (4, 10))]
    torch.testing.assert_close(m.aux_loss, 2.0 * sum(parts) / 10)


def test_backbone_trains_the_indexer_with_the_kl():
    from harness.accuracy.train import aux_losses

    torch.manual_seed(0)
    cfg = attn.TransformerConfig.preset("tiny", attention="dsa",
                                        attention_params={"topk": 4, "index_heads": 2, "index_dim": 8, "kl_weight": 1.0})
    model = attn.Transformer(cfg).train()
    idx = torch.randint(0, 256, (2, 12))
    model(idx).sum()
    extra = aux_losses(model)
    assert extra is not None and aux_losses(model) is None  # one per layer, summed once
    extra.backward()
    layer = model.blocks[-1].attn  # the last layer: its qkv feeds no later indexer
    assert layer.inputs["index_q"].weight.shape[0] == cfg.num_kv_heads * 2 * 8
    assert layer.inputs["index_q"].weight.grad.abs().sum() > 0 and layer.qkv.weight.grad is None


def test_fla_naive_dsa_is_ours_with_one_key_head():
    """fla's naive DSA (one index key per token, shared by every head) is ours with H_kv = 1 and Lq = Lk; its positive
    scale 1/sqrt(d_I) inside the relu does not change the ranking. Positive head weights and 8 indexer heads keep
    exact ties (every head's relu at 0) away from the top-k boundary; fla ranks in float32."""
    naive = fla_naive("ops/dsa/naive.py")
    B, H, L, D, hi, di, topk = 2, 4, 33, 16, 8, 8, 7
    (q, k, v), inputs = draw(B, (H, 1), L, 0, hi, di, seed=11, D=D)
    inputs["index_w"] = inputs["index_w"].abs()
    ours = attn.build_attention("dsa", topk=topk, index_heads=hi, index_dim=di)(q, k, v, **inputs)
    theirs = naive.naive_dsa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             inputs["index_q"][:, 0].view(B, L, hi, di), inputs["index_k"][:, 0], inputs["index_w"][:, 0],
                             topk=topk).transpose(1, 2)
    torch.testing.assert_close(ours, theirs.to(ours.dtype), atol=1e-5, rtol=1e-5)
