"""Test plugin: registers a class that is not an ``attn.Attention`` (the registry must refuse it)."""
from __future__ import annotations

from dataclasses import dataclass

import attn


@dataclass(frozen=True)
class Cfg:
    x: int = 1


@attn.register_attention("test_not_attention", config=Cfg)
class NotAttention:
    """Forgot to subclass attn.Attention."""
