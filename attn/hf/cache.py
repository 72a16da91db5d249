"""Our variants' own decoding state inside a transformers model: a ``Cache`` that keeps, per layer, what the variant
needs to decode (``start_state()``: a ring of the last window, a recurrent matrix, a band of blocks) instead of every
past key and value.

``cache = VariantCache(model.config)``, then ``model(ids, past_key_values=cache)`` or
``model.generate(ids, past_key_values=cache)``: same logits as transformers' ``DynamicCache`` (which hands the
variant every cached key), with memory and a step's work bounded as the variant's are.

How a step runs. transformers' attention layer calls ``past_key_values.update(k, v, layer_idx)`` and hands the
attention function what it returns, keys already rotated (``LlamaAttention.forward``); it keeps the cache itself
from the attention function. :meth:`VariantLayer.update` returns only the new tokens' keys and values and marks the
key tensor as its own (an attribute, taken off by :func:`claim`); our attention function (:mod:`attn.hf.interface`)
claims it and runs the variant's ``run_step(q, k, v, state)`` on the new tokens, which absorbs them into the layer's
state. A new token's queries are the last positions (bottom-right), as everywhere in this project.

Refused, in one line each: a model whose attention is not ours (by its config when given, else at the next
``update``: it attended over the new keys only), a mark the attention never claimed (a model that changes the keys
between the cache and the attention: at the next ``update``), padding (each row's state would absorb its padding),
beam search and other batch reordering of a filled state, bidirectional attention.
``crop`` rewinds through the states' ``truncate``: a recurrent state, or a cache that evicts, goes back one step only
(what the harness does after each timed step).
"""
from __future__ import annotations

from attn.hf.needs import transformers as _transformers  # noqa: F401  (first: a broken install is an ImportError)

# isort: split

from typing import Any

import torch
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin

from attn.attention.base import Attention
from attn.hf.naming import PREFIX

MARK = "_attn_bench_cache_layer"  # set on the key tensor update returns; claim() takes it off
UNCLAIMED = ("VariantCache: the model's attention did not run attn-bench's step on the keys the cache returned "
             "(another attn_implementation, or a model that changes keys after the cache): use DynamicCache")


def claim(key: torch.Tensor) -> VariantLayer | None:
    """The :class:`VariantLayer` whose ``update`` returned ``key`` and waits for its step (None: keys of no
    VariantCache). The mark lives on the tensor, not in a registry: nothing outlives the forward but the layer's
    ``pending``, which its next ``update`` checks."""
    layer = key.__dict__.pop(MARK, None)
    if layer is None or layer.pending is not key:
        return None
    layer.pending = None
    return layer


class VariantLayer(CacheLayerMixin):
    """One layer's decoding state (the variant's own, made at its first step), in transformers' cache-layer shape."""

    is_sliding = False  # masks cover every position: our padding mask needs no offset (padding is refused anyway)
    is_compileable = False

    def __init__(self) -> None:
        super().__init__()
        self.state: Any = None
        self.owner: Attention | None = None  # the module whose state this is
        self.pending: torch.Tensor | None = None  # the key tensor update returned, until the attention claims it

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens' k, v: (B, H_kv, T, D) -> the same tensors, marked for our attention function's step."""
        self.check_claimed()
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.pending = key_states
        setattr(key_states, MARK, self)
        return key_states, value_states

    def check_claimed(self) -> None:
        """ValueError if the keys the last update returned never reached our attention function's step."""
        if self.pending is None:
            return
        self.pending.__dict__.pop(MARK, None)
        self.pending = None
        raise ValueError(UNCLAIMED)

    def step(self, module: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: (B, H, T, D), k, v: (B, H_kv, T, D) new tokens -> (B, H, T, D), through ``module``'s own state."""
        if self.state is None:
            self.state, self.owner = module.start_state(), module
        elif module is not self.owner:
            raise ValueError(f"VariantCache: layer state made by {self.owner.name}, now run by {module.name} (the "
                             "model switched variants): start a new cache")
        # transformers' q, k, v are (B, L, H, D) projections transposed: views, which some steps cannot take (linear's
        # chunked prefill views them flat). A copy of the new tokens only (one per decoding step).
        return module.run_step(q.contiguous(), k.contiguous(), v.contiguous(), self.state)

    def get_seq_length(self) -> int:
        return 0 if self.state is None else int(self.state.length)

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        """(kv_length, kv_offset) as a cache of every token would give: our padding mask reads them, nothing else."""
        return self.get_seq_length() + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` tokens (negative: drop that many); a state that cannot go back so far raises
        ``ValueError`` (a recurrence or an evicting cache: one step back only)."""
        if self.state is None:
            return
        length = self.state.length
        self.state.truncate(length + max_length if max_length < 0 else max_length)

    def reset(self) -> None:
        self.state = self.owner = self.pending = None

    def _refuse_reorder(self, what: str) -> None:
        if self.state is not None:
            raise ValueError(f"VariantCache cannot {what} (a variant's state is not rows of keys to copy): use "
                             "greedy or sampled decoding with one sequence per prompt, or DynamicCache")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._refuse_reorder("reorder rows for beam search")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse_reorder("repeat rows")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._refuse_reorder("select rows")

    def offload(self) -> None:
        raise ValueError("VariantCache does not offload")

    def nbytes(self) -> int:
        return 0 if self.state is None else int(self.state.nbytes())


class VariantCache(Cache):
    """A cache whose layers hold our variants' own decoding states (module docstring). ``config``: the model's, to
    refuse a model whose attention is not attn-bench's (it would attend over the new tokens only)."""

    def __init__(self, config: PreTrainedConfig | None = None):
        if config is not None:
            name = getattr(config.get_text_config(decoder=True), "_attn_implementation", None)
            if not (isinstance(name, str) and name.startswith(PREFIX)):
                raise ValueError(f"VariantCache needs a model running an attn-bench variant (attn_implementation "
                                 f"{PREFIX}<variant>), not {name!r}: use DynamicCache")
        super().__init__(layer_class_to_replicate=VariantLayer)

    def nbytes(self) -> int:
        """Bytes every layer's state holds now (the decode rows' ``state_bytes``)."""
        return sum(layer.nbytes() for layer in self.layers)


__all__ = ["VariantCache", "VariantLayer", "claim"]
