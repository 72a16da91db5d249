"""Attention variants; importing this package registers the built-in ones."""
from attn.attention import (  # noqa: F401  (imported to register them)
    block_sparse,
    dsa,
    flexprefill,
    full,
    gated_deltanet,
    gla,
    linear,
    mamba2,
    mla,  # noqa: F401  (imported to register them)
    moba,
    nsa,
    quest,
    retention,
    sliding_window,
    vertical_slash,
    xattention,
)
from attn.attention.base import Attention, Backend, UnsupportedBackend
from attn.attention.state import KVCache

__all__ = ["Attention", "Backend", "KVCache", "UnsupportedBackend"]
