"""Scope ``op``: the attention call alone on random q (B, H, L, D) and k, v (B, H_kv, L, D), with no positions and
no backbone. ``train`` takes the gradients of the inputs (and of a variant's own inputs, such as gates); the FLOPs
are the variant's own count in the cell's mode (harness.cost.cells)."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

import attn
from attn.attention.token_inputs import draw_inputs
from harness.cost.capacity import batched_state, capacity_batch
from harness.cost.cells import (
    DTYPES,
    Cell,
    Measured,
    Rewind,
    Scope,
    attention_bytes,
    attention_flops,
    kv_heads_field,
    register_scope,
    selection_flops,
)
from harness.cost.gate import check_decode_step, check_forward


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
    if cell.mode == "decode":
        return build_decode(cell, module)
    flops, moved = op_flops(module, cell), attention_bytes(module, cell)
    chosen = selection_flops(module, cell)
    columns = (lambda: {"selection_flops": chosen}) if chosen else None  # its part of `flops`
    probe = getattr(module, "take_selection", None)
    backend = lambda: module.last_backend
    extra = lambda n: draw_inputs(module.token_inputs, B, Hkv, n, D, device=dev, dtype=dtype)  # gates, decays: (B, H_kv, n, .)

    q, k, v = (torch.randn(B, h, L, D, device=dev, dtype=dtype) for h in (H, Hkv, Hkv))  # (B, H|H_kv, L, D)
    inputs, documents = extra(L), cell.documents(dev)
    gate = lambda options: check_forward(cell, q, k, v, inputs, documents, options)  # noqa: E731
    if cell.mode == "train":
        leaves = (q, k, v, *inputs.values())  # a gate's gradient is part of the step
        for t in leaves:
            t.requires_grad_(True)
        grad_out = torch.randn_like(q)

        def train_step() -> tuple[torch.Tensor, ...]:
            out = module(q, k, v, causal=cell.causal, documents=documents, **inputs)
            return torch.autograd.grad(out, leaves, grad_out)

        return Measured(train_step, flops, B * L, backend, columns=columns, bytes=moved, gate=gate)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return module(q, k, v, causal=cell.causal, documents=documents, **inputs)

    if probe is not None:  # a dynamic prefill: its work is the pairs it chooses on these inputs (one untimed call)
        from attn.attention.prompt_sparse import selection_columns  # here: a --base ref's attn may predate it

        forward()
        flops = 4 * D * module.last_pairs + chosen  # last_pairs: summed over the batch and the heads
        probe()

        def columns() -> dict[str, Any]:
            return {"selection_flops": chosen, "dense_flops": op_flops(module, cell) - chosen,
                    **selection_columns(probe())}

    return Measured(forward, flops, B * L, backend, columns=columns, bytes=moved, gate=gate)


def build_decode(cell: Cell, module: Any) -> Measured:
    """One decoding step of ``cell.step_tokens`` new tokens per sequence on a state that holds L tokens (one
    sequence prefilled once, untimed, and repeated to the batch). With a memory budget that state is measured and
    repeated to the largest batch it fits (harness.cost.capacity); rows then carry ``capacity_batch`` and
    ``state_bytes``. A ragged cell's sequences hold their own contexts (``Cell.contexts``), each the longest
    prompt's prefix where the state can forget tokens (else prefilled on its own), joined by the variant's
    ``ragged_state``; rows carry ``contexts`` and ``state_bytes``."""
    dev, dtype = torch.device(cell.device), DTYPES[cell.dtype]
    B, H, Hkv, L, D, T = cell.batch_size, cell.num_heads, cell.kv_heads, cell.seq_len, cell.head_dim, cell.step_tokens
    asked = cell  # the gate checks the cell as asked (a budget's batch is found below)
    extra = lambda b, n: draw_inputs(module.token_inputs, b, Hkv, n, D, device=dev, dtype=dtype)  # noqa: E731

    def prefill(b: int, n: int) -> Any:
        """A state holding ``b`` random prompts of ``n`` tokens."""
        state = module.start_state(n + T)
        with torch.no_grad():
            prompt = [torch.randn(b, h, n, D, device=dev, dtype=dtype) for h in (H, Hkv, Hkv)]  # (b, H|H_kv, n, D)
            module.run_step(*prompt, state, **extra(b, n))
        return state

    held: dict[str, Any] = {}
    if cell.ragged:
        contexts = cell.contexts()
        longest = prefill(1, max(contexts))
        state = module.ragged_state([prefix_state(longest, n, lambda n: prefill(1, n)) for n in contexts], T)
        del longest
        held = {"contexts": contexts, "state_bytes": int(state.nbytes())}
    else:  # one prompt of L tokens, its state repeated to the batch: a step costs the same whichever prompts they are,
        state = prefill(1, L)  # and B prefills at once overran a cell's memory (gated_deltanet at B=32 x 16K)
        if B > 1:
            state = batched_state(state, B)
    if cell.budget_bytes:
        one = int(state.nbytes())
        B = capacity_batch(cell.budget_bytes, one)
        if B == 0:
            raise MemoryError(f"one sequence's decoding state at {L} tokens ({one / 2**20:.1f} MiB) exceeds the "
                              f"budget of {cell.budget_bytes / 2**20:g} MiB")
        state = batched_state(state, B)
        cell = dataclasses.replace(cell, batch_size=B)  # what the counts describe
        held = {"capacity_batch": B, "state_bytes": int(state.nbytes()), "state_bytes_per_sequence": one}
    flops, moved, chosen = op_flops(module, cell), attention_bytes(module, cell), selection_flops(module, cell)
    columns = {**held, **({"selection_flops": chosen} if chosen else {})}
    q1, k1, v1 = (torch.randn(B, h, T, D, device=dev, dtype=dtype) for h in (H, Hkv, Hkv))  # (B, H|H_kv, T, D)
    inputs1 = extra(B, T)
    rewind = Rewind([state], state.length)

    def decode_step() -> torch.Tensor:
        with torch.no_grad():
            out = module.run_step(q1, k1, v1, state, **inputs1)
        rewind()
        return out

    return Measured(decode_step, flops, B * T, lambda: module.last_backend, state, (lambda: columns) if columns else None,
                    moved, gate=lambda options: check_decode_step(asked, options))


def prefix_state(state: Any, length: int, prefill: Callable[[int], Any]) -> Any:
    """The state of the first ``length`` tokens of the prompt ``state`` (one sequence) holds: ``state`` rewound
    where it can forget tokens (a KV cache, sharing its memory), else ``prefill(length)`` (a recurrence)."""
    out = copy.copy(state)
    try:
        out.truncate(length)
    except ValueError:
        return prefill(length)
    return out


@register_scope("op")
class OpScope(Scope):
    def shapes(self, grid: Any, prepared: Any, position: str, heads: int, head_dim: int, kv_heads: int | None,
               length: int) -> list[dict[str, Any]]:
        return [dict(position="none", position_params={}, layers=None, num_heads=heads, head_dim=head_dim,
                     num_kv_heads=kv_heads_field(heads, kv_heads))]

    def build(self, cell: Cell) -> Measured:
        return build_op(cell)


__all__ = ["OpScope", "build_decode", "build_op", "op_flops", "prefix_state"]
