"""One definition of "correct" for every variant: each backend that can run here equals the variant's
``reference``, computed in fp64, within a tolerance measured from the reference itself.

``attn-bench check`` runs this on a plugin's variants; the built-ins' own tests run it on theirs; and
``tests/test_backends_devices.py`` uses the same tolerance on CUDA. Properties, per backend and device:

- forward, with and without gradients (causal, and bidirectional where the variant supports it), at
  odd lengths below and above typical block sizes, and with fewer queries than keys (bottom-right);
- gradients of q, k, v, where the backend declares ``backward`` on the device;
- each dtype the backend declares, fp32 and bf16 (fp16 too when declared and asked for);
- decoding: the variant's own ``new_state``/``step``, token by token and in chunks, equals one forward (a
  ``dense_prefill`` variant: a forward per step, of its queries over the keys before them);
- grouped-query attention: k, v with H_kv < H heads (a variant without ``supports_gqa`` gets them repeated);
- token inputs (gates, decays) drawn as a fresh layer makes them, with their gradients too.

Tolerance: a backend in a low precision may be off from the fp64 reference by at most 4x what the
reference itself is off when run in that precision on those inputs, or by a floor of 2 unit
roundoffs (fp32: 4 of TF32's, so TF32 kernels pass). The error of each dtype and shape is measured,
not guessed: a bf16 window off by one (3.7e-2 at L=1000) is 8x the 4.6e-3 a bf16 reference makes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attn.attention.base import UnsupportedBackend

FLOOR = {torch.float32: 4 * 2.0**-11, torch.bfloat16: 2 * 2.0**-8, torch.float16: 2 * 2.0**-11, torch.float64: 1e-10}
DECODE_CHUNKS = (1, 1, 3, 1, 5)  # token by token, then chunks: a decode state must accept both
# (B, H, H_kv, Lq, Lk, D): odd lengths below and above 128 (Flex's block), one query, fewer queries than keys,
# and grouped-query attention (H_kv < H; 1 = multi-query) in each of those regimes
SHAPES = ((1, 2, 2, 37, 37, 16), (2, 2, 2, 130, 130, 16), (1, 2, 2, 1, 45, 16), (1, 3, 3, 7, 150, 8),
          (1, 4, 2, 37, 37, 16), (2, 4, 1, 130, 130, 16), (1, 6, 2, 1, 45, 16), (1, 6, 3, 7, 150, 8))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def tolerance(dtype: torch.dtype, baseline: float) -> float:
    """What a backend may be off from the fp64 reference, given the low-precision reference's own error."""
    return max(4 * baseline, FLOOR[dtype])


def mismatches(fast: Any, ref: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, grad: bool,
               seed: int = 1, inputs: dict[str, torch.Tensor] | None = None) -> list[str]:
    """Compare ``fast`` (inputs in q's dtype) with ``ref`` in fp64; return what is off, with the figures.

    The reference also runs in q's dtype: its error at this dtype and shape sets the tolerance. ``inputs``: the
    variant's token inputs (their gradients are compared too).
    """
    dtype, inputs = q.dtype, inputs or {}
    names = ["q", "k", "v", *inputs]
    exact, low, mine = ([t.detach().to(dt).requires_grad_(grad) for t in (q, k, v, *inputs.values())]
                        for dt in (torch.float64, dtype, dtype))
    call = lambda m, ts: m(*ts[:3], causal=causal, **dict(zip(inputs, ts[3:], strict=True)))
    with torch.set_grad_enabled(grad):
        expected, baseline, out = call(ref, exact), call(ref, low), call(fast, mine)
    found = []
    tol = tolerance(dtype, rel_err(baseline, expected))
    if not rel_err(out, expected) <= tol:  # NaN fails too
        found.append(f"output off by {rel_err(out, expected):.2e} (tolerance {tol:.2e})")
    if grad:
        g = torch.Generator(device=q.device).manual_seed(seed)
        dout = torch.randn(expected.shape, device=q.device, generator=g, dtype=torch.float64)
        expected.backward(dout)
        baseline.backward(dout.to(dtype))
        out.backward(dout.to(dtype))
        for name, e, b, a in zip(names, exact, low, mine, strict=True):
            tol = tolerance(dtype, rel_err(b.grad, e.grad))
            if a.grad is None or not rel_err(a.grad, e.grad) <= tol:
                err = "no gradient" if a.grad is None else f"off by {rel_err(a.grad, e.grad):.2e} (tolerance {tol:.2e})"
                found.append(f"d{name} {err}")
    return found


@dataclass(frozen=True)
class Finding:
    """One checked property of one backend: ``ok``, ``mismatch``, or ``skipped`` (with why)."""

    variant: str
    backend: str
    check: str
    status: str
    detail: str = ""


def _inputs(shape: tuple[int, ...], device: str, seed: int,
            token_inputs: tuple = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """q, k, v in fp64 and the variant's token inputs (over the Lk key positions)."""
    from attn.attention.token_inputs import draw_inputs

    B, H, Hkv, lq, lk, D = shape
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, H, lq, D, device=device, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, lk, D, device=device, generator=g, dtype=torch.float64) for _ in range(2))
    extra = draw_inputs(token_inputs, B, Hkv, lk, D, device=device, dtype=torch.float64, generator=g)
    return q, k, v, extra


def check_backend(name: str, params: dict[str, Any], backend: str, device: str = "cpu",
                  dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
                  shapes: tuple[tuple[int, ...], ...] = SHAPES) -> list[Finding]:
    """Every property of one backend against the variant's reference, on ``device``."""
    import attn

    fast = attn.build_attention(name, backend=backend, **params).to(device)
    ref = attn.build_attention(name, backend="reference", **params).to(device)
    info, kind = fast.backend_info(backend), torch.device(device).type
    directions = [c for c, ok in ((True, fast.supports_causal), (False, fast.supports_bidirectional)) if ok]
    out = []
    for dtype in dtypes:
        dt = str(dtype).removeprefix("torch.")
        for shape in shapes:
            # fresh modules per shape: one module serves one head count (a variant may size parameters by it at
            # its first call, as sink logits do)
            fast = attn.build_attention(name, backend=backend, **params).to(device)
            ref = attn.build_attention(name, backend="reference", **params).to(device)
            decode_shape = shape[3] < shape[4]
            mode = "decode" if decode_shape else "forward"
            runs = [(mode, False)] + ([("backward", True)] if not decode_shape else [])
            for causal in directions if not decode_shape else [c for c in directions if c]:
                for run_mode, grad in runs:
                    label = (f"{run_mode}{' (grad)' if grad else ''} {dt} {'causal' if causal else 'bidirectional'} "
                             f"B={shape[0]} H={shape[1]} H_kv={shape[2]} Lq={shape[3]} Lk={shape[4]} D={shape[5]}")
                    why = info.why_not(kind, dtype, run_mode)
                    if why:
                        out.append(Finding(name, backend, label, "skipped", why))
                        continue
                    q, k, v, extra = _inputs(shape, device, sum(shape), fast.token_inputs)
                    q, k, v = (t.to(dtype) for t in (q, k, v))
                    try:
                        found = mismatches(fast, ref, q, k, v, causal, grad, inputs=extra)
                    except UnsupportedBackend as e:
                        out.append(Finding(name, backend, label, "skipped", str(e)))
                        continue
                    except Exception as e:  # noqa: BLE001 -- a crash is a finding, not the checker's failure
                        found = [f"raised {type(e).__name__}: {' '.join(str(e).split())[:200]}"]
                    if not found and fast.last_backend != backend:
                        found = [f"ran {fast.last_backend!r} instead"]
                    out.append(Finding(name, backend, label, "mismatch" if found else "ok", "; ".join(found)))
    return out


def check_decode(name: str, params: dict[str, Any], device: str = "cpu", length: int = 11) -> list[Finding]:
    """The variant's own decoding state (``new_state``/``step``), in ``DECODE_CHUNKS``, equals one causal forward,
    with as many key heads as query heads and with grouped keys (4 query heads, 2 key heads)."""
    import attn

    m = attn.build_attention(name, **params).to(device)
    if not (m.supports_decode and m.supports_causal):
        return [Finding(name, "decode state", "new_state/step", "skipped", "the variant does not decode")]
    found = []
    for heads in ((2, 2), (4, 2)):
        try:  # a fresh module per head count, as in check_backend
            m = attn.build_attention(name, **params).to(device)
            found.append(_check_decode_once(m, name, params, device, length, heads))
        except Exception as e:  # noqa: BLE001 -- a crash is a finding, not the checker's failure
            found.append(Finding(name, "decode state", f"new_state/step, H={heads[0]} H_kv={heads[1]}", "mismatch",
                                 f"raised {type(e).__name__}: {' '.join(str(e).split())[:200]}"))
    return found


def _check_decode_once(m: Any, name: str, params: dict[str, Any], device: str, length: int,
                       heads: tuple[int, int]) -> Finding:
    import attn
    from attn.attention.token_inputs import sliced

    q, k, v, extra = _inputs((2, *heads, length, length, 16), device, 7, m.token_inputs)
    ref = attn.build_attention(name, backend="reference", **params).to(device)
    with torch.no_grad():
        expected = ref(q, k, v, causal=True, **extra)
        if m.dense_prefill:  # a step equals a forward of its queries over the keys before them (Quest)
            ends = [e for e in torch.tensor(DECODE_CHUNKS).cumsum(0).tolist() if e < length] + [length]
            expected = torch.cat([ref(q[:, :, a:e], k[:, :, :e], v[:, :, :e], causal=True, **sliced(extra, 0, e))
                                  for a, e in zip([0, *ends[:-1]], ends, strict=True)], 2)
        state, outs, t = m.start_state(length), [], 0
        for n in DECODE_CHUNKS:
            outs.append(m.run_step(q[:, :, t: t + n], k[:, :, t: t + n], v[:, :, t: t + n], state,
                                   **sliced(extra, t, t + n)))
            t += n
        if t < length:
            outs.append(m.run_step(q[:, :, t:], k[:, :, t:], v[:, :, t:], state, **sliced(extra, t)))
        got = torch.cat(outs, dim=2)
    err = rel_err(got, expected)
    ok = err <= FLOOR[torch.float64] * 1e3
    steps = "+".join(map(str, DECODE_CHUNKS))
    return Finding(name, "decode state", f"new_state/step in steps of {steps}+rest vs one forward, fp64, "
                   f"H={heads[0]} H_kv={heads[1]}", "ok" if ok else "mismatch",
                   "" if ok else f"off from one forward by {err:.2e}")


def check_layer(name: str, params: dict[str, Any], device: str = "cpu", length: int = 11) -> list[Finding]:
    """A layer-level variant (one that owns its projections: MLA) in a 2-layer fp64 backbone with RoPE: decoding
    through the layer's own cache, in ``DECODE_CHUNKS``, equals one forward (for MLA: the absorbed form against the
    expanded one)."""
    import attn
    from attn.registry import ATTENTION

    if getattr(ATTENTION.get(name).cls, "layer", None) is None:
        return []
    what = f"backbone decode in steps of {'+'.join(map(str, DECODE_CHUNKS))}+rest vs one forward, fp64, rope"
    try:
        torch.manual_seed(0)
        config = attn.TransformerConfig(d_model=32, n_heads=2, n_layers=2, position="rope", attention=name,
                                        attention_params=params)
        model = attn.Transformer(config).to(device, torch.float64).eval()
        idx = torch.randint(0, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(7)).to(device)
        with torch.no_grad():
            expected, state, outs, t = model(idx), model.init_state(2, length), [], 0
            for n in [*DECODE_CHUNKS, length]:
                if t < length:
                    outs.append(model(idx[:, t:t + n], state=state))
                    t += n
        err = rel_err(torch.cat(outs, 1), expected)
    except Exception as e:  # noqa: BLE001 -- a crash is a finding, not the checker's failure
        return [Finding(name, "layer", what, "mismatch", f"raised {type(e).__name__}: {' '.join(str(e).split())[:200]}")]
    ok = err <= FLOOR[torch.float64] * 1e3
    return [Finding(name, "layer", what, "ok" if ok else "mismatch", "" if ok else f"off from one forward by {err:.2e}")]


def check_variant(name: str, params: dict[str, Any] | None = None, device: str = "cpu",
                  dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)) -> list[Finding]:
    """Every backend of a variant that is not its reference, plus its decoding state."""
    import attn

    params = params or {}
    module = attn.build_attention(name, **params)
    findings = []
    for b in module.backends:
        if b.name == "reference":
            continue
        if torch.device(device).type not in b.devices:
            findings.append(Finding(name, b.name, "all", "skipped", f"no {torch.device(device).type} support declared"))
            continue
        findings += check_backend(name, params, b.name, device, dtypes)
    return findings + check_decode(name, params, device) + check_layer(name, params, device)


__all__ = ["DECODE_CHUNKS", "FLOOR", "Finding", "SHAPES", "check_backend", "check_decode", "check_layer", "check_variant",
           "mismatches",
           "rel_err", "tolerance"]
