"""Decoding under a memory budget: how many sequences' decoding states fit in it, and that batch's state built.

A serving system sizes its batch by the memory its KV cache (or recurrent state) takes: attention-gym's
``flex_perf.py`` derives the batch from a KV budget, and its paged-attention example reports the largest batch that
fits. Here the budget applies to the variant's own state, measured (``nbytes()``) on one sequence after a real
prefill, and the batch's state is that sequence's state repeated, so a million-token context at the batch a budget
allows costs one prefill, not one per sequence.
"""
from __future__ import annotations

from typing import Any


def capacity_batch(budget_bytes: int, state_bytes: int) -> int:
    """The most sequences whose states of ``state_bytes`` each fit in ``budget_bytes``; 0 when not even one does."""
    if state_bytes <= 0:
        raise ValueError(f"a decoding state of {state_bytes} bytes: nothing to size a batch by")
    return budget_bytes // state_bytes


def batched_state(state: Any, batch: int) -> Any:
    """A copy of a one-sequence decoding state with every per-sequence tensor repeated to ``batch`` sequences, in new
    memory (attn.attention.ragged.stacked of the state ``batch`` times): positions, scalars and configs shared, a
    one-step undo dropped."""
    from attn.attention.ragged import stacked  # here: a --base ref's attn may predate it (harness.cost.pinned)

    return stacked([state] * batch)


__all__ = ["batched_state", "capacity_batch"]
