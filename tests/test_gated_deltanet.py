"""`gated_deltanet`: the reference equals the paper's recurrence written out here in float64, the delta rule's
defining properties hold (no write without beta, exact recall of orthonormal keys), the chunked and recurrent
forms equal the reference with their gradients, decoding with the constant-size state equals one forward, and
the conventions match fla's own naive implementation when fla is installed."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from attn.attention.base import UnsupportedBackend
from attn.attention.gated_deltanet import GatedDeltaNetConfig
from attn.attention.matrix_state import MatrixState
from attn.checks import check_variant
from tests.definitions import backbone_steps_and_forward, decode_in_chunks, fla_naive

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# log decays per regime: strong (alpha ~ e^-8 .. e^-30: the state forgets within a token), fresh layer, weak (~1)
DECAY_SHIFT = {"strong": -12.0, "fresh": 0.0, "weak": 8.0}


def gdn(backend="auto", **params):
    return attn.build_attention("gated_deltanet", backend=backend, **params)


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(floor))


def draw(B, H, Hkv, lq, lk, D, seed, decay="fresh", dtype=torch.float64):
    """q (B, H, lq, D), k, v (B, H_kv, lk, D), g = logsigmoid(N(shift, 1)), beta = sigmoid(N(0, 1)), each (B, H_kv, lk, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, lk, D, generator=gen, dtype=torch.float64) for _ in range(2))
    g = F.logsigmoid(torch.randn(B, Hkv, lk, 1, generator=gen, dtype=torch.float64) + DECAY_SHIFT[decay])
    beta = torch.sigmoid(torch.randn(B, Hkv, lk, 1, generator=gen, dtype=torch.float64))
    return [t.to(dtype) for t in (q, k, v, g, beta)]


def paper_recurrence(q, k, v, g, beta, qk_norm=True):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t / sqrt(D), in float64, one
    (batch, query head) at a time; query head h reads key head h // G; query i is position i + Lk - Lq."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    if qk_norm:
        q, k = q / (q.norm(dim=-1, keepdim=True) ** 2 + 1e-6).sqrt(), k / (k.norm(dim=-1, keepdim=True) ** 2 + 1e-6).sqrt()
    B, H, lq, D = q.shape
    lk, G = k.shape[2], H // k.shape[1]
    out = torch.zeros(B, H, lq, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(D, v.shape[-1], dtype=torch.float64)
            for t in range(lk):
                kt, vt = k[b, h // G, t][:, None], v[b, h // G, t][:, None]  # columns
                a, s = math.exp(g[b, h // G, t, 0]), float(beta[b, h // G, t, 0])
                S = a * (torch.eye(D, dtype=torch.float64) - s * kt @ kt.T) @ S + s * kt @ vt.T
                if t >= lk - lq:
                    out[b, h, t - (lk - lq)] = S.T @ q[b, h, t - (lk - lq)] / math.sqrt(D)
    return out


@pytest.mark.parametrize("shape", [(2, 2, 2, 9, 9, 8), (1, 4, 2, 9, 9, 8), (2, 3, 1, 4, 11, 4), (1, 2, 2, 1, 1, 8)],
                         ids=["mha", "gqa", "mqa-bottom-right", "one-token"])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_reference_equals_the_papers_recurrence(shape, qk_norm):
    q, k, v, g, beta = draw(*shape, seed=sum(shape))
    if not qk_norm:
        k = k / (2 * math.sqrt(k.shape[-1]))  # short keys: I - beta k k^T stays a contraction
    out = gdn("reference", qk_norm=qk_norm)(q, k, v, g=g, beta=beta)
    torch.testing.assert_close(out, paper_recurrence(q, k, v, g, beta, qk_norm), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "chunked", "recurrent"])
def test_without_writes_the_state_stays_empty(backend):
    """beta = 0: nothing is ever written, whatever the keys and decays: every output is exactly 0."""
    q, k, v, g, beta = draw(2, 4, 2, 13, 13, 8, seed=1)
    out = gdn(backend, chunk_size=4)(q, k, v, g=g, beta=torch.zeros_like(beta))
    assert out.abs().max() == 0
    m, state = gdn(), MatrixState()
    m.run_step(q[:, :, :5], k[:, :, :5], v[:, :, :5], state, g=g[:, :, :5], beta=torch.zeros_like(beta[:, :, :5]))
    m.run_step(q[:, :, 5:6], k[:, :, 5:6], v[:, :, 5:6], state, g=g[:, :, 5:6], beta=torch.zeros_like(beta[:, :, 5:6]))
    assert state.S.abs().max() == 0 and state.S.shape == (2, 2, 8, 8)


@pytest.mark.parametrize("backend", ["reference", "chunked", "recurrent"])
def test_orthonormal_keys_are_recalled_exactly_and_overwritten(backend):
    """g = 0, beta = 1: writing v_i under orthonormal keys k_i, then reading k_i returns v_i (times the D^-1/2 scale);
    writing key 0 again with a new value replaces v_0 (linear attention would return v_0 + v_new)."""
    D = 8
    gen = torch.Generator().manual_seed(2)
    keys = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0].T  # rows orthonormal
    values, new = torch.randn(D, D, generator=gen, dtype=torch.float64), torch.randn(D, generator=gen, dtype=torch.float64)
    # tokens: D writes, a rewrite of key 0, then D reads (beta = 0: the read tokens write nothing)
    k = torch.cat([keys, keys[:1], torch.randn(D, D, generator=gen, dtype=torch.float64)])
    v = torch.cat([values, new[None], torch.randn(D, D, generator=gen, dtype=torch.float64)])
    q = torch.cat([torch.randn(D + 1, D, generator=gen, dtype=torch.float64), keys])
    beta = torch.cat([torch.ones(D + 1), torch.zeros(D)]).double()
    as4 = lambda x: x.reshape(1, 1, 2 * D + 1, -1)
    # qk_norm off: the keys are unit already, and the l2norm's eps would shrink them by 1e-6
    out = gdn(backend, chunk_size=3, qk_norm=False)(as4(q), as4(k), as4(v), g=as4(torch.zeros_like(beta)), beta=as4(beta))[0, 0]
    expected = torch.cat([new[None], values[1:]]) / math.sqrt(D)
    torch.testing.assert_close(out[D + 1:], expected, atol=1e-12, rtol=1e-12)


@st.composite
def problems(draw_, max_len=100):
    B, Hkv, G = draw_(st.integers(1, 2)), draw_(st.integers(1, 2)), draw_(st.sampled_from([1, 2]))
    D = draw_(st.sampled_from([1, 4, 8, 16]))
    lk = draw_(st.sampled_from([1, 2, 31, 32, 33, 65])) if draw_(st.booleans()) else draw_(st.integers(1, max_len))
    lq = draw_(st.integers(1, lk)) if draw_(st.booleans()) else lk
    decay = draw_(st.sampled_from(list(DECAY_SHIFT)))
    dtype = draw_(st.sampled_from([torch.float32, torch.bfloat16]))
    return draw(B, Hkv * G, Hkv, lq, lk, D, seed=draw_(st.integers(0, 2**16)), decay=decay, dtype=dtype)


@settings(max_examples=20)
@given(problems(), st.integers(1, 40))
def test_chunked_and_recurrent_equal_reference_with_gradients(inputs, chunk):
    """Odd lengths around the chunk, fewer queries than keys, GQA, strong and weak decays; gradients of all five
    inputs (g and beta included). Every form computes in fp32, so bf16 differs only by the final rounding."""
    inputs = [t.requires_grad_() for t in inputs]
    q, k, v, g, beta = inputs
    dtype = q.dtype
    ref = gdn("reference")(q, k, v, g=g, beta=beta)
    dout = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    expected = torch.autograd.grad(ref, inputs, dout)
    for backend in ("chunked", "recurrent"):
        out = gdn(backend, chunk_size=chunk)(q, k, v, g=g, beta=beta)
        assert out.dtype == dtype and out.shape == q.shape
        torch.testing.assert_close(out, ref, **TOL[dtype], msg=backend)
        got = torch.autograd.grad(out, inputs, dout)
        for name, a, b in zip(["q", "k", "v", "g", "beta"], got, expected, strict=True):
            assert rel_err(a, b, floor=1.0) < (1e-4 if dtype == torch.float32 else 2e-2), (backend, name)


@pytest.mark.parametrize("backend", ["chunked", "recurrent"])
def test_without_qk_norm_the_forms_still_agree(backend):
    q, k, v, g, beta = draw(1, 4, 2, 37, 45, 8, seed=3)
    k = k / (2 * math.sqrt(8))
    ref = gdn("reference", qk_norm=False)(q, k, v, g=g, beta=beta)
    torch.testing.assert_close(gdn(backend, qk_norm=False, chunk_size=8)(q, k, v, g=g, beta=beta), ref,
                               atol=1e-12, rtol=1e-12)


def test_the_equivalence_checker_finds_no_mismatch():
    findings = check_variant("gated_deltanet", {"chunk_size": 16})
    bad = [f for f in findings if f.status == "mismatch"]
    assert not bad, bad
    assert {f.backend for f in findings if f.status == "ok"} >= {"chunked", "recurrent", "decode state"}


@pytest.mark.parametrize("chunks", [[1] * 19, [5, 1, 7, 3], [19], [2, 17]])
def test_decoding_in_chunks_equals_one_forward_in_constant_memory(chunks):
    q, k, v, g, beta = draw(2, 4, 2, 19, 19, 8, seed=4, dtype=torch.float32)
    m = gdn(chunk_size=4)
    full = m(q, k, v, g=g, beta=beta)
    seen = []  # (tokens in the state, its bytes, the form that ran) after each step
    watch = lambda state: seen.append((state.length, state.nbytes(), m.last_backend))
    got = decode_in_chunks(m, q, k, v, chunks, on_step=watch, inputs={"g": g, "beta": beta})
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    assert {size for _, size, _ in seen} == {2 * 2 * 8 * 8 * 4}  # (B, H_kv, D, D) fp32 at every length
    steps = [b - a for a, b in zip([0] + [n for n, _, _ in seen], [n for n, _, _ in seen] + [0], strict=True)][:-1]
    assert [form for *_, form in seen] == ["recurrent" if n == 1 else "chunked" for n in steps]


def test_state_can_rewind_its_last_step_only():
    q, k, v, g, beta = draw(1, 2, 2, 6, 6, 8, seed=5)
    m, state = gdn(), MatrixState()
    sl = lambda a, b: dict(g=g[:, :, a:b], beta=beta[:, :, a:b])
    m.step(q[:, :, :4], k[:, :, :4], v[:, :, :4], state, **sl(0, 4))
    first = m.step(q[:, :, 4:5], k[:, :, 4:5], v[:, :, 4:5], state, **sl(4, 5))
    state.truncate(4)
    assert state.length == 4
    torch.testing.assert_close(m.step(q[:, :, 4:5], k[:, :, 4:5], v[:, :, 4:5], state, **sl(4, 5)), first, atol=0, rtol=0)
    with pytest.raises(ValueError, match="cannot forget"):
        state.truncate(2)


def test_backbone_decoding_equals_forward_and_a_fresh_layer_remembers_with_a_learned_rate_per_key_head():
    model, steps, full = backbone_steps_and_forward("gated_deltanet", {"chunk_size": 3})
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    # the decay is Mamba-2's, exp(A_h dt_t) with A_h learned per key head and layer (fla's layer): a fresh layer keeps
    # a quarter of what it wrote 128 tokens back in its slowest head; a sigmoid gate of a zero-mean projection
    # (alpha ~ 1/2, this variant's first form) kept 2^-128 of it and never learned MQAR at 128 tokens
    block = model.blocks[0].attn
    rate = block.input_maps["g"]
    assert rate.A_log.shape == (model.config.num_kv_heads,) and rate is not model.blocks[1].attn.input_maps["g"]
    x = torch.randint(0, model.config.vocab_size, (4, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        raw = block.inputs["g"](model.blocks[0].ln1(model.tok_emb(x))).view(4, 128, -1, 1).transpose(1, 2)
    kept = rate(raw).sum(2).exp()  # (B, H_kv, 1): the fraction of a first token's write left after 128 tokens
    assert kept.max(1).values.min() > 0.25 and kept.min() < 0.2  # heads span memories, the slowest holds 128 tokens
    model.train()
    model.loss(x[:, :17], x[:, :17]).backward()
    assert rate.A_log.grad is not None and rate.A_log.grad.abs().min() > 0


def test_equals_fla_naive_implementations():
    """fla's conventions, matched: state (K, V) with the decay applied before the delta write, scale K^-1/2 on q,
    inputs (B, T, H, .), g the log decay and beta post-sigmoid, both (B, T, H); its naive functions do not
    normalise, so they get l2-normalised q, k (its kernels' use_qk_l2norm_in_kernel) and ours qk_norm=False.
    They compute in fp32 and take one key head per query head (k, v, g, beta repeated here for GQA)."""
    naive = fla_naive("ops/gated_delta_rule/naive.py")
    q, k, v, g, beta = draw(2, 4, 2, 77, 77, 16, seed=6)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    ours = gdn("reference", qk_norm=False)(q, k, v, g=g, beta=beta)
    bthd = lambda x: x.repeat_interleave(2, 1).transpose(1, 2)  # (B, H_kv, T, .) -> (B, T, H, .)
    o, _ = naive.naive_recurrent_gated_delta_rule(q.transpose(1, 2), bthd(k), bthd(v), bthd(beta)[..., 0], bthd(g)[..., 0])
    torch.testing.assert_close(o.transpose(1, 2).double(), ours, atol=1e-5, rtol=1e-5)
    o, _ = naive.naive_chunk_gated_delta_rule(q.transpose(1, 2), bthd(k), bthd(v), bthd(g)[..., 0], bthd(beta)[..., 0],
                                              chunk_size=16)
    torch.testing.assert_close(o.transpose(1, 2).double(), ours, atol=1e-5, rtol=1e-5)


@pytest.fixture
def fla_stand_in(monkeypatch):
    """A stand-in for fla.ops.gated_delta_rule.chunk_gated_delta_rule following its documented contract ((B, T, H, .)
    q, k, v in the kernel dtype, g, beta (B, T, H), fp32 initial state (B, H, K, V), l2norm of q, k in the kernel,
    output in the inputs' dtype), computed with this file's recurrence, so the fla backend's glue runs on CPU."""
    import sys
    import types

    def chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel):
        assert q.shape == k.shape and g.shape == beta.shape == q.shape[:3] and not output_final_state
        assert q.dtype == k.dtype == v.dtype and g.dtype == torch.float32 and scale == q.shape[-1] ** -0.5
        bhtd = lambda x: x.double().transpose(1, 2)
        qd, kd, vd, gd, bd = bhtd(q), bhtd(k), bhtd(v), bhtd(g)[..., None], bhtd(beta)[..., None]
        if initial_state is not None:  # S0 as D writes in front: key e_i, value row i of S0, g = 0, beta = 1
            # (exact recall of orthonormal keys; the l2norm's eps perturbs it by 1e-6)
            assert initial_state.dtype == torch.float32
            D = qd.shape[-1]
            eye = torch.eye(D, dtype=torch.float64).expand(*kd.shape[:2], D, D)
            kd, vd = torch.cat([eye, kd], 2), torch.cat([initial_state.double(), vd], 2)
            gd, bd = F.pad(gd, (0, 0, D, 0)), F.pad(bd, (0, 0, D, 0), value=1.0)
        return paper_recurrence(qd, kd, vd, gd, bd, use_qk_l2norm_in_kernel).transpose(1, 2).to(q.dtype), None

    ops = types.ModuleType("fla.ops.gated_delta_rule")
    ops.chunk_gated_delta_rule = chunk_gated_delta_rule
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", ops)


@pytest.mark.parametrize("lq", [9, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_glue_with_a_stand_in_kernel_equals_reference(fla_stand_in, lq, dtype):
    """Layout, GQA repetition, the prefix as initial state (Lq < Lk) and the dtypes the kernel is fed."""
    q, k, v, g, beta = draw(2, 4, 2, lq, 9, 8, seed=7, dtype=dtype)
    m = gdn(chunk_size=4)
    out = m.backend_fla(q, k, v, True, g=g, beta=beta)
    assert out.dtype == dtype
    torch.testing.assert_close(out, m.backend_reference(q, k, v, True, g=g, beta=beta), **TOL[dtype])


def test_fla_backend_on_cpu_says_why():
    q, k, v, g, beta = draw(1, 2, 2, 8, 8, 16, seed=8, dtype=torch.float32)
    with pytest.raises(UnsupportedBackend, match="fla.*CUDA"):
        gdn("fla")(q, k, v, g=g, beta=beta)


def test_auto_picks_chunked_for_training_and_the_recurrence_for_decoding():
    q, k, v, g, beta = draw(1, 2, 2, 8, 8, 16, seed=9, dtype=torch.float32)
    m = gdn()
    m(q, k, v, g=g, beta=beta)
    assert m.last_backend == "chunked"
    m(q.requires_grad_(), k, v, g=g, beta=beta)
    assert m.last_backend == "chunked"
    with torch.no_grad():
        m(q[:, :, -2:], k, v, g=g, beta=beta)
    assert m.last_backend == "recurrent"


def test_flops_count_the_recurrent_form():
    m = gdn()
    B, H, Hkv, L, D = 2, 8, 2, 4096, 64
    per_key = D * D + 2 * D * D + 2 * D + 2 * D * D + 1 + 3 * D  # decay, read, error, write, exp(g), k's norm
    per_query = 3 * D + D + 2 * D * D  # q's norm, scale, read
    assert m.flops(B, H, L, L, D) == B * L * (H * per_key + H * per_query)
    assert m.flops(B, H, L, L, D, kv_heads=Hkv) == B * L * (Hkv * per_key + H * per_query)  # one state per key head
    assert gdn(qk_norm=False).flops(B, H, L, L, D) == B * L * H * (per_key + per_query - 6 * D)
    assert m.flops(B, H, 2 * L, 2 * L, D) == 2 * m.flops(B, H, L, L, D)  # linear in length
    assert m.mode_flops("forward", B, H, L, D, kv_heads=Hkv) == m.flops(B, H, L, L, D, kv_heads=Hkv)
    assert m.mode_flops("train", B, H, L, D) == 3 * m.flops(B, H, L, L, D)
    decode = m.mode_flops("decode", B, H, L, D, kv_heads=Hkv)
    assert decode == B * (Hkv * per_key + H * per_query) == m.mode_flops("decode", B, H, 16 * L, D, kv_heads=Hkv)


@pytest.mark.parametrize("params, field", [({"chunk_size": 0}, "chunk_size"), ({"chunk_size": "many"}, "chunk_size"),
                                           ({"qk_norm": "maybe"}, "qk_norm"), ({"window": 4}, "window")])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        gdn(**params)


def test_bad_calls_say_what_is_wrong():
    q, k, v, g, beta = draw(1, 2, 2, 8, 8, 16, seed=10, dtype=torch.float32)
    m = gdn()
    with pytest.raises(ValueError, match="bidirectional"):
        m(q, k, v, causal=False, g=g, beta=beta)
    with pytest.raises(ValueError, match="missing beta"):
        m(q, k, v, g=g)
    with pytest.raises(ValueError, match="'g' must be"):
        m(q, k, v, g=g.expand(-1, -1, -1, 16), beta=beta)
    with pytest.raises(ValueError, match="chunk_size"):
        GatedDeltaNetConfig(chunk_size=-1)


def test_listed_with_its_parameters_backends_and_inputs():
    spec = next(s for s in attn.list_attention() if s["name"] == "gated_deltanet")
    assert spec["params"] == {"qk_norm": True, "chunk_size": 32}
    assert [b["name"] for b in spec["backends"]] == ["reference", "chunked", "recurrent", "fla"]
    assert spec["token_inputs"] == ["g", "beta"] and spec["gqa"] == "native"
    assert spec["exact"] is False and spec["causal"] and not spec["bidirectional"] and spec["decode"]
    m = gdn()
    assert m.output_norm and all(t.width == 1 for t in m.token_inputs)
    raw = torch.linspace(-5, 5, 11)
    g, beta = (t.mapping(2)(raw[None, None, :, None].expand(1, 2, 11, 1)) for t in m.token_inputs)
    assert (g < 0).all() and ((beta > 0) & (beta < 1)).all()
    # Mamba-2's (and fla's) decay at init: dt = 0.01 at a zero projection, A spread over [1, 16] across key heads
    torch.testing.assert_close(g[0, :, 5, 0].detach(), -0.01 * torch.tensor([1.0, 16.0]))
