"""Models for the accuracy tasks, built from spec strings through the registry.

Length generalisation needs one thing the backbone does not do by itself: evaluate a model
with its position method rescaled for a longer context. A RoPE-family method whose config has
``factor`` gets ``factor = context / train_len`` (zero-shot scaling, as Position Interpolation,
NTK-aware, YaRN and Llama 3 prescribe) and ``original_max_position_embeddings = train_len``,
unless the spec sets them. A method that already adapts to the length by itself (dynamic NTK,
detected by its frequencies changing with ``seq_len``) keeps its own ``factor``.

At ``factor = 1`` those methods equal plain RoPE, so one model trained with RoPE serves all of
them, exactly the literature's setting (a model pretrained with RoPE, rescaled afterwards):
:func:`training_spec` maps each to the spec it is actually trained with.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import attn
from attn.patterns import LAYERS, parse_pattern
from attn.registry import POSITIONS

ORIGINAL_LEN = "original_max_position_embeddings"


@dataclass(frozen=True)
class Spec:
    """A registered name and its params (typed by the registry), e.g. ``sliding_window:window=64``."""

    name: str
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    backend: str = "auto"  # attention only: ``backend=NAME`` in the spec, as in ``attn-bench sweep``

    @property
    def label(self) -> str:
        if self.name == LAYERS:  # a layer pattern: its unit
            return str(self.params["pattern"])
        items = sorted(self.params.items()) + ([("backend", self.backend)] if self.backend != "auto" else [])
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in items) if items else "")

    def __str__(self) -> str:
        return self.label


def _typed(name: str, raw: dict[str, Any], fill: dict[str, Any]) -> dict[str, Any]:
    cfg = POSITIONS.make_config(name, {**fill, **raw})  # raises ValueError naming what is wrong
    return {k: getattr(cfg, k) for k in raw}


def parse_variant(text: str) -> Spec:
    v = attn.resolve_variant(text)
    return Spec(v.name, v.given, v.backend)


def parse_layers(text: str) -> Spec:
    """A layer pattern (named or ``SPEC*N; SPEC``) as a variant of a job: ``layers`` with its unit written out."""
    return Spec(LAYERS, {"pattern": parse_pattern(text).text})


def position_fields(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(POSITIONS.get(name).config)}


def parse_position(text: str, head_dim: int = 64) -> Spec:
    """Parse and check a position spec; the fields the harness fills itself (shapes, factor,
    original length) are filled with placeholders for the check only."""
    name, raw = attn.parse_spec(text)
    placeholders = {"head_dim": head_dim, "d_model": head_dim, "max_seq_len": 1, "factor": 1.0, ORIGINAL_LEN: 1}
    fill = {k: v for k, v in placeholders.items() if k in position_fields(name)}
    return Spec(name, _typed(name, raw, fill))


def _build_position(name: str, params: dict[str, Any], head_dim: int) -> nn.Module:
    fill = {k: v for k, v in {"head_dim": head_dim, "d_model": head_dim, "max_seq_len": 1 << 20}.items()
            if k in position_fields(name)}
    return attn.build_position(name, **{**fill, **params})


def has_weights(spec: Spec, head_dim: int, max_seq_len: int) -> bool:
    """True for position methods with trained parameters (learned absolute positions)."""
    fill = {k: v for k, v in {"head_dim": head_dim, "d_model": head_dim, "max_seq_len": max_seq_len, "factor": 1.0,
                              ORIGINAL_LEN: 1}.items() if k in position_fields(spec.name)}
    return any(True for _ in attn.build_position(spec.name, **{**fill, **spec.params}).parameters())


def adapts_to_length(spec: Spec, train_len: int, head_dim: int) -> bool:
    """True for methods whose frequencies depend on the sequence length (dynamic NTK)."""
    fields = position_fields(spec.name)
    params = {**spec.params}
    if ORIGINAL_LEN in fields and ORIGINAL_LEN not in params:
        params[ORIGINAL_LEN] = train_len
    if "factor" in fields and "factor" not in params:
        params["factor"] = 1.0
    p = _build_position(spec.name, params, head_dim)
    if not hasattr(p, "inv_freq"):
        return False
    return not torch.equal(p.inv_freq(seq_len=train_len), p.inv_freq(seq_len=4 * train_len))


def scaled_params(spec: Spec, train_len: int, context: int, head_dim: int) -> dict[str, Any]:
    """The position params for running a model trained at ``train_len`` on ``context`` tokens."""
    fields = position_fields(spec.name)
    params = dict(spec.params)
    if ORIGINAL_LEN in fields and ORIGINAL_LEN not in params:
        params[ORIGINAL_LEN] = train_len
    if "factor" in fields and "factor" not in params:
        if adapts_to_length(spec, train_len, head_dim):
            default = next(f.default for f in dataclasses.fields(POSITIONS.get(spec.name).config) if f.name == "factor")
            params["factor"] = 1.0 if default is dataclasses.MISSING else default
        else:
            params["factor"] = max(1.0, context / train_len)
    return params


def training_spec(spec: Spec, train_len: int, head_dim: int) -> Spec:
    """The spec a model for ``spec`` is trained with: plain ``rope`` when the method at
    ``factor = 1`` has RoPE's frequencies and no attention factor; else ``spec`` itself."""
    if spec.name == "rope" or "rope" not in POSITIONS.names():
        return spec
    params = scaled_params(spec, train_len, train_len, head_dim)
    p = _build_position(spec.name, params, head_dim)
    if not (hasattr(p, "inv_freq") and hasattr(p, "attention_factor")):
        return spec
    rope_fields = position_fields("rope")
    shared = {k: v for k, v in spec.params.items() if k in rope_fields}
    rope = _build_position("rope", shared, head_dim)
    same = (
        set(spec.params) <= rope_fields | {"factor", ORIGINAL_LEN}
        and p.inv_freq(seq_len=train_len).shape == rope.inv_freq(seq_len=train_len).shape
        and torch.allclose(p.inv_freq(seq_len=train_len), rope.inv_freq(seq_len=train_len), rtol=1e-9, atol=0)
        and abs(p.attention_factor - rope.attention_factor) < 1e-12
    )
    return Spec("rope", shared) if same else spec


def make_model(preset: str, vocab_size: int, variant: Spec, position: Spec, position_params: dict[str, Any],
               max_seq_len: int, seed: int, init_std: float | None = None, **overrides: Any) -> attn.Transformer:
    """A freshly initialised backbone (seeded), attention and position from the registry.

    Weights are drawn from N(0, init_std^2), by default init_std = d_model^-1/2. GPT-2's 0.02
    (the backbone's default) is tuned for d_model = 768; at the widths trained here (64-256) it
    makes every attention logit ~0 at the start, and small models then sit on a loss plateau
    for thousands of steps before an induction circuit forms (measured here: MQAR with 2 pairs
    stalls for ~2500 steps at 0.02 and is solved within 200 at d_model^-1/2; passkey at length
    128 goes from chance after 600 steps to 100 %).
    """
    torch.manual_seed(seed)
    layers = variant.params["pattern"] if variant.name == LAYERS else None
    cfg = attn.TransformerConfig.preset(
        preset, vocab_size=vocab_size, attention="full" if layers else variant.name,
        attention_params={} if layers else dict(variant.params), backend=variant.backend, layers=layers,
        position=position.name, position_params=dict(position_params), max_seq_len=max_seq_len, **overrides,
    )
    model = attn.Transformer(cfg)
    std = cfg.d_model ** -0.5 if init_std is None else init_std
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
    return model


def set_position(model: attn.Transformer, name: str, params: dict[str, Any]) -> None:
    """Swap the model's position method for ``name(params)``, keeping any learned weights."""
    old = model.position
    model.config.position, model.config.position_params = name, dict(params)
    new = attn.build_position(name, **attn.model.position_params_for(model.config))
    with torch.no_grad():
        olds = dict(old.named_parameters())
        for n, p in new.named_parameters():
            if n in olds and olds[n].shape == p.shape:
                p.copy_(olds[n])
    model.position = new
    for block in model.blocks:
        if hasattr(block.attn, "use_position"):  # a layer-level variant ropes its own channels (MLA)
            block.attn.use_position(attn.model.rotary_at(model.config, new))
        else:
            block.attn.position = new


def set_attention(model: attn.Transformer, variant: Spec) -> None:
    """Replace every layer's attention (which holds no trained weights) with ``variant``, with the parameters the
    model's position method sets on it (ALiBi's bias)."""
    if variant.name == LAYERS or model.config.layers is not None:
        raise ValueError("a layer pattern's layers hold their own trained weights: train each pattern itself")
    needs = {t.name for t in attn.registry.ATTENTION.get(variant.name).cls.token_inputs}
    have = set(model.blocks[0].attn.inputs)
    if needs - have:
        raise ValueError(f"{variant.name} needs trained projections for its token inputs ({', '.join(sorted(needs - have))}); "
                         "a model trained with another variant has none: train with it instead")
    model.config.attention, model.config.attention_params = variant.name, dict(variant.params)
    params = attn.model.attention_params_for(model.config)
    for block in model.blocks:
        block.attn.attn = eval_attention(Spec(variant.name, params, variant.backend), *_where(model))


def eval_attention(variant: Spec, device: str = "cpu", dtype: torch.dtype = torch.float32) -> nn.Module:
    """The variant's attention module, with ``auto`` resolved as for training (see :func:`pin_backend`)."""
    m = attn.build_attention(variant.name, backend=variant.backend, **variant.params)
    if m.backend == "auto":
        m.backend = m.select_backend(device, dtype, "backward")
    return m


def pin_backend(model: attn.Transformer) -> None:
    """Evaluate with the backend ``auto`` trains with: the same kernel as trained, and no compile of
    another one (on CPU, ``auto`` picks compiled FlexAttention for forward-only calls)."""
    for block in model.blocks:
        a = block.attn.attn
        if a.backend == "auto":
            a.backend = a.select_backend(*_where(model), "backward")


@torch.no_grad()
def state_size(model: attn.Transformer, length: int) -> dict[str, int | None]:
    """What one layer carries while decoding one sequence after ``length`` tokens: its decoding state's bytes and
    numbers (KV cache for full and block_sparse, the window for sliding_window, S and z for linear, the
    matrix state of the gated family), the mean over layers (a layer pattern's differ). Zoology's x axis for recall
    vs state size. None where a model cannot decode."""
    if not model.config.causal:
        return {"state_bytes": None, "state_numbers": None}
    was_training = model.training
    model.eval()
    try:
        state = model.init_state(1, length)
        model(torch.zeros(1, length, dtype=torch.long, device=next(model.parameters()).device), state=state)
        held = sum(int(s.nbytes()) for s in state.layers) + sum(c.nbytes() for c in state.convs)  # short-conv inputs too
        size = held // len(state.layers)
    except (NotImplementedError, ValueError, AttributeError):
        return {"state_bytes": None, "state_numbers": None}
    finally:
        model.train(was_training)
    return {"state_bytes": size, "state_numbers": size // next(model.parameters()).element_size()}


def _where(model: nn.Module) -> tuple[str, torch.dtype]:
    w = next(model.parameters())
    return w.device.type, w.dtype


def last_backends(model: attn.Transformer) -> str:
    names = {getattr(b.attn.attn, "last_backend", None) for b in model.blocks} - {None}
    return ",".join(sorted(names))


__all__ = [
    "Spec", "adapts_to_length", "eval_attention", "has_weights", "last_backends", "make_model", "parse_layers",
    "parse_position",
    "parse_variant", "pin_backend", "state_size", "scaled_params", "set_attention", "set_position", "training_spec",
]
