"""The correctness gate: before a cell is timed, its backend's output on the cell's own inputs (and, training, its
gradients) against the same variant's ``reference`` backend, at the tolerance ``attn-bench check`` uses
(attn.checks: fp64 reference, 4x what the reference itself is off in the cell's dtype, or a floor). A cell that
differs is recorded ``mismatch`` and never timed -- FlashInfer's ``--refcheck``, fla's ``verify.py``.

The reference is dense and runs in fp64, so the gate takes the first ``tokens`` tokens of the cell's inputs (1024 by
default): a prefix is a problem of its own (causal, its outputs are the first rows of the whole call's), and the
block, chunk and window boundaries of the built-in backends' default layouts fall inside it. A decoding cell prefills that many
tokens of its shape into the variant's own state, takes one step of its new tokens and compares them with the
reference's bottom rows over every key. In a ``--base`` run each side saves its output; the side measured second
(head) compares its own with the base's on the same inputs and dtype, at the same tolerance.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from attn.attention.base import UnsupportedBackend

GATE_TOKENS = 1024


@dataclass(frozen=True)
class GateOptions:
    """What the driver asks of one cell's gate (sent to the worker as a dict)."""

    tokens: int = GATE_TOKENS
    save: str | None = None  # where this side writes its output on the gate's inputs
    against: str | None = None  # the other side's output, compared with this side's when it exists

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _build(cell: Any, backend: str, device: torch.device) -> Any:
    import attn

    torch.manual_seed(0)  # a variant with parameters (sink logits) gets the same ones on both sides
    return attn.build_attention(cell.variant, backend=backend, **cell.variant_params).to(device)


def _verdict(found: list[str], n: int, out: torch.Tensor, tol: float, options: GateOptions) -> dict[str, Any]:
    """The gate's columns; the output saved for the other side and compared with its output if there is one."""
    from attn.checks import rel_err

    columns: dict[str, Any] = {"check": "mismatch" if found else "ok", "check_detail": "; ".join(found) or None,
                               "check_tokens": n, "base_check": None, "base_err": None}
    if options.save:
        torch.save(out.detach().cpu(), options.save)
    if options.against:
        if not Path(options.against).exists():
            columns["base_check"] = "absent"  # the base side failed or was refused: nothing to compare with
        else:
            other = torch.load(options.against)
            err = rel_err(out, other) if other.shape == out.shape else float("inf")
            columns.update(base_err=err, base_check="ok" if err <= tol else "mismatch")
            if err > tol:
                columns["check_detail"] = "; ".join([*found, f"off from the base by {err:.2e} (tolerance {tol:.2e})"])
    return columns


def check_forward(cell: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: dict[str, torch.Tensor],
                  documents: torch.Tensor | None, options: GateOptions) -> dict[str, Any]:
    """A forward or training cell: its backend against the reference on the first ``options.tokens`` tokens of
    the cell's own q, k, v (and token inputs, documents); gradients of each input too when the cell trains."""
    from attn.attention.token_inputs import sliced
    from attn.checks import mismatches, rel_err, tolerance

    n = min(cell.seq_len, options.tokens)
    qn, kn, vn = (t[:, :, :n].detach() for t in (q, k, v))
    extra = {name: t.detach() for name, t in sliced(inputs, 0, n).items()} if inputs else {}
    docs = None if documents is None else documents[..., :n]
    fast, ref = (_build(cell, b, q.device) for b in (cell.backend_requested, "reference"))

    def with_documents(m: Any) -> Any:
        return m if docs is None else (lambda *a, **kw: m(*a, documents=docs, **kw))

    try:
        found = mismatches(with_documents(fast), with_documents(ref), qn, kn, vn, cell.causal, cell.mode == "train",
                           inputs=extra)
    except UnsupportedBackend:
        raise  # the cell cannot run here: unsupported, as without the gate
    except Exception as e:  # noqa: BLE001 -- a backend that raises on the gate's inputs is refused, with why
        found = [f"raised {type(e).__name__}: {' '.join(str(e).split())[:200]}"]
    # the output and the reference's own error once more, for the other side: a ref's attn.checks (the base side's)
    # has only ``mismatches``, which returns neither
    with torch.no_grad():
        out = with_documents(fast)(qn, kn, vn, causal=cell.causal, **extra)
        low = with_documents(ref)(qn, kn, vn, causal=cell.causal, **extra)
        exact = with_documents(ref)(*(t.double() for t in (qn, kn, vn)), causal=cell.causal,
                                    **{name: t.double() for name, t in extra.items()})
    return _verdict(found, n, out, tolerance(q.dtype, rel_err(low, exact)), options)


def check_decode_step(cell: Any, options: GateOptions) -> dict[str, Any]:
    """A decoding cell: ``options.tokens`` tokens of its shape prefilled into the backend's own state, then one step of
    the cell's new tokens, against the reference's last rows over every key (bottom-right causal)."""
    from attn.attention.token_inputs import draw_inputs, sliced
    from attn.checks import mismatches, rel_err, tolerance
    from harness.cost.cells import DTYPES

    dev, dtype = torch.device(cell.device), DTYPES[cell.dtype]
    B, H, Hkv, D, T = cell.batch_size, cell.num_heads, cell.kv_heads, cell.head_dim, cell.step_tokens
    n = min(cell.seq_len, options.tokens)
    fast, ref = (_build(cell, b, dev) for b in (cell.backend_requested, "reference"))
    g = torch.Generator(device=dev).manual_seed(cell.seq_len)
    prompt_q, q_step = (torch.randn(B, H, m, D, device=dev, generator=g, dtype=torch.float64) for m in (n, T))
    k, v = (torch.randn(B, Hkv, n + T, D, device=dev, generator=g, dtype=torch.float64) for _ in range(2))
    extra = draw_inputs(fast.token_inputs, B, Hkv, n + T, D, device=dev, dtype=torch.float64, generator=g)

    def stepper(m: Any) -> Any:
        def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, **more: torch.Tensor) -> torch.Tensor:
            state = m.start_state(n + T)
            m.run_step(prompt_q.to(q.dtype), k[:, :, :n], v[:, :, :n], state, **sliced(more, 0, n))
            return m.run_step(q, k[:, :, n:], v[:, :, n:], state, **sliced(more, n))
        return step

    q_low, k_low, v_low = (t.to(dtype) for t in (q_step, k, v))
    try:
        found = mismatches(stepper(fast), ref, q_low, k_low, v_low, True, False, inputs=extra)
    except UnsupportedBackend:
        raise  # the cell cannot run here: unsupported, as without the gate
    except Exception as e:  # noqa: BLE001 -- a backend that raises on the gate's inputs is refused, with why
        found = [f"raised {type(e).__name__}: {' '.join(str(e).split())[:200]}"]
    low_extra = {name: t.to(dtype) for name, t in extra.items()}
    with torch.no_grad():
        out = stepper(fast)(q_low, k_low, v_low, True, **low_extra)
        tol = tolerance(dtype, rel_err(ref(q_low, k_low, v_low, causal=True, **low_extra),
                                       ref(q_step, k, v, causal=True, **extra)))
    return _verdict(found, n, out, tol, options)


__all__ = ["GATE_TOKENS", "GateOptions", "check_decode_step", "check_forward"]
