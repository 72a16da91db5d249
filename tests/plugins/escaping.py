"""Test plugin: variants that leave the worker in ways a memory or time limit must not misread --
a process that kills itself with SIGKILL (not an out-of-memory kill), one that starts a child in
a session of its own (outside the worker's process group) and then hangs, and one that asks for
more memory than the accuracy runner's cap allows (and refuses to run without a cap)."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from attn.attention.base import ALL_MODES, Attention, Backend
from attn.registry import register_attention


@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class OrphanConfig:
    pidfile: str = ""  # where the escaped child's pid is written, for the test to check on it


class _ReferenceOnly(Attention):
    backends = (Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}),)


@register_attention("test_sigkill", config=NoParams)
class SelfKill(_ReferenceOnly):
    """SIGKILLs its own process with almost no memory in use: not an out-of-memory kill."""

    def backend_reference(self, q, k, v, causal):
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
        return q


@register_attention("test_orphan", config=OrphanConfig)
class Orphan(_ReferenceOnly):
    """Starts ``sleep 300`` in a new session (out of the worker's process group), then hangs."""

    def backend_reference(self, q, k, v, causal):
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        if self.config.pidfile:
            Path(self.config.pidfile).write_text(str(child.pid))
        time.sleep(3600)
        return q


@register_attention("test_over_cap", config=NoParams)
class OverCap(_ReferenceOnly):
    """Allocates (without touching) one GiB more than the address-space cap leaves; with no cap it
    raises a plain error instead, so an uncapped run can never be mistaken for a capped one."""

    def backend_reference(self, q, k, v, causal):
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            raise RuntimeError("test_over_cap: no address-space cap is set")
        hog = torch.empty(soft // 4 + 2**28, dtype=torch.float32)  # the cap alone, and 1 GiB more
        return q + hog[:1].zero_()
