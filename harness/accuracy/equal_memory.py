"""``--equal-memory``: the attention variants that hold as many keys as a press keeps.

A press at compression ratio r keeps ``length * (1 - r)`` tokens of the context; a sliding window (with and without
StreamingLLM's sinks) and a block-sparse layout of blocks of 128 hold that many keys a query, so each press is compared
with the variants of its memory (harness/accuracy/pretrained.py makes them settings, the budget on their rows). The
``--budget`` grid sizes its variants in :mod:`harness.accuracy.budgets` (blocks of 64, as the selective preset ran).
"""
from __future__ import annotations

SINKS = 4  # the equal-memory window's sinks (StreamingLLM's)
BLOCK = 128  # the equal-memory block_sparse's block size


def equal_memory_specs(budget: int) -> list[str]:
    """Variant specs whose decoding state holds ``budget`` tokens (see module docstring)."""
    blocks = budget // BLOCK
    # backends pinned as the checkpoint presets pin them (harness/accuracy/checkpoint_presets.py): auto would compile Flex
    # once per prompt shape
    specs = [f"sliding_window:window={budget},backend=blocked",
             f"sliding_window:sinks={SINKS},window={budget - SINKS},backend=blocked"]
    if blocks >= 2:
        specs.append(f"block_sparse:block_size={BLOCK},global_blocks=1,local_blocks={blocks - 1},backend=gathered")
    return specs


def equal_memory_budget(length: int, ratio: float) -> int:
    return int(length * (1 - ratio))


__all__ = ["equal_memory_budget", "equal_memory_specs"]
