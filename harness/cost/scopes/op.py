"""Scope ``op``: the attention call alone on random q (B, H, L, D) and k, v (B, H_kv, L, D), with no positions and
no backbone. ``train`` takes the gradients of the inputs (and of a variant's own inputs, such as gates); the FLOPs
are the variant's own count in the cell's mode (harness.cost.cells)."""
from __future__ import annotations

from typing import Any

import torch

import attn
from attn.attention.token_inputs import draw_inputs
from harness.cost.cells import (
    DTYPES,
    Cell,
    Measured,
    Rewind,
    Scope,
    attention_flops,
    kv_heads_field,
    register_scope,
    selection_flops,
)


def op_flops(module: Any, cell: Cell) -> int:
    """What an op-scope cell times: the attention call alone."""
    return attention_flops(module, cell)


def build_op(cell: Cell) -> Measured:
    dev, dtype = torch.device(cell.device), DTYPES[cell.dtype]
    B, H, Hkv, L, D = cell.batch_size, cell.num_heads, cell.kv_heads, cell.seq_len, cell.head_dim
    module = attn.build_attention(cell.variant, backend=cell.backend_requested, **cell.variant_params).to(dev, dtype)
    if getattr(module, "layer", None) is not None:  # MLA: the op on expanded heads is full attention
        raise attn.UnsupportedBackend(f"{cell.variant} owns its projections (a layer-level variant): time it with "
                                      "--scope model")
    flops = op_flops(module, cell)
    chosen = selection_flops(module, cell)
    columns = (lambda: {"selection_flops": chosen}) if chosen else None  # its part of `flops`
    backend = lambda: module.last_backend
    extra = lambda n: draw_inputs(module.token_inputs, B, Hkv, n, D, device=dev, dtype=dtype)  # gates, decays: (B, H_kv, n, .)

    if cell.mode == "decode":
        state = module.start_state(L + 1)
        with torch.no_grad():
            prompt = [torch.randn(B, h, L, D, device=dev, dtype=dtype) for h in (H, Hkv, Hkv)]  # (B, H|H_kv, L, D)
            module.run_step(*prompt, state, **extra(L))  # prefill: the cache now holds L tokens
            del prompt
        q1, k1, v1 = (torch.randn(B, h, 1, D, device=dev, dtype=dtype) for h in (H, Hkv, Hkv))  # (B, H|H_kv, 1, D)
        inputs1 = extra(1)
        rewind = Rewind([state], L)

        def decode_step() -> torch.Tensor:
            with torch.no_grad():
                out = module.run_step(q1, k1, v1, state, **inputs1)
            rewind()
            return out

        return Measured(decode_step, flops, B, backend, state, columns)

    q, k, v = (torch.randn(B, h, L, D, device=dev, dtype=dtype) for h in (H, Hkv, Hkv))  # (B, H|H_kv, L, D)
    inputs, documents = extra(L), cell.documents(dev)
    if cell.mode == "train":
        leaves = (q, k, v, *inputs.values())  # a gate's gradient is part of the step
        for t in leaves:
            t.requires_grad_(True)
        grad_out = torch.randn_like(q)

        def train_step() -> tuple[torch.Tensor, ...]:
            out = module(q, k, v, causal=cell.causal, documents=documents, **inputs)
            return torch.autograd.grad(out, leaves, grad_out)

        return Measured(train_step, flops, B * L, backend, columns=columns)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return module(q, k, v, causal=cell.causal, documents=documents, **inputs)

    return Measured(forward, flops, B * L, backend, columns=columns)


@register_scope("op")
class OpScope(Scope):
    def shapes(self, grid: Any, prepared: Any, position: str, heads: int, head_dim: int, kv_heads: int | None,
               length: int) -> list[dict[str, Any]]:
        return [dict(position="none", position_params={}, layers=None, num_heads=heads, head_dim=head_dim,
                     num_kv_heads=kv_heads_field(heads, kv_heads))]

    def build(self, cell: Cell) -> Measured:
        return build_op(cell)


__all__ = ["OpScope", "build_op", "op_flops"]
