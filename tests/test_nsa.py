"""NSA against its definition written here in float64 with loops: the three branches, the selection, the gates,
gradients, kept keys, decoding and the counts."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention import block_selection as bsel
from attn.attention import nsa
from tests.definitions import decode_in_chunks

BACKENDS = ("reference", "gathered", "masked")


def definition(q, k, v, gates, wk, wv, bl, s, bs, topk, window):
    """(output (B, H, Lq, D), kept keys (B, H, Lq, Lk)) of NSA (arXiv:2502.11089, eq. 5-10) as nsa.py states it: window
    i of bl tokens every s pooled by the weights; a query attends to the complete windows; a selection block scores the
    sum of the group's probabilities of the windows overlapping it; block 0, the own block (causal) and the topk - 2
    best earlier blocks (ties: the earlier) are selected; a window of the last ``window`` keys; gated sum."""
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    G, n = H // Hkv, (0 if Lk < bl else (Lk - bl) // s + 1)
    kc = [[torch.stack([sum(wk[h, p] * k[b, h, i * s + p] for p in range(bl)) for i in range(n)]) if n else None
           for h in range(Hkv)] for b in range(B)]
    vc = [[torch.stack([sum(wv[h, p] * v[b, h, i * s + p] for p in range(bl)) for i in range(n)]) if n else None
           for h in range(Hkv)] for b in range(B)]

    def softmax_rows(qv, keys, values):
        return torch.softmax(keys @ qv / math.sqrt(D), 0) @ values

    out = torch.zeros(B, H, Lq, D, dtype=torch.float64)
    kept = torch.zeros(B, H, Lq, Lk, dtype=torch.bool)
    rows = {}
    for b in range(B):
        for hk in range(Hkv):
            for r in range(Lq):
                t = Lk - Lq + r
                seen = [i for i in range(n) if i * s + bl <= t + 1]
                o_cmp, score = {}, {}
                for h in range(hk * G, (hk + 1) * G):
                    if seen:
                        p = torch.softmax(kc[b][hk][seen] @ q[b, h, r] / math.sqrt(D), 0)
                        o_cmp[h] = p @ vc[b][hk][seen]
                        for c in range(t // bs):
                            score[c] = score.get(c, 0.0) + sum(float(p[m].detach()) for m, i in enumerate(seen)
                                                              if i * s < (c + 1) * bs and i * s + bl > c * bs)
                    else:
                        o_cmp[h] = torch.zeros(D, dtype=torch.float64)
                own = t // bs
                others = sorted(range(1, own), key=lambda c: (-score.get(c, 0.0), c))[: max(0, topk - 2)]
                blocks = sorted({own, 0, *others}) if own else [0]
                sel = [j for c in blocks for j in range(c * bs, min((c + 1) * bs, t + 1))]
                win = list(range(max(0, t - window + 1), t + 1))
                g = gates[b, hk, t]
                for h in range(hk * G, (hk + 1) * G):
                    rows[b, h, r] = (g[0] * o_cmp[h] + g[1] * softmax_rows(q[b, h, r], k[b, hk, sel], v[b, hk, sel])
                                     + g[2] * softmax_rows(q[b, h, r], k[b, hk, win], v[b, hk, win]))
                    kept[b, h, r, sel] = True
                    kept[b, h, r, win] = True
    out = torch.stack([torch.stack([torch.stack([rows[b, h, r] for r in range(Lq)]) for h in range(H)])
                       for b in range(B)])
    return out, kept


def params_strategy():
    return st.integers(2, 6).flatmap(lambda bl: st.tuples(
        st.just(bl), st.sampled_from([s for s in range(1, bl + 1) if bl % s == 0])).flatmap(lambda ls: st.tuples(
            st.just(ls[0]), st.just(ls[1]), st.integers(1, max(1, 6 // ls[1])).map(lambda m: m * ls[1]),
            st.integers(1, 4), st.integers(1, 12))))


def draw(B, heads, L, extra, seed=0, dtype=torch.float64):
    H, Hkv = heads
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, 8, generator=g, dtype=dtype)
    k, v = (torch.randn(B, Hkv, L + extra, 8, generator=g, dtype=dtype) for _ in range(2))
    gates = torch.rand(B, Hkv, L + extra, 3, generator=g, dtype=dtype)
    return q, k, v, gates


def build(params, Hkv, backend="auto", seed=0):
    bl, s, bs, topk, w = params
    m = attn.build_attention("nsa", block_len=bl, stride=s, select_block=bs, topk=topk, window=w, kv_heads=Hkv,
                             backend=backend).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # weights other than the mean, so the definition sees them used
        m.cmp_k.copy_(torch.rand(Hkv, bl, generator=g, dtype=torch.float64))
        m.cmp_v.copy_(torch.rand(Hkv, bl, generator=g, dtype=torch.float64))
    return m


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(2, 2), (4, 2), (3, 1)]), st.integers(1, 40), st.integers(0, 20),
       params_strategy(), st.integers(0, 10**6))
def test_forward_gradients_and_kept_keys_are_the_definition(B, heads, L, extra, params, seed):
    q, k, v, gates = (x.requires_grad_() for x in draw(B, heads, L, extra, seed))
    models = [build(params, heads[1], backend, seed) for backend in BACKENDS]  # the same weights
    wk, wv = (w.detach().clone().requires_grad_() for w in (models[0].cmp_k, models[0].cmp_v))
    want, want_kept = definition(q, k, v, gates, wk, wv, *params)
    go = torch.randn_like(want)
    ref = torch.autograd.grad(want, (q, k, v, gates, wk, wv), go, allow_unused=True)
    for m, backend in zip(models, BACKENDS, strict=True):
        out = m(q, k, v, gates=gates)
        assert m.last_backend == backend
        torch.testing.assert_close(out, want, atol=1e-9, rtol=1e-9)
        assert torch.equal(m.kept_keys(q, k), want_kept)
        got = torch.autograd.grad(out, (q, k, v, gates, m.cmp_k, m.cmp_v), go, allow_unused=True)
        for a, b in zip(got, ref, strict=True):
            if b is None:  # no complete window: the compression weights reach nothing
                assert a is None or not a.any()
                continue
            torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_auto_masks_short_calls_and_gathers_long_ones(monkeypatch):
    q, k, v, gates = draw(1, (2, 2), 20, 0, dtype=torch.float32)
    m = attn.build_attention("nsa", block_len=4, stride=2, select_block=4, topk=2, window=8)
    m(q, k, v, gates=gates)
    assert m.last_backend == "masked"
    assert m.cmp_k.shape == (2, 4) and torch.equal(m.cmp_k, torch.full((2, 4), 0.25))  # mean pooling, made now
    monkeypatch.setattr(type(m), "MASKED_MAX_PAIRS", 20 * 20 - 1)
    m(q, k, v, gates=gates)
    assert m.last_backend == "gathered"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads", [(2, 2), (4, 2)])
@pytest.mark.parametrize("chunks", [[1] * 12, [5, 1, 7, 6], [23, 2]])
def test_decoding_equals_one_forward(backend, heads, chunks):
    params = (4, 2, 4, 3, 5)
    q, k, v, gates = draw(2, heads, 41, 0, seed=5)
    m = build(params, heads[1], backend)
    sizes = []
    got = decode_in_chunks(m, q, k, v, chunks, on_step=lambda st: sizes.append((st.length, st.windows)),
                           inputs={"gates": gates})
    torch.testing.assert_close(got, m(q, k, v, gates=gates), atol=1e-12, rtol=1e-12)
    assert all(n == (0 if t < 4 else (t - 4) // 2 + 1) for t, n in sizes)  # windows compressed as they complete


def test_decoding_state_rewinds_and_counts_its_bytes():
    m = attn.build_attention("nsa", block_len=4, stride=2, select_block=4, topk=2, window=8)
    state = m.new_state()
    k = torch.randn(1, 2, 11, 8)
    m.run_step(torch.randn(1, 4, 11, 8), k, k.clone(), state, gates=torch.rand(1, 2, 11, 3))
    assert state.windows == 4 and state.nbytes() == 2 * (2 * 11 * 8 * 4) + 2 * (2 * 4 * 8 * 4)
    state.truncate(7)
    assert (state.length, state.windows) == (7, 2)


def test_counts_are_a_hand_count():
    """L = 10, block_len 4, stride 2, select_block 4, topk 3, window 3; B 1, H 2, H_kv 1, D 8, counted by hand."""
    m = attn.build_attention("nsa", block_len=4, stride=2, select_block=4, topk=3, window=3)
    # compressed keys seen 16 (t = 3..9: 1 1 2 2 3 3 4), selected tokens 55, window tokens 27; gating 5 per output
    assert m.pairs(10, 10, True) == 16 + 55 + 27
    assert m.flops(1, 2, 10, 10, 8) == 4 * 2 * 8 * 98 + 5 * 2 * 10 * 8
    assert m.mode_flops("forward", 1, 2, 10, 8) == m.flops(1, 2, 10, 10, 8)
    # 4 windows x (key + value) x 2 l D; (visible window, candidate block) pairs 16 per head x 2 heads, + 8 group adds
    assert m.selection_flops("forward", 1, 2, 10, 8, kv_heads=1) == 4 * 128 + 32 + 8
    assert m.selection_flops("train", 1, 2, 10, 8, kv_heads=1) == 3 * 4 * 128 + 40
    # the token at position 9 completes window 3 and scores blocks 0 (2 windows) and 1 (3 windows)
    assert m.selection_flops("decode", 1, 2, 9, 8, kv_heads=1) == 128 + 2 * 5 + 2
    q, k = torch.randn(1, 2, 10, 8), torch.randn(1, 1, 10, 8)
    sel_only = attn.build_attention("nsa", block_len=4, stride=2, select_block=4, topk=3, window=1)
    assert int(sel_only.kept_keys(q, k).sum()) == 2 * 55  # a window of one adds nothing to the selected tokens


@pytest.mark.parametrize("params, fragment", [
    ({"block_len": 0}, "block_len must be >= 1"), ({"stride": 0}, "stride must be >= 1"),
    ({"topk": 0}, "topk must be >= 1"), ({"window": 0}, "window must be >= 1"),
    ({"select_block": 0}, "select_block must be >= 1"),
    ({"block_len": 4, "stride": 5}, r"stride \(5\) must be <= block_len \(4\)"),
    ({"stride": 4, "select_block": 6}, r"select_block \(6\) must be a multiple of stride \(4\)")])
def test_bad_parameters_are_refused(params, fragment):
    with pytest.raises(ValueError, match=fragment):
        attn.build_attention("nsa", **params)


def test_no_bidirectional_form():
    q, k, v, gates = draw(1, (2, 2), 8, 0)
    with pytest.raises(ValueError, match="does not support bidirectional"):
        attn.build_attention("nsa")(q, k, v, causal=False, gates=gates)


def test_a_fresh_module_loads_weights_made_at_the_first_call():
    a = attn.build_attention("nsa", block_len=4, stride=2, select_block=4, topk=2, window=8)
    q, k, v, gates = draw(1, (2, 2), 12, 0, dtype=torch.float32)
    a(q, k, v, gates=gates)
    with torch.no_grad():
        a.cmp_k.mul_(2)
    b = attn.build_attention("nsa", block_len=4, stride=2, select_block=4, topk=2, window=8)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b(q, k, v, gates=gates), a(q, k, v, gates=gates))


@settings(max_examples=40, deadline=None)
@given(params_strategy(), st.integers(1, 90), st.integers(0, 10**6))
def test_block_scores_and_the_scoring_count_are_loops(params, L, seed):
    """The banded block scores against a sum over every (window, block) overlap; the closed-form scoring count against
    one add per (seen window, overlapped candidate block) and G - 1 per (query, candidate) of a 2-head group."""
    bl, s, bs, topk, w = params
    m = attn.build_attention("nsa", block_len=bl, stride=s, select_block=bs, topk=topk, window=w)
    n, blocks = (0 if L < bl else (L - bl) // s + 1), L // bs
    lap = [[i * s < (c + 1) * bs and i * s + bl > c * bs for c in range(blocks)] for i in range(n)]
    probs = torch.rand(3, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    want = torch.tensor([[sum(float(probs[r, i]) for i in range(n) if lap[i][c]) for c in range(blocks)]
                         for r in range(3)], dtype=torch.float64).view(3, blocks)
    torch.testing.assert_close(nsa.block_scores(probs, blocks, m.config), want, atol=1e-12, rtol=1e-12)
    q_len = 1 + seed % L
    adds = sum(lap[i][c] for t in range(L - q_len, L) for c in range(t // bs) for i in range(n) if i * s + bl <= t + 1)
    group = sum(t // bs for t in range(L - q_len, L))
    assert m.scoring_adds(q_len, L, 2, 1) == 2 * adds + group


def test_stable_topk_keeps_what_a_stable_sort_keeps():
    g = torch.Generator().manual_seed(0)
    s = torch.randint(0, 4, (200, 13), generator=g).double()  # many ties, at the cut and elsewhere
    s[::7] = -math.inf  # and rows of fewer finite entries than k
    s[::7, :2] = 1.0
    for k in (0, 1, 5, 12, 13):
        vals, idx = bsel.stable_topk(s, k)
        want = s.sort(dim=-1, descending=True, stable=True)[1][:, :k]
        assert torch.equal(idx.sort(-1)[0], want.sort(-1)[0])
        assert torch.equal(vals, s.gather(-1, idx))


def test_chunked_scan_equals_one_chunk(monkeypatch):
    """A long prefill scans its queries in chunks (GATHER_ELEMENTS): one query at a time gives the same choice and output."""
    q, k, v, gates = draw(1, (4, 2), 70, 3, seed=3)
    m = build((4, 2, 8, 3, 6), 2, "gathered")
    want, kept = m(q, k, v, gates=gates), m.kept_keys(q, k)
    monkeypatch.setattr(bsel, "GATHER_ELEMENTS", 1)
    torch.testing.assert_close(m(q, k, v, gates=gates), want, atol=1e-12, rtol=1e-12)
    assert torch.equal(m.kept_keys(q, k), kept)
