"""Scope ``model``: the shared backbone (``attn.Transformer``: embeddings, projections, positions, FFN) on random
tokens, ``--layers`` blocks deep. ``train`` takes the gradients of every weight.

Decode rows add ``state_bytes``: what the decoding states of all layers hold at L tokens (``nbytes()`` of each,
summed; ``peak_mem_bytes`` is measured, and also holds the weights and the step's temporaries).

A layer pattern (``--pattern``, attn/patterns.py) is a cell of variant ``layers`` whose ``variant_params`` say the
pattern's unit; every layer runs its own spec, keeps its own state and counts its own attention FLOPs.

FLOPs: ``2 * tokens * (weights of every nn.Linear, LM head included)`` (x 3 for train; tokens = B * L, or B for one
decoding step) + each layer's attention count in the same mode.

Positions are resolved against the backbone's shapes (:func:`resolve_position`; the spec validates every grid's
positions with it, even where only op cells run)."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

import attn
from attn.patterns import LAYERS
from harness.cost.cells import (
    DTYPES,
    Cell,
    Measured,
    Rewind,
    Scope,
    attention_bytes,
    attention_flops,
    json_normal,
    kv_heads_field,
    linear_weights,
    register_scope,
    train_factor,
    weight_bytes,
)

VOCAB_SIZE = 256  # the backbone's byte-level default; the LM head is part of the model's cost


def resolve_position(spec: str, heads: int, head_dim: int, seq_len: int) -> tuple[str, dict[str, Any]]:
    """Position spec -> (name, its own config fields); the shape fields the backbone fills are left out."""
    import attn
    from attn.registry import POSITIONS

    name, params = attn.parse_spec(spec)
    entry = POSITIONS.get(name)
    names = {f.name for f in dataclasses.fields(entry.config)}
    shape = {"head_dim": head_dim, "d_model": heads * head_dim, "max_seq_len": seq_len + 1}
    fill = {k: v for k, v in shape.items() if k in names and k not in params}
    config = POSITIONS.make_config(name, {**fill, **params})
    resolved = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init and f.name not in fill}
    return name, json_normal(resolved)


def model_flops(model: Any, cell: Cell) -> int:
    """Every nn.Linear once per token processed (B, or B * L), plus each layer's attention in the same mode."""
    tokens = cell.batch_size * (1 if cell.mode == "decode" else cell.seq_len)
    weights = train_factor(cell.mode) * 2 * tokens * linear_weights(model)
    return weights + sum(attention_flops(b.attn.attn, cell) for b in model.blocks)


def model_bytes(model: Any, cell: Cell) -> int | None:
    """Every nn.Linear's weights (harness.cost.cells.weight_bytes) plus each layer's attention traffic; the other
    activations (norms, MLP hidden states) are not counted, so this is a lower bound outside decoding, where weights
    and the attention states dominate. None if a layer's variant does not count its bytes."""
    layers = [attention_bytes(b.attn.attn, cell) for b in model.blocks]
    if None in layers:
        return None
    return weight_bytes(linear_weights(model), cell) + sum(layers)


def model_config(cell: Cell) -> attn.TransformerConfig:
    """The backbone for a model-scope cell: d_model = heads x head_dim, ``layers`` blocks, byte vocabulary; a layer
    pattern's cell (variant ``layers``) gives each layer its spec."""
    pattern = cell.variant == LAYERS
    return attn.TransformerConfig(
        vocab_size=VOCAB_SIZE, d_model=cell.num_heads * cell.head_dim, n_heads=cell.num_heads, num_kv_heads=cell.kv_heads,
        n_layers=cell.layers or 1, attention="full" if pattern else cell.variant,
        attention_params={} if pattern else dict(cell.variant_params), backend=cell.backend_requested,
        layers=cell.variant_params["pattern"] if pattern else None, position=cell.position,
        position_params=dict(cell.position_params), max_seq_len=cell.seq_len + 1, causal=cell.causal,
    )


def build_model(cell: Cell) -> Measured:
    dev, dtype = torch.device(cell.device), DTYPES[cell.dtype]
    B, L = cell.batch_size, cell.seq_len
    model = attn.Transformer(model_config(cell)).to(dev, dtype)
    flops, moved = model_flops(model, cell), model_bytes(model, cell)

    def backend() -> str | None:
        ran = sorted({b.attn.attn.last_backend for b in model.blocks if b.attn.attn.last_backend})
        return ",".join(ran) or None

    if cell.mode == "decode":
        model.eval()
        state = model.init_state(B, L + 1)
        with torch.no_grad():
            model(torch.randint(0, VOCAB_SIZE, (B, L), device=dev), state=state)  # prefill L tokens
        token = torch.randint(0, VOCAB_SIZE, (B, 1), device=dev)
        rewind = Rewind(state.layers, L)

        def decode_step() -> torch.Tensor:
            with torch.no_grad():
                out = model(token, state=state)
            rewind()
            state.start = L  # positions always restart at L, even when a rolling cache advances
            return out

        def held() -> dict[str, Any]:  # what every layer's decoding state holds at L tokens (short-conv inputs too)
            return {"state_bytes": sum(int(s.nbytes()) for s in state.layers) + sum(c.nbytes() for c in state.convs)}

        return Measured(decode_step, flops, B, backend, state, held, moved)

    idx = torch.randint(0, VOCAB_SIZE, (B, L), device=dev)  # (B, L)
    documents = cell.documents(dev)
    if cell.mode == "train":
        model.train()
        targets = torch.randint(0, VOCAB_SIZE, (B, L), device=dev)
        params = [p for p in model.parameters() if p.requires_grad]

        def train_step() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(model.loss(idx, targets, documents=documents), params)

        return Measured(train_step, flops, B * L, backend, bytes=moved)

    model.eval()

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return model(idx, documents=documents)

    return Measured(forward, flops, B * L, backend, bytes=moved)


@register_scope("model")
class ModelScope(Scope):
    def shapes(self, grid: Any, prepared: Any, position: str, heads: int, head_dim: int, kv_heads: int | None,
               length: int) -> list[dict[str, Any]]:
        name, params = resolve_position(position, heads, head_dim, length)
        return [dict(position=name, position_params=params, layers=grid.layers, num_heads=heads, head_dim=head_dim,
                     num_kv_heads=kv_heads_field(heads, kv_heads))]

    def label(self, cell: Cell) -> list[str]:
        return [f"model/{cell.position}"]

    def build(self, cell: Cell) -> Measured:
        return build_model(cell)


__all__ = ["VOCAB_SIZE", "ModelScope", "build_model", "model_config", "model_bytes", "model_flops",
           "resolve_position"]
