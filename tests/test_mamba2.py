"""`mamba2` (Mamba-2's SSD): the reference equals the recurrence written out in float64, the chunked and recurrent forms
equal the reference (gradients of q, k, v, dt and the learned A and D too), decoding equals one forward, the FLOP count
matches a hand count, and the backbone trains A and D from the start."""
import pytest
import torch
from definitions import backbone_steps_and_forward
from hypothesis import given
from hypothesis import strategies as st

import attn
from attn.attention.decay_rate import step_size

pytestmark = pytest.mark.usefixtures("one_thread")


def mamba2(backend="auto", **params):
    return attn.build_attention("mamba2", backend=backend, **params)


def rel_err(a, b, floor=1e-30):
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm().clamp_min(floor))


def ssd_recurrence(q, k, v, dt, A, D):
    """h_t = exp(dt_t A) h_{t-1} + dt_t k_t^T v_t, y_t = q_t h_t + D v_t, token by token in float64, per query head
    reading key head h // (H / H_kv); the queries are the last Lq positions."""
    q, k, v, dt, A, D = (x.double() for x in (q, k, v, dt, A, D))
    B, H, Lq, _ = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        kh = h // (H // Hkv)
        S = torch.zeros(B, k.shape[-1], v.shape[-1], dtype=torch.float64)
        for t in range(Lk):
            a = torch.exp(dt[:, kh, t, 0] * A[kh])[:, None, None]
            S = a * S + dt[:, kh, t, 0, None, None] * k[:, kh, t, :, None] * v[:, kh, t, None, :]
            if t >= Lk - Lq:
                out[:, h, t - (Lk - Lq)] = (q[:, h, t - (Lk - Lq), :, None] * S).sum(-2) + D[kh] * v[:, kh, t]
    return out


def inputs(B, H, Hkv, lq, lk, D, seed, dtype=torch.float64, scale=0.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, lq, D, generator=g, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(B, Hkv, lk, D, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    dt = step_size(torch.randn(B, Hkv, lk, 1, generator=g, dtype=torch.float64) + scale).to(dtype)
    return q, k, v, dt


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("lq, lk", [(9, 9), (3, 9), (1, 1)])
@pytest.mark.parametrize("dt_shift", [0.0, 6.0], ids=["fresh", "strong"])  # strong: dt ~ 6, decays e^-6A per token
def test_reference_equals_the_ssd_recurrence(heads, lq, lk, dt_shift):
    H, Hkv = heads
    q, k, v, dt = inputs(2, H, Hkv, lq, lk, 8, lq + lk, scale=dt_shift)
    m = mamba2("reference").double()
    out = m(q, k, v, causal=True, dt=dt)
    A, D = -m.A_log.double().exp(), m.D.double()  # the weights are made at the first call, in fp32
    torch.testing.assert_close(out, ssd_recurrence(q, k, v, dt, A.detach(), D.detach()), atol=1e-12, rtol=1e-12)


@st.composite
def cases(draw):
    Hkv, groups = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    lk = draw(st.sampled_from([1, 63, 64, 65])) if draw(st.booleans()) else draw(st.integers(1, 100))
    lq = draw(st.integers(1, lk)) if draw(st.booleans()) else lk
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    shift = draw(st.sampled_from([0.0, 3.0]))
    return (*inputs(draw(st.integers(1, 2)), Hkv * groups, Hkv, lq, lk, draw(st.sampled_from([4, 16])),
                    draw(st.integers(0, 2**16)), dtype, shift), dtype, draw(st.integers(1, 70)))


@given(cases())
def test_chunked_and_recurrent_equal_reference_with_gradients(case):
    q, k, v, dt, dtype, chunk = case
    ref = mamba2("reference").double()
    leaves = [t.requires_grad_() for t in (q, k, v, dt)]
    exact = [t.detach().double().requires_grad_() for t in leaves]
    expected_out = ref(*exact[:3], causal=True, dt=exact[3])
    grad = torch.randn(expected_out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = torch.autograd.grad(expected_out, [*exact, ref.A_log, ref.D], grad)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for backend in ("chunked", "recurrent"):
        m = mamba2(backend, chunk_size=chunk)
        out = m(q, k, v, causal=True, dt=dt)
        assert out.dtype == dtype and out.shape == q.shape and torch.isfinite(out).all()
        assert rel_err(out, expected_out, floor=1e-6) < tol, backend
        got = torch.autograd.grad(out, [*leaves, m.A_log, m.D], grad.to(dtype))
        for name, a, b in zip(["q", "k", "v", "dt", "A_log", "D"], got, expected, strict=True):
            assert torch.isfinite(a).all() and rel_err(a, b, floor=1.0) < tol, (backend, name)


def test_decoding_equals_one_forward_in_the_backbone_and_A_D_train_from_the_start():
    model, stepped, full = backbone_steps_and_forward("mamba2", {})
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
    layer = model.blocks[0].attn.attn
    names = {n for n, _ in model.named_parameters()}
    assert layer.A_log is not None and "blocks.0.attn.attn.A_log" in names and "blocks.0.attn.attn.D" in names
    assert layer.A_log.shape == (model.config.num_kv_heads,)
    torch.testing.assert_close(-layer.A_log.exp(), -torch.linspace(1, 16, model.config.num_kv_heads))


def test_flops_are_the_recurrence_counted_by_hand():
    D, Hkv, H, L = 16, 2, 4, 10
    per_key = 2 + D + D * D + 2 * D * D  # exp(dt A); k dt; decay S; add (k dt)^T v
    per_query = 2 * D * D + 2 * D  # q S; + D v
    assert mamba2().flops(3, H, L, L, D, kv_heads=Hkv) == 3 * (Hkv * L * per_key + H * L * per_query)
    assert mamba2().mode_flops("decode", 1, H, 65536, D, kv_heads=Hkv) == Hkv * per_key + H * per_query
