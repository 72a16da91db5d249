"""The dynamic sparse prefills (vertical_slash, flexprefill, xattention) against definitions written here with loops in
float64: what each chooses, that the fast estimate chooses the same, and that every backend attends to exactly that."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention.prompt_sparse import visible_per_head
from attn.registry import resolve_variant
from tests.definitions import float64_attention

SMALL = {  # parameters at which a few dozen tokens already choose (test sizes)
    "vertical_slash": dict(vertical_size=40, slash_size=110, last_q=8),
    "flexprefill": dict(block_size=8, min_budget=8, gamma=0.6, tau=0.2),
    "xattention": dict(block_size=8, stride=4, threshold=0.6),
}
KEEP_ALL = {  # parameters that keep every causal key
    "vertical_slash": dict(vertical_size=10**6, slash_size=10**6),
    "flexprefill": dict(block_size=8, min_budget=8, gamma=1.0, tau=0.0),
    "xattention": dict(block_size=8, stride=4, threshold=1.0),
}


def draw(B, heads, L, D=8, dtype=torch.float64, seed=0, grad=False):
    H, Hkv = heads
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=dtype) * 2  # sharper attention: choices differ from keeping all
    k, v = (torch.randn(B, Hkv, L, D, generator=g, dtype=dtype) for _ in range(2))
    return [t.requires_grad_(grad) for t in (q, k, v)]


def probs64(q, k):
    """Dense causal softmax attention (B, H, L, L) in float64, keys repeated to the query heads."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1).double()
    s = q.double() @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    L = q.shape[2]
    return torch.softmax(s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf), -1)


def vertical_slash_definition(q, k, vertical_size, slash_size, last_q):
    """MInference's choice with loops: per head, the last queries' attention; column sums (the first 30 forced) and
    per-distance sums (the 100 nearest forced), the top of each; a query block of 64 reads its columns and, per
    distance d, the keys [start - d, start + 64 - d); then causal -> (B, H, L, L)."""
    p = probs64(q, k)
    B, H, L, _ = p.shape
    m = min(last_q, L)
    mask = torch.zeros(B, H, L, L, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            rows = p[b, h, L - m:]
            col = [float(rows[:, j].sum()) if j >= 30 else math.inf for j in range(L)]
            dist = [math.inf if d < 100 else sum(float(rows[t, L - m + t - d]) for t in range(m) if L - m + t - d >= 0)
                    for d in range(L)]
            cols = sorted(range(L), key=lambda j: -col[j])[:vertical_size]
            dists = sorted(range(L), key=lambda d: -dist[d])[:slash_size]
            for start in range(0, L, 64):  # a query block reads the same keys; causal below
                rows_ = slice(start, start + 64)
                mask[b, h, rows_, cols] = True
                for d in dists:
                    mask[b, h, rows_, max(0, start - d): max(0, start + 64 - d)] = True
    return mask & torch.ones(L, L, dtype=torch.bool).tril()


def xattention_definition(q, k, block, stride, threshold):
    """XAttention's choice with loops: antidiagonal sums of each stride tile of the (zero-padded) score matrix, softmax
    per strided row (stride-level causal), block sums, then per query block: block 0 and the diagonal, then the others
    by decreasing score while the sum kept before each is below threshold x the row total -> (B, H, L, L)."""
    B, H, L, D = q.shape
    pad = -L % block
    qp = torch.nn.functional.pad(q.double(), (0, 0, 0, pad))
    kp = torch.nn.functional.pad(k.repeat_interleave(H // k.shape[1], 1).double(), (0, 0, 0, pad))
    n, per, R = (L + pad) // stride, block // stride, (L + pad) // block
    mask = torch.zeros(B, H, L, L, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            s = qp[b, h] @ kp[b, h].T
            tile = torch.tensor([[sum(float(s[i * stride + stride - 1 - t, j * stride + t]) for t in range(stride))
                                  for j in range(n)] for i in range(n)]) / (math.sqrt(D) * stride)
            tile = tile.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf).softmax(-1)
            tile[torch.arange(n) * stride >= L] = 0
            score = tile.reshape(R, per, R, per).sum((1, 3))
            for r in range(R):
                forced = [0, r] if r else [0]
                rest = sorted((c for c in range(1, r)), key=lambda c: -float(score[r, c]))
                total, kept, acc = float(score[r, : r + 1].sum()), set(forced), sum(float(score[r, c]) for c in forced)
                for c in rest:
                    if acc < threshold * total:
                        kept.add(c)
                    acc += float(score[r, c])
                for i in range(r * block, min(L, (r + 1) * block)):
                    for c in kept:
                        mask[b, h, i, c * block: min(i + 1, (c + 1) * block)] = True
    return mask


def attends_as_defined(name, params, q, k, v, want_mask):
    """Every backend keeps exactly ``want_mask`` and equals float64 attention over it, forward and gradients."""
    want = float64_attention(q, k, v, want_mask)
    go = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), go)
    for backend in ("reference", "gathered"):
        m = attn.build_attention(name, **params, backend=backend)
        assert torch.equal(m.kept_keys(q, k), want_mask)
        out = m(q, k, v)
        torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
        for a, b in zip(torch.autograd.grad(out, (q, k, v), go), want_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(2, 2), (4, 2), (3, 1)]), st.integers(1, 280), st.integers(30, 60),
       st.integers(100, 140), st.integers(1, 16), st.integers(0, 10**6))
def test_vertical_slash_chooses_and_attends_as_defined(B, heads, L, vs, ss, last_q, seed):
    q, k, v = draw(B, heads, L, seed=seed, grad=True)
    want_mask = vertical_slash_definition(q.detach(), k.detach(), vs, ss, last_q)
    attends_as_defined("vertical_slash", dict(vertical_size=vs, slash_size=ss, last_q=last_q), q, k, v, want_mask)


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 2), st.sampled_from([(2, 2), (4, 2), (3, 1)]), st.integers(1, 70), st.sampled_from([(8, 2),
       (8, 4), (12, 3), (16, 8)]), st.floats(0.3, 1.0), st.integers(0, 10**6))
def test_xattention_chooses_and_attends_as_defined(B, heads, L, block_stride, threshold, seed):
    block, stride = block_stride
    q, k, v = draw(B, heads, L, seed=seed, grad=True)
    want_mask = xattention_definition(q.detach(), k.detach(), block, stride, threshold)
    attends_as_defined("xattention", dict(block_size=block, stride=stride, threshold=threshold), q, k, v, want_mask)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(SMALL)), st.integers(1, 2), st.sampled_from([(2, 2), (4, 2), (3, 1)]),
       st.integers(1, 240), st.integers(0, 10**6))
def test_the_estimate_chooses_what_the_dense_matrix_chooses(name, B, heads, L, seed):
    """Each fast estimate (strided products, the last queries' rows alone, pooled blocks) picks what the same rule picks
    from the dense attention matrix, and the gathered backend equals the reference."""
    q, k, v = draw(B, heads, L, seed=seed)
    ref = attn.build_attention(name, backend="reference", **SMALL[name])
    fast = attn.build_attention(name, backend="gathered", **SMALL[name])
    assert torch.equal(fast.chosen_keys(q, k, reference=False), ref.chosen_keys(q, k, reference=True))
    torch.testing.assert_close(fast(q, k, v), ref(q, k, v), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_keeping_everything_is_full_attention_and_a_small_budget_is_not(name):
    q, k, v = draw(2, (4, 2), 400, seed=3)  # vertical-slash: its 100 nearest distances alone cover 164 keys a block
    full = attn.build_attention("full")(q, k, v)
    m = attn.build_attention(name, **KEEP_ALL[name])
    torch.testing.assert_close(m(q, k, v), full, atol=1e-12, rtol=1e-12)
    assert m.take_selection()[0]["density"] == [1.0] * 8
    sparse = attn.build_attention(name, **SMALL[name])
    assert (sparse(q, k, v) - full).abs().max() > 1e-3
    assert min(sparse.take_selection()[0]["density"]) < 1.0


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_follows_float64_on_the_same_choice(name, dtype):
    q, k, v = draw(1, (4, 2), 230, D=16, seed=5, dtype=dtype)
    m = attn.build_attention(name, backend="gathered", **SMALL[name])
    mask = m.kept_keys(q, k)
    out = m(q, k, v)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), float64_attention(q, k, v, mask), atol=tol, rtol=tol)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_flex_runs_the_same_choice(name):
    pytest.importorskip("torch.nn.attention.flex_attention")
    params = {**SMALL[name], **({"block_size": 64} if "block_size" in SMALL[name] else {})}
    if name == "xattention":
        params["stride"] = 8
    q, k, v = draw(1, (4, 2), 300, D=16, seed=7, dtype=torch.float32)
    got = attn.build_attention(name, backend="flex", **params)(q, k, v)
    want = attn.build_attention(name, backend="gathered", **params)(q, k, v)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_call_extending_a_context_reads_the_whole_cache(name):
    """Decoding (Lq < Lk) is dense causal attention over every cached key: these methods save prefill, not memory."""
    q, k, v = draw(1, (4, 2), 60, seed=11)
    m = attn.build_attention(name, **SMALL[name])
    t = torch.arange(60)
    want = float64_attention(q[:, :, -5:], k, v, (t[None, :] <= t[-5:, None]))
    torch.testing.assert_close(m(q[:, :, -5:], k, v), want, atol=1e-12, rtol=0)
    assert m.take_selection() == []  # nothing chosen


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_choice_reads_the_whole_prompt(name):
    """A later token can change which keys an earlier query reads (never what a chosen key contributes): why callers
    must prefill a prompt in one call (``sparse_prefill``) and why the causality test of test_model.py exempts them."""
    m = attn.build_attention(name, **SMALL[name])
    assert type(m).sparse_prefill
    changed = False
    for seed in range(20):
        q, k, v = draw(1, (2, 2), 400, seed=seed)
        early = m.kept_keys(q[:, :, :300], k[:, :, :300])
        late = m.kept_keys(q, k)[:, :, :300, :300]
        changed |= not torch.equal(early, late)
    assert changed


def test_density_counts_the_visible_pairs():
    q, k, _ = draw(1, (3, 3), 70, seed=2)
    m = attn.build_attention("xattention", **SMALL["xattention"])
    keys = m.chosen_keys(q, k)
    assert visible_per_head(keys, 8).tolist() == m.kept_keys(q, k).sum((-2, -1)).tolist()


@pytest.mark.parametrize("spec, message", [
    ("xattention:stride=3", "stride must be >= 1 and divide block_size"),
    ("xattention:threshold=0", "threshold must be in"),
    ("flexprefill:gamma=1.5", "gamma must be in"),
    ("flexprefill:min_budget=2048,max_budget=1024", "max_budget must be 0"),
    ("vertical_slash:vertical_size=10", "vertical_size must be >= 30"),
    ("vertical_slash:slash_size=50", "slash_size must be >= 100"),
])
def test_bad_parameters_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_variant(spec)


def test_the_selection_task_scores_the_whole_prompts_choice():
    """The selection task reads queries in chunks; a dynamic prefill's keys are still the ones the whole prompt chose."""
    from harness.accuracy.tasks.selection import QUERY_CHUNK, selection_measures

    L = QUERY_CHUNK + 100
    q, k, _ = draw(1, (2, 2), L, seed=4)
    m = attn.build_attention("xattention", **SMALL["xattention"])
    kept = m.kept_keys(q, k)
    mass = (probs64(q, k) * kept).sum(-1)  # (1, H, L)
    for h, got in enumerate(selection_measures(m, q, k)):
        assert got["mass"].value == pytest.approx(float(mass[0, h].mean()), abs=1e-6)
        assert got["mass"].value < 0.999


def test_a_checkpoint_prefills_each_prompt_whole_and_its_rows_say_what_was_chosen():
    """Inside a transformers model the shared-prefix cache must not prefill a prompt's suffix alone (the choice reads
    the whole prompt): each prompt is one prefill call per layer, and the row columns report its choice."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, GenerationConfig

    from attn import hf
    from harness.accuracy.prefill import SharedPrefill
    from harness.accuracy.pretrained import prefill_choices

    config = hf.tiny_config("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=1024,
                            initializer_range=0.2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    hf.set_variant(model, "xattention:block_size=16,stride=4,threshold=0.5")
    gen = GenerationConfig(max_new_tokens=3, min_new_tokens=3, do_sample=False, num_beams=1, pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    first = torch.randint(1, 256, (200,), generator=g).tolist()
    second = first[:150] + torch.randint(1, 256, (50,), generator=g).tolist()  # shares a 150-token prefix
    cache = SharedPrefill()
    cache.answers(model, first, len(first), gen)
    cache.answers(model, second, len(second), gen)
    calls = [c for m in hf.attention_modules(model) for c in m.calls]
    assert len(calls) == 2 * 2  # two prompts, each one whole prefill in each of the two layers
    cols = prefill_choices(model)
    assert 0 < cols["density"] < 1 and cols["decode_keys"] == "all" and 0 <= cols["choose_share"] <= 1


def test_a_budget_sizes_each_prefill_and_the_frontier_reads_it_as_one():
    from harness.accuracy.budgets import PREFILL, parse_budget, prefill_sized
    from harness.analysis.frontier import arm

    for name in PREFILL:
        for b in ("1/4", "1/8"):
            assert resolve_variant(prefill_sized(name, parse_budget(b), 8192)).name == name
        assert prefill_sized(name, parse_budget("1/3"), 8192) is None  # no parameters measured for that share
    assert prefill_sized("vertical_slash", parse_budget("1/8"), 8192) == "vertical_slash:vertical_size=100,slash_size=180"
    row = {"variant_spec": "xattention:threshold=0.5", "budget": "1/8", "decode_keys": "all"}
    assert arm(row) == ("xattention", "prefill", "1/8")
    assert arm({**row, "decode_keys": None})[1] == "variant"


def test_the_presets_selection_specs_are_the_budgets():
    from harness.accuracy.budgets import parse_budget, prefill_sized, sized
    from harness.accuracy.checkpoint_presets import BLOCK_SPARSE_512, PREFILL_AT_8K, PREFILL_METHODS

    assert PREFILL_AT_8K == tuple(prefill_sized(m, parse_budget("1/8"), 8192) for m in PREFILL_METHODS)
    assert BLOCK_SPARSE_512 == sized("block_sparse", 512)[0]
