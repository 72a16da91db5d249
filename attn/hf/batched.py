"""Every arm's answer in one batch: the arms' caches of one prompt decoded together, each at its own length.

A greedy decoding step reads all the model's weights; decoding n arms one at a time reads them n times a step. Here the
arms that branch from one prompt decode as one batch: one forward per step for all of them. A press leaves a different
number of keys per arm, and per layer, so nothing is padded: each layer is a :class:`Rows`, the rows grouped by the
length of their context keys (the presses of one ratio together), each group one buffer with room for the tokens
decoded after the context (written in place, every row the same number). While the batch decodes, the model attends
through :func:`attention` (transformers' attention signature, under :data:`NAME`): group by group, what our ``full``
computes for one arm alone (the same SDPA call, the same mask), the group a batch of it, so a row reads only its keys.
Positions are each arm's own (a retrieval arm's question follows its kept chunks, a press's the whole context). An arm
whose answer has ended leaves the batch (:func:`decode`). A window layer (Gemma 3's local layers) holds each row's last
context keys and masks by the window. Models whose attention is softcapped decode one arm at a time
(:func:`batchable`).
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
    subclassed: this module loads without transformers): the rows grouped by the length of their context keys, each
    group one buffer holding its rows' context keys as their arms left them and room for ``room`` tokens decoded
    after (written in place a step, never copied again)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], room: int):
        by_length: dict[int, list[int]] = {}
        for row, k in enumerate(keys):
            by_length.setdefault(k.shape[-2], []).append(row)
        self.groups = []  # (rows as an index tensor, (G, Hkv, n + room, D) keys, values, n)
        for n, rows in by_length.items():
            k, v = (torch.cat([t[r] for r in rows]) for t in (keys, values))
            pad = k.new_empty(*k.shape[:2], room, k.shape[-1])
            self.groups.append((torch.tensor(rows, device=k.device), torch.cat([k, pad], dim=-2),
                                torch.cat([v, pad], dim=-2), n))
        self.t = 0  # tokens decoded since the context, every row
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: Any = None) -> tuple[Any, Any]:
        q = key_states.shape[-2]
        for rows, k, v, n in self.groups:
            k[:, :, n + self.t:n + self.t + q] = key_states[rows]
            v[:, :, n + self.t:n + self.t + q] = value_states[rows]
        self.t += q
        return self, self  # what :func:`attention` reads its rows from

    def get_seq_length(self) -> int:
        return max(n for *_, n in self.groups) + self.t

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """As a padded (B, Hkv, L, D) cache would read: kvpress's attention wrapper compares it with the queries'."""
        _, k, _, _ = self.groups[0]
        return (sum(len(r) for r, *_ in self.groups), k.shape[1], self.get_seq_length(), k.shape[-1])

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.get_seq_length() + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1

    def keep(self, index: list[int]) -> None:
        """Only these rows go on, renumbered in this order."""
        new = {old: i for i, old in enumerate(index)}
        groups = []
        for rows, k, v, n in self.groups:
            at = [j for j, r in enumerate(rows.tolist()) if r in new]
            if len(at) < len(rows) and at:
                pick = torch.tensor(at, device=k.device)
                k, v = k[pick], v[pick]
            if at:
                groups.append((torch.tensor([new[int(rows[j])] for j in at], device=k.device), k, v, n))
        self.groups = groups


def attention(module: torch.nn.Module, query: torch.Tensor, key: Rows, value: Rows,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' signature: (B, H, Lq, D) queries, group by group against the group's keys in ``key`` (a
    :class:`Rows`): its context keys, then the ``key.t`` tokens decoded since, causal from the bottom right (and within
    ``sliding_window`` on a window layer, whose context keys are the last ones before the first decoded token). Each
    group is what our ``full`` computes for one arm alone (:func:`attn.attention.gqa.sdpa`, the same mask), a group
    of rows one batch of it."""
    from attn.attention import gqa
    from attn.attention.masks import causal_mask

    if kwargs.get("softcap"):
        raise ValueError("a batch of arms decodes softmax attention without a softcap")
    B, H, Lq, D = query.shape
    scale = 1.0 if scaling is None else scaling * D ** 0.5  # as our variants take a scale: on q, SDPA's 1/sqrt(D) after
    q = query * scale if abs(scale - 1.0) > 1e-6 else query
    out = torch.empty_like(q)
    for rows, k, v, n in key.groups:
        L = n + key.t
        mask = causal_mask(Lq, L, q.device, window=sliding_window) if Lq > 1 or sliding_window else None
        out[rows] = gqa.sdpa(q[rows], k[:, :, :L], v[:, :, :L], attn_mask=mask)
    return out.transpose(1, 2).contiguous(), None


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
                               [empty if v is None else v for _, v in pairs], room))
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
