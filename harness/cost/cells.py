"""The data of a cost sweep: one cell of the grid (:class:`Cell`), its identity in a results file (``KEY_FIELDS``),
what a scope hands the worker to time (:class:`Measured`), the FLOP conventions every scope shares, and the
registry of scopes (:func:`register_scope`; the scopes themselves are harness.cost.scopes, one file each).

Modes: ``forward``; ``train`` = forward + backward (no optimiser step); ``decode`` = one new token per sequence
with the cache already holding ``seq_len`` tokens (prefilled once, outside the timed region).

FLOPs are the useful FLOPs of exactly what is timed (2 per multiply-add), from the variant's own
mode-aware count ``variant.mode_flops(mode, B, H, L, D, causal)`` (``attn.Attention.mode_flops``):
forward = ``flops(B, H, L, L, D, causal)``; decode = one step with L tokens already in the state (for
KV-cache variants one query against the L + 1 keys it sees, for ``linear`` one key absorbed into the
recurrent state and one query read from it, independent of L); train = 3 x forward: each forward matmul
C = A B has two matmuls in the backward pass (dA = dC B^T, dB = A^T dC), so backward = 2 x forward
(Kaplan et al. 2020, sec. 2.1; the PaLM MFU convention). FlashAttention's recomputation of the scores is
not useful work and is not counted, so a recomputing kernel shows a lower FLOP/s for the same time.
Each scope adds what else it times (weights of its linear layers) in its own file.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from attn.attention.base import TRAIN_FLOPS_FACTOR, UnsupportedBackend
from attn.attention.documents import even_documents
from attn.attention.documents import lengths as document_lengths
from attn.registry import ATTENTION
from harness.results import COST_KEY_FIELDS, cell_key

MODES = ("forward", "train", "decode")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Identity of a cell in a results file (--resume skips rows with the same key): the one definition every consumer uses.
KEY_FIELDS = COST_KEY_FIELDS


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
    # scope hf only, --press (harness.cost.presses): the KV press's name, its spec, every parameter it runs with
    # (defaults included) and the fraction of the context it removes; all None without a press axis
    press: str | None = None
    press_spec: str | None = None
    press_params: dict[str, Any] | None = field(default=None, hash=False)
    compression_ratio: float | None = None
    # decode only (op scope): new tokens per step (None = 1), and a memory budget the cell's batch is the largest
    # decoding state to fit in (None = batch_size sequences)
    queries: int | None = None
    budget_bytes: int | None = None
    # decode only (op scope): each sequence's context drawn uniformly from [L(1 - r), L(1 + r)] (None: all L)
    ragged: float | None = None
    # sweep --base: which side of the comparison measures it, "base" (REF's variants) or "head" (the working tree's)
    side: str | None = None

    def contexts(self) -> list[int]:
        """Each sequence's context: ``seq_len`` for all, or with ``ragged`` r drawn uniformly from the integers in
        [L(1 - r), L(1 + r)] (vLLM's random-range-ratio), seeded by the batch and length: a rerun draws the same."""
        if not self.ragged:
            return [self.seq_len] * self.batch_size
        rng = np.random.default_rng([self.seq_len, self.batch_size])
        lo, hi = max(1, round(self.seq_len * (1 - self.ragged))), round(self.seq_len * (1 + self.ragged))
        return [int(n) for n in rng.integers(lo, hi, endpoint=True, size=self.batch_size)]

    def sequences(self) -> list[Cell]:
        """A ragged cell as one one-sequence cell per context: what its counts sum over."""
        return [dataclasses.replace(self, batch_size=1, seq_len=n, ragged=None) for n in self.contexts()]

    @property
    def step_tokens(self) -> int:
        """Tokens each sequence takes per decoding step."""
        return self.queries or 1

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
        parts = [self.variant_spec or self.variant, *SCOPES[self.scope].label(self)]
        parts += [self.mode, f"L={self.seq_len}"] + ([f"docs={self.docs}"] if self.docs else [])
        parts += ([f"T={self.queries}"] if self.queries else []) + (
            [f"budget={self.budget_bytes / 2**20:g}MiB"] if self.budget_bytes else []) + (
            [f"ragged={self.ragged:g}"] if self.ragged else [])
        return " ".join(parts + ([f"[{self.side}]"] if self.side else []))


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
    columns: Callable[[], dict[str, Any]] | None = None  # row columns read after the timed calls (a press's kept tokens)
    bytes: int | None = None  # what one call must move to and from memory at least (the bandwidth roofline's count)
    # the correctness gate (harness.cost.gate): the cell's own inputs, cut to a length, compared with the reference
    gate: Callable[..., dict[str, Any]] | None = None


# -- FLOPs ---------------------------------------------------------------------------------------

def train_factor(mode: str) -> int:
    """Train step / forward for matmuls with weights (model scope): the convention attention uses too."""
    return TRAIN_FLOPS_FACTOR if mode == "train" else 1


def _contexts(cell: Cell) -> list[int]:
    """The lengths a call's count sums over: each packed document (forward, train), or the context each of a
    decoding step's new tokens sees before it (``queries`` tokens: L, L + 1, ...; a step equals one token at a time,
    call by call, for every built-in variant)."""
    if cell.mode == "decode":
        return [cell.seq_len + i for i in range(cell.step_tokens)]
    return document_lengths(cell.documents(), cell.seq_len) if cell.docs else [cell.seq_len]


def attention_flops(module: Any, cell: Cell) -> int:
    """FLOPs of one timed attention call of ``cell`` in its mode (forward, forward + backward, or one
    decoding step), from the variant's ``mode_flops`` (every registered variant is an attn.Attention), plus what it
    spends choosing its keys (:func:`selection_flops`): the work the call does; a ragged batch's, its sequences'."""
    if cell.ragged:
        return sum(attention_flops(module, c) for c in cell.sequences())
    total = 0
    for length in _contexts(cell):
        args = (cell.mode, cell.batch_size, cell.num_heads, length, cell.head_dim, cell.causal)
        if cell.num_kv_heads and "kv_heads" in inspect.signature(module.mode_flops).parameters:
            total += int(module.mode_flops(*args, kv_heads=cell.num_kv_heads))
        else:
            total += int(module.mode_flops(*args))  # a plugin's count without GQA: as multi-head
    return total + selection_flops(module, cell)


def selection_flops(module: Any, cell: Cell) -> int:
    """The part of :func:`attention_flops` a selecting variant spends scoring blocks or tokens (its
    ``selection_flops``; 0 for fixed patterns and for plugins that do not say), per attention call."""
    count = getattr(module, "selection_flops", None)
    if count is None:
        return 0
    if cell.ragged:
        return sum(selection_flops(module, c) for c in cell.sequences())
    return sum(int(count(cell.mode, cell.batch_size, cell.num_heads, n, cell.head_dim, cell.num_kv_heads))
               for n in _contexts(cell))


def attention_bytes(module: Any, cell: Cell) -> int | None:
    """Bytes one timed attention call of ``cell`` must move at least, from the variant's ``mode_bytes``
    (attn.Attention.mode_bytes: inputs and outputs once, a decoding step's state and what it reads to choose keys);
    None for a plugin that is not an attn.Attention and does not count them. A step of T tokens reads the state
    once: the last token's count (its context holds the other T - 1) plus the other tokens' own q, k, v and outputs."""
    count = getattr(module, "mode_bytes", None)
    if count is None:
        return None
    if cell.ragged:  # what each sequence must move (a padded step reads more: its bandwidth_fraction says so)
        return sum(attention_bytes(module, c) for c in cell.sequences())
    itemsize = DTYPES[cell.dtype].itemsize
    lengths = [cell.seq_len + cell.step_tokens - 1] if cell.mode == "decode" else _contexts(cell)
    total = sum(int(count(cell.mode, cell.batch_size, cell.num_heads, n, cell.head_dim, cell.causal,
                          kv_heads=cell.num_kv_heads, itemsize=itemsize)) for n in lengths)
    if cell.step_tokens > 1 and hasattr(module, "io_elements"):
        total += (cell.step_tokens - 1) * itemsize * module.io_elements(cell.batch_size, cell.num_heads, cell.kv_heads,
                                                                       1, cell.head_dim)
    return total


def weight_bytes(weights: int, cell: Cell) -> int:
    """Bytes of ``weights`` parameters one call moves: read once forward; to train, read again for the backward and
    their gradients written (3x, as FLOPs)."""
    return train_factor(cell.mode) * weights * DTYPES[cell.dtype].itemsize


def linear_weights(model: nn.Module) -> int:
    """Weights that take part in a matmul per token: every nn.Linear (a tied LM head counts, as it multiplies)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


# -- decoding state ------------------------------------------------------------------------------

class Rewind:
    """Return decoding states to ``length`` tokens after each timed step, so every repeat decodes at the same
    context length (every state has ``truncate``: attn/attention/state.py). A state that says it cannot go back
    that far (``ValueError``: a cache that evicted what it needs) keeps advancing: its size, hence a step's cost,
    does not grow."""

    def __init__(self, states: list[Any], length: int):
        self.states, self.length = states, length
        self.enabled = True

    def __call__(self) -> None:
        if not self.enabled:
            return
        try:
            for s in self.states:
                s.truncate(self.length)
        except ValueError:  # the state says it cannot rewind (nothing changed): let it advance
            self.enabled = False


# -- scopes ----------------------------------------------------------------------------------------

class Scope:
    """What one scope (``op``, ``model``, ``hf``: harness.cost.scopes) does with a cell: how a grid's values
    become its cells' shape fields, how a cell is built and measured, and how its FLOPs are counted.

    ``grid`` below is a harness.cost.spec.Grid (not imported: the spec reads this registry)."""

    name = ""
    positions_from_config = False  # positions come from each model config, not from the grid's position specs
    presses = False  # takes the --press axis (a transformers model's KV cache)

    def check(self, grid: Any) -> None:
        """Refuse a grid this scope cannot run (ValueError), before anything is resolved."""

    def prepare(self, grid: Any) -> Any:
        """What the scope reads once per grid (hf: every model config), after its variants and positions resolved."""
        return None

    def shapes(self, grid: Any, prepared: Any, position: str, heads: int, head_dim: int, kv_heads: int | None,
               length: int) -> list[dict[str, Any]]:
        """The Cell fields the scope sets (position, layers, heads, head dim) for one point of the grid."""
        raise NotImplementedError

    def label(self, cell: Cell) -> list[str]:
        """What a cell's label says about its scope, after the variant."""
        return []

    def layer_variants(self, cell: Cell) -> list[str] | None:
        """The variant of each layer of a layer-pattern cell when the scope reads the pattern its own way (hf: a
        model's layer spec); None: our backbone's pattern (attn.patterns)."""
        return None

    def build(self, cell: Cell) -> Measured:
        """Inputs, module and the measured callable of ``cell`` (seed the RNG before calling)."""
        raise NotImplementedError


SCOPES: dict[str, Scope] = {}  # name -> scope, in registration order (harness.cost.scopes registers them)


def register_scope(name: str) -> Callable[[type[Scope]], type[Scope]]:
    """Class decorator: ``@register_scope("op")`` makes ``--scope op`` build and measure cells with that class."""
    def register(cls: type[Scope]) -> type[Scope]:
        if name in SCOPES:
            raise ValueError(f"scope {name!r} is already registered")
        scope = cls()
        scope.name = name
        SCOPES[name] = scope
        return cls
    return register


def kv_heads_field(heads: int, kv_heads: int | None) -> int | None:
    """A cell's key/value heads: None when there are as many as query heads (multi-head: the rows' key stays
    what it was before GQA existed), else a number that must divide ``heads``."""
    if kv_heads is None or kv_heads == heads:
        return None
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads {kv_heads} must divide heads {heads} (H % H_kv == 0)")
    return kv_heads


def check_supported(cls: type, cell: Cell) -> None:
    if cell.causal and not getattr(cls, "supports_causal", True):
        raise UnsupportedBackend(f"{cell.variant} has no causal form")
    if not cell.causal and not getattr(cls, "supports_bidirectional", True):
        raise UnsupportedBackend(f"{cell.variant} has no bidirectional form")
    if cell.mode == "decode" and not getattr(cls, "supports_decode", True):
        raise UnsupportedBackend(f"{cell.variant} has no incremental decoding")
    if cell.device.startswith("cuda") and not torch.cuda.is_available():
        raise UnsupportedBackend("no CUDA device")


def cell_classes(cell: Cell) -> list[type]:
    """The attention classes a cell runs: its variant's, or every layer's of a layer pattern."""
    from attn.patterns import LAYERS, parse_pattern
    from attn.registry import resolve_variant

    if cell.variant != LAYERS:
        return [ATTENTION.get(cell.variant).cls]
    names = SCOPES[cell.scope].layer_variants(cell)
    if names is not None:
        return [ATTENTION.get(n).cls for n in dict.fromkeys(names)]
    unit = parse_pattern(cell.variant_params["pattern"]).unit
    return [ATTENTION.get(resolve_variant(s).name).cls for s in dict.fromkeys(unit)]


def build(cell: Cell) -> Measured:
    """Inputs, module and the measured callable of ``cell``, by its scope (seed the RNG before calling)."""
    for cls in cell_classes(cell):
        check_supported(cls, cell)
    return SCOPES[cell.scope].build(cell)


__all__ = [
    "Cell", "DTYPES", "KEY_FIELDS", "MODES", "Measured", "Rewind", "SCOPES", "Scope", "attention_bytes", "attention_flops",
    "build", "weight_bytes",
    "selection_flops",
    "check_supported", "json_normal", "kv_heads_field", "linear_weights", "register_scope", "train_factor",
]
