"""Dynamic sparse prefill: attention that reads a cheap sample of each head's attention on *this* prompt and computes
only the keys that sample says matter (vertical-slash, FlexPrefill, XAttention). What they share lives here.

A call whose queries are the whole sequence (a prefill, Lq == Lk) is cut into query blocks of ``block`` tokens from
position 0 (block ``r`` = queries ``[r * bs, (r + 1) * bs)``). A variant's ``choose`` returns, per batch row and query
head, the keys each query block may read: a (B, H, R, n) key-block layout, or a (B, H, R, Lk) key mask where its choice
is finer than blocks (vertical-slash's columns). Rule, per query ``i`` of block ``r`` and key ``j``: visible iff
``j <= i`` and ``j`` is chosen for ``r``; the diagonal block is always chosen, so every query sees itself. Each variant
chooses twice over: ``choose(q, k, reference=False)`` from the cheap estimate its paper computes, and the
``reference`` backend from the same rule fed by the dense causal attention matrix, so tests prove the fast estimate
picks exactly what the definition picks.

The choice reads the whole call: a query's keys depend on later queries of the same prompt (the last queries' attention
for vertical-slash and FlexPrefill, every query's for XAttention's block scores), never their values. So a prompt must
be prefilled in one call (``sparse_prefill``: callers do not reuse a cached prefix), and a prompt's logits at a
position may change with what follows it. Calls that extend a context (Lq < Lk: decoding, a question after a cached
document) attend densely over the whole cache, as MInference does: these methods save prefill compute, not memory.

Every prefill records its choice (:meth:`PromptSparseAttention.take_selection`): the share of causal (query, key)
pairs computed per head (``density``) and the seconds spent choosing against attending.
"""
from __future__ import annotations

import math
import time
from typing import Any, ClassVar

import torch

from attn.attention import gqa
from attn.attention.base import Attention, Backend, UnsupportedBackend, modes
from attn.attention.flex import BlockMask, flex_unavailable, run_flex
from attn.attention.full import dense_attention
from attn.attention.masks import causal_mask

GATHER_ELEMENTS = 1 << 24  # gathered key elements per chunk of query blocks (n * W * D): ~64 MB of fp32 temporaries


def diagonal_forced(layout: torch.Tensor) -> torch.Tensor:
    """A (B, H, R, n) block layout restricted to the causal blocks (c <= r) with the diagonal block always on."""
    R, n = layout.shape[-2:]
    r = torch.arange(R, device=layout.device)[:, None]
    c = torch.arange(n, device=layout.device)[None, :]
    return (layout & (c <= r)) | (c == r)


def expand_layout(layout: torch.Tensor, bs: int, length: int) -> torch.Tensor:
    """(B, H, R, n) key-block layout -> (B, H, R, length) key mask."""
    return layout.repeat_interleave(bs, dim=-1)[..., :length]


def row_keys(chosen: torch.Tensor, bs: int, length: int, by_key: bool) -> torch.Tensor:
    """A variant's choice, key blocks (``by_key`` False) or keys -> the (B, H, R, length) key mask, diagonal block on."""
    if by_key:
        R = chosen.shape[-2]
        diag = expand_layout(torch.eye(R, -(-length // bs), dtype=torch.bool, device=chosen.device), bs, length)
        return chosen | diag
    return expand_layout(diagonal_forced(chosen), bs, length)


def visible_per_head(keys: torch.Tensor, bs: int) -> torch.Tensor:
    """Causal (query, key) pairs each head computes under the rule: (B, H, R, L) key mask -> (B, H) counts. Keys before
    a block count for each of its queries; inside the diagonal block, query i sees the keys up to itself."""
    R, L = keys.shape[-2:]
    start = torch.arange(R, device=keys.device) * bs
    nq = (L - start).clamp(max=bs)  # queries of each block (the last may be short)
    before = (keys & (torch.arange(L, device=keys.device)[None, :] < start[:, None])).sum(-1)  # (B, H, R)
    return (before * nq).sum(-1) + int((nq * (nq + 1) // 2).sum())


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, bs: int) -> torch.Tensor:
    """Causal softmax attention of a prefill where query block r of head h reads only the keys ``keys[b, h, r]``.

    q (B, H, L, D), k, v (B, H_kv, L, D), keys (B, H, R, L) bool -> (B, H, L, D). The (batch, head, block) rows are
    grouped by how many keys they read (within 25%) and each group's keys gathered by position into one dense product:
    work and memory follow the keys chosen, not L^2. Differentiable in q, k and v (the choice is fixed)."""
    B, H, L, D = q.shape
    Hkv, R = k.shape[1], keys.shape[2]
    g = H // Hkv
    f = torch.promote_types(q.dtype, torch.float32)
    qb = torch.nn.functional.pad(q, (0, 0, 0, R * bs - L)).reshape(B * H * R, bs, D)
    flat = keys.reshape(B * H * R, L)
    counts = flat.sum(-1)
    out_rows, order = [], []
    for rows in _groups(counts):
        W = int(counts[rows].max())
        step = max(1, GATHER_ELEMENTS // max(1, W * max(D, bs)))
        for part in rows.split(step):
            out_rows.append(_attend_group(qb[part], k, v, flat[part], part, counts[part], W, bs, R, H, g, f))
            order.append(part)
    out = torch.cat(out_rows)[torch.argsort(torch.cat(order))]
    return out.reshape(B, H, R * bs, D)[:, :, :L].to(q.dtype)


def _groups(counts: torch.Tensor) -> list[torch.Tensor]:
    """Row indices grouped by key count, each group's counts within 25% of its smallest."""
    values = torch.unique(counts).tolist()
    groups: list[list[int]] = []
    for c in values:
        if groups and c * 4 <= groups[-1][0] * 5:
            groups[-1].append(c)
        else:
            groups.append([c])
    return [torch.nonzero((counts >= gr[0]) & (counts <= gr[-1])).squeeze(1) for gr in groups]


def _attend_group(qr: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
                  counts: torch.Tensor, W: int, bs: int, R: int, H: int, g: int, f: torch.dtype) -> torch.Tensor:
    """One group of rows: qr (n, bs, D) over the keys of ``mask`` (n, L), at most W each -> (n, bs, D) in ``f``."""
    n, L = mask.shape
    at, col = mask.nonzero(as_tuple=True)  # row-major: each row's keys in order
    start = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(col), device=col.device) - start[at]
    kpos = torch.zeros(n, W, dtype=torch.long, device=qr.device)
    valid = torch.zeros(n, W, dtype=torch.bool, device=qr.device)
    kpos[at, slot], valid[at, slot] = col, True
    b, h, r = rows // (H * R), (rows // R) % H, rows % R
    kh = h // g
    kg, vg = k[b[:, None], kh[:, None], kpos], v[b[:, None], kh[:, None], kpos]  # (n, W, D)
    qpos = r[:, None] * bs + torch.arange(bs, device=kpos.device)  # (n, bs)
    seen = valid[:, None, :] & (kpos[:, None, :] <= qpos[:, :, None])  # (n, bs, W); the diagonal key: never empty
    scores = (qr.to(f) @ kg.to(f).transpose(-2, -1)) / math.sqrt(qr.shape[-1])
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1)
    return probs @ vg.to(f)


def causal_probs(q: torch.Tensor, k: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
    """The dense causal attention of a prefill in float32 or wider: q (B, H, L, D), k (B, H_kv, L, D) -> (B, H, Lr, L)
    for the queries ``rows`` (default all) -- what references choose from."""
    L = k.shape[2]
    f = torch.promote_types(q.dtype, torch.float32)
    kk = k.repeat_interleave(q.shape[1] // k.shape[1], 1).to(f)
    qs = q[:, :, rows] if rows is not None else q
    t = torch.arange(L, device=q.device)[rows if rows is not None else slice(None)]
    scores = (qs.to(f) @ kk.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    visible = torch.arange(L, device=q.device)[None, :] <= t[:, None]
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)


class PromptSparseAttention(Attention):
    """Base of the dynamic sparse prefills: a subclass gives ``block`` and ``choose``; this runs the rule."""

    supports_gqa = True
    supports_bidirectional = False
    sparse_prefill: ClassVar[bool] = True
    chooses_keys: ClassVar[bool] = False  # True: ``choose`` returns keys (B, H, R, L), not key blocks (B, H, R, n)
    backends: ClassVar[tuple[Backend, ...]] = (
        Backend("reference", {"cpu": modes("forward", "backward", "decode"), "cuda": modes("forward", "backward",
                                                                                            "decode")},
                note="the choice made from the dense attention matrix, then a dense masked softmax"),
        Backend("gathered", {"cpu": modes("forward", "backward", "decode"), "cuda": modes("forward", "backward",
                                                                                           "decode")},
                note="the paper's estimate, then each (head, query block) gathers its chosen keys"),
    )

    def __init__(self, config: Any, backend: str = "auto"):
        super().__init__(config, backend)
        self.calls: list[dict[str, Any]] = []

    @property
    def block(self) -> int:
        raise NotImplementedError

    def choose(self, q: torch.Tensor, k: torch.Tensor, reference: bool) -> torch.Tensor:
        """(B, H, R, n) key blocks or (B, H, R, L) keys each query block reads (see the module docstring)."""
        raise NotImplementedError

    def dense_below(self, length: int) -> bool:
        """True when a prompt this short is attended densely (a method's own fallback; none by default)."""
        return False

    # -- the rule ---------------------------------------------------------------------------------------------------
    def chosen_keys(self, q: torch.Tensor, k: torch.Tensor, reference: bool = False) -> torch.Tensor:
        """The (B, H, R, L) key mask of a prefill (diagonal block on; all causal keys when the prompt is short)."""
        B, H, L = q.shape[0], q.shape[1], q.shape[2]
        R = -(-L // self.block)
        if self.dense_below(L):
            return torch.ones(B, H, R, L, dtype=torch.bool, device=q.device)
        with torch.no_grad():
            return row_keys(self.choose(q.detach(), k.detach(), reference), self.block, L, self.chooses_keys)

    def kept_keys(self, q, k, causal=True, **inputs):
        """A prefill's keys for every query (B, H, L, L): what the selection task scores. Only whole prompts
        (Lq == Lk) select; a call extending a context keeps every key."""
        if q.shape[2] < k.shape[2]:
            return super().kept_keys(q, k, causal)
        keys = self.chosen_keys(q, k)
        rows = torch.arange(q.shape[2], device=q.device) // self.block
        return keys[:, :, rows] & causal_mask(q.shape[2], k.shape[2], q.device)

    def _run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reference: bool) -> torch.Tensor:
        if q.shape[2] < k.shape[2]:  # decoding, or a question after a cached context: the full cache (SDPA)
            return gqa.sdpa(q, k, v, attn_mask=causal_mask(q.shape[2], k.shape[2], q.device))
        t0 = time.perf_counter()
        keys = self.chosen_keys(q, k, reference)
        t1 = time.perf_counter()
        if reference:
            rows = torch.arange(q.shape[2], device=q.device) // self.block
            mask = keys[:, :, rows] & causal_mask(q.shape[2], q.shape[2], q.device)  # (B, H, L, L)
            out = dense_attention(q, k, v, mask.unflatten(1, (k.shape[1], -1)))
        else:
            out = self.attend(q, k, v, keys)
        self.record(keys, q.shape[2], t1 - t0, time.perf_counter() - t1)
        return out

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return attend_rows(q, k, v, keys, self.block)

    def backend_reference(self, q, k, v, causal):
        return self._run(q, k, v, reference=True)

    def backend_gathered(self, q, k, v, causal):
        return self._run(q, k, v, reference=False)

    # -- what a prefill chose ---------------------------------------------------------------------------------------
    def record(self, keys: torch.Tensor, length: int, choose_s: float, attend_s: float) -> None:
        pairs = visible_per_head(keys, self.block)
        per_head = pairs.double() / (length * (length + 1) // 2)
        self.last_pairs = int(pairs.sum())
        self.calls.append({"density": per_head.flatten().tolist(), "choose_s": choose_s, "attend_s": attend_s,
                           "backend": self.last_backend})

    def take_selection(self) -> list[dict[str, Any]]:
        """The prefills recorded since the last call (each: per-head densities, seconds choosing and attending)."""
        got, self.calls = self.calls, []
        return got

    def selection_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        return 0  # a decoding step reads the whole cache (counted by pairs): nothing more to choose


def selection_columns(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Row columns over recorded prefills (one module's or a model's layers'): the density per head (min / mean / max
    over heads, layers and prompts), the milliseconds an attention call spent choosing and attending (means over the
    calls) and the share spent choosing, the backend(s) the prefills ran (``prefill_backend``: a row's ``backend`` is
    the last call's, a decoding step's), and ``decode_keys``: decoding reads every cached key."""
    if not calls:
        return {}
    dens = [d for c in calls for d in c["density"]]
    choose, attend = sum(c["choose_s"] for c in calls), sum(c["attend_s"] for c in calls)
    return {"decode_keys": "all", "density": sum(dens) / len(dens), "density_head_min": min(dens),
            "density_head_max": max(dens), "choose_ms": 1e3 * choose / len(calls), "attend_ms": 1e3 * attend / len(calls),
            "choose_share": choose / max(choose + attend, 1e-12),
            "prefill_backend": ",".join(sorted({str(c.get("backend")) for c in calls}))}


class BlockPrefillAttention(PromptSparseAttention):
    """A dynamic prefill that chooses whole key blocks, so compiled FlexAttention can run it: one BlockMask a call,
    with a layout per head (blocks before the diagonal whole, the diagonal causal)."""

    backends: ClassVar[tuple[Backend, ...]] = (
        *PromptSparseAttention.backends,
        Backend("flex", {"cpu": modes("forward"), "cuda": modes("forward", "backward")},
                dtypes=(torch.float32, torch.bfloat16, torch.float16), requires=flex_unavailable,
                note="compiled FlexAttention, a BlockMask per call from each head's chosen blocks (no CPU backward)"),
    )
    # Timed by hand on the 2-core AMD EPYC (B=1 H=8 D=64 fp32, 8K, random q/k): flex 2-3x faster than gathered for
    # both block methods; the flex rows: results/prefill-cost-cpu.jsonl (attn-bench sweep --config results/prefill-cost-cpu.toml)
    auto_order = {"cpu/forward": ("flex", "gathered")}

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        name = super().select_backend(device, dtype, mode)
        if name == "flex" and self.backend == "auto" and (self.short_for_flex() or flex_tile_ok(self.block, device)):
            return "gathered"  # short prompts never wait on a compile; a block Flex cannot tile runs gathered
        return name

    def backend_flex(self, q, k, v, causal):
        why = flex_tile_ok(self.block, q.device.type)
        if why:
            raise UnsupportedBackend(f"{self.name}/flex: {why}")
        return self._run(q, k, v, reference=False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if self.last_backend != "flex":
            return super().attend(q, k, v, keys)
        bs, L = self.block, q.shape[2]
        layout = keys[..., ::bs]  # a block's first key stands for the block (choices are whole blocks)
        R, n = layout.shape[-2:]
        r = torch.arange(R, device=q.device)[:, None]
        c = torch.arange(n, device=q.device)[None, :]
        full = layout & (c < r) & ((r + 1) * bs <= L)
        partial = layout & ~full

        mask = BlockMask.from_kv_blocks(*kv_blocks(partial), *kv_blocks(full), BLOCK_SIZE=bs, mask_mod=causal_mod,
                                        seq_lengths=(L, L))
        return run_flex(q, k, v, mask, enable_gqa=q.shape[1] != k.shape[1])


def kv_blocks(layout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A per-head (B, H, R, n) block layout -> BlockMask's (kv_num_blocks, kv_indices), active blocks first."""
    idx = torch.argsort((~layout).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return layout.sum(-1, dtype=torch.int32), idx


def causal_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """Flex's causal mask_mod (one function object: a new closure a call would be a new compile)."""
    return kv_idx <= q_idx


def flex_tile_ok(bs: int, device: str) -> str | None:
    """Why Flex cannot tile a ``bs`` block on ``device`` (CPU: powers of two from 64; CUDA: from 16), or None."""
    low = 64 if device == "cpu" else 16
    if bs & (bs - 1) or bs < low:
        return f"flex tiles blocks that are powers of two >= {low} on {device}, not {bs}"
    return None


__all__ = ["BlockPrefillAttention", "PromptSparseAttention", "attend_rows", "causal_mod", "causal_probs",
           "diagonal_forced", "expand_layout", "flex_tile_ok", "kv_blocks", "row_keys", "selection_columns",
           "visible_per_head"]
