"""Every arm's answer in one batch: the arms' caches of one prompt decoded together, each at its own length.

A greedy decoding step reads all the model's weights; decoding n arms one at a time reads them n times a step. Here the
arms that branch from one prompt decode as one batch: one forward per step for all of them. Their caches stay as they
are -- a press leaves a different number of keys per arm, and per layer -- inside :class:`Rows` (one per layer), which
adds the tokens decoded after the context to a buffer shared by the rows (every arm decodes the same number of tokens); rows
of one length (the presses of one ratio) are stacked once, so one product reads them.
While the batch decodes, the model attends through :func:`attention` (transformers' attention signature, under
:data:`NAME`): each row's queries against its own context keys (never padded: a row reads only its keys) and the new
tokens, causal among those, the weights in float32 as transformers' eager attention computes them. Positions are each
arm's own (a retrieval arm's question follows its kept chunks, a press's the whole context). An arm whose answer has
ended leaves the batch (:func:`decode`). A window layer (Gemma 3's local layers) holds each row's last context keys
and masks by the window. Models whose attention is softcapped decode one arm at a time (:func:`batchable`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

NAME = "attn_bench_batched"


def batchable(model: Any) -> str | None:
    """Why the arms of this model cannot decode in one batch (None: they can)."""
    if getattr(model.config, "attn_logit_softcapping", None):
        return "a model whose attention is softcapped"
    return None


class Rows:
    """One layer of a batch of arms, as a ``DynamicCache`` calls its layers (transformers' ``CacheLayerMixin``, not
    subclassed: this module loads without transformers): the rows' context keys and values as their arms left them,
    rows of one length stacked into one group (read by one product; a row alone is never copied), and the tokens
    decoded since, for all rows, in one buffer of ``room`` positions."""

    is_sliding = False
    is_compileable = False

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], room: int, like: torch.Tensor):
        by_length: dict[int, list[int]] = {}
        for row, k in enumerate(keys):
            by_length.setdefault(k.shape[-2], []).append(row)
        self.groups = [(rows, torch.cat([keys[r] for r in rows]) if len(rows) > 1 else keys[rows[0]],
                        torch.cat([values[r] for r in rows]) if len(rows) > 1 else values[rows[0]])
                       for rows in by_length.values()]  # (rows, (G, Hkv, n, D) keys, values)
        _, heads, _, dim = like.shape
        self.new_k = like.new_empty(len(keys), heads, room, dim)
        self.new_v = like.new_empty(len(keys), heads, room, dim)
        self.t = 0  # tokens decoded since the context, every row
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: Any = None) -> tuple[Any, Any]:
        q = key_states.shape[-2]
        self.new_k[:, :, self.t:self.t + q] = key_states
        self.new_v[:, :, self.t:self.t + q] = value_states
        self.t += q
        return self, self  # what :func:`attention` reads its rows from

    def get_seq_length(self) -> int:
        return max(k.shape[-2] for _, k, _ in self.groups) + self.t

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """As a padded (B, Hkv, L, D) cache would read: kvpress's attention wrapper compares it with the queries'."""
        return (self.new_k.shape[0], self.new_k.shape[1], self.get_seq_length(), self.new_k.shape[-1])

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.get_seq_length() + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1

    def keep(self, index: list[int]) -> None:
        """Only these rows go on, renumbered in this order."""
        new = {old: i for i, old in enumerate(index)}
        groups = []
        for rows, k, v in self.groups:
            at = [j for j, r in enumerate(rows) if r in new]
            if len(at) == len(rows):
                groups.append(([new[r] for r in rows], k, v))
            elif at:
                pick = torch.tensor(at, device=k.device)
                groups.append(([new[rows[j]] for j in at], k[pick], v[pick]))
        self.groups = groups
        at = torch.tensor(index, device=self.new_k.device)
        self.new_k, self.new_v = self.new_k[at], self.new_v[at]


def attention(module: torch.nn.Module, query: torch.Tensor, key: Rows, value: Rows,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' signature: (B, H, Lq, D) queries, group by group against the rows' context keys in ``key`` (a
    :class:`Rows`) and the ``key.t`` tokens decoded since, causal from the bottom right among those. A window layer
    (``sliding_window=w``): a row's context keys are the last ones before its first decoded token, as a window layer's
    cache holds them, and a query sees the keys of the last ``w`` positions, itself included."""
    if kwargs.get("softcap"):
        raise ValueError("a batch of arms decodes softmax attention without a softcap")
    B, H, Lq, D = query.shape
    Hkv, t = key.new_k.shape[1], key.t
    g = H // Hkv  # query heads per key head, grouped as transformers' repeat_kv groups them
    q = query.reshape(B, Hkv, g * Lq, D) * (scaling if scaling is not None else D ** -0.5)
    new_k, new_v = key.new_k[:, :, :t], key.new_v[:, :, :t]
    at = torch.arange(Lq, device=q.device)[:, None] + (t - Lq)  # each query's index among the decoded tokens
    late = (q @ new_k.transpose(-1, -2)).view(B, Hkv, g, Lq, t)
    seen = torch.arange(t, device=q.device)[None] <= at
    if sliding_window:
        seen &= torch.arange(t, device=q.device)[None] > at - sliding_window
    late = late.masked_fill(~seen, float("-inf")).view(B, Hkv, g * Lq, t)
    out = torch.empty_like(q)
    for rows, k, v in key.groups:
        index = torch.tensor(rows, device=q.device)
        n = k.shape[-2]
        early = q[index] @ k.transpose(-1, -2)
        if sliding_window:  # context key i sits n - i positions before the first decoded token
            gone = torch.arange(n, device=q.device)[None] < n + at - sliding_window + 1
            early = early.view(len(rows), Hkv, g, Lq, n).masked_fill(gone, float("-inf")).view(early.shape)
        w = torch.softmax(torch.cat([early, late[index]], dim=-1), dim=-1, dtype=torch.float32).to(v.dtype)
        out[index] = w[..., :n] @ v + w[..., n:] @ new_v[index]
    return out.view(B, H, Lq, D).transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None  # :func:`attention` masks each row itself


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, _no_mask)


@contextlib.contextmanager
def active(model: Any) -> Iterator[None]:
    """The model attends through :func:`attention` while inside."""
    register()
    before = model.config._attn_implementation
    model.config._attn_implementation = NAME
    try:
        yield
    finally:
        model.config._attn_implementation = before


def stack(caches: Sequence[Any], layers: int, room: int) -> Any:
    """One cache holding ``caches`` (batch-1 caches, consumed) as rows: a :class:`Rows` a layer, with ``room`` for the
    tokens decoded after the context."""
    from transformers import DynamicCache

    def kv(cache: Any, i: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if i >= len(cache.layers):
            return None, None
        return getattr(cache.layers[i], "keys", None), getattr(cache.layers[i], "values", None)

    like = next(k for c in caches for i in range(layers) if (k := kv(c, i)[0]) is not None)
    empty = like[:, :, :0]
    out = DynamicCache()
    for i in range(layers):
        pairs = [kv(c, i) for c in caches]
        out.layers.append(Rows([empty if k is None else k for k, _ in pairs],
                               [empty if v is None else v for _, v in pairs], room, like))
        for c in caches:  # consumed: what a group copied is freed now
            if i < len(c.layers):
                c.layers[i].keys = c.layers[i].values = None
    return out


@torch.no_grad()
def decode(model: Any, caches: Sequence[Any], question: Sequence[int], starts: Sequence[int],
           pick: Callable[[torch.Tensor, int], int], ended: Callable[[list[int]], bool], new_tokens: int,
           layers: int) -> list[list[int]]:
    """Each row's greedy answer: ``question`` decoded from the row's position in ``starts`` against its cache, then
    ``pick(logits, made)`` token by token until ``new_tokens`` or ``ended(ids)``; the rules of one arm decoding alone,
    row by row. ``caches`` are consumed."""
    dev = model.device
    if any(getattr(m, "masked_key_indices", None) is not None for m in model.modules()):
        raise ValueError("a press left keys masked on the model's layers (AdaKV's way), which a batch cannot carry")
    cache = stack(caches, layers, len(question) + new_tokens)
    said: list[list[int]] = [[] for _ in caches]
    live = list(range(len(caches)))
    at = torch.tensor(list(starts), device=dev)[:, None]
    ids = torch.tensor([list(question)] * len(caches), device=dev)
    with active(model):
        while True:
            pos = at + torch.arange(ids.shape[1], device=dev)[None]
            logits = model(input_ids=ids, past_key_values=cache, position_ids=pos, logits_to_keep=1,
                           use_cache=True).logits[:, -1]
            at = at + ids.shape[1]
            for r, row in enumerate(live):
                said[row].append(pick(logits[r], len(said[row])))
            going = [r for r, row in enumerate(live) if len(said[row]) < new_tokens and not ended(said[row])]
            if not going:
                return said
            if len(going) < len(live):  # an answer has ended: its row leaves the batch
                for layer in cache.layers:
                    layer.keep(going)
                at = at[torch.tensor(going, device=dev)]
                live = [live[r] for r in going]
            ids = torch.tensor([[said[row][-1]] for row in live], device=dev)


__all__ = ["NAME", "Rows", "active", "attention", "batchable", "decode", "register", "stack"]
