"""NSA, Native Sparse Attention (Yuan et al. 2025, arXiv:2502.11089): three causal branches over the same queries, gated.

Query at absolute position ``t`` (row r of Lq is ``t = Lk - Lq + r``, bottom-right aligned), keys ``j``:

1. **compressed**: window ``i`` covers ``[i s, i s + l)`` (``l = block_len``, ``s = stride``); its compressed key and
   value are ``phi(k[i s : i s + l])``, visible to ``t`` once complete (``i s + l <= t + 1``). ``phi`` here is a
   learned weighted pooling, one weight per (key head, position in the window), initialised to ``1 / l`` (mean
   pooling): the linear special case of the paper's MLP with intra-block position encoding (eq. 7). ``p_cmp`` =
   softmax of q against the visible compressed keys; a query that sees no complete window gets 0 from this branch.
2. **selected**: selection blocks of ``l'`` = ``select_block`` tokens (absolute, as in block_selection.py). Block
   ``c``'s score is the sum of ``p_cmp`` over the windows that overlap it (eq. 9 for overlapping windows; the
   identity when ``l = s = l'``), summed over the query heads of a GQA group (the paper shares the selection across
   the group, eq. 10). Each query keeps block 0, its own block (up to itself) and the ``topk - 2`` best complete
   earlier blocks (the paper's "1 initial block and local blocks", counted in its top-n; with ``topk = 1`` both forced
   blocks are still kept). Ties go to the earlier block. The choice takes no gradient.
3. **window**: the last ``window`` keys, ``t - window < j <= t``.

``out = g_cmp o_cmp + g_slc o_slc + g_win o_win``, the gates one token input ``gates`` (B, H_kv, L, 3) after a sigmoid
(eq. 5), per key head and broadcast over its query heads, read at the query's position.

Where this differs from the paper: ``phi`` is linear (above); the paper's eq. 9 weights a window by how many
(m, n) index pairs name it, ours counts each overlapping window once; one local block, not two. From fla's
``naive_nsa`` (fla-core 0.6.0): fla compresses by plain mean pooling with stride = block = selection block, forces the
previous block as well, averages (not sums) the group's probabilities, and gates per query head.

Backends: ``reference`` (each branch a masked dense softmax, the selection as a bool mask) and ``gathered`` (the
compressed branch over chunks of queries, each reading the ``L / s`` compressed keys it sees and scoring the blocks
from the same probabilities by a band of ``(l' + l) / s`` windows a block, so prefill is O(L² / s) in time and
bounded in memory; the selected branch through block_selection's gathering; the window through sliding_window's
``blocked`` kernel) and ``masked`` (the same compressed branch; the chosen blocks and the window as bool masks
through SDPA: O(Lq Lk), what ``auto`` runs for calls of up to 1M (query, key) pairs, i.e. training here). Decoding
keeps every key and value and the compressed keys and values of every complete window (:class:`CompressedCache`).

Cost (:meth:`NsaAttention.flops`, 2 per MAC): ``4 D`` per (query head, key) pair of each branch -- compressed keys
seen + selected tokens + window tokens, each counted QK^T + PV -- plus the gating, 3 multiplies and 2 adds per output
element. :meth:`NsaAttention.selection_flops`: the compression, ``2 l D`` for each compressed key and each compressed
value per key head (l MACs per channel), and the block scoring, one add per (visible window, candidate block it
overlaps) per query head plus ``G - 1`` adds per (query, key head, candidate block) to sum a group. The compressed
attention is in ``flops``: its output is used. Training trains the compression (backward = 2x, so 3x), the scoring
takes no gradient (1x).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from attn.attention import block_selection as bsel
from attn.attention import gqa
from attn.attention.base import ALL_MODES, TRAIN_FLOPS_FACTOR, Attention, Backend
from attn.attention.blocked_window import blocked_attention
from attn.attention.full import dense_attention
from attn.attention.masks import causal_mask, visible_pairs
from attn.attention.state import KVCache
from attn.attention.token_inputs import TokenInput
from attn.registry import check, register_attention


@dataclass(frozen=True)
class NsaConfig:
    """Paper defaults (sec. 4.1): block_len 32, stride 16, select_block 64, topk 16, window 512; ours are halved or
    quartered for the lengths trained here. ``kv_heads``: key heads, to make the compression weights at construction
    (0: at the first call, sized by its keys)."""

    block_len: int = 16
    stride: int = 8
    select_block: int = 32
    topk: int = 8  # selection blocks per query, block 0 and its own included
    window: int = 128
    kv_heads: int = 0

    def __post_init__(self) -> None:
        for name in ("block_len", "stride", "select_block", "topk", "window"):
            check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        check(self.stride <= self.block_len, f"stride ({self.stride}) must be <= block_len ({self.block_len})")
        check(self.select_block % self.stride == 0,
              f"select_block ({self.select_block}) must be a multiple of stride ({self.stride})")
        check(self.kv_heads >= 0, f"kv_heads must be >= 0 (0 = sized at the first call), got {self.kv_heads}")


def windows(length: int, cfg: NsaConfig) -> int:
    """Complete compression windows among the first ``length`` tokens."""
    return 0 if length < cfg.block_len else (length - cfg.block_len) // cfg.stride + 1


def compress(x: torch.Tensor, weight: torch.Tensor, cfg: NsaConfig) -> torch.Tensor:
    """x (B, H_kv, L, D), weight (H_kv, l) -> one weighted pooling per complete window (B, H_kv, n, D)."""
    B, H, L, D = x.shape
    if windows(L, cfg) == 0:
        return x.new_zeros(B, H, 0, D) + weight.sum() * 0  # keeps the weights in the graph
    spans = x.unfold(2, cfg.block_len, cfg.stride)  # (B, H_kv, n, D, l)
    return torch.einsum("bhndl,hl->bhnd", spans, weight.to(x.dtype))


def compressed_visible(q_len: int, k_len: int, n: int, cfg: NsaConfig, device) -> torch.Tensor:
    """(Lq, n) bool: window i is complete at the query's position."""
    t = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return torch.arange(n, device=device)[None, :] * cfg.stride + cfg.block_len <= t + 1


def band(cfg: NsaConfig) -> tuple[int, int]:
    """(p, m): window ``i`` overlaps selection block ``c`` iff ``c p - m <= i < (c + 1) p``, p = l' / s windows start in
    a block and m = ceil(l / s) - 1 earlier ones reach into it."""
    return cfg.select_block // cfg.stride, -(-cfg.block_len // cfg.stride) - 1


def compressed_probs(q: torch.Tensor, kc: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax of q (B, H, Lq, D) over the visible compressed keys kc (B, H_kv, n, D) -> (B, H, Lq, n); rows that see
    no window are 0."""
    scores = bsel.grouped_scores(q.to(kc.dtype) / math.sqrt(q.shape[-1]), kc).masked_fill_(~visible, -math.inf)
    probs = torch.softmax(scores, -1)
    return probs if visible.any(-1).all() else probs.nan_to_num(0.0)


def block_scores(probs: torch.Tensor, blocks: int, cfg: NsaConfig) -> torch.Tensor:
    """Each of the first ``blocks`` selection blocks' score, the sum of probs (..., n) over the windows overlapping it
    (:func:`band`), in probs' dtype: sums of the p windows starting in each block, shifted and added over the m before it
    (m = a p + r), not an (n, blocks) product. Blocks whose bands hold equal values score exactly alike."""
    p, m = band(cfg)
    a, r = divmod(m, p)
    n = probs.shape[-1]
    whole = min(blocks, n // p)  # blocks whose p windows all exist

    def sums(lo: int) -> torch.Tensor:  # (..., blocks): windows j p + lo .. (j + 1) p - 1 of each block j
        parts = [probs[..., :whole * p].unflatten(-1, (whole, p))[..., lo:].sum(-1)]
        if whole < blocks:  # block `whole` holds the last n - whole p windows, the blocks after it none
            parts.append(probs[..., whole * p + lo:].sum(-1, keepdim=True))
            parts.append(probs.new_zeros(*probs.shape[:-1], blocks - whole - 1))
        return torch.cat(parts, -1)

    own = sums(0)
    scores = own.clone()
    for j in range(1, min(a, blocks - 1) + 1):  # the a whole blocks of windows before
        scores[..., j:] += own[..., :-j]
    if r and blocks > a + 1:  # and the last r windows of the block before those
        scores[..., a + 1:] += sums(p - r)[..., :blocks - a - 1]
    return scores


def choose(probs: torch.Tensor, kv_heads: int, k_len: int, cfg: NsaConfig, first: int | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen blocks besides each query's own: probs (B, H, C, n) of the queries at positions first..first+C-1
    (default: the last C of k_len) -> idx, valid (B, H, C, S), S slots of block 0 and the best complete earlier blocks
    (the same for every query head of a group; ties to the earlier block)."""
    B, H, C, _ = probs.shape
    first = k_len - C if first is None else first
    blocks = k_len // cfg.select_block  # complete selection blocks: the candidates
    S = min(max(1, cfg.topk - 1), blocks)
    if S == 0:
        empty = probs.new_zeros(B, H, C, 0, dtype=torch.long)
        return empty, empty.bool()
    scores = block_scores(probs, blocks, cfg).view(B, kv_heads, -1, C, blocks).sum(2)
    own = torch.arange(first, first + C, device=probs.device) // cfg.select_block
    future = torch.arange(blocks, device=probs.device)[None, :] >= own[:, None]
    scores[..., 0] = math.inf  # block 0 always, when it is earlier than the query's own
    vals, idx = bsel.stable_topk(scores.masked_fill(future, -math.inf), S)
    g = H // kv_heads
    return idx.repeat_interleave(g, 1), (vals > -math.inf).repeat_interleave(g, 1)


def compressed_scan(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor | None, k_len: int, cfg: NsaConfig
                    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The compressed branch and the choice its probabilities make, over chunks of queries that each read only the
    windows complete by their last position: the (B, H, Lq, n) probabilities of a long prefill (16 GB for 8 heads at
    64K tokens, stride 8) never exist at once. q (B, H, Lq, D), the last Lq of k_len positions -> (o_cmp (B, H, Lq, D)
    or None without ``vc``, idx, valid)."""
    B, H, Lq, D = q.shape
    Hkv, n = kc.shape[1], kc.shape[2]
    step = max(1, bsel.GATHER_ELEMENTS // max(1, B * H * n))
    outs, parts = [], []
    for a in range(0, Lq, step):
        qa = q[:, :, a:a + step]
        C = qa.shape[2]
        end = k_len - Lq + a + C  # keys seen by the chunk's last query
        seen = min(n, windows(end, cfg))
        probs = compressed_probs(qa, kc[:, :, :seen], compressed_visible(C, end, seen, cfg, q.device))
        if vc is not None:
            outs.append((probs.view(B, Hkv, H // Hkv * C, seen) @ vc[:, :, :seen]).view(B, H, C, D))
        with torch.no_grad():
            parts.append(choose(probs.detach(), Hkv, k_len, cfg, end - C))
    idx, valid = (torch.cat([p[i] for p in parts], 2) for i in (0, 1))
    return (torch.cat(outs, 2) if vc is not None else None), idx, valid


@dataclass
class CompressedCache:
    """Every key and value (selection may pick any block) plus the compressed keys and values of every complete
    window, compressed as windows complete; ``compress(k, v)`` maps spans of keys and values to their windows."""

    cfg: NsaConfig
    compress: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    kv: KVCache = field(default_factory=KVCache)
    kc: torch.Tensor | None = None
    vc: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.kv.length

    @property
    def windows(self) -> int:
        return 0 if self.kc is None else self.kc.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Take new tokens -> (all keys, all values, compressed keys, compressed values)."""
        keys, values = self.kv.append(k, v)
        have, done, s = self.windows, windows(self.length, self.cfg), self.cfg.stride
        if self.kc is None or done > have:
            span = slice(have * s, max(have * s, (done - 1) * s + self.cfg.block_len))
            kc, vc = self.compress(keys[:, :, span], values[:, :, span])
            self.kc = kc if self.kc is None else torch.cat([self.kc, kc], 2)
            self.vc = vc if self.vc is None else torch.cat([self.vc, vc], 2)
        return keys, values, self.kc, self.vc

    def truncate(self, length: int) -> None:
        self.kv.truncate(length)
        keep = windows(self.length, self.cfg)
        if self.kc is not None and keep < self.windows:
            self.kc, self.vc = self.kc[:, :, :keep], self.vc[:, :, :keep]

    def nbytes(self) -> int:
        extra = 0 if self.kc is None else 2 * self.kc.numel() * self.kc.element_size()
        return self.kv.nbytes() + extra


@register_attention("nsa", config=NsaConfig)
class NsaAttention(Attention):
    """Native Sparse Attention: gated compressed, selected and sliding-window branches (Yuan et al. 2025)."""

    supports_gqa = True
    supports_bidirectional = False
    token_inputs = (TokenInput("gates", width=3, activation=torch.sigmoid,
                               doc="the gates of the compressed, selected and window branches (eq. 5)"),)
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="each branch a masked dense softmax"),
        Backend("gathered", {"cpu": ALL_MODES, "cuda": ALL_MODES},
                note="compressed keys dense, chosen blocks gathered, blocked window"),
        Backend("masked", {"cpu": ALL_MODES, "cuda": ALL_MODES},
                note="compressed keys dense, chosen blocks and window as masks through SDPA"),
    )
    MASKED_MAX_PAIRS: ClassVar[int] = bsel.MASKED_MAX_PAIRS

    def __init__(self, config: NsaConfig, backend: str = "auto"):
        super().__init__(config, backend)
        for name in ("cmp_k", "cmp_v"):
            w = torch.full((config.kv_heads, config.block_len), 1.0 / config.block_len) if config.kv_heads else None
            self.register_parameter(name, None if w is None else nn.Parameter(w))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("cmp_k", "cmp_v"):  # weights made at the first call: a fresh module takes a checkpoint's
            if getattr(self, name) is None and prefix + name in state_dict:
                setattr(self, name, nn.Parameter(torch.empty_like(state_dict[prefix + name])))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def weights(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The compression weights (H_kv, l) for keys and values, made (mean pooling) at the first call if needed."""
        if self.cmp_k is None:
            w = torch.full((k.shape[1], self.config.block_len), 1.0 / self.config.block_len, device=k.device,
                           dtype=torch.promote_types(k.dtype, torch.float32))
            self.cmp_k, self.cmp_v = nn.Parameter(w), nn.Parameter(w.clone())
        if self.cmp_k.shape[0] != k.shape[1]:
            raise ValueError(f"nsa: the compression weights are for {self.cmp_k.shape[0]} key heads, the call has "
                             f"{k.shape[1]} (one module serves one head count: build another)")
        return self.cmp_k, self.cmp_v

    def compress(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H_kv, L, D) -> their compressed keys and values (B, H_kv, n, D), in float32 or wider."""
        wk, wv = self.weights(k)
        f = torch.promote_types(k.dtype, torch.float32)
        return compress(k.to(f), wk, self.config), compress(v.to(f), wv, self.config)

    def select(self, q: torch.Tensor, k: torch.Tensor, kc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return compressed_scan(q, kc, None, k.shape[2], self.config)[1:]

    def kept_keys(self, q, k, causal=True, **inputs):
        """The raw keys the selected and window branches read; the compressed branch reads summaries, not keys."""
        with torch.no_grad():
            kc = compress(k.to(torch.promote_types(k.dtype, torch.float32)), self.weights(k)[0], self.config)
            mask = bsel.selection_mask(*self.select(q, k, kc), k.shape[2], self.config.select_block)
        return mask | causal_mask(q.shape[2], k.shape[2], q.device, window=self.config.window)

    def backend_reference(self, q, k, v, causal, gates):
        return self._attend(q, k, v, gates[:, :, k.shape[2] - q.shape[2]:], *self.compress(k, v), dense=True)

    def backend_gathered(self, q, k, v, causal, gates):
        return self._attend(q, k, v, gates[:, :, k.shape[2] - q.shape[2]:], *self.compress(k, v), dense=False)

    def backend_masked(self, q, k, v, causal, gates):
        return self._attend(q, k, v, gates[:, :, k.shape[2] - q.shape[2]:], *self.compress(k, v), dense=False,
                            masked=True)

    def select_backend(self, device: str, dtype: torch.dtype, mode: str) -> str:
        """``auto``: ``masked`` up to MASKED_MAX_PAIRS (query, key) pairs, ``gathered`` above (and for decoding steps,
        which gather in :meth:`step`)."""
        return bsel.short_calls_masked(self, super().select_backend(device, dtype, mode))

    def _attend(self, q, k, v, gates, kc, vc, dense: bool, masked: bool = False) -> torch.Tensor:
        """The three branches and their gates: gates (B, H_kv, Lq, 3) are the queries' own."""
        B, H, Lq, D = q.shape
        Hkv, Lk = k.shape[1], k.shape[2]
        f = torch.promote_types(q.dtype, torch.float32)
        bs, w = self.config.select_block, self.config.window
        if dense:
            idx, valid = self.select(q, k, kc)
            o_cmp = dense_attention(q.to(f), kc, vc, compressed_visible(Lq, Lk, kc.shape[2], self.config, q.device))
            chosen = bsel.selection_mask(idx, valid, Lk, bs).view(B, Hkv, H // Hkv, Lq, Lk)
            o_slc = dense_attention(q, k, v, chosen)
            o_win = dense_attention(q, k, v, causal_mask(Lq, Lk, q.device, window=w))
        elif masked:
            o_cmp, idx, valid = compressed_scan(q.to(f), kc, vc, Lk, self.config)
            o_slc = bsel.masked_sdpa(q, k, v, bsel.selection_mask(idx, valid, Lk, bs))  # every row: its own key
            o_win = gqa.sdpa(q, k, v, attn_mask=causal_mask(Lq, Lk, q.device, window=w))
        else:
            o_cmp, idx, valid = compressed_scan(q.to(f), kc, vc, Lk, self.config)
            o_slc = bsel.attend_selected(q, k, v, idx, valid, bs)
            o_win = blocked_attention(q, k, v, w, True)
        g = gates.to(f)[:, :, None]  # (B, H_kv, 1, Lq, 3): one gate per key head, over its query heads
        out = sum(g[..., c, None] * o.to(f).view(B, Hkv, H // Hkv, Lq, D)
                  for c, o in enumerate((o_cmp, o_slc, o_win)))
        return out.reshape(B, H, Lq, D).to(q.dtype)

    # -- decoding ------------------------------------------------------------------------
    def new_state(self, max_len: int = 0) -> CompressedCache:
        return CompressedCache(self.config, self.compress, KVCache(capacity_hint=max_len))

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: CompressedCache,
             gates: torch.Tensor) -> torch.Tensor:
        """New tokens (queries the last T of everything the state holds), their gates (B, H_kv, T, 3)."""
        keys, values, kc, vc = state.append(k, v)
        self.last_backend = "reference" if self.backend == "reference" else "gathered"
        return self._attend(q, keys, values, gates, kc, vc, dense=self.backend == "reference")

    # -- cost ----------------------------------------------------------------------------
    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        """(query, key) pairs of the three branches: compressed keys seen, selected tokens, window tokens."""
        c = self.config
        t = torch.arange(k_len - q_len, k_len, dtype=torch.int64)
        cmp = int(((t + 1 - c.block_len).div(c.stride, rounding_mode="floor") + 1).clamp(min=0).sum())
        slc = bsel.selected_pairs(q_len, k_len, c.select_block, max(1, c.topk - 1))
        return cmp + slc + visible_pairs(q_len, k_len, True, window=c.window)

    def flops(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int, causal: bool = True,
              kv_heads: int | None = None) -> int:
        gating = 5 * batch * heads * q_len * head_dim  # 3 multiplies, 2 adds per output element
        return 4 * batch * heads * head_dim * self.pairs(q_len, k_len, True) + gating

    def scoring_adds(self, q_len: int, k_len: int, heads: int, kv_heads: int) -> int:
        """Adds of the block scoring per sequence: (visible window, overlapped candidate block) pairs per query head,
        and G - 1 per (query, key head, candidate block) to sum a group; counted per query in closed form."""
        c = self.config
        p, m = band(c)
        t = torch.arange(k_len - q_len, k_len, dtype=torch.int64)
        b = t // c.select_block  # candidate blocks
        nt = ((t + 1 - c.block_len).div(c.stride, rounding_mode="floor") + 1).clamp(min=0)  # windows seen
        x = torch.minimum(b, nt // p)  # blocks 0..x-1: every window overlapping them seen, (c+1)p - max(0, cp - m)
        c0 = m // p + 1  # the first block whose band starts after window 0
        late = (x - c0).clamp(min=0)
        pairs = p * x * (x + 1) // 2 - (p * late * (x + c0 - 1) // 2 - m * late)
        for j in range(m // p + 3):  # blocks x.. (while x < b): the seen windows of their band, nt - max(0, cp - m)
            cc = x + j
            pairs += torch.where(cc < b, (nt - (cc * p - m).clamp(min=0)).clamp(min=0), 0)
        return heads * int(pairs.sum()) + (heads - kv_heads) * int(b.sum())

    def selection_flops(self, mode: str, batch: int, heads: int, seq_len: int, head_dim: int,
                        kv_heads: int | None = None) -> int:
        c, hkv = self.config, kv_heads or heads
        per_window = 2 * (2 * c.block_len * head_dim)  # the compressed key and value, l MACs per channel each
        if mode == "decode":  # one token at position seq_len: the window it completes, its own scoring
            done = windows(seq_len + 1, c) - windows(seq_len, c)
            return batch * (hkv * done * per_window + self.scoring_adds(1, seq_len + 1, heads, hkv))
        factor = TRAIN_FLOPS_FACTOR if mode == "train" else 1
        if mode not in ("forward", "train"):
            raise ValueError(f"unknown mode {mode!r}; valid: forward, train, decode")
        compression = factor * hkv * windows(seq_len, c) * per_window
        return batch * (compression + self.scoring_adds(seq_len, seq_len, heads, hkv))

    def decode_state_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """The selected blocks' and the window's keys and values, counted as if they did not overlap (at most the
        L cached tokens), and the new token's key and value written, per key head."""
        c = self.config
        seen = (bsel.selected_pairs(1, seq_len + 1, c.select_block, max(1, c.topk - 1))
                + visible_pairs(1, seq_len + 1, True, window=c.window) - 2)
        return 2 * batch * kv_heads * head_dim * (min(seen, seq_len) + 1)

    def selection_elements(self, batch: int, heads: int, seq_len: int, head_dim: int, kv_heads: int) -> int:
        """The compressed keys and values of every complete window, per key head (the compressed branch reads them,
        and block selection scores from its probabilities)."""
        return 2 * batch * kv_heads * head_dim * windows(seq_len + 1, self.config)


__all__ = ["CompressedCache", "NsaAttention", "NsaConfig", "band", "block_scores", "choose", "compress",
           "compressed_probs", "compressed_scan", "windows"]
