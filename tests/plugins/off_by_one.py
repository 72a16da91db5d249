"""A plugin with a realistic bug: its fast backend's window is one key short (what `check` must catch)."""
from dataclasses import dataclass

import attn
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.full import dense_attention
from attn.attention.masks import causal_mask


@dataclass(frozen=True)
class Cfg:
    window: int = 16


@attn.register_attention("test_off_by_one", config=Cfg)
class OffByOne(Attention):
    backends = (Backend("reference", {"cpu": ALL_MODES}), Backend("fast", {"cpu": ALL_MODES}))

    def backend_reference(self, q, k, v, causal):
        return dense_attention(q, k, v, causal_mask(q.shape[2], k.shape[2], q.device, self.config.window, causal))

    def backend_fast(self, q, k, v, causal):
        return dense_attention(q, k, v, causal_mask(q.shape[2], k.shape[2], q.device, self.config.window - 1, causal))
