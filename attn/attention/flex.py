"""FlexAttention plumbing shared by the masked variants (sliding window, block sparse).

Two things are expensive and cached here: the compiled ``flex_attention`` callable (compiling
takes seconds) and BlockMasks. BlockMasks are built from a block layout with
``BlockMask.from_kv_blocks`` -- O(number of blocks) -- instead of ``create_block_mask``, which
evaluates the mask on all L x L pairs (hours at 1M tokens).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # torch too old
    BlockMask = None
    flex_attention = None

# Flex compiles one kernel per shape (seconds) and works in 128-wide tiles: below this many queries a variant's
# `auto` runs a backend that needs no compile, so short or varying lengths never wait on one.
FLEX_MIN_LEN = 256

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def flex_unavailable() -> str | None:
    return None if flex_attention is not None else "FlexAttention needs torch>=2.5"


@functools.cache
def compiled_flex() -> Callable[..., torch.Tensor]:
    """The compiled flex_attention, compiled once per process (eager flex materialises L x L scores).

    Every new shape is a recompile of the same function; past dynamo's default limit (8) it would
    silently fall back to eager flex, which builds the L x L score matrix. A sweep or an evaluation
    over many lengths needs more, so the limit is raised (never lowered).
    """
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, 256)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4096)
    return torch.compile(flex_attention, dynamic=False)


def layout_to_kv_blocks(layout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(nq, nk) bool layout -> (kv_num_blocks (1, 1, nq), kv_indices (1, 1, nq, nk)), active blocks first."""
    layout = layout.to(torch.bool)
    num = layout.sum(-1, dtype=torch.int32)
    # Stable sort puts active blocks first, in increasing key-block order.
    idx = torch.argsort((~layout).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num[None, None], idx[None, None]


def block_mask_from_layout(
    partial: torch.Tensor,
    full: torch.Tensor | None,
    block_size: int,
    q_len: int,
    k_len: int,
    mask_mod: MaskMod,
) -> BlockMask:
    """BlockMask whose ``partial`` blocks apply ``mask_mod`` and whose ``full`` blocks skip it.

    ``partial`` and ``full`` are disjoint (nq, nk) bool layouts with nq = ceil(q_len / block_size),
    nk = ceil(k_len / block_size). Every block that touches a padded edge must be in ``partial``
    (the mask_mod must exclude out-of-range keys) so unequal lengths stay exact.
    """
    kv_num, kv_idx = layout_to_kv_blocks(partial)
    full_num = full_idx = None
    if full is not None and bool(full.any()):
        full_num, full_idx = layout_to_kv_blocks(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(q_len, k_len)
    )


def run_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask,
             kernel_options: dict[str, int] | None = None, enable_gqa: bool = False, score_mod=None) -> torch.Tensor:
    """q: (B, H, Lq, D), k, v: (B, H_kv, Lk, D) -> (B, H, Lq, D), through the cached compiled kernel
    (``kernel_options``: Triton tiles; ``enable_gqa``: Flex reads key head h // G for query head h itself)."""
    extra = {"kernel_options": kernel_options} if kernel_options else {}
    if enable_gqa:
        extra["enable_gqa"] = True
    if score_mod is not None:  # e.g. softcapping: applied to each score before the mask and the softmax
        extra["score_mod"] = score_mod
    return compiled_flex()(q, k, v, block_mask=block_mask, **extra)


__all__ = ["FLEX_MIN_LEN", "BlockMask", "block_mask_from_layout", "compiled_flex", "flex_unavailable", "layout_to_kv_blocks",
           "run_flex"]
