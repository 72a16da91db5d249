"""The contract every attention variant implements, and the backend dispatch they share.

A variant subclasses :class:`Attention`, lists its :class:`Backend` s and writes one
``backend_<name>(q, k, v, causal)`` method per backend; ``last_backend`` says which ran.

``auto`` = the fastest backend here. It tries, in order, the backends a variant's ``auto_order`` lists for
``"<device>/<mode>"`` (an order *measured* on that device class, written down with the command that measured it),
then the rest in declaration order (the author's guess, for unmeasured devices); the first that can run on the
inputs' device, dtype and mode wins. The dense ``reference`` is chosen only when nothing else can run.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from attn.attention import gqa
from attn.attention.documents import document_spans, per_document
from attn.attention.flex import FLEX_MIN_LEN
from attn.attention.masks import causal_mask, visible_pairs
from attn.attention.ragged import RAGGED_CACHES, stacked
from attn.attention.state import KVCache, checked
from attn.attention.token_inputs import TokenInput
from attn.optional import unavailable
from attn.registry import check_backend

MODES = ("forward", "backward", "decode")
# A training step = forward + backward; backward = 2 x forward (two matmuls per forward matmul).
TRAIN_FLOPS_FACTOR = 3
ALL_MODES = frozenset(MODES)


class UnsupportedBackend(RuntimeError):
    """A backend that cannot run here; the message says why (the harness records it)."""


@dataclass(frozen=True)
class Backend:
    """What one backend can run: modes per device type, dtypes, and an availability probe."""

    name: str
    devices: dict[str, frozenset[str]]
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    requires: Callable[[], str | None] | None = None  # returns why it cannot run, or None
    note: str = ""

    def why_not(self, device: str, dtype: torch.dtype, mode: str) -> str | None:
        if device not in self.devices:
            return f"{self.name} needs {' or '.join(self.devices).upper()}, inputs are on {device}"
        if mode not in self.devices[device]:
            return f"{self.name} has no {mode} on {device}"
        if dtype not in self.dtypes:
            return f"{self.name} does not support {str(dtype).removeprefix('torch.')}"
        if self.requires is not None:
            return self.requires()
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices": {d: sorted(m, key=MODES.index) for d, m in self.devices.items()},
            "available": self.requires() if self.requires else None,
            "note": self.note,
        }


def modes(*names: str) -> frozenset[str]:
    return frozenset(names)


def have_module(module: str, why: str = "") -> Callable[[], str | None]:
    """An availability probe: None if ``module`` really imports, else the reason (the import's own error).

    It imports rather than looks the name up: an installed package whose submodule, C extension or
    dependency fails (fla without fla-core's ``fla.ops``, or without einops) must say so, not claim to be
    available and fail inside a measured cell. The answer is cached per process.
    """
    hint = why.strip().removeprefix("(").removesuffix(")")

    @functools.cache
    def probe() -> str | None:
        return unavailable(module, hint)

    return probe


def needs_cuda() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA device"


class Attention(nn.Module):
    """Base class: validates the call, picks the backend, runs it, remembers which ran."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    supports_causal: ClassVar[bool] = True
    supports_bidirectional: ClassVar[bool] = True
    exact: ClassVar[bool] = True
    # Grouped-query attention: True when every backend takes k, v with H_kv < H heads itself. A variant
    # that does not declare it still runs GQA calls: its keys are repeated to H heads first (a warning says so).
    supports_gqa: ClassVar[bool] = False
    backends: ClassVar[tuple[Backend, ...]] = ()
    # Per-token inputs besides q, k, v (gates, decays): the backbone projects them from the layer input, sweeps
    # draw them; each backend and ``step`` receives them as keyword arguments (see token_inputs.py).
    token_inputs: ClassVar[tuple[TokenInput, ...]] = ()
    # True when the layer RMS-normalises each head's output (no weight) before its output projection: the
    # decayed/gated linear family's layers do (RetNet's GroupNorm, GLA's and Gated DeltaNet's RMSNorm), since
    # their raw outputs scale with the decay's horizon. The op itself never normalises: it equals the paper's sum.
    output_norm: ClassVar[bool] = False
    # True when the backends mask across packed documents themselves (``documents=``); otherwise the base
    # class runs each document as its own call (equal-length documents folded into the batch).
    supports_documents: ClassVar[bool] = False
    # "<device>/<mode>" -> backends fastest first, as measured on that device class (see module docstring)
    auto_order: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, config: Any, backend: str = "auto"):
        super().__init__()
        check_backend(self.name, backend, [b.name for b in self.backends])
        self.config = config
        self.backend = backend
        self.last_backend: str | None = None
        # Queries of the call being dispatched while select_backend runs inside forward (None otherwise): a variant
        # can skip a backend that would compile per shape for short inputs (flex.FLEX_MIN_LEN).
        self.dispatch_queries: int | None = None
        self.dispatch_keys: int | None = None  # and its keys: a dense path can win below some number of pairs

    # -- dispatch -----------------------------------------------------------------------
    def backend_info(self, name: str) -> Backend:
        return next(b for b in self.backends if b.name == name)

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        """The backend that will run for these inputs, or :class:`UnsupportedBackend` with why."""
        if self.backend != "auto":
            why = self.backend_info(self.backend).why_not(device, dtype, mode)
            if why:
                raise UnsupportedBackend(f"{self.name}/{self.backend}: {why}")
            return self.backend
        reasons = []
        for b in self.auto_candidates(device, mode):
            if b.name == "reference" and len(self.backends) > 1:
                continue  # auto never picks the dense reference when a fast path exists
            why = b.why_not(device, dtype, mode)
            if why is None:
                return b.name
            reasons.append(why)
        ref = next((b for b in self.backends if b.name == "reference"), None)  # wherever it is listed
        if ref is not None and ref.why_not(device, dtype, mode) is None:
            return "reference"
        raise UnsupportedBackend(f"{self.name}: no backend can run ({'; '.join(reasons)})")

    @classmethod
    def check_declaration(cls) -> None:
        """TypeError unless ``auto_order`` keys are ``<device>/<mode>`` (modes: forward, backward, decode)
        and name declared backends: a typo would otherwise be ignored, or fail at the first call."""
        names = [b.name for b in cls.backends]
        for key, order in cls.auto_order.items():
            device, _, mode = key.partition("/")
            if not device or mode not in MODES:
                raise TypeError(f"{cls.__qualname__}.auto_order: key {key!r} must be '<device>/<mode>' with mode "
                                f"one of {', '.join(MODES)} (a training step is 'backward')")
            unknown = [n for n in order if n not in names]
            if unknown:
                raise TypeError(f"{cls.__qualname__}.auto_order[{key!r}] names unknown backends {unknown}; "
                                f"declared: {', '.join(names)}")
        missing = [n for n in names if not callable(getattr(cls, f"backend_{n}", None))]
        if missing:
            raise TypeError(f"{cls.__qualname__} declares backend(s) {', '.join(missing)} without a method: write "
                            + ", ".join(f"def backend_{n}(self, q, k, v, causal)" for n in missing))

    def short_for_flex(self) -> bool:
        """Whether the call being dispatched has fewer queries than a Flex compile is worth (flex.FLEX_MIN_LEN)."""
        return self.dispatch_queries is not None and self.dispatch_queries < FLEX_MIN_LEN

    def auto_candidates(self, device: str, mode: str) -> list[Backend]:
        """Backends in the order ``auto`` tries them on ``device`` (a device type: cpu, cuda) in ``mode``."""
        measured = self.auto_order.get(f"{device}/{mode}", ())
        first = [self.backend_info(n) for n in measured]
        return first + [b for b in self.backends if b.name not in measured]

    @staticmethod
    def mode_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return "backward"
        if q.shape[2] < k.shape[2]:
            return "decode"
        return "forward"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, *,
                documents: torch.Tensor | None = None, **inputs: torch.Tensor) -> torch.Tensor:
        """q: (B, H, Lq, D), k, v: (B, H_kv, Lk, D) with H % H_kv == 0 (GQA) -> (B, H, Lq, D).

        ``documents``: packed sequences, a document id per key position, (Lk,) or (B, Lk), constant over each
        document and non-decreasing; no query sees a key of another document. ``inputs``: the variant's
        :attr:`token_inputs` by name, each (B, H_kv, Lk, width)."""
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError(f"expected (B, H, L, D) tensors, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if (k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]
                or k.shape[1] == 0 or q.shape[1] % k.shape[1]):
            raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                             "(k, v: (B, H_kv, Lk, D) with H_kv dividing q's H heads)")
        if q.shape[2] > k.shape[2]:
            raise ValueError(f"more queries ({q.shape[2]}) than keys ({k.shape[2]})")
        if causal and not self.supports_causal:
            raise ValueError(f"{self.name} does not support causal attention")
        if not causal and not self.supports_bidirectional:
            raise ValueError(f"{self.name} does not support bidirectional attention")
        self.check_inputs(inputs, k, k.shape[2])
        if documents is not None:
            spans = document_spans(documents, k.shape[0], k.shape[2])
            if len(spans) > 1 and not self.supports_documents:
                return per_document(self, q, k, v, causal, spans, inputs)
            if len(spans) > 1:
                inputs = {**inputs, "documents": documents}
        self.dispatch_queries, self.dispatch_keys = q.shape[2], k.shape[2]
        try:
            name = self.select_backend(q.device.type, q.dtype, self.mode_of(q, k, v))
        finally:
            self.dispatch_queries = self.dispatch_keys = None
        self.last_backend = name
        if q.shape[1] != k.shape[1] and not self.supports_gqa:
            k, v, inputs = gqa.repeated_for(type(self), q, k, v, inputs)
        return getattr(self, f"backend_{name}")(q, k, v, causal, **inputs)

    def check_inputs(self, inputs: dict[str, torch.Tensor], k: torch.Tensor, length: int) -> None:
        """ValueError unless ``inputs`` are exactly this variant's token inputs, each (B, H_kv, length, width)."""
        want = {t.name: t for t in self.token_inputs}
        if set(inputs) != set(want):
            missing, unknown = sorted(set(want) - set(inputs)), sorted(set(inputs) - set(want))
            needs = ", ".join(want) or "none"
            raise ValueError(f"{self.name} takes token inputs: {needs}"
                             + (f"; missing {', '.join(missing)}" if missing else "")
                             + (f"; unknown {', '.join(unknown)}" if unknown else ""))
        for name, t in inputs.items():
            shape = want[name].shape(k.shape[0], k.shape[1], length, k.shape[3])
            if tuple(t.shape) != shape:
                raise ValueError(f"{self.name}: token input {name!r} must be (B, H_kv, L, width) = {shape}, "
                                 f"got {tuple(t.shape)}")

    # -- cost ---------------------------------------------------------------------------
    def flops(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int, causal: bool = True,
              kv_heads: int | None = None) -> int:
        """Useful FLOPs of one forward call on q (Lq) and k, v (Lk), 2 per MAC: QK^T and PV over the
        visible pairs only (masked-out pairs not counted). See :meth:`mode_flops` for what a harness mode costs.

        ``heads`` are query heads: with GQA (``kv_heads`` < ``heads``) every query head still forms its own
        scores and output, so softmax attention's count does not depend on ``kv_heads``; a variant whose
        work is per key head (a recurrent state) uses it."""
        return 4 * batch * heads * head_dim * self.pairs(q_len, k_len, causal)

    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        """Visible (query, key) pairs of a call; Lq < Lk means the queries are the last Lq positions."""
        return visible_pairs(q_len, k_len, causal)

    def mode_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = True,
                   kv_heads: int | None = None) -> int:
        """Useful FLOPs of what the harness times in ``mode`` at context ``seq_len`` (L), 2 per MAC.

        - ``forward``: one call on L queries and L keys, ``flops(B, H, L, L, D, causal)``.
        - ``train``: forward + backward = 3 x forward. Each forward matmul C = A B has two in the
          backward pass (dA = dC B^T, dB = A^T dC), so backward = 2 x forward (Kaplan et al. 2020,
          sec. 2.1; the PaLM MFU convention). Recomputation (FlashAttention re-forms the scores in
          its backward) is not useful work and is not counted.
        - ``decode``: one step of one new token whose state already holds L tokens. The default is
          for variants with a KV cache: one query against the L + 1 keys it sees, i.e.
          ``flops(B, H, 1, L + 1, D, causal=True)`` (appending to the cache is a copy, no FLOPs).
          A step is causal whatever ``causal`` says: a new token has no future.

        Plugins that do not override this get these definitions through their own ``flops`` and
        ``pairs``; a variant whose step does not re-read every key (a recurrent state) must
        override the ``decode`` case, or its decode is charged all L + 1 keys. ``kv_heads`` (GQA) changes
        nothing here: every query head does its own QK^T and PV (see :meth:`flops`).
        """
        if mode == "forward":
            return self.flops(batch, heads, seq_len, seq_len, head_dim, causal)
        if mode == "train":
            return TRAIN_FLOPS_FACTOR * self.flops(batch, heads, seq_len, seq_len, head_dim, causal)
        if mode == "decode":
            return self.flops(batch, heads, 1, seq_len + 1, head_dim, True)
        raise ValueError(f"unknown mode {mode!r}; valid: forward, train, decode")

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        """FLOPs spent *choosing* keys in ``mode`` (2 per MAC), apart from :meth:`mode_flops` (the attention on the
        chosen keys); rows report both. 0 for a fixed pattern (a window, a block layout)."""
        return 0

    def mode_bytes(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = True,
                   kv_heads: int | None = None, itemsize: int = 4) -> int:
        """Bytes what the harness times in ``mode`` must move between memory and the cores at least (the compulsory
        traffic a roofline divides by: each tensor read or written once, never the re-reads of a tiled kernel).

        - ``forward``: read q, k, v and the token inputs of L tokens, write the output: :meth:`io_elements`.
        - ``train``: 3 x forward, as for FLOPs: the backward reads q, k, v, o, dO and writes dq, dk, dv (and the
          token inputs' gradients), twice the forward's traffic. The softmax statistics (one number per query and
          head) are not counted.
        - ``decode``: the new token's q, k, v and output, plus :meth:`decode_state_elements` (what the step reads from
          its state and writes back) and :meth:`selection_elements` (what it reads to choose keys).

        Elements of ``itemsize`` bytes, the inputs' dtype; a state kept in another precision says so in
        :meth:`state_itemsize`. ``causal`` does not change the count: a masked key is still read once.
        """
        kvh = kv_heads or heads
        if mode in ("forward", "train"):
            factor = TRAIN_FLOPS_FACTOR if mode == "train" else 1
            return factor * itemsize * self.io_elements(batch, heads, kvh, seq_len, head_dim)
        if mode == "decode":
            new = self.io_elements(batch, heads, kvh, 1, head_dim) + self.selection_elements(
                batch, heads, seq_len, head_dim, kvh)
            state = self.decode_state_elements(batch, heads, seq_len, head_dim, kvh)
            return itemsize * new + self.state_itemsize(itemsize) * state
        raise ValueError(f"unknown mode {mode!r}; valid: forward, train, decode")

    def io_elements(self, batch: int, heads: int, kv_heads: int, length: int, head_dim: int) -> int:
        """Elements of ``length`` tokens' q (``heads``), k and v (``kv_heads``) and token inputs read, and their output
        (``heads``) written."""
        inputs = sum(_numel(t.shape(batch, kv_heads, length, head_dim)) for t in self.token_inputs)
        return batch * length * head_dim * (2 * heads + 2 * kv_heads) + inputs

    def decode_state_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """Elements one decoding step at context ``seq_len`` reads from its state and writes to it. A KV cache reads
        the keys and values of the cached tokens the new query sees (``pairs(1, L + 1) - 1``: its own key comes with
        the call) and writes the new token's key and value, per key head."""
        seen = self.pairs(1, seq_len + 1, True) - 1
        return 2 * batch * kv_heads * head_dim * (seen + 1)

    def selection_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """Elements a decoding step reads only to choose its keys (block summaries, index keys); 0 for a fixed
        pattern. The chosen keys themselves are counted by :meth:`decode_state_elements` through :meth:`pairs`."""
        return 0

    def state_itemsize(self, itemsize: int) -> int:
        """Bytes per element of the decoding state for inputs of ``itemsize`` bytes: the inputs' dtype (a KV cache)."""
        return itemsize

    # -- selection --------------------------------------------------------------------------
    def kept_keys(self, q: torch.Tensor, k: torch.Tensor, causal: bool = True,
                  **inputs: torch.Tensor) -> torch.Tensor | None:
        """Bool (B, H, Lq, Lk): the keys in each query's softmax when it is the newest token (what a decoding step
        reads), which the selection task compares with full attention. None for a recurrence (no subset of keys)."""
        B, H, Lq, Lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        return causal_mask(Lq, Lk, q.device, causal=causal).expand(B, H, Lq, Lk)

    # -- incremental decoding -----------------------------------------------------------
    supports_decode: ClassVar[bool] = True
    # True when a call whose queries are the whole sequence (a prefill, Lq == Lk) attends densely and only calls with
    # Lq < Lk select keys (Quest, as in its paper): decoding then equals the forward *call by call* (each step equals
    # a forward of its queries over the keys before them), not one forward over every token.
    dense_prefill: ClassVar[bool] = False

    def new_state(self, max_len: int = 0) -> Any:
        """Per-layer decoding state (the contract: attn/attention/state.py); the default keeps every key and value."""
        return KVCache(capacity_hint=max_len)

    def start_state(self, max_len: int = 0) -> Any:
        """:meth:`new_state` as callers get it: refused (``TypeError``) unless it follows the decoding-state contract."""
        return checked(self.new_state(max_len), type(self).__qualname__)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Any, **inputs: torch.Tensor) -> torch.Tensor:
        """Attend new tokens (q, k, v: (B, H, T, D)) to everything before them; updates ``state``.
        ``inputs``: the new tokens' :attr:`token_inputs` (a variant that declares some overrides this)."""
        keys, values = state.append(k, v)
        return self(q, keys, values, causal=True)

    def run_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Any,
                 **inputs: torch.Tensor) -> torch.Tensor:
        """:meth:`step` as callers (the backbone, the harness, the checker) make it: token inputs checked, and a
        variant that does not declare ``supports_gqa`` is given keys and values repeated to the query heads, so
        its own ``step`` sees H heads."""
        self.check_inputs(inputs, k, k.shape[2])
        if q.shape[1] != k.shape[1] and not self.supports_gqa:
            k, v, inputs = gqa.repeated_for(type(self), q, k, v, inputs)
        if isinstance(state, RAGGED_CACHES):  # masked SDPA: all of plain full's and plain window's step
            self.last_backend = "ragged-sdpa"
            return state.attend(q, k, v)
        return self.step(q, k, v, state, **inputs)

    def ragged_state(self, states: list[Any], step_tokens: int = 1) -> Any:
        """One batched decoding state from one-sequence states of different lengths, whose steps of ``step_tokens``
        tokens run each sequence exactly as its own state would (attn/attention/ragged.py); refused by default."""
        raise UnsupportedBackend(f"{type(self).__name__} does not decode ragged batches (sequences of different "
                                 "lengths in one step): built for plain full, sliding_window and the recurrences")

    @classmethod
    def auto_orders(cls) -> dict[str, list[str]]:
        """``"<device>/<mode>"`` -> the backends ``auto`` tries there, in order (the dense reference last:
        it runs only when nothing else can), for every device and mode some backend declares."""
        out = {}
        devices = dict.fromkeys(d for b in cls.backends for d in b.devices)
        for device in devices:
            for mode in MODES:
                able = [b for b in cls.backends if mode in b.devices.get(device, ())]
                if not able:
                    continue
                measured = cls.auto_order.get(f"{device}/{mode}", ())
                order = [n for n in measured if any(b.name == n for b in able)]
                order += [b.name for b in able if b.name not in order and b.name != "reference"]
                if any(b.name == "reference" for b in able):
                    order.append("reference")
                out[f"{device}/{mode}"] = order
        return out

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "causal": cls.supports_causal,
            "bidirectional": cls.supports_bidirectional,
            "exact": cls.exact,
            "decode": cls.supports_decode,
            "gqa": "native" if cls.supports_gqa else "keys repeated to the query heads",
            "token_inputs": [t.name for t in cls.token_inputs],
            "documents": "masked in the kernel" if cls.supports_documents else "one call per document",
            "backends": [b.describe() for b in cls.backends],
            "auto_order": cls.auto_orders(),
            "doc": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "",
        }


class RecurrentAttention(Attention):
    """Base of the variants that decode with a constant-size state (linear attention and its decayed/gated family):
    their :meth:`flops` count the recurrent form (linear in length, never L^2), so a call costs
    ``flops(B, H, L, L, D)`` forward, 3x that to train (backward = 2x forward, as for every variant), and a decoding
    step -- absorb ONE key into the state, read it with one query -- ``flops(B, H, 1, 1, D)``, whatever the context
    length L is. ``kv_heads`` (GQA) reaches :meth:`flops`: the state is updated per key head, read per query head."""

    def kept_keys(self, q: torch.Tensor, k: torch.Tensor, causal: bool = True,
                  **inputs: torch.Tensor) -> torch.Tensor | None:
        return None  # a state, not a subset of keys: the selection metric has nothing to compare

    def mode_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = True,
                   kv_heads: int | None = None) -> int:
        if mode == "decode":
            return self.flops(batch, heads, 1, 1, head_dim, True, kv_heads)
        if mode in ("forward", "train"):
            factor = TRAIN_FLOPS_FACTOR if mode == "train" else 1
            return factor * self.flops(batch, heads, seq_len, seq_len, head_dim, causal, kv_heads)
        return super().mode_flops(mode, batch, heads, seq_len, head_dim, causal)

    def ragged_state(self, states: list[Any], step_tokens: int = 1) -> Any:
        """The sequences' states stacked: a recurrence's state has one size at every length."""
        return stacked(states)

    def decode_state_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """A recurrent step reads its whole state and writes it back, whatever the context length."""
        return 2 * self.state_elements(batch, kv_heads, head_dim)

    def state_elements(self, batch: int, kv_heads: int, head_dim: int) -> int:
        """Elements of the recurrent state: one (D_k x D_v) matrix per key head."""
        return batch * kv_heads * head_dim * head_dim

    def state_itemsize(self, itemsize: int) -> int:
        """The state is kept in fp32 at least (fp64 stays fp64): a bf16 running sum drifts over long contexts."""
        return max(itemsize, 4)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


__all__ = [
    "Attention", "RecurrentAttention", "Backend", "UnsupportedBackend", "ALL_MODES", "MODES",
    "have_module", "modes", "needs_cuda", "field",
]
