"""Softcapped attention (Gemma 2): scores pass through cap * tanh(s / cap) before the softmax."""
import math
from dataclasses import dataclass

import torch

import attn
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.masks import causal_mask
from attn.registry import check


@dataclass(frozen=True)
class SoftcapConfig:
    cap: float = 50.0

    def __post_init__(self):
        check(self.cap > 0, f"cap must be > 0, got {self.cap}")


@attn.register_attention("softcap", config=SoftcapConfig)
class SoftcapAttention(Attention):
    """Full attention with tanh soft-capped logits."""

    backends = (Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}),)

    def backend_reference(self, q, k, v, causal):
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
        s = self.config.cap * torch.tanh(s / self.config.cap)
        if causal:
            s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
        return torch.softmax(s, dim=-1) @ v
