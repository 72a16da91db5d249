"""Block-sparse attention: softmax attention restricted to a boolean layout of (query block, key block) pairs.

The layout is built from named, combinable parts: a local band and global blocks (Longformer,
Beltagy et al. 2020; BigBird, Zaheer et al. 2020, arXiv:2007.14062), random blocks (BigBird) and
the strided pattern of the Sparse Transformer (Child et al. 2019, arXiv:1904.10509, Sec. 4.2).

Blocks are absolute: block ``b`` covers positions ``[b * block_size, (b + 1) * block_size)``, the
last block is cut at the sequence length. When ``Lq < Lk`` the queries are the last ``Lq`` positions
(bottom-right alignment, DESIGN.md), so the layout is computed over ``Lk`` and the rows of the blocks
holding the queries are used; that keeps token-by-token decoding equal to one full forward pass.

Element rule: query at absolute position ``i`` sees key ``j`` iff ``layout[i // bs, j // bs]`` and
``j < Lk`` and, when causal, ``j <= i`` (inside the diagonal block too).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attn.attention import gqa
from attn.attention.band_cache import BandBlockCache
from attn.attention.base import ALL_MODES, Attention, Backend, UnsupportedBackend, modes
from attn.attention.flex import block_mask_from_layout, flex_unavailable, run_flex
from attn.attention.full import dense_attention
from attn.attention.gathered import gathered_attention
from attn.attention.merged_flash import Part, merged_attention
from attn.registry import check, register_attention


@dataclass(frozen=True)
class BlockSparseConfig:
    """Layout parts, all combinable; query block ``b`` may see key block ``c`` if any part allows it."""

    block_size: int = 64
    local_blocks: int = 2  # band, diagonal included: causal b-local+1 <= c <= b; bidirectional |b - c| < local
    global_blocks: int = 1  # key blocks c < global seen by every query; bidirectional: query blocks b < global see all
    random_blocks: int = 0  # extra blocks per query block, drawn from `seed` (causal: earlier blocks only)
    stride: int = 0  # 0 = off; else Sparse Transformer strided pattern at block level: (b - c) % stride == 0
    seed: int = 0
    flex_tile: int = 0  # flex backend only: its tile; 0 = the layout's block where Flex allows it (see flex_block_size)

    def __post_init__(self) -> None:
        check(self.flex_tile == 0 or (self.flex_tile >= 16 and self.flex_tile & (self.flex_tile - 1) == 0),
              f"flex_tile must be 0 (the layout's block) or a power of two >= 16, got {self.flex_tile}")
        check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        check(self.local_blocks >= 0, f"local_blocks must be >= 0, got {self.local_blocks}")
        check(self.global_blocks >= 0, f"global_blocks must be >= 0, got {self.global_blocks}")
        check(self.random_blocks >= 0, f"random_blocks must be >= 0, got {self.random_blocks}")
        check(self.stride >= 0, f"stride must be >= 0 (0 = off), got {self.stride}")
        check(0 <= self.seed < 2**31, f"seed must be in [0, 2**31), got {self.seed}")
        # Random blocks alone could leave a query with no key at all (softmax over nothing).
        check(self.local_blocks > 0 or self.global_blocks > 0 or self.stride > 0,
              "local_blocks, global_blocks and stride are all 0: at least one must be > 0 so every query sees a key")


# -- layout ----------------------------------------------------------------------------------


def _layout_rows(cfg: BlockSparseConfig, rows: torch.Tensor, num_blocks: int, causal: bool) -> torch.Tensor:
    """Layout rows for absolute query blocks ``rows`` (R,) over ``num_blocks`` key blocks -> (R, num_blocks) bool."""
    b = rows.to(torch.int32)[:, None]  # (R, 1)
    c = torch.arange(num_blocks, dtype=torch.int32)[None, :]  # (1, n)
    d = b - c
    lay = (d >= 0) & (d < cfg.local_blocks) if causal else d.abs() < cfg.local_blocks
    lay |= c < cfg.global_blocks
    if not causal:
        lay |= b < cfg.global_blocks
    if cfg.stride:
        lay |= d.remainder(cfg.stride) == 0
    if causal:
        lay &= d >= 0
    if cfg.random_blocks:
        # One stream per query block, seeded from (seed, block) by numpy's SeedSequence (independent
        # streams): a causal row never depends on the sequence length, so decoding sees the same
        # blocks as the full forward pass.
        g = torch.Generator()
        for r, blk in enumerate(rows.tolist()):
            cand = ~lay[r] & (c[0] < blk) if causal else ~lay[r]
            cand = cand.nonzero().squeeze(1)
            g.manual_seed(int(np.random.SeedSequence([cfg.seed, blk]).generate_state(1)[0]))
            lay[r, cand[torch.randperm(len(cand), generator=g)[: cfg.random_blocks]]] = True
    return lay


def _compute_query_layout(cfg: BlockSparseConfig, q_len: int, k_len: int, causal: bool) -> torch.Tensor:
    bs = cfg.block_size
    first, last = (k_len - q_len) // bs, (k_len - 1) // bs
    n = -(-k_len // bs)
    rows = torch.arange(first, last + 1)
    # Row chunks keep the integer temporaries small at long lengths (n = 16K blocks at 1M tokens).
    return torch.cat([_layout_rows(cfg, r, n, causal) for r in rows.split(1024)])


_cached_query_layout = functools.lru_cache(maxsize=8)(_compute_query_layout)


def _query_layout(cfg: BlockSparseConfig, q_len: int, k_len: int, causal: bool) -> torch.Tensor:
    """Rows of the absolute layout over ``k_len`` for the blocks holding the last ``q_len`` positions.

    Cached per shape, except decode steps (q_len < k_len): a row or two, at a new length every token.
    """
    if q_len < k_len:
        return _compute_query_layout(cfg, q_len, k_len, causal)
    return _cached_query_layout(cfg, q_len, k_len, causal)


def block_layout(cfg: BlockSparseConfig, q_len: int, k_len: int | None = None, causal: bool = True) -> torch.Tensor:
    """Bool (num_q_blocks, num_k_blocks): which key blocks each query block sees.

    num_k_blocks = ceil(k_len / bs). Row r is absolute block ``(k_len - q_len) // bs + r``; the rows
    cover the blocks holding the last ``q_len`` positions, so num_q_blocks = ceil(q_len / bs) when
    q_len == k_len.
    """
    k_len = q_len if k_len is None else k_len
    check(1 <= q_len <= k_len, f"need 1 <= q_len <= k_len, got q_len={q_len}, k_len={k_len}")
    return _query_layout(cfg, q_len, k_len, causal).clone()


def element_mask(cfg: BlockSparseConfig, q_len: int, k_len: int, causal: bool,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Dense (q_len, k_len) bool mask, True = visible: the layout expanded to elements (reference only)."""
    bs, off = cfg.block_size, k_len - q_len
    lay = _query_layout(cfg, q_len, k_len, causal).to(device)
    i = torch.arange(q_len, device=device)[:, None] + off  # absolute query positions
    j = torch.arange(k_len, device=device)[None, :]
    mask = lay[i // bs - off // bs, j // bs]  # (Lq, Lk)
    return mask & (j <= i) if causal else mask


def visible_pairs(cfg: BlockSparseConfig, q_len: int, k_len: int, causal: bool) -> int:
    """Exact number of visible (query, key) pairs, counted per block: O(blocks), not O(L^2)."""
    bs, off = cfg.block_size, k_len - q_len
    lay = _query_layout(cfg, q_len, k_len, causal)  # (R, n)
    n = lay.shape[1]
    b = torch.arange(lay.shape[0], dtype=torch.int64) + off // bs  # absolute query blocks
    lo, hi = (b * bs).clamp(min=off), ((b + 1) * bs).clamp(max=k_len)  # queries [lo, hi) in each block
    nq = hi - lo
    # Keys seen per query if every active block were fully visible; only the last block is short.
    keys = lay.sum(-1) * bs - lay[:, -1].long() * (n * bs - k_len)
    total = int((nq * keys).sum())
    if causal:  # the diagonal block is triangular: query i sees keys b*bs .. i
        diag = lay[torch.arange(lay.shape[0]), b].long()
        u, w = lo - b * bs + 1, hi - b * bs
        block_keys = ((b + 1) * bs).clamp(max=k_len) - b * bs
        total -= int((diag * (nq * block_keys - (u + w) * nq // 2)).sum())
    return total


# -- flex backend --------------------------------------------------------------------------------


def _range_reduce(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, dim: int, op: str) -> torch.Tensor:
    """any/all of ``x`` over index ranges [lo[t], hi[t]] along ``dim`` (ranges are short: a few blocks)."""
    out = None
    for s in range(int((hi - lo).max()) + 1):
        part = x.index_select(dim, torch.minimum(lo + s, hi))
        out = part if out is None else (out | part if op == "any" else out & part)
    return out


def flex_block_size(block_size: int, device_type: str = "cpu", grad: bool = False, tile: int = 0) -> int:
    """Flex tile for a layout block: ``tile`` (else the block itself) when a power of two at or above the
    device's minimum, else that minimum (non-powers of two: 128).

    A tile wider than the block wastes work: block 64 on 128 tiles computes ~49K pairs per query tile
    for ~20.5K useful ones (two local blocks). CUDA forward: the tile follows the block down to 16, with
    Flex's kernel block sizes set to match (:func:`flex_kernel_options`). CUDA backward: 128, because
    Flex's default backward tiles on H100-class GPUs are 64 x 128 and its backward takes no
    ``kernel_options`` override of them (torch 2.11-2.13 skip a config whose tiles do not divide the
    BlockMask's block). CPU: at least 64, since the CPU kernel gave wrong results at BLOCK_SIZE=8 (the
    AVX2 vector width; torch 2.13). A coarser tile stays exact: the mask_mod looks the layout up per element.
    """
    want = tile or block_size
    if want & (want - 1):
        return 128
    minimum = 64 if device_type == "cpu" else 128 if grad else 16
    return max(want, minimum)


def flex_kernel_options(tile: int, device_type: str) -> dict[str, int] | None:
    """Triton block sizes for a CUDA forward at ``tile`` below Flex's default 128 (which must divide the tile)."""
    if device_type != "cuda" or tile >= 128:
        return None
    return {"BLOCK_M": tile, "BLOCK_N": tile}


@functools.lru_cache(maxsize=8)
def _flex_block_mask(cfg: BlockSparseConfig, q_len: int, k_len: int, causal: bool, device: str, fb: int):
    """BlockMask for the element rule at tile :func:`flex_block_size`; cached per shape.

    Flex tiles count query indices 0..Lq-1 while layout rows are absolute, so a tile may straddle
    layout blocks: partial/full are reduced over every layout block a tile touches (partial may
    over-cover, which only costs time; full is exact).
    """
    bs, off = cfg.block_size, k_len - q_len
    lay = _query_layout(cfg, q_len, k_len, causal)  # (R, n)
    r, s = torch.arange(-(-q_len // fb)), torch.arange(-(-k_len // fb))
    q_lo, q_hi = off + r * fb, off + ((r + 1) * fb).clamp(max=q_len) - 1  # absolute query span per tile row
    k_lo, k_hi = s * fb, ((s + 1) * fb).clamp(max=k_len) - 1
    row_lo, row_hi = q_lo // bs - off // bs, q_hi // bs - off // bs
    any_ = _range_reduce(_range_reduce(lay, row_lo, row_hi, 0, "any"), k_lo // bs, k_hi // bs, 1, "any")
    all_ = _range_reduce(_range_reduce(lay, row_lo, row_hi, 0, "all"), k_lo // bs, k_hi // bs, 1, "all")
    whole = (((r + 1) * fb <= q_len)[:, None]) & (((s + 1) * fb <= k_len)[None, :])  # no padded edge
    if causal:
        any_ &= k_lo[None, :] <= q_hi[:, None]
        all_ &= k_hi[None, :] <= q_lo[:, None]
    full = all_ & whole
    partial = any_ & ~full
    pad = -(-fb // bs)  # empty rows/columns: lookups from padded tile positions stay in bounds
    lay_dev = F.pad(lay, (0, pad, 0, pad)).to(device)
    # Causality as a captured tensor, not a Python bool: the compiled kernel guards on Python
    # constants, so this way causal and bidirectional calls at one shape share a compile.
    horizon = torch.tensor(0 if causal else k_len, device=device)

    def block_sparse_mask(b, h, q_idx, kv_idx):
        i = q_idx + off  # absolute query position
        seen = lay_dev[i // bs - off // bs, kv_idx // bs] & (kv_idx < k_len)
        return seen & (kv_idx <= i + horizon)

    return block_mask_from_layout(partial.to(device), full.to(device), fb, q_len, k_len, block_sparse_mask)


def band_parts(length: int, block: int, local: int, global_blocks: int) -> list[Part]:
    """The causal layout of ``local`` band blocks and ``global_blocks`` as merged flash parts over ``length`` tokens
    (whole blocks): each query block against itself (causal), against each earlier band block (whole, chunk by
    chunk), and the query blocks past the band of global block c against it (one call each)."""
    parts = [Part(0, length, 0, length, causal=True, chunk=block)]
    parts += [Part(o * block, length, 0, length - o * block, causal=False, chunk=block)
              for o in range(1, min(local, length // block))]
    parts += [Part((c + local) * block, length, c * block, (c + 1) * block, causal=False)
              for c in range(global_blocks) if (c + local) * block < length]
    return parts


@register_attention("block_sparse", config=BlockSparseConfig)
class BlockSparseAttention(Attention):
    """Softmax attention over a block layout (local band, global, random, strided blocks)."""

    supports_gqa = True

    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="dense element mask from the layout"),
        Backend("flex", {"cpu": modes("forward"), "cuda": modes("forward", "backward")},
                dtypes=(torch.float32, torch.bfloat16, torch.float16), requires=flex_unavailable,
                note="compiled FlexAttention, BlockMask from the layout (no CPU backward; no decode: a mask per length)"),
        Backend("gathered", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="gathers the active key blocks per query block"),
        Backend("split", {"cpu": modes("forward", "backward")}, dtypes=(torch.float32, torch.float64, torch.bfloat16),
                note="causal local band + global blocks as flash calls (diagonal, each earlier band block, each global "
                     "block) merged by log-sum-exp, with a custom backward"),
    )
    # Forward on the 2-core development CPU (quiet): flex 2.2-4.3x faster than gathered at 4K-32K
    # (16K: 59 vs 256 ms). Command: attn-bench sweep --config results/targets-cpu.toml (results/targets-cpu.jsonl).
    # Training on the 2-core CPU (AMD EPYC, quiet), B=1 H=8 D=64 fp32, default layout: split 285 ms against gathered's
    # 667 at 16K, 64 against 75 at 4K (attn-bench sweep --config results/kernels-cpu.toml).
    auto_order = {"cpu/forward": ("flex", "gathered"), "cpu/backward": ("split", "gathered")}

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        name = super().select_backend(device, dtype, mode)
        if name == "flex" and self.backend == "auto" and self.short_for_flex():
            return "gathered"  # as sliding_window does: short or varying lengths never wait on a compile per shape
        return name

    def layout(self, q_len: int, k_len: int | None = None, causal: bool = True) -> torch.Tensor:
        """Bool (num_q_blocks, num_k_blocks), see :func:`block_layout`."""
        return block_layout(self.config, q_len, k_len, causal)

    def density(self, q_len: int, k_len: int | None = None, causal: bool = True) -> float:
        """Fraction of the q_len x k_len (query, key) pairs that are visible."""
        k_len = q_len if k_len is None else k_len
        return self.pairs(q_len, k_len, causal) / (q_len * k_len)

    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        return visible_pairs(self.config, q_len, k_len, causal)

    def kept_keys(self, q, k, causal=True, **inputs):
        mask = element_mask(self.config, q.shape[2], k.shape[2], causal, q.device)
        return mask.expand(q.shape[0], q.shape[1], *mask.shape)

    def backend_reference(self, q, k, v, causal):
        return dense_attention(q, k, v, element_mask(self.config, q.shape[2], k.shape[2], causal, q.device))

    def backend_flex(self, q, k, v, causal):
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        fb = flex_block_size(self.config.block_size, q.device.type, grad, self.config.flex_tile)
        block_mask = _flex_block_mask(self.config, q.shape[2], k.shape[2], causal, str(q.device), fb)
        return run_flex(q, k, v, block_mask, flex_kernel_options(fb, q.device.type), enable_gqa=q.shape[1] != k.shape[1])

    def new_state(self, max_len: int = 0):
        """Bounded when the layout is only global and local blocks (the default); random or strided blocks can
        reach any earlier block, so those layouts keep every token (the default KV cache)."""
        if self.config.random_blocks == 0 and self.config.stride == 0 and self.backend in ("auto", "gathered"):
            c = self.config
            return BandBlockCache(c.block_size, c.global_blocks, c.local_blocks)
        return super().new_state(max_len)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state) -> torch.Tensor:
        if not isinstance(state, BandBlockCache):
            return super().step(q, k, v, state)
        if q.shape[2] > self.config.block_size and state.length == 0:
            # a prompt: attend with the fast backends over the whole prompt, then keep what decoding needs
            keys, values, _ = state.append(k, v)
            return self(q, keys, values, causal=True)
        keys, values, pos = state.append(k, v)
        bs, q_pos = self.config.block_size, pos[-q.shape[2]:]
        rows = _layout_rows(self.config, torch.unique(q_pos // bs), int(pos[-1]) // bs + 1, True)  # (R, n)
        row_of = q_pos // bs - int(q_pos[0]) // bs
        mask = rows[row_of][:, pos // bs] & (pos[None, :] <= q_pos[:, None])  # (T, kept + T) by absolute position
        self.last_backend = "gathered"
        return gqa.sdpa(q, keys, values, attn_mask=mask).nan_to_num(0.0)

    def backend_split(self, q, k, v, causal):
        """A causal band with global blocks and as many queries as keys; under ``auto`` anything else (random or
        strided blocks, no band, bidirectional, decoding) runs ``gathered``, chosen by the same dispatch."""
        cfg = self.config
        if causal and q.shape[2] == k.shape[2] and cfg.local_blocks and not (cfg.random_blocks or cfg.stride):
            L, bs = q.shape[2], cfg.block_size
            pad = -L % bs
            if pad:
                q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
            return merged_attention(q, k, v, band_parts(L + pad, bs, cfg.local_blocks, cfg.global_blocks))[:, :, :L]
        if self.backend != "auto":
            raise UnsupportedBackend("split runs causal bands with global blocks (no random or strided blocks) with as "
                                     "many queries as keys")
        self.last_backend = "gathered"
        return self.backend_gathered(q, k, v, causal)

    def backend_gathered(self, q, k, v, causal):
        lay = _query_layout(self.config, q.shape[2], k.shape[2], causal).to(q.device)
        return gathered_attention(q, k, v, lay, self.config.block_size, causal)


__all__ = [
    "BandBlockCache", "BlockSparseAttention", "BlockSparseConfig", "band_parts", "block_layout", "element_mask",
    "flex_block_size", "flex_kernel_options", "visible_pairs",
]
