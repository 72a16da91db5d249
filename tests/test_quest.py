"""Quest against its definition built here in float64: the page bound, the pages chosen, the dense prefill, decoding."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention.quest import score_bound
from tests.definitions import decode_in_chunks, float64_attention


def literal_bound(q: torch.Tensor, keys: torch.Tensor) -> float:
    """Quest's criticality of a page for q (D,): sum_i max(q_i min_i, q_i max_i) over the page's keys (n, D)."""
    lo, hi = keys.amin(0), keys.amax(0)
    return float(torch.maximum(q * lo, q * hi).sum())


def definition_mask(q: torch.Tensor, k: torch.Tensor, ps: int, budget: int) -> torch.Tensor:
    """(B, H, Lq, Lk): a query reads its own page up to itself and the budget / ps - 1 complete earlier pages of
    highest bound (Quest, arXiv:2406.10774, Alg. 1), with loops."""
    B, H, Lq, _ = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    g = H // Hkv
    mask = torch.zeros(B, H, Lq, Lk, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for r in range(Lq):
                t = Lk - Lq + r
                own = t // ps
                mask[b, h, r, own * ps: t + 1] = True
                bounds = [(literal_bound(q[b, h, r].double(), k[b, h // g, p * ps:(p + 1) * ps].double()), p)
                          for p in range(own)]
                for _, p in sorted(bounds, reverse=True)[: budget // ps - 1]:
                    mask[b, h, r, p * ps:(p + 1) * ps] = True
    return mask


def draw(B, heads, Lq, Lk, dtype=torch.float64, seed=0, grad=False):
    H, Hkv = heads
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, 8, generator=g, dtype=dtype)
    k, v = (torch.randn(B, Hkv, Lk, 8, generator=g, dtype=dtype) for _ in range(2))
    return [t.requires_grad_(grad) for t in (q, k, v)]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(0, 10**6))
def test_the_bound_is_the_papers_and_bounds_every_score(n, seed):
    g = torch.Generator().manual_seed(seed)
    q, keys = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, n, 8, generator=g,
                                                                                    dtype=torch.float64)
    got = float(score_bound(q, keys.amin(-2), keys.amax(-2)))
    assert got == pytest.approx(literal_bound(q[0, 0, 0], keys[0, 0, 0]), abs=1e-12)
    assert got >= float((keys[0, 0, 0] @ q[0, 0, 0]).max()) - 1e-12


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(2, 2), (4, 2), (3, 1)]), st.integers(1, 6), st.integers(1, 40),
       st.integers(1, 6), st.integers(1, 5), st.integers(0, 10**6))
def test_extending_queries_read_the_pages_of_the_definition(B, heads, Lq, extra, ps, pages, seed):
    q, k, v = draw(B, heads, Lq, Lq + extra, seed=seed, grad=True)
    want_mask = definition_mask(q.detach(), k.detach(), ps, ps * pages)
    want = float64_attention(q, k, v, want_mask)
    go = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), go)
    for backend in ("gathered", "masked"):
        m = attn.build_attention("quest", page_size=ps, token_budget=ps * pages, backend=backend)
        assert torch.equal(m.kept_keys(q, k), want_mask)
        out = m(q, k, v)
        torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), go), want_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("backend", ["reference", "gathered", "masked"])
def test_the_prefill_is_full_attention(backend):
    q, k, v = draw(2, (4, 2), 45, 45, seed=2)
    m = attn.build_attention("quest", page_size=4, token_budget=8, backend=backend)
    t = torch.arange(45)
    torch.testing.assert_close(m(q, k, v), float64_attention(q, k, v, t[None, :] <= t[:, None]), atol=1e-12, rtol=0)


@pytest.mark.parametrize("heads", [(2, 2), (4, 2)])
@pytest.mark.parametrize("chunks", [[17] + [1] * 10, [9, 3, 1, 6]])
def test_decoding_equals_the_forward_call_by_call(heads, chunks):
    q, k, v = draw(1, heads, 40, 40, seed=4)
    m = attn.build_attention("quest", page_size=4, token_budget=12)
    got = decode_in_chunks(m, q, k, v, chunks)
    want, t = [], 0
    for n in [*chunks, 40]:
        n = min(n, 40 - t)
        if n <= 0:
            break
        want.append(m(q[:, :, t:t + n], k[:, :, :t + n], v[:, :, :t + n]))
        t += n
    torch.testing.assert_close(got, torch.cat(want, 2), atol=1e-12, rtol=1e-12)
    # and differs from one dense forward once a step selects (guards the property above)
    assert not torch.allclose(got, m(q, k, v), atol=1e-6)


def test_a_budget_beyond_the_context_is_full_attention_and_the_state_keeps_page_bounds():
    q, k, v = draw(1, (2, 2), 1, 30, seed=6)
    m = attn.build_attention("quest", page_size=4, token_budget=64)
    torch.testing.assert_close(m(q, k, v), float64_attention(q, k, v, torch.ones(1, 30, dtype=torch.bool)),
                               atol=1e-12, rtol=0)
    state = m.new_state()
    m.run_step(torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16), torch.randn(1, 2, 30, 16), state)
    assert state.nbytes() == 2 * 2 * 30 * 16 * 4 + 2 * 2 * 7 * 16 * 4  # K, V, and 7 pages' minima and maxima


@pytest.mark.parametrize("q_len, k_len, ps, budget", [(1, 100, 16, 32), (9, 50, 4, 12), (1, 17, 8, 64)])
def test_counts_are_the_mask_and_a_hand_count(q_len, k_len, ps, budget):
    m = attn.build_attention("quest", page_size=ps, token_budget=budget)
    q, k = torch.randn(1, 1, q_len, 4), torch.randn(1, 1, k_len, 4)
    assert m.pairs(q_len, k_len, True) == int(m.kept_keys(q, k).sum())
    assert m.pairs(k_len, k_len, True) == k_len * (k_len + 1) // 2  # the prefill is dense
    B, H, D = 2, 3, 8
    assert m.selection_flops("decode", B, H, k_len - 1, D) == 4 * B * H * D * ((k_len - 1) // ps)
    assert m.selection_flops("forward", B, H, k_len, D) == 0


def test_a_backbone_prefill_is_the_full_models():
    torch.manual_seed(0)
    quest = attn.Transformer(attn.TransformerConfig.preset("tiny", attention="quest",
                                                           attention_params={"page_size": 2, "token_budget": 4}))
    torch.manual_seed(0)
    full = attn.Transformer(attn.TransformerConfig.preset("tiny", attention="full"))
    idx = torch.randint(0, 256, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(quest.eval()(idx), full.eval()(idx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("params, fragment", [({"page_size": 0}, "page_size must be >= 1"),
                                              ({"page_size": 16, "token_budget": 40}, "multiple of page_size"),
                                              ({"page_size": 16, "token_budget": 8}, "multiple of page_size")])
def test_bad_parameters_are_refused(params, fragment):
    with pytest.raises(ValueError, match=fragment):
        attn.build_attention("quest", **params)
