"""Decoding under a memory budget: how many sequences' decoding states fit in it, and that batch's state built.

A serving system sizes its batch by the memory its KV cache (or recurrent state) takes: attention-gym's
``flex_perf.py`` derives the batch from a KV budget, and its paged-attention example reports the largest batch that
fits. Here the budget applies to the variant's own state, measured (``nbytes()``) on one sequence after a real
prefill, and the batch's state is that sequence's state repeated, so a million-token context at the batch a budget
allows costs one prefill, not one per sequence.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch


def capacity_batch(budget_bytes: int, state_bytes: int) -> int:
    """The most sequences whose states of ``state_bytes`` each fit in ``budget_bytes``; 0 when not even one does."""
    if state_bytes <= 0:
        raise ValueError(f"a decoding state of {state_bytes} bytes: nothing to size a batch by")
    return budget_bytes // state_bytes


def batched_state(state: Any, batch: int) -> Any:
    """A copy of a one-sequence decoding state with every per-sequence tensor (leading dimension 1, then heads or
    channels) repeated to ``batch`` sequences, in new memory; nested states (a cache inside a summary cache) likewise.
    Tensors without a batch dimension (positions, even one position: ``BandBlockCache.pos``; scalars) are shared; a
    one-step undo is dropped (the copy has taken no step yet)."""
    def grown(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dim() >= 2 and value.shape[0] == 1:  # (1, heads, ...): a 1-D tensor holds positions
                return value.expand(batch, *value.shape[1:]).contiguous()
            return value
        if isinstance(value, (tuple, list)):
            return type(value)(grown(v) for v in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and not value.__dataclass_params__.frozen:
            return batched_state(value, batch)  # a state inside a state; configs (frozen) and callables are shared
        return value

    out = copy.copy(state)
    for name, value in vars(state).items():
        setattr(out, name, None if name == "_undo" else grown(value))
    return out


__all__ = ["batched_state", "capacity_batch"]
