"""The contract every position method implements.

Additive methods (sinusoidal, learned) change the token embeddings; rotary methods rotate
q and k inside every attention layer, before the attention variant runs. The backbone calls
both hooks on every method, so a method only overrides the one it needs.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn


class Position(nn.Module):
    """Base: identity on embeddings and on q/k."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    kind: ClassVar[str] = "none"  # "none" | "additive" | "rotary" | "bias"
    # Parameters the method sets on the attention variant: a bias method (ALiBi) is computed inside the
    # attention scores, so the backbone builds the variant with these (e.g. {"alibi": True}).
    attention_params: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: Any):
        super().__init__()
        self.config = config

    def embed(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """x: (B, T, d_model) embeddings of tokens at positions start..start+T-1."""
        return x

    def rotate(self, x: torch.Tensor, start: int = 0, seq_len: int | None = None) -> torch.Tensor:
        """x: (B, H, T, head_dim) queries or keys at positions start..start+T-1.

        ``seq_len`` is the length the sequence is being processed at: the full length in a
        forward pass, and the length announced when a decoding cache was created (so that
        length-dependent methods such as dynamic NTK use one consistent scaling for every
        token of a generation, and decoding equals the full forward pass).
        """
        return x

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {"kind": cls.kind, "doc": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""}
