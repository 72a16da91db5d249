"""Attention variants; importing this package registers the built-in ones."""
from attn.attention import block_sparse, dsa, full, gated_deltanet, gla, linear, moba, nsa, quest, retention, sliding_window  # noqa: F401  (imported to register them)
from attn.attention.base import Attention, Backend, UnsupportedBackend
from attn.attention.state import KVCache

__all__ = ["Attention", "Backend", "KVCache", "UnsupportedBackend"]
