"""The shared Transformer backbone: any registered attention variant x any position method.

Kept small enough to read in one sitting (nanoGPT-style). Decoding: ``state = model.init_state(
batch_size, max_len)`` then feed tokens chunk by chunk with ``model(idx, state=state)``; the
logits equal one full forward pass over the same tokens.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from attn.attention.short_conv import ConvCache, causal_conv
from attn.patterns import parse_pattern
from attn.registry import ATTENTION, POSITIONS, build_attention, build_position, check, resolve_variant


@dataclass
class TransformerConfig:
    vocab_size: int = 256  # bytes by default: the accuracy tasks are byte/token level
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    num_kv_heads: int | None = None  # key/value heads (GQA; 1 = multi-query); None = n_heads
    d_ff: int | None = None  # None -> 4 * d_model (ReLU/GELU) or 8/3 * d_model rounded (SwiGLU)
    attention: str = "full"
    attention_params: dict[str, Any] = field(default_factory=dict)
    backend: str = "auto"
    position: str = "none"
    position_params: dict[str, Any] = field(default_factory=dict)
    max_seq_len: int = 4096  # only learned positions allocate by it
    norm: Literal["pre", "post"] = "pre"  # post-norm is the 2017 paper's layout
    ffn: Literal["relu", "gelu", "swiglu"] = "gelu"
    causal: bool = True  # False -> bidirectional encoder
    dropout: float = 0.0
    bias: bool = False
    tie_embeddings: bool = True
    # > 0: a causal depthwise convolution of this many taps (SiLU after it) on the q/k/v projections, as the short
    # convolutions of flash-linear-attention's layers (4 taps) and Zoology's conv + attention hybrid. 0 = none.
    short_conv: int = 0
    # A layer pattern (attn/patterns.py): a named one ("gemma3", "qwen3-next"), a unit "gated_deltanet*3; full" or a
    # list of specs, repeated to n_layers; each layer's spec gives its variant, parameters and backend. None: every
    # layer runs ``attention`` with ``attention_params`` and ``backend``.
    layers: str | list[str] | None = None

    def __post_init__(self) -> None:
        check(self.d_model % self.n_heads == 0, f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.num_kv_heads is None:
            self.num_kv_heads = self.n_heads
        check(1 <= self.num_kv_heads <= self.n_heads and self.n_heads % self.num_kv_heads == 0,
              f"num_kv_heads ({self.num_kv_heads}) must divide n_heads ({self.n_heads})")
        check(self.n_layers >= 1, "n_layers must be >= 1")
        check(self.vocab_size >= 1, "vocab_size must be >= 1")
        check(self.short_conv >= 0, f"short_conv must be >= 0 (taps; 0 = none), got {self.short_conv}")
        check(0.0 <= self.dropout < 1.0, "dropout must be in [0, 1)")
        check(self.norm in ("pre", "post"), f"norm must be 'pre' or 'post', got {self.norm!r}")
        check(self.ffn in ("relu", "gelu", "swiglu"), f"ffn must be relu, gelu or swiglu, got {self.ffn!r}")
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model if self.ffn != "swiglu" else 64 * math.ceil(8 * self.d_model / 3 / 64)
        ATTENTION.get(self.attention)  # unknown names fail here, with the registered list
        POSITIONS.get(self.position)
        for name, params, _ in self.layer_specs():
            attention_params_for(self, name, params)  # a position method that needs a parameter the variant lacks

    def layer_specs(self) -> list[tuple[str, dict[str, Any], str]]:
        """(variant, its params, backend) of every layer, in depth order."""
        if self.layers is None:
            return [(self.attention, dict(self.attention_params), self.backend)] * self.n_layers
        out = []
        for spec in parse_pattern(self.layers).layers(self.n_layers):
            v = resolve_variant(spec)
            out.append((v.name, dict(v.given), self.backend if v.backend == "auto" else v.backend))
        return out

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> TransformerConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; valid: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


PRESETS: dict[str, dict[str, Any]] = {
    # The 2017 base model (Vaswani et al., Table 3).
    "paper-base": dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, norm="post", ffn="relu", dropout=0.1,
                       vocab_size=37000),
    # Small CPU presets for the accuracy tasks (a few hundred K to a few M parameters).
    "tiny": dict(d_model=64, n_heads=2, n_layers=2),
    "small": dict(d_model=128, n_heads=4, n_layers=2),
    "medium": dict(d_model=256, n_heads=4, n_layers=4),
}


def position_params_for(config: TransformerConfig) -> dict[str, Any]:
    """The position config's shape fields (head_dim, d_model, max_seq_len) filled from the model."""
    entry = POSITIONS.get(config.position)
    names = {f.name for f in dataclasses.fields(entry.config)}
    shape = {"head_dim": config.head_dim, "d_model": config.d_model, "max_seq_len": config.max_seq_len}
    return {**{k: v for k, v in shape.items() if k in names}, **config.position_params}


def attention_params_for(config: TransformerConfig, name: str | None = None,
                         params: dict[str, Any] | None = None) -> dict[str, Any]:
    """A layer's attention params (``config.attention``'s unless ``name`` and ``params`` are given): the position
    method's (ALiBi asks the attention for its bias) under the user's, and the head count of the weights the
    variant learns per head."""
    name, given = (config.attention, config.attention_params) if name is None else (name, params or {})
    wanted = POSITIONS.get(config.position).cls.attention_params
    entry = ATTENTION.get(name)
    fields = {f.name for f in dataclasses.fields(entry.config)}
    missing = [k for k in wanted if k not in fields]
    check(not missing, f"position {config.position!r} needs an attention variant with parameter(s) {', '.join(missing)} "
                       f"({name!r} has none)")
    params = {**wanted, **given}
    per_head = getattr(entry.cls, "learned_per_head", None)  # "key": weights per key head (mamba2's A and D)
    if "heads" in fields and not params.get("heads") and (params.get("sink_logit") or per_head):
        # made now, so an optimizer built before the first call trains them
        params["heads"] = config.num_kv_heads if per_head == "key" else config.n_heads
    return params


class SelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig, position: nn.Module, name: str, params: dict[str, Any], backend: str):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.causal = config.n_heads, config.num_kv_heads, config.causal
        width = config.d_model + 2 * config.num_kv_heads * config.head_dim
        self.qkv = nn.Linear(config.d_model, width, bias=config.bias)
        self.conv = nn.Conv1d(width, width, config.short_conv, groups=width, bias=False) if config.short_conv else None
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.attn = build_attention(name, backend=backend, **attention_params_for(config, name, params))
        # the variant's per-token inputs (gates, decays): one projection each, per key head (token_inputs.py)
        self.inputs = nn.ModuleDict({t.name: nn.Linear(config.d_model, config.num_kv_heads * t.channels(config.head_dim),
                                                       bias=True) for t in self.attn.token_inputs})
        # ... and the inputs' own learned weights after the projection (Gated DeltaNet's decay rate per key head)
        self.input_maps = nn.ModuleDict({t.name: t.mapping(config.num_kv_heads) for t in self.attn.token_inputs
                                         if t.layer is not None})
        self.position = position  # shared with the model; rotary methods act here
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, start: int, seq_len: int, state: Any = None,
                documents: torch.Tensor | None = None, conv: ConvCache | None = None) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_heads
        h = self.qkv(x)
        if self.conv is not None:
            check(documents is None, "short_conv would mix packed documents: run them without short_conv")
            h = causal_conv(self.conv.weight, h, conv)
        qkv = h.view(B, T, self.n_heads + 2 * self.n_kv_heads, hs).transpose(1, 2)  # (B, nh + 2 n_kv, T, hs)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)  # k, v: (B, n_kv, T, hs)
        q = self.position.rotate(q, start, seq_len)
        k = self.position.rotate(k, start, seq_len)
        extra = {}  # each (B, n_kv, T, width)
        for t in self.attn.token_inputs:
            raw = self.inputs[t.name](x).view(B, T, self.n_kv_heads, -1).transpose(1, 2)
            extra[t.name] = self.input_maps[t.name](raw) if t.name in self.input_maps else t.activation(raw)
        if state is None:
            y = self.attn(q, k, v, causal=self.causal, documents=documents, **extra)
        else:
            check(documents is None, "decoding packed documents is not supported: start a new state per document")
            y = self.attn.run_step(q, k, v, state, **extra)
        if self.attn.output_norm:  # per-head RMS norm, as the gated linear family's layers do (see Attention)
            y = F.rms_norm(y, (hs,))
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.dropout(self.proj(y))


def rotary_at(config: TransformerConfig, position: nn.Module) -> Callable[[int], nn.Module]:
    """head dim -> the model's position method at that head dim, for a layer that ropes only some channels (MLA's
    RoPE key); a method without rotation (it acts at the input) is the model's own module at any head dim."""
    if not callable(getattr(position, "inv_freq", None)):
        return lambda head_dim: position
    return lambda head_dim: build_position(config.position, **{**position_params_for(config), "head_dim": head_dim})


class FeedForward(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.kind = config.ffn
        hidden = config.d_ff * (2 if self.kind == "swiglu" else 1)
        self.up = nn.Linear(config.d_model, hidden, bias=config.bias)
        self.down = nn.Linear(config.d_ff, config.d_model, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.kind == "swiglu":  # Shazeer 2020
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        else:
            h = F.relu(h) if self.kind == "relu" else F.gelu(h)
        return self.dropout(self.down(h))


class Block(nn.Module):
    def __init__(self, config: TransformerConfig, position: nn.Module, spec: tuple[str, dict[str, Any], str]):
        super().__init__()
        self.pre = config.norm == "pre"
        self.ln1 = nn.LayerNorm(config.d_model, bias=config.bias)
        self.ln2 = nn.LayerNorm(config.d_model, bias=config.bias)
        name, params, backend = spec
        layer = getattr(ATTENTION.get(name).cls, "layer", None)  # a layer-level variant (MLA) owns its projections
        self.attn = (layer(config, position, name, attention_params_for(config, name, params), backend,
                           rotary_at(config, position)) if layer
                     else SelfAttention(config, position, name, params, backend))
        self.ffn = FeedForward(config)

    def forward(self, x: torch.Tensor, start: int, seq_len: int, state: Any = None,
                documents: torch.Tensor | None = None, conv: ConvCache | None = None) -> torch.Tensor:
        if self.pre:
            x = x + self.attn(self.ln1(x), start, seq_len, state, documents, conv)
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.attn(x, start, seq_len, state, documents, conv))
        return self.ln2(x + self.ffn(x))


@dataclass
class DecodeState:
    """Where a generation is: the next position, the announced length, per-layer caches (and short-conv inputs)."""

    layers: list[Any]
    max_len: int
    start: int = 0
    convs: list[ConvCache] = field(default_factory=list)


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.position = build_position(config.position, **position_params_for(config))
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, self.position, spec) for spec in config.layer_specs())
        self.ln_f = nn.LayerNorm(config.d_model, bias=config.bias) if config.norm == "pre" else nn.Identity()
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def init_state(self, batch_size: int = 1, max_len: int = 0) -> DecodeState:
        """Fresh decoding state; ``max_len`` is the length the generation will reach, if known."""
        if not self.config.causal:
            raise ValueError("incremental decoding needs a causal model")
        return DecodeState([b.attn.attn.start_state(max_len) for b in self.blocks], max_len=max_len,
                           convs=[ConvCache() for _ in self.blocks])

    def forward(self, idx: torch.Tensor, state: DecodeState | None = None,
                documents: torch.Tensor | None = None) -> torch.Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab). With ``state``, continues a generation. ``documents``:
        a document id per token, (T,) or (B, T), for packed sequences (no attention across documents)."""
        B, T = idx.shape
        start = 0 if state is None else state.start
        seq_len = start + T if state is None or not state.max_len else max(state.max_len, start + T)
        x = self.drop(self.position.embed(self.tok_emb(idx), start))
        for i, block in enumerate(self.blocks):
            x = block(x, start, seq_len, None if state is None else state.layers[i], documents,
                      None if state is None else state.convs[i])
        if state is not None:
            state.start += T
        return self.head(self.ln_f(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
             documents: torch.Tensor | None = None) -> torch.Tensor:
        logits = self(idx, documents=documents)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index)


__all__ = ["Transformer", "TransformerConfig", "DecodeState", "PRESETS", "position_params_for"]
