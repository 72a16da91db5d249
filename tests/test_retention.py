"""`retention` (RetNet): the reference equals the paper's recurrence written out in float64, the chunked and
recurrent forms equal the reference (gradients too), decoding with the constant-size state equals one forward,
and the conventions match flash-linear-attention's."""
import math

import pytest
import torch
from definitions import backbone_steps_and_forward, decode_in_chunks, fla_naive
from hypothesis import given
from hypothesis import strategies as st

import attn
from attn.attention.base import UnsupportedBackend
from attn.attention.retention import RetentionConfig
from attn.checks import check_variant

pytestmark = pytest.mark.usefixtures("one_thread")


def ret(backend="auto", **params):
    return attn.build_attention("retention", backend=backend, **params)


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm().clamp_min(floor))


def paper_recurrence(q, k, v, gamma=None):
    """RetNet's recurrent form in float64, token by token: S_t = gamma S_{t-1} + k_t^T v_t, o_t = q_t S_t / sqrt(D),
    gamma_h = 1 - 2^(-5-h) per key head h; query head i reads key head i // (H / H_kv). The queries are the last Lq
    positions."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        kh = h // (H // Hkv)
        decay = 1 - 2.0 ** (-5 - kh) if gamma is None else gamma
        S = torch.zeros(B, D, v.shape[-1], dtype=torch.float64)
        for t in range(Lk):
            S = decay * S + k[:, kh, t, :, None] * v[:, kh, t, None, :]
            if t >= Lk - Lq:
                out[:, h, t - (Lk - Lq)] = (q[:, h, t - (Lk - Lq), :, None] * S).sum(-2) / math.sqrt(D)
    return out


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("lq, lk", [(9, 9), (3, 9), (1, 1), (1, 6)])
@pytest.mark.parametrize("gamma", [None, 0.5])
def test_reference_equals_the_papers_recurrence(heads, lq, lk, gamma):
    g = torch.Generator().manual_seed(lq + lk)
    H, Hkv = heads
    q = torch.randn(2, H, lq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, Hkv, lk, 8, generator=g, dtype=torch.float64) for _ in range(2))
    out = ret("reference", gamma=gamma)(q, k, v, causal=True)
    torch.testing.assert_close(out, paper_recurrence(q, k, v, gamma), atol=1e-12, rtol=1e-12)


@st.composite
def qkv(draw, max_len=130):
    B, Hkv, groups = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3]))
    D = draw(st.sampled_from([1, 4, 8, 16]))
    lk = draw(st.sampled_from([1, 2, 63, 64, 65])) if draw(st.booleans()) else draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(B, Hkv * groups, lq, D, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, lk, D, generator=g).to(dtype) for _ in range(2))
    return q, k, v, dtype


# None: RetNet's weak decays (0.97..); 0.3 and 1e-3: strong (gamma^64 underflows fp32); 1.0: no decay at all
@given(qkv(), st.integers(1, 70), st.sampled_from([None, 0.3, 1e-3, 1.0]))
def test_chunked_and_recurrent_equal_reference_with_gradients(inputs, chunk, gamma):
    q, k, v, dtype = inputs
    params = dict(chunk_size=chunk, gamma=gamma)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]  # the truth: the reference in float64
    ref = ret("reference", **params)(*exact, causal=True)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = torch.autograd.grad(ref, exact, grad)
    grad = grad.to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for backend in ("chunked", "recurrent"):
        out = ret(backend, **params)(q, k, v, causal=True)
        assert out.dtype == dtype and out.shape == q.shape[:3] + v.shape[3:] and torch.isfinite(out).all()
        assert rel_err(out, ref, floor=1e-6) < tol, backend
        for name, a, b in zip("qkv", torch.autograd.grad(out, (q, k, v), grad), expected, strict=True):
            assert rel_err(a, b, floor=1.0) < tol, (backend, name)


@pytest.mark.parametrize("params", [{}, {"chunk_size": 16, "gamma": 0.5}, {"chunk_size": 5, "gamma": 1e-3}])
def test_equivalence_checker_finds_no_mismatch(params):
    findings = check_variant("retention", params)
    assert not [f for f in findings if f.status == "mismatch"], [f for f in findings if f.status == "mismatch"]
    ran = {f.backend for f in findings if f.status == "ok"}
    assert ran == {"chunked", "recurrent", "decode state"}


@pytest.mark.parametrize("chunks", [[1] * 23, [5, 1, 7, 8], [23], [2, 9, 1]])
def test_decoding_in_chunks_equals_one_forward_with_a_constant_state(chunks):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 23, 8, generator=g)
    k, v = (torch.randn(2, 2, 23, 8, generator=g) for _ in range(2))
    m = ret(chunk_size=4)
    sizes = []
    got = decode_in_chunks(m, q, k, v, chunks, on_step=lambda s: sizes.append(s.nbytes()))
    torch.testing.assert_close(got, m(q, k, v, causal=True), atol=1e-5, rtol=1e-5)
    assert set(sizes) == {2 * 2 * 8 * 8 * 4}  # (B, H_kv, D, D) fp32, at every length


def test_a_step_runs_the_recurrence_and_a_prefill_the_chunks():
    q = torch.randn(1, 2, 6, 8)
    m = ret()
    state = m.new_state()
    m.run_step(q[:, :, :5], q[:, :, :5], q[:, :, :5], state)
    assert m.last_backend == "chunked" and state.length == 5
    m.run_step(q[:, :, 5:], q[:, :, 5:], q[:, :, 5:], state)
    assert m.last_backend == "recurrent" and state.length == 6 and state.S.dtype == torch.float32


def test_backbone_decoding_equals_forward():
    _, steps, full = backbone_steps_and_forward("retention", {"chunk_size": 3})
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)



def test_reference_equals_flas_naive_retention():
    """fla's conventions, read from fla/ops/retention/naive.py and chunk.py (fla-org/flash-linear-attention):
    scale D^-1/2 on q; decay 1 - 2^(-5-h) for head h = 0..H-1 (chunk_retention: g_gamma = log of that, handed
    to chunk_simple_gla); o_t = sum_{s<=t} gamma^(t-s) (q_t . k_s) v_s, no normaliser; naive_retention is
    head-first (B, H, T, D), the chunk kernels (B, T, H, D). Ours matches all of these, with H_kv = H."""
    naive = fla_naive("ops/retention/naive.py").naive_retention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 37, 16, generator=g, dtype=torch.float64) for _ in range(3))
    assert rel_err(ret("reference")(q, k, v), naive(q, k, v)) < 1e-5  # naive runs in fp32


@pytest.fixture
def fla_stand_in(monkeypatch):
    """A stand-in for fla.ops.simple_gla.chunk_simple_gla following its documented contract ((B, T, H, K) inputs,
    g_gamma (H,) fp32 log decays, fp32 initial state (N, H, K, V), o_t = scale q_t S_t with
    S_t = exp(g_gamma) S_{t-1} + k_t^T v_t), so the fla backend's glue runs on CPU."""
    import sys
    import types

    def chunk_simple_gla(q, k, v, g_gamma, scale, initial_state, output_final_state):
        assert q.shape == k.shape and g_gamma.shape == (q.shape[2],) and g_gamma.dtype == torch.float32
        assert initial_state is None or initial_state.dtype == torch.float32
        B, T, H, K = q.shape
        S = torch.zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state
        outs = []
        for t in range(T):
            S = g_gamma.exp()[:, None, None] * S + k[:, t].float()[..., None] * v[:, t].float()[..., None, :]
            outs.append(scale * (q[:, t].float()[..., None, :] @ S).squeeze(-2))
        return torch.stack(outs, 1).to(q.dtype), None

    ops = types.ModuleType("fla.ops.simple_gla")
    ops.chunk_simple_gla = chunk_simple_gla
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.simple_gla", ops)


@pytest.mark.parametrize("lq", [37, 5])
@pytest.mark.parametrize("gamma", [None, 0.8])
def test_fla_glue_with_a_stand_in_kernel_equals_reference(fla_stand_in, lq, gamma):
    """Layout, the prefix state, and the decay of a GQA group: its key head's, not its query heads' own."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, lq, 8, generator=g)
    k, v = (torch.randn(2, 2, 37, 8, generator=g) for _ in range(2))
    m = ret(gamma=gamma)
    torch.testing.assert_close(m.backend_fla(q, k, v, True), m.backend_reference(q, k, v, True), atol=1e-5, rtol=1e-5)


def test_auto_picks_chunked_for_training_and_the_recurrence_for_decoding():
    q = torch.randn(1, 2, 8, 16)
    m = ret()
    m(q, q, q)
    assert m.last_backend == "chunked"
    m(q.clone().requires_grad_(), q, q)
    assert m.last_backend == "chunked"
    with torch.no_grad():
        m(q[:, :, -2:], q, q)
    assert m.last_backend == "recurrent"
    with pytest.raises(UnsupportedBackend, match="fla.*CUDA"):
        ret("fla")(q, q, q)


def test_flops_count_the_recurrent_form():
    m = ret()
    B, H, Hkv, L, D = 2, 8, 2, 4096, 64
    per_key, per_query = D * D + 2 * D * D, 2 * D * D + D  # decay + outer product; scale + read
    assert m.flops(B, H, L, L, D) == B * H * L * (per_key + per_query)
    assert m.flops(B, H, L, L, D, kv_heads=Hkv) == B * (Hkv * L * per_key + H * L * per_query)
    assert m.mode_flops("forward", B, H, L, D, kv_heads=Hkv) == m.flops(B, H, L, L, D, kv_heads=Hkv)
    assert m.mode_flops("train", B, H, L, D) == 3 * m.flops(B, H, L, L, D)
    decode = B * (Hkv * per_key + H * per_query)  # one key absorbed, one query read: O(1) in L
    assert m.mode_flops("decode", B, H, L, D, kv_heads=Hkv) == m.mode_flops("decode", B, H, 8 * L, D, kv_heads=Hkv) == decode


@pytest.mark.parametrize("params, field", [
    ({"chunk_size": 0}, "chunk_size"),
    ({"gamma": 0.0}, "gamma"),
    ({"gamma": 1.5}, "gamma"),
    ({"gamma": math.nan}, "gamma"),
    ({"gamma": "fast"}, "gamma"),
])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        ret(**params)
    if not isinstance(params.get("gamma"), str):
        with pytest.raises(ValueError, match=field):
            RetentionConfig(**params)


def test_causal_only_and_no_token_inputs():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="bidirectional"):
        ret()(q, q, q, causal=False)
    with pytest.raises(ValueError, match="retention takes token inputs: none; unknown gk"):
        ret()(q, q, q, gk=torch.zeros(1, 2, 5, 8))


def test_listed_with_its_parameters_and_capabilities():
    spec = next(s for s in attn.list_attention() if s["name"] == "retention")
    assert spec["params"] == {"chunk_size": 64, "gamma": None}
    assert [b["name"] for b in spec["backends"]] == ["reference", "chunked", "recurrent", "fla"]
    assert spec["causal"] and not spec["bidirectional"] and spec["decode"] and spec["exact"] is False
    assert attn.build_attention("retention").output_norm
