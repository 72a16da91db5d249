"""Test plugin: attention variants that fail in every way a sweep must survive, plus one that
allocates a known amount of extra memory (so the peak-memory measurement can be checked)."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn.attention.base import ALL_MODES, Attention, Backend
from attn.registry import register_attention


@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class HogConfig:
    gib: float = 4.0  # allocated and touched on every call


@dataclass(frozen=True)
class BallastConfig:
    mib: int = 64  # extra buffer alive during every call


class _ReferenceOnly(Attention):
    backends = (Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}),)


@register_attention("test_raises", config=NoParams)
class Raises(_ReferenceOnly):
    """Raises on every call."""

    def backend_reference(self, q, k, v, causal):
        raise RuntimeError("deliberate failure from test_raises")


@register_attention("test_hog", config=HogConfig)
class Hog(_ReferenceOnly):
    """Allocates ``gib`` GiB on every call: beyond any memory limit a test sets."""

    def backend_reference(self, q, k, v, causal):
        hog = torch.ones(int(self.config.gib * 2**30) // 4)
        return q + hog[0]


@register_attention("test_hang", config=NoParams)
class Hang(_ReferenceOnly):
    """Never returns."""

    def backend_reference(self, q, k, v, causal):
        time.sleep(3600)
        return q


@register_attention("test_segfault", config=NoParams)
class Segfault(_ReferenceOnly):
    """Kills its own process with SIGSEGV, like a crashing kernel."""

    def backend_reference(self, q, k, v, causal):
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)
        return q


@register_attention("test_ballast", config=BallastConfig)
class Ballast(_ReferenceOnly):
    """Full attention that also holds ``mib`` MiB (written, so resident) while it computes."""

    def backend_reference(self, q, k, v, causal):
        ballast = torch.ones(self.config.mib * 2**20 // 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out + 0 * ballast[0]
