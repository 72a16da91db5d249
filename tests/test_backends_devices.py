"""Every backend, on every device it claims, against its variant's reference.

On this CPU-only CI the CUDA half is skipped and the other half checks that every CUDA-only
backend refuses with a reason (which the harness records as `unsupported`), never a crash, and that
the tolerance rule rejects a planted off-by-one window. `scripts/gpu_check.sh` runs this same file on
a GPU machine, where the CUDA half runs: each fast backend with gradients, without them (the graphs
and kernels a timed forward cell runs), and decoding, in fp32 and bf16.

Tolerance: attn.checks' (the one `attn-bench check` and the built-ins' tests use): a fast backend in a
low precision may be off from the fp64 reference by at most 4x what the reference itself is off when
run in that precision at that length (or a floor of 2 unit roundoffs; in fp32 4 of TF32's). The error
of the dtype and the length is measured, not guessed: a bf16 window off by one (3.7e-2 at L=1000) is
8x the 4.6e-3 a bf16 reference makes, where the old fixed bf16 tolerance of 3e-2 let it through.

``ATTN_BENCH_REQUIRE_BACKENDS=xformers,fla`` (set by gpu_check.sh for the wheels it carried) turns
"skipped: cannot run here" into a failure for those backends, so a carried wheel that does not work
cannot pass silently.
"""
import os

import pytest
import torch

import attn
from attn.attention.base import UnsupportedBackend
from attn.attention.token_inputs import draw_inputs
from attn.checks import mismatches  # the one definition of "close enough" (tolerance and figures)

# Parameters at which each built-in variant has structure at the test lengths.
PARAMS = {
    "sliding_window": {"window": 256},
    "block_sparse": {"block_size": 64, "local_blocks": 2, "global_blocks": 1, "random_blocks": 1},
    "linear": {},
}
CUDA = torch.cuda.is_available()
LENGTH, DECODE_QUERIES = 1000, 7
# variants whose reference is a token-by-token loop (the delta rule) or (L, L, D) decays (GLA): a shorter sequence keeps the
# fp64 reference and its backward to seconds; still several chunks long
SHORT = {"gated_deltanet": 160, "gla": 160}  # gla: its dense reference holds (L, L, D) per-channel decays


def required_backends() -> set[str]:
    return {b.strip() for b in os.environ.get("ATTN_BENCH_REQUIRE_BACKENDS", "").split(",") if b.strip()}


def decode_mismatches(fast, ref, q, k, v, inputs=None) -> list[str]:
    """The last few queries against every key (bottom-right aligned), without gradients."""
    return mismatches(fast, ref, q[:, :, -DECODE_QUERIES:], k, v, causal=True, grad=False, inputs=inputs)


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
    extra = draw_inputs(m.token_inputs, 1, 2, 8, 16)  # gates of the gated linear family
    with pytest.raises(UnsupportedBackend, match=r"\w+"):
        m(q, q, q, **extra)


def qkv(device: str, length: int = LENGTH):
    g = torch.Generator(device=device).manual_seed(0)
    return [torch.randn(2, 4, length, 64, device=device, generator=g) for _ in range(3)]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs CUDA"))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("window", [255, 257])
def test_the_tolerance_rejects_a_window_off_by_one(device, dtype, window):
    """A planted bug the check must catch: a window of 255 or 257 posing as a fast backend for 256.
    The same rule accepts a real fast backend (`blocked`) in that dtype."""
    q, k, v = qkv(device)
    ref = attn.build_attention("sliding_window", backend="reference", window=256).to(device)
    planted = attn.build_attention("sliding_window", backend="reference", window=window).to(device)
    blocked = attn.build_attention("sliding_window", backend="blocked", window=256).to(device)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    for causal in (True, False):
        assert mismatches(planted, ref, q, k, v, causal, grad=False), "an off-by-one window passed"
        assert not mismatches(blocked, ref, q, k, v, causal, grad=False)


# Cheapest first: torch's own kernels, then xformers (no compile), fla (Triton compiles), Flex (Inductor
# compiles, forward and backward), so a GPU run cut at its cap drops the fewest cases; what it dropped,
# gpu_check.sh lists (scripts/pytest_unrun.py).
COST = {"xformers": 1, "fla": 2, "flex": 3}


def device_cases():
    for device in ["cpu", "cuda"] if CUDA else ["cpu"]:
        for case in sorted(backend_cases(device), key=lambda c: COST.get(c.values[1], 0)):
            yield pytest.param(device, *case.values, id=f"{device}-{case.id}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
@pytest.mark.parametrize("device, name, backend, modes", list(device_cases()))
def test_backend_matches_reference(device, name, backend, modes, dtype, causal):
    """The same body on every device: CI runs it on CPU, gpu_check.sh on CUDA."""
    spec = next(s for s in attn.list_attention() if s["name"] == name)
    if not spec["causal" if causal else "bidirectional"]:
        pytest.skip("mode not supported by the variant")
    params = PARAMS.get(name, {})
    fast = attn.build_attention(name, backend=backend, **params).to(device)
    ref = attn.build_attention(name, backend="reference", **params).to(device)
    b = next(b for b in fast.backends if b.name == backend)
    required = backend in required_backends()
    if dtype not in b.dtypes:
        pytest.skip(f"{backend} declares no {dtype}")
    why = b.requires() if b.requires else None
    if why:
        (pytest.fail if required else pytest.skip)(f"{backend}: {why}")
    q, k, v = (t.to(dtype) for t in qkv(device, SHORT.get(name, LENGTH)))
    extra = draw_inputs(fast.token_inputs, *k.shape, device=device, dtype=torch.float64,
                        generator=torch.Generator(device=device).manual_seed(1))  # the gated family's gates
    runs = [("forward", False, False)]
    if "backward" in modes:
        runs.append(("backward", True, False))
    if "decode" in modes and causal:
        runs.append(("decode", False, True))
    found = []
    for mode, grad, decode in runs:
        try:
            found += (decode_mismatches(fast, ref, q, k, v, extra) if decode
                      else mismatches(fast, ref, q, k, v, causal, grad, inputs=extra))
        except UnsupportedBackend as e:
            if required:
                found.append(f"{mode}: refused although its wheel was carried: {e}")
            else:
                pytest.skip(f"{mode}: {e}")
        else:
            assert fast.last_backend == backend, mode
    assert not found, "; ".join(found)
