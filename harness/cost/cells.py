"""One cell of a cost sweep, and the callable that measures it, with its FLOP count.

Scopes: ``op`` is the attention call alone on random q (B, H, L, D) and k, v (B, H_kv, L, D); ``model`` is the shared
backbone (``attn.Transformer``: embeddings, projections, positions, FFN) on random tokens; ``hf`` is a Hugging Face
causal LM (random weights) running the variant through transformers' attention interface (harness.cost.hf_cells).
Modes: ``forward``; ``train`` = forward + backward (gradients of the inputs for ``op``, of every
weight for ``model``; no optimiser step); ``decode`` = one new token per sequence with the cache
already holding ``seq_len`` tokens (prefilled once, outside the timed region).

FLOPs are the useful FLOPs of exactly what is timed (2 per multiply-add), from the variant's own
mode-aware count ``variant.mode_flops(mode, B, H, L, D, causal)`` (``attn.Attention.mode_flops``):
- op: that count. forward = ``flops(B, H, L, L, D, causal)``; train = 3 x forward; decode = one
  step with L tokens already in the state: for KV-cache variants one query against the L + 1 keys
  it sees, for ``linear`` one key absorbed into the recurrent state and one query read from it
  (independent of L).
- model: ``2 * tokens * (weights of every nn.Linear, LM head included)`` (x 3 for train; tokens =
  B * L, or B for one decoding step) + ``n_layers * op count`` in the same mode.
- train = 3 x forward: each forward matmul C = A B has two matmuls in the backward pass
  (dA = dC B^T, dB = A^T dC), so backward = 2 x forward (Kaplan et al. 2020, sec. 2.1;
  the PaLM MFU convention). FlashAttention's recomputation of the scores is not useful work and
  is not counted, so a recomputing kernel shows a lower FLOP/s for the same time.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import attn
from attn.attention.base import TRAIN_FLOPS_FACTOR, UnsupportedBackend
from attn.attention.documents import even_documents
from attn.attention.documents import lengths as document_lengths
from attn.attention.token_inputs import draw_inputs
from attn.registry import ATTENTION
from harness.results import cell_key

SCOPES = ("op", "model", "hf")
MODES = ("forward", "train", "decode")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
VOCAB_SIZE = 256  # the backbone's byte-level default; the LM head is part of the model's cost

# Identity of a cell in a results file: --resume skips rows with the same key.
KEY_FIELDS = (
    "variant", "variant_params", "backend_requested", "position", "position_params", "scope", "mode", "device",
    "dtype", "batch_size", "num_heads", "num_kv_heads", "head_dim", "seq_len", "causal", "layers", "hf_config", "docs",
)


@dataclass(frozen=True)
class Cell:
    """One point of the grid. ``variant_params`` are the variant's resolved config fields."""

    variant: str
    variant_params: dict[str, Any] = field(hash=False)
    backend_requested: str
    position: str
    position_params: dict[str, Any] = field(hash=False)
    scope: str
    mode: str
    device: str
    dtype: str
    batch_size: int
    num_heads: int
    head_dim: int
    seq_len: int
    causal: bool = True
    layers: int | None = None  # model scope only: backbone depth
    variant_spec: str = ""  # the spec as written, minus defaults: labels tables and plots
    num_kv_heads: int | None = None  # GQA: key/value heads; None = as many as num_heads
    hf_config: str | None = None  # scope hf only: the transformers config (preset name or local path)
    docs: int | None = None  # packed documents per sequence (equal lengths; no attention across them); None = one

    def documents(self, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """The document id of each position (``--docs``), or None for one document."""
        return None if not self.docs else even_documents(self.seq_len, self.docs, device)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Cell:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})

    def key(self) -> str:
        return cell_key(self.as_row(), KEY_FIELDS)

    def config_key(self) -> str:
        """The key without the length: longer lengths of a failed configuration are skipped."""
        return cell_key(self.as_row(), tuple(f for f in KEY_FIELDS if f != "seq_len"))

    @property
    def label(self) -> str:
        parts = [self.variant_spec or self.variant]
        if self.scope == "model":
            parts.append(f"model/{self.position}")
        if self.scope == "hf":
            parts.append(f"hf:{self.hf_config}/{self.position}")
        parts += [self.mode, f"L={self.seq_len}"] + ([f"docs={self.docs}"] if self.docs else [])
        return " ".join(parts)


def json_normal(value: Any) -> Any:
    """The value as it reads back from JSON (tuples become lists), so keys match across runs."""
    return json.loads(json.dumps(value, default=str))


@dataclass
class Measured:
    """What the worker times: ``fn`` runs one call; ``backend()`` names the backend(s) that ran."""

    fn: Callable[[], Any]
    flops: int | None
    tokens: int  # tokens processed per call: B * L, or B for one decoding step
    backend: Callable[[], str | None]
    state: Any = None  # decoding state (inspected by tests)


# -- FLOPs ---------------------------------------------------------------------------------------

def train_factor(mode: str) -> int:
    """Train step / forward for matmuls with weights (model scope): the convention attention uses too."""
    return TRAIN_FLOPS_FACTOR if mode == "train" else 1


def attention_flops(module: Any, cell: Cell) -> int:
    """FLOPs of one timed attention call of ``cell`` in its mode (forward, forward + backward, or one
    decoding step), from the variant's ``mode_flops`` (every registered variant is an attn.Attention)."""
    packed = cell.mode != "decode" and cell.docs  # only within-document pairs (a decode step is in its last document)
    total = 0
    for length in document_lengths(cell.documents(), cell.seq_len) if packed else [cell.seq_len]:
        args = (cell.mode, cell.batch_size, cell.num_heads, length, cell.head_dim, cell.causal)
        if cell.num_kv_heads and "kv_heads" in inspect.signature(module.mode_flops).parameters:
            total += int(module.mode_flops(*args, kv_heads=cell.num_kv_heads))
        else:
            total += int(module.mode_flops(*args))  # a plugin's count without GQA: as multi-head
    return total


def op_flops(module: Any, cell: Cell) -> int:
    """What an op-scope cell times: the attention call alone."""
    return attention_flops(module, cell)


def linear_weights(model: nn.Module) -> int:
    """Weights that take part in a matmul per token: every nn.Linear (a tied LM head counts, as it multiplies)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def model_flops(model: Any, cell: Cell) -> int:
    """Every nn.Linear once per token processed (B, or B * L), plus each layer's attention in the same mode."""
    tokens = cell.batch_size * (1 if cell.mode == "decode" else cell.seq_len)
    weights = train_factor(cell.mode) * 2 * tokens * linear_weights(model)
    return weights + model.config.n_layers * attention_flops(model.blocks[0].attn.attn, cell)


# -- decoding state ------------------------------------------------------------------------------

class Rewind:
    """Return decoding states to ``length`` tokens after each timed step, so every repeat decodes
    at the same context length. A state that cannot forget (a rolling window cache that evicted
    what it needs) just keeps advancing: its size, hence a step's cost, does not grow."""

    def __init__(self, states: list[Any], length: int):
        self.states, self.length = states, length
        self.enabled = all(callable(getattr(s, "truncate", None)) for s in states)

    def __call__(self) -> None:
        if not self.enabled:
            return
        try:
            for s in self.states:
                s.truncate(self.length)
        except ValueError:  # the state says it cannot rewind (nothing changed): let it advance
            self.enabled = False


# -- building a cell -----------------------------------------------------------------------------

def check_supported(cls: type, cell: Cell) -> None:
    if cell.causal and not getattr(cls, "supports_causal", True):
        raise UnsupportedBackend(f"{cell.variant} has no causal form")
    if not cell.causal and not getattr(cls, "supports_bidirectional", True):
        raise UnsupportedBackend(f"{cell.variant} has no bidirectional form")
    if cell.mode == "decode" and not getattr(cls, "supports_decode", True):
        raise UnsupportedBackend(f"{cell.variant} has no incremental decoding")
    if cell.device.startswith("cuda") and not torch.cuda.is_available():
        raise UnsupportedBackend("no CUDA device")


def build(cell: Cell) -> Measured:
    """Inputs, module and the measured callable of ``cell`` (seed the RNG before calling)."""
    check_supported(ATTENTION.get(cell.variant).cls, cell)
    if cell.scope == "hf":
        from harness.cost.hf_cells import build_hf  # imports transformers: only for hf cells

        return build_hf(cell)
    return build_op(cell) if cell.scope == "op" else build_model(cell)


def build_op(cell: Cell) -> Measured:
    dev, dtype = torch.device(cell.device), DTYPES[cell.dtype]
    B, H, Hkv, L, D = cell.batch_size, cell.num_heads, cell.kv_heads, cell.seq_len, cell.head_dim
    module = attn.build_attention(cell.variant, backend=cell.backend_requested, **cell.variant_params).to(dev, dtype)
    flops = op_flops(module, cell)
    backend = lambda: module.last_backend
    extra = lambda n: draw_inputs(module.token_inputs, B, Hkv, n, D, device=dev, dtype=dtype)  # gates, decays: (B, H_kv, n, .)

    if cell.mode == "decode":
        state = module.new_state(L + 1)
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

        return Measured(decode_step, flops, B, backend, state)

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

        return Measured(train_step, flops, B * L, backend)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return module(q, k, v, causal=cell.causal, documents=documents, **inputs)

    return Measured(forward, flops, B * L, backend)


def model_config(cell: Cell) -> attn.TransformerConfig:
    """The backbone for a model-scope cell: d_model = heads x head_dim, ``layers`` blocks, byte vocabulary."""
    return attn.TransformerConfig(
        vocab_size=VOCAB_SIZE, d_model=cell.num_heads * cell.head_dim, n_heads=cell.num_heads, num_kv_heads=cell.kv_heads,
        n_layers=cell.layers or 1, attention=cell.variant, attention_params=dict(cell.variant_params),
        backend=cell.backend_requested, position=cell.position, position_params=dict(cell.position_params),
        max_seq_len=cell.seq_len + 1, causal=cell.causal,
    )


def build_model(cell: Cell) -> Measured:
    dev, dtype = torch.device(cell.device), DTYPES[cell.dtype]
    B, L = cell.batch_size, cell.seq_len
    model = attn.Transformer(model_config(cell)).to(dev, dtype)
    flops = model_flops(model, cell)

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

        return Measured(decode_step, flops, B, backend, state)

    idx = torch.randint(0, VOCAB_SIZE, (B, L), device=dev)  # (B, L)
    documents = cell.documents(dev)
    if cell.mode == "train":
        model.train()
        targets = torch.randint(0, VOCAB_SIZE, (B, L), device=dev)
        params = [p for p in model.parameters() if p.requires_grad]

        def train_step() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(model.loss(idx, targets, documents=documents), params)

        return Measured(train_step, flops, B * L, backend)

    model.eval()

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return model(idx, documents=documents)

    return Measured(forward, flops, B * L, backend)


__all__ = [
    "Cell", "DTYPES", "KEY_FIELDS", "MODES", "Measured", "Rewind", "SCOPES", "attention_flops", "build", "json_normal",
    "linear_weights", "model_config", "model_flops", "op_flops",
]
