"""The prefix of every attn_implementation name attn-bench registers with transformers (``attn_bench.<variant>``):
the interface names its functions with it, and a cache that only works with our attention checks a model by it."""
from __future__ import annotations

PREFIX = "attn_bench."

__all__ = ["PREFIX"]
