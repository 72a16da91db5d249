"""Attention sinks (StreamingLLM, Xiao et al. 2023, arXiv:2309.17453): each query sees the first
``sinks`` tokens plus the last ``window`` keys (itself included). Decoding keeps only those: memory
stays bounded at any length. The plugin guide (docs/plugins.md) walks through this file; the test
suite runs `attn-bench check` on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import attn
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.full import dense_attention
from attn.attention.state import OneStepUndo
from attn.registry import check


@dataclass(frozen=True)
class SinkConfig:
    window: int = 256  # recent keys each query sees, itself included
    sinks: int = 4  # first tokens every query sees (StreamingLLM keeps 4)

    def __post_init__(self) -> None:
        check(self.window >= 1, f"window must be >= 1, got {self.window}")
        check(self.sinks >= 0, f"sinks must be >= 0, got {self.sinks}")


def sink_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, sinks: int, causal: bool) -> torch.Tensor:
    """(Lq, Lk) bool from absolute positions: in the window (|i - j| < window; j <= i if causal) or a sink."""
    d = q_pos[:, None] - k_pos[None, :]
    near = (d >= 0) & (d < window) if causal else d.abs() < window
    return near | ((k_pos[None, :] < sinks) & ((d >= 0) if causal else True))


@dataclass
class SinkCache(OneStepUndo):
    """Decoding state: the sink tokens and the last ``window - 1`` tokens, with their absolute positions.

    Bounded: at most ``sinks + window - 1`` tokens, whatever the length. It cannot forget a token it
    already evicted, so it goes back one step only (``OneStepUndo``: the harness rewinds each timed step).
    """

    UNDO_FIELDS = ("k", "v", "pos")
    KIND = "sink cache"
    window: int
    sinks: int
    k: torch.Tensor | None = None  # (B, H, kept, D)
    v: torch.Tensor | None = None
    pos: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))  # (kept,)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add T new tokens; return every token the new queries may see (kept + new) and their positions."""
        new_pos = torch.arange(self.length, self.length + k.shape[2], device=k.device)
        keys = k if self.k is None else torch.cat([self.k, k], 2)
        values = v if self.v is None else torch.cat([self.v, v], 2)
        pos = torch.cat([self.pos.to(k.device), new_pos])
        self.remember()
        self.length += k.shape[2]
        keep = (pos < self.sinks) | (pos > self.length - self.window)  # what any later token can still see
        self.k, self.v, self.pos = keys[:, :, keep].clone(), values[:, :, keep].clone(), pos[keep]
        return keys, values, pos

    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()


@attn.register_attention("sink_attention", config=SinkConfig)
class SinkAttention(Attention):
    """Sliding window plus attention sinks (StreamingLLM): bounded decoding memory at any length."""

    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="dense mask + explicit softmax"),
        # The fast path: PyTorch's fused SDPA kernel with the same boolean mask (float64 too, so the
        # checker can compare it exactly). Train mode is "backward" here.
        Backend("sdpa", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="F.scaled_dot_product_attention, boolean mask"),
    )

    def _mask(self, q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
        k_pos = torch.arange(k.shape[2], device=q.device)
        q_pos = k_pos[k.shape[2] - q.shape[2]:]  # bottom-right: the queries are the last positions
        return sink_mask(q_pos, k_pos, self.config.window, self.config.sinks, causal)

    def backend_reference(self, q, k, v, causal):
        return dense_attention(q, k, v, self._mask(q, k, causal))

    def backend_sdpa(self, q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._mask(q, k, causal))

    # -- cost: the visible pairs, so FLOP counts (and FLOP/s) are what is really computed -----------
    def pairs(self, q_len: int, k_len: int, causal: bool) -> int:
        """Closed form, O(q_len): a sweep at 1M tokens must not build the 1M x 1M mask to count it."""
        w, s = self.config.window, self.config.sinks
        p = torch.arange(k_len - q_len, k_len)  # absolute query positions
        lo = (p - w + 1).clamp(min=0)
        hi = p if causal else (p + w - 1).clamp(max=k_len - 1)
        outside = lo.clamp(max=s) + (0 if causal else (min(s, k_len) - (hi + 1)).clamp(min=0))  # sinks off the window
        return int((hi - lo + 1 + outside).sum())

    # -- decoding: a bounded state instead of the default KV cache ----------------------------------
    def new_state(self, max_len: int = 0) -> SinkCache:
        return SinkCache(self.config.window, self.config.sinks)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: SinkCache) -> torch.Tensor:
        """New tokens (B, H, T, D) attend to the kept tokens and to each other, by absolute position."""
        keys, values, pos = state.append(k, v)
        mask = sink_mask(pos[-q.shape[2]:], pos, self.config.window, self.config.sinks, causal=True)
        self.last_backend = "sdpa"
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
