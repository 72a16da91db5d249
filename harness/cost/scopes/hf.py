"""Scope ``hf``: a whole Hugging Face causal LM (random weights: cost does not depend on them) running
one of our variants through transformers' attention interface (:mod:`attn.hf`).

What is timed, per mode:
- ``forward``: the prefill of L tokens as ``generate`` runs it: every layer on every token, the LM head on the
  last token only (``logits_to_keep=1``), no cache kept.
- ``train``: forward + backward of the next-token loss on L tokens (logits for every token), gradients of every weight.
- ``decode``: one new token with a cache already holding L tokens, cut back to L after each timed step
  (``crop(-1)``), through :class:`attn.hf.cache.VariantCache`: each layer holds its variant's own decoding state
  (a window, a recurrence, a band of blocks, or for ``full`` a KV cache written in place) and runs the variant's
  step on the new token only, as the backbone does. transformers' ``DynamicCache`` instead concatenates each new key
  onto a fresh copy of the layer's cache; from 32 MiB a layer glibc maps every such copy fresh from the kernel
  (``M_MMAP_THRESHOLD`` cannot exceed 32 MiB), and those page faults were the jump of ``full``'s step from 32K to
  64K (``results/hf-decode-full-cpu.jsonl``). Rows add ``hf_cache`` and ``state_bytes`` (what it holds at L tokens, all
  layers).

FLOPs: 2 per multiply-add of every ``nn.Linear`` weight per token it is applied to (the LM head on 1 token in
``forward``), x 3 for ``train``, plus ``num_hidden_layers`` x the variant's own count of the attention in that mode,
with the config's query heads, key/value heads (GQA) and head dim.

``--press`` (harness.cost.presses): forward and decode as kvpress's pipeline runs them, the press's hooks on during
the prefill; its FLOPs are the model's (no LM head in forward, where the base model prefills; a decode step attends
over the tokens each layer kept), the press's own scoring not counted.

``--pattern`` on a model with layer types (Gemma 3's sliding and global layers): a layer spec (:mod:`attn.hf.layers`;
``own``, the model's own pattern, or ``TYPE=SPEC;TYPE=SPEC``) in place of one variant on every layer; its FLOPs and
bytes are each layer's own variant's, and a press runs on the model's own pattern only (its global layers pressed,
the sliding ones at their window), compressed from a recorded prefill as the evaluation does it (kvpress's own hooks
would press the sliding layers too).

Shapes (heads, key/value heads, head dim, layers) and positions come from each model config, read once per grid.
transformers is imported only when an hf cell is resolved or built (``attn.hf`` imports it).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

import attn
from attn.patterns import LAYERS
from harness.cost.cells import (
    DTYPES,
    Cell,
    Measured,
    Scope,
    attention_bytes,
    attention_flops,
    json_normal,
    linear_weights,
    register_scope,
    train_factor,
    weight_bytes,
)
from harness.cost.presses import build_press


def hf_shape(hf_config: str, kv_heads: int | None = None) -> dict[str, Any]:
    """Heads, key/value heads, head dim and layers of a config (a preset name or a local path); ValueError if
    it cannot be read. ``kv_heads`` overrides the config's ``num_key_value_heads`` (``--kv-heads``)."""
    from attn.hf.rope import head_dim

    config = load(hf_config, kv_heads)
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return {"num_heads": heads, "num_kv_heads": None if kv == heads else kv, "head_dim": head_dim(config),
            "layers": config.num_hidden_layers, "vocab_size": config.vocab_size}


def load(hf_config: str, kv_heads: int | None = None):
    """The transformers config of a cell; ``kv_heads`` replaces its key/value heads (must divide its heads)."""
    from attn.hf import load_config

    config = load_config(hf_config)
    if kv_heads is not None:
        if config.num_attention_heads % kv_heads:
            raise ValueError(f"kv_heads {kv_heads} must divide the {config.num_attention_heads} heads of {hf_config}")
        config.num_key_value_heads = kv_heads
    return config


def own_rope(config: Any) -> tuple[str, dict[str, Any]]:
    """A config's RoPE as a cell's position: ours (attn.hf.position_from_hf), or for a RoPE per layer type (Gemma 3's
    local and global), which no one position of ours names, ``checkpoint`` with transformers' parameters."""
    from attn.hf import position_from_hf

    rope = getattr(config, "rope_parameters", None) or {}
    if any(t in rope for t in getattr(config, "layer_types", None) or ()):
        return "checkpoint", json_normal({"rope_parameters": rope})
    return position_from_hf(config)


def hf_position(hf_config: str, position: str | None) -> tuple[str, dict[str, Any]]:
    """The cell's position: the config's own RoPE (``position`` None or ``none``), or a rope spec to override it."""
    from attn.hf.rope import override_rope

    config = load(hf_config)
    if position not in (None, "none"):
        override_rope(config, position)
    return own_rope(config)


def _spec_text(name: str, params: dict[str, Any]) -> str:
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


def _spec(cell: Cell) -> str:
    """The spec the model is built with: the cell's variant, or its layer spec (``--pattern``)."""
    if cell.variant == LAYERS:
        return str(cell.variant_params["pattern"])
    backend = {"backend": cell.backend_requested} if cell.backend_requested != "auto" else {}
    return _spec_text(cell.variant, {**cell.variant_params, **backend})


def type_specs(config: Any, text: str) -> dict[str, str]:
    """Each layer type's variant spec under the layer spec ``text`` (``--pattern``; attn.hf.layers.layer_plan's rule);
    ValueError for a model without layer types (it takes ``--variant``) and for a spec the model cannot run."""
    import copy

    from attn.hf.layers import layer_plan

    plan = layer_plan(copy.deepcopy(config), text)  # a plan may lift the window of the config it is given
    if plan is None:
        raise ValueError(f"--pattern {text} on --scope hf gives each layer type of a model its spec, and this model has "
                         "one layer type (config.layer_types): give it --variant")
    return dict(plan.specs)


def _per_layer(config: Any, typed: dict[str, str]) -> list[str]:
    return [typed[t] for t in config.layer_types[:config.num_hidden_layers]]


def layer_specs(config: Any, text: str) -> list[str]:
    """Each layer's variant spec under the layer spec ``text`` (:func:`type_specs`)."""
    return _per_layer(config, type_specs(config, text))


def cell_type_specs(cell: Cell, config: Any) -> dict[str, str] | None:
    """The spec each layer type of the cell's model runs (None: a model with one layer type, under ``--variant``)."""
    if cell.variant == LAYERS:
        return type_specs(config, _spec(cell))
    types = list(dict.fromkeys(getattr(config, "layer_types", None) or ()))
    return {t: cell.variant_spec for t in types} if len(types) > 1 else None


def layer_modules(cell: Cell, config: Any, typed: dict[str, str] | None) -> list[Any]:
    """Each layer's attention module of the cell's model, for its FLOPs and bytes (one module a distinct spec);
    ``typed``: :func:`cell_type_specs`."""
    from attn.hf.interface import variant_of

    if cell.variant != LAYERS or typed is None:
        return [attn.build_attention(cell.variant, **cell.variant_params)] * cell.layers
    specs = _per_layer(config, typed)
    built = {s: variant_of(s) for s in dict.fromkeys(specs)}
    modules = {s: attn.build_attention(v.name, **dict(v.params)) for s, v in built.items()}
    return [modules[s] for s in specs]


def _position_spec(cell: Cell, config: Any) -> str | None:
    """The cell's RoPE as a spec to override ``config``'s with, or None when it is the config's own."""
    name, params = own_rope(config)
    if (cell.position, cell.position_params) == (name, json_normal(params)):
        return None
    return _spec_text(cell.position, cell.position_params)


def hf_flops(model: nn.Module, cell: Cell, modules: list[Any], kept: list[int] | None = None) -> int:
    """Every nn.Linear per token it multiplies (the LM head on the last token only in forward, not at all in a press's
    forward) + each layer's attention (``modules``: :func:`layer_modules`); ``kept``: the tokens each layer's cache
    holds, which a decode step attends over."""
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    body = sum(m.weight.numel() for m in linears if m is not head)
    head_w = head.weight.numel()
    B, L = cell.batch_size, cell.seq_len
    tokens = B * (1 if cell.mode == "decode" else L)
    head_tokens = B if cell.mode in ("forward", "decode") else B * L
    if cell.press is not None and cell.mode == "forward":
        head_tokens = 0
    weights = train_factor(cell.mode) * 2 * (tokens * body + head_tokens * head_w)
    if kept is None:
        return weights + sum(attention_flops(m, cell) for m in modules)
    return weights + sum(attention_flops(m, dataclasses.replace(cell, seq_len=k))
                         for m, k in zip(modules, kept, strict=True))


def hf_bytes(model: nn.Module, cell: Cell, modules: list[Any]) -> int | None:
    """Every nn.Linear's weights once (harness.cost.cells.weight_bytes) plus each layer's attention traffic; other
    activations are not counted (a lower bound outside decoding)."""
    attention = [attention_bytes(m, cell) for m in modules]
    if None in attention:
        return None
    return weight_bytes(linear_weights(model), cell) + sum(attention)  # type: ignore[arg-type]


def build_hf(cell: Cell) -> Measured:
    """Model, inputs and the measured callable of an ``hf`` cell."""
    from attn.hf import attention_modules, build_model
    from attn.hf.cache import VariantCache

    dev, dtype = torch.device(cell.device), DTYPES[cell.dtype]
    config = load(cell.hf_config, cell.kv_heads)  # num_kv_heads None = as many as the query heads, not the config's
    model = build_model(config, _spec(cell), position=_position_spec(cell, config), dtype=dtype).to(dev)
    B, L, V = cell.batch_size, cell.seq_len, model.config.vocab_size
    idx = torch.randint(0, V, (B, L), device=dev)

    def backend() -> str | None:
        ran = sorted({m.last_backend for m in attention_modules(model) if m.last_backend})
        return ",".join(ran) or None

    typed = cell_type_specs(cell, config)  # the layer plan, once: the modules' FLOPs and the press's check read it
    modules = layer_modules(cell, config, typed)
    if cell.press is not None:
        return build_press(cell, model, idx, backend, lambda kept: hf_flops(model, cell, modules, kept), typed)
    flops, moved = hf_flops(model, cell, modules), hf_bytes(model, cell, modules)
    if cell.mode == "decode":
        cache = VariantCache(model.config)
        with torch.no_grad():
            model(idx, past_key_values=cache, use_cache=True, logits_to_keep=1)  # prefill: the cache holds L tokens
        token = torch.randint(0, V, (B, 1), device=dev)

        def decode_step() -> torch.Tensor:
            with torch.no_grad():
                out = model(token, past_key_values=cache, use_cache=True).logits
            cache.crop(-1)  # back to L tokens: every timed step decodes at the same context
            return out

        def held() -> dict[str, Any]:  # what the cache holds at L tokens, all layers
            return {"hf_cache": type(cache).__name__, "state_bytes": cache.nbytes()}

        return Measured(decode_step, flops, B, backend, cache, held, bytes=moved)
    if cell.mode == "train":
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]

        def train_step() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(model(idx, labels=idx, use_cache=False).loss, params)

        return Measured(train_step, flops, B * L, backend, bytes=moved)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return model(idx, use_cache=False, logits_to_keep=1).logits

    return Measured(forward, flops, B * L, backend, bytes=moved)


def hf_cell_fields(hf_config: str, kv_heads: int | None, position: str) -> dict[str, Any]:
    """The Cell fields an ``hf`` cell takes from its model config rather than from the grid."""
    shape = hf_shape(hf_config, kv_heads)
    name, params = hf_position(hf_config, position)
    return {"num_heads": shape["num_heads"], "num_kv_heads": shape["num_kv_heads"], "head_dim": shape["head_dim"],
            "layers": shape["layers"], "position": name, "position_params": json_normal(params), "hf_config": hf_config}


def hf_grid_fields(configs: tuple[str, ...], positions: tuple[str, ...], kv_heads: tuple[int | None, ...],
                   ) -> dict[tuple[str, int | None], list[dict[str, Any]]]:
    """(position, kv_heads) -> the Cell fields of each transformers config of a grid (each read and validated once:
    a missing path or an unknown preset is one ValueError). Position ``none`` = the config's own RoPE."""
    return {(p, kv): [hf_cell_fields(c, kv, p) for c in configs] for p in positions for kv in kv_heads}


@register_scope("hf")
class HfScope(Scope):
    positions_from_config = True
    presses = True

    def check(self, grid: Any) -> None:
        if not grid.causal:
            raise ValueError("scope hf runs causal language models: drop --bidirectional")

    def prepare(self, grid: Any) -> dict[tuple[str, int | None], list[dict[str, Any]]]:
        try:
            fields = hf_grid_fields(grid.hf_config, grid.position, grid.kv_heads or (None,))
        except ImportError as e:  # attn.optional.Unavailable says whether it is missing or broken, and why
            why = str(e) if str(e) else f"{e.name} is not installed"
            raise ValueError(f"scope hf needs transformers ({why}; pip install 'attn-bench[hf]')") from None
        if grid.docs != (1,):
            raise ValueError("--docs needs scope op or model (transformers models get packed documents another way)")
        for text in grid.pattern:  # a layer spec: every model of the grid must have the layer types it names
            for c in grid.hf_config:
                layer_specs(load(c), text)
        return fields

    def shapes(self, grid: Any, prepared: Any, position: str, heads: int, head_dim: int, kv_heads: int | None,
               length: int) -> list[dict[str, Any]]:
        return prepared[(position, kv_heads)]  # shapes and positions come from each model config

    def label(self, cell: Cell) -> list[str]:
        return [f"hf:{cell.hf_config}/{cell.position}"] + ([f"press={cell.press_spec}"] if cell.press else [])

    def layer_variants(self, cell: Cell) -> list[str] | None:
        from attn.hf.interface import variant_of

        return [variant_of(s).name for s in layer_specs(load(cell.hf_config), _spec(cell))]

    def build(self, cell: Cell) -> Measured:
        return build_hf(cell)


__all__ = ["HfScope", "build_hf", "hf_bytes", "hf_cell_fields", "hf_flops", "hf_grid_fields", "hf_position", "hf_shape",
           "layer_modules", "layer_specs", "load", "own_rope", "type_specs"]
