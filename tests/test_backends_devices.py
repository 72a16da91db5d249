"""Every backend, on every device it claims, against its variant's reference.

On this CPU-only CI the CUDA half is skipped and the other half checks that every CUDA-only
backend refuses with a reason (which the harness records as `unsupported`), never a crash.
`scripts/gpu_check.sh` runs this same file on a GPU machine, where the CUDA half runs.
"""
import pytest
import torch

import attn
from attn.attention.base import UnsupportedBackend

# Parameters at which each built-in variant has structure at the test lengths.
PARAMS = {
    "sliding_window": {"window": 256},
    "block_sparse": {"block_size": 64, "local_blocks": 2, "global_blocks": 1, "random_blocks": 1},
    "linear": {},
}
CUDA = torch.cuda.is_available()
TOL = {torch.float32: 2e-3, torch.bfloat16: 3e-2, torch.float16: 1e-2}  # rel. L2 error vs fp32 reference


def backend_cases(device: str):
    for spec in attn.list_attention():
        for b in spec["backends"]:
            if b["name"] != "reference" and device in b["devices"]:
                yield pytest.param(spec["name"], b["name"], b["devices"][device], id=f"{spec['name']}-{b['name']}")


def cuda_only_backends():
    for spec in attn.list_attention():
        for b in spec["backends"]:
            if "cpu" not in b["devices"]:
                yield pytest.param(spec["name"], b["name"], id=f"{spec['name']}-{b['name']}")


@pytest.mark.skipif(CUDA, reason="checks the CPU refusal path")
@pytest.mark.parametrize("name, backend", list(cuda_only_backends()))
def test_cuda_only_backends_refuse_on_cpu_with_a_reason(name, backend):
    m = attn.build_attention(name, backend=backend, **PARAMS.get(name, {}))
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(UnsupportedBackend, match=r"\w+"):
        m(q, q, q)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
@pytest.mark.parametrize("name, backend, modes", list(backend_cases("cuda")))
def test_cuda_backend_matches_reference(name, backend, modes, dtype, causal):
    params = PARAMS.get(name, {})
    fast = attn.build_attention(name, backend=backend, **params).cuda()
    ref = attn.build_attention(name, backend="reference", **params).cuda()
    spec = next(s for s in attn.list_attention() if s["name"] == name)
    if not spec["causal" if causal else "bidirectional"]:
        pytest.skip("mode not supported by the variant")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 1000, 64, device="cuda", generator=g) for _ in range(3))
    try:
        q_, k_, v_ = (t.to(dtype).requires_grad_("backward" in modes) for t in (q, k, v))
        out = fast(q_, k_, v_, causal=causal)
    except UnsupportedBackend as e:
        pytest.skip(str(e))
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q_, k_, v_))
    expected = ref(q32, k32, v32, causal=causal)
    assert fast.last_backend == backend
    assert rel_err(out, expected) < TOL[dtype]
    if "backward" in modes:
        grad = torch.randn_like(expected)
        out.backward(grad.to(dtype))
        expected.backward(grad)
        for a, b in [(q_, q32), (k_, k32), (v_, v32)]:
            assert rel_err(a.grad, b.grad) < 2 * TOL[dtype]
    if "decode" in modes and causal:
        with torch.no_grad():
            out = fast(q_[:, :, -7:].detach(), k_.detach(), v_.detach(), causal=True)
            exp = ref(q32[:, :, -7:].detach(), k32.detach(), v32.detach(), causal=True)
        assert rel_err(out, exp) < TOL[dtype]
