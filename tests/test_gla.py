"""`gla` (Gated Linear Attention): the reference equals the paper's recurrence written out in float64, the chunked
and recurrent forms equal the reference (gradients of q, k, v and the gate gk too) from weak decays to decays far
beyond what a factorised chunk survives, decoding equals one forward, and the conventions match
flash-linear-attention's."""
import math

import pytest
import torch
import torch.nn.functional as F
from definitions import backbone_steps_and_forward, decode_in_chunks, fla_naive
from hypothesis import given
from hypothesis import strategies as st

import attn
from attn.attention import gla as gla_module
from attn.attention.base import UnsupportedBackend
from attn.attention.gla import GLAConfig
from attn.checks import check_variant

pytestmark = pytest.mark.usefixtures("one_thread")


def gla(backend="auto", **params):
    return attn.build_attention("gla", backend=backend, **params)


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-30) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm().clamp_min(floor))


def paper_recurrence(q, k, v, gk):
    """GLA's recurrent form in float64, token by token: S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t,
    o_t = q_t S_t / sqrt(D); query head i reads key head i // (H / H_kv) and its gates. The queries are the last Lq
    positions."""
    q, k, v, gk = q.double(), k.double(), v.double(), gk.double()
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        kh = h // (H // Hkv)
        S = torch.zeros(B, D, v.shape[-1], dtype=torch.float64)
        for t in range(Lk):
            S = torch.exp(gk[:, kh, t, :, None]) * S + k[:, kh, t, :, None] * v[:, kh, t, None, :]
            if t >= Lk - Lq:
                out[:, h, t - (Lk - Lq)] = (q[:, h, t - (Lk - Lq), :, None] * S).sum(-2) / math.sqrt(D)
    return out


# log decays per token: a fresh layer's (logsigmoid(x) / 16), an unnormalised logsigmoid, ~-20 (the state forgets
# everything each token; a factorised chunk would overflow), and a mix over channels and time
STRENGTHS = {
    "layer": lambda x: F.logsigmoid(x) / 16,
    "logsigmoid": F.logsigmoid,
    "strong": lambda x: F.logsigmoid(x - 20),
    "mixed": lambda x: F.logsigmoid(x - 20 * (torch.rand(x.shape, generator=torch.Generator().manual_seed(1)) < 0.3)),
}


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("lq, lk", [(9, 9), (3, 9), (1, 1), (1, 6)])
@pytest.mark.parametrize("strength", ["logsigmoid", "strong"])
def test_reference_equals_the_papers_recurrence(heads, lq, lk, strength):
    g = torch.Generator().manual_seed(lq + lk)
    H, Hkv = heads
    q = torch.randn(2, H, lq, 8, generator=g, dtype=torch.float64)
    k, v, raw = (torch.randn(2, Hkv, lk, 8, generator=g, dtype=torch.float64) for _ in range(3))
    gk = STRENGTHS[strength](raw)
    out = gla("reference")(q, k, v, causal=True, gk=gk)
    torch.testing.assert_close(out, paper_recurrence(q, k, v, gk), atol=1e-12, rtol=1e-12)


@st.composite
def qkv(draw, max_len=130):
    B, Hkv, groups = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 3]))
    D = draw(st.sampled_from([1, 4, 8, 16]))
    lk = draw(st.sampled_from([1, 2, 63, 64, 65])) if draw(st.booleans()) else draw(st.integers(1, max_len))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(B, Hkv * groups, lq, D, generator=g).to(dtype)
    k, v, raw = (torch.randn(B, Hkv, lk, D, generator=g) for _ in range(3))
    gk = STRENGTHS[draw(st.sampled_from(sorted(STRENGTHS)))](raw)
    return q, k.to(dtype), v.to(dtype), gk.to(dtype), dtype


@given(qkv(), st.integers(1, 70))
def test_chunked_and_recurrent_equal_reference_with_gradients(inputs, chunk):
    q, k, v, gk, dtype = inputs
    leaves = [t.requires_grad_() for t in (q, k, v, gk)]
    exact = [t.detach().double().requires_grad_() for t in leaves]  # the truth: the reference in float64
    ref = gla("reference")(*exact[:3], causal=True, gk=exact[3])
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = torch.autograd.grad(ref, exact, grad)
    grad = grad.to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for backend in ("chunked", "recurrent"):
        out = gla(backend, chunk_size=chunk)(q, k, v, causal=True, gk=gk)
        assert out.dtype == dtype and out.shape == q.shape[:3] + v.shape[3:] and torch.isfinite(out).all()
        assert rel_err(out, ref, floor=1e-6) < tol, backend
        for name, a, b in zip(["q", "k", "v", "gk"], torch.autograd.grad(out, leaves, grad), expected, strict=True):
            assert torch.isfinite(a).all() and rel_err(a, b, floor=1.0) < tol, (backend, name)


def test_strong_decays_need_the_safe_path(monkeypatch):
    """Decays of logsigmoid(-20) per token: factorising the whole chunk, exp(b_i) exp(-b_j), overflows (shown by
    forcing it); the chunked form factorises the weak chunks, takes the sub-blocked path for the strong ones, and
    equals the float64 recurrence, gradients included."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 96, 16, generator=g) for _ in range(3))
    gk = F.logsigmoid(torch.randn(1, 2, 96, 16, generator=g)) / 16
    gk[:, :, 40:70] = F.logsigmoid(torch.randn(1, 2, 30, 16, generator=g) - 20)  # chunks 1 and 2 of 3 are strong
    gk.requires_grad_()
    m = gla("chunked", chunk_size=32)
    out = m(q, k, v, causal=True, gk=gk)
    assert rel_err(out, paper_recurrence(q, k, v, gk.detach())) < 1e-5
    (dgk,) = torch.autograd.grad(out.square().sum(), gk)
    gk64 = gk.detach().double().requires_grad_()
    ref = gla("reference")(q.double(), k.double(), v.double(), causal=True, gk=gk64)
    (expected,) = torch.autograd.grad(ref.square().sum(), gk64)
    assert rel_err(dgk, expected) < 1e-4
    monkeypatch.setattr(gla_module, "SAFE_LOG_RANGE", math.inf)  # factorise every chunk
    with torch.no_grad():
        assert not torch.isfinite(m(q, k, v, causal=True, gk=gk)).all()


def test_equivalence_checker_finds_no_mismatch():
    findings = check_variant("gla", {"chunk_size": 16})
    assert not [f for f in findings if f.status == "mismatch"], [f for f in findings if f.status == "mismatch"]
    assert {f.backend for f in findings if f.status == "ok"} == {"chunked", "recurrent", "decode state"}


@pytest.mark.parametrize("chunks", [[1] * 23, [5, 1, 7, 8], [23], [2, 9, 1]])
@pytest.mark.parametrize("strength", ["layer", "mixed"])
def test_decoding_in_chunks_equals_one_forward_with_a_constant_state(chunks, strength):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 23, 8, generator=g)
    k, v, raw = (torch.randn(2, 2, 23, 8, generator=g) for _ in range(3))
    gk = STRENGTHS[strength](raw)
    m = gla(chunk_size=4)
    sizes = []
    got = decode_in_chunks(m, q, k, v, chunks, on_step=lambda s: sizes.append(s.nbytes()), inputs={"gk": gk})
    torch.testing.assert_close(got, m(q, k, v, causal=True, gk=gk), atol=1e-5, rtol=1e-5)
    assert set(sizes) == {2 * 2 * 8 * 8 * 4}  # (B, H_kv, D, D) fp32, at every length


def test_backbone_projects_the_gate_and_decodes_equal_to_forward():
    model, steps, full = backbone_steps_and_forward("gla", {"chunk_size": 3})
    assert "gk" in model.blocks[0].attn.inputs
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)



def test_reference_equals_flas_naive_recurrent_gla():
    """fla's conventions, read from fla/ops/gla/naive.py and chunk.py (fla-org/flash-linear-attention): (B, T, H, K)
    layout; scale K^-1/2 on q; h_t = h_{t-1} * exp(gk_t)[:, None] + k_t^T v_t (the decay acts on the key
    channel, a row of the K x V state); o_t = (q_t scale) h_t, no normaliser; the GLA layer makes
    gk = logsigmoid(gk_proj(x)) / 16. Ours matches these, in (B, H, T, K), with H_kv = H."""
    naive = fla_naive("ops/gla/naive.py").naive_recurrent_gla
    g = torch.Generator().manual_seed(0)
    q, k, v, raw = (torch.randn(2, 4, 37, 16, generator=g, dtype=torch.float64) for _ in range(4))
    gk = F.logsigmoid(raw)
    expected, _ = naive(*(x.transpose(1, 2) for x in (q, k, v, gk)))  # naive runs in fp32
    assert rel_err(gla("reference")(q, k, v, gk=gk), expected.transpose(1, 2)) < 1e-5


@pytest.fixture
def fla_stand_in(monkeypatch):
    """A stand-in for fla.ops.gla.chunk_gla following its documented contract ((B, T, H, K) inputs with
    q.shape == k.shape == g.shape, fp32 initial state (N, H, K, V), h_t = h_{t-1} exp(g_t) + k_t^T v_t,
    o_t = scale q_t h_t), so the fla backend's glue runs on CPU."""
    import sys
    import types

    def chunk_gla(q, k, v, g, scale, initial_state, output_final_state):
        assert q.shape == k.shape == g.shape and g.dtype == torch.float32
        assert initial_state is None or initial_state.dtype == torch.float32
        B, T, H, K = q.shape
        S = torch.zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state
        outs = []
        for t in range(T):
            S = g[:, t].exp()[..., None] * S + k[:, t].float()[..., None] * v[:, t].float()[..., None, :]
            outs.append(scale * (q[:, t].float()[..., None, :] @ S).squeeze(-2))
        return torch.stack(outs, 1).to(q.dtype), None

    ops = types.ModuleType("fla.ops.gla")
    ops.chunk_gla = chunk_gla
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.gla", ops)


@pytest.mark.parametrize("lq", [37, 5])
def test_fla_glue_with_a_stand_in_kernel_equals_reference(fla_stand_in, lq):
    """Layout, the prefix state, and a GQA group's gates: its key head's."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, lq, 8, generator=g)
    k, v, raw = (torch.randn(2, 2, 37, 8, generator=g) for _ in range(3))
    gk = F.logsigmoid(raw)
    m = gla()
    torch.testing.assert_close(m.backend_fla(q, k, v, True, gk), m.backend_reference(q, k, v, True, gk),
                               atol=1e-5, rtol=1e-5)


def test_gate_is_required_and_checked_per_key_head():
    q, k = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8)
    m = gla()
    with pytest.raises(ValueError, match="gla takes token inputs: gk; missing gk"):
        m(q, k, k)
    with pytest.raises(ValueError, match=r"'gk' must be \(B, H_kv, L, width\) = \(1, 2, 6, 8\)"):
        m(q, k, k, gk=torch.zeros(1, 4, 6, 8))  # per query head: gates belong to key heads
    with pytest.raises(ValueError, match="missing gk"):
        m.run_step(q, k, k, m.new_state())
    with pytest.raises(ValueError, match="bidirectional"):
        m(q, k, k, causal=False, gk=torch.zeros(1, 2, 6, 8))


def test_the_gate_activation_is_flas():
    spec = gla().token_inputs[0]
    x = torch.randn(50)
    assert spec.name == "gk" and spec.width is None  # one decay per key channel
    torch.testing.assert_close(spec.activation(x), F.logsigmoid(x) / 16)
    assert (spec.draw(1, 2, 30, 8) <= 0).all()


def test_auto_picks_chunked_for_training_and_the_recurrence_for_decoding():
    q, gk = torch.randn(1, 2, 8, 16), torch.full((1, 2, 8, 16), -0.1)
    m = gla()
    m(q, q, q, gk=gk)
    assert m.last_backend == "chunked"
    m(q.clone().requires_grad_(), q, q, gk=gk)
    assert m.last_backend == "chunked"
    with torch.no_grad():
        m(q[:, :, -2:], q, q, gk=gk)
    assert m.last_backend == "recurrent"
    with pytest.raises(UnsupportedBackend, match="fla.*CUDA"):
        gla("fla")(q, q, q, gk=gk)


def test_flops_count_the_recurrent_form():
    m = gla()
    B, H, Hkv, L, D = 2, 8, 2, 4096, 64
    per_key, per_query = D + D * D + 2 * D * D, 2 * D * D + D  # exp(g), decay, outer product; scale, read
    assert m.flops(B, H, L, L, D) == B * H * L * (per_key + per_query)
    assert m.flops(B, H, L, L, D, kv_heads=Hkv) == B * (Hkv * L * per_key + H * L * per_query)
    assert m.mode_flops("train", B, H, L, D, kv_heads=Hkv) == 3 * m.flops(B, H, L, L, D, kv_heads=Hkv)
    decode = B * (Hkv * per_key + H * per_query)  # one key absorbed, one query read: O(1) in L
    assert m.mode_flops("decode", B, H, L, D, kv_heads=Hkv) == m.mode_flops("decode", B, H, 8 * L, D, kv_heads=Hkv) == decode


@pytest.mark.parametrize("value", [0, -3, "big"])
def test_bad_chunk_size_names_the_field(value):
    with pytest.raises(ValueError, match="chunk_size"):
        gla(chunk_size=value)
    if not isinstance(value, str):
        with pytest.raises(ValueError, match="chunk_size"):
            GLAConfig(chunk_size=value)


def test_listed_with_its_parameters_and_capabilities():
    spec = next(s for s in attn.list_attention() if s["name"] == "gla")
    assert spec["params"] == {"chunk_size": 64} and spec["token_inputs"] == ["gk"]
    assert [b["name"] for b in spec["backends"]] == ["reference", "chunked", "recurrent", "fla"]
    assert spec["causal"] and not spec["bidirectional"] and spec["decode"] and spec["exact"] is False
    assert attn.build_attention("gla").output_norm
