"""The arms of a checkpoint evaluation, one file each (:mod:`attn.hf.arms.base` says what an arm is).

``arm(spec)`` gives the arm a press spec names: ``none`` (:mod:`.plain`), ``quantized`` (:mod:`.quantized`),
``oracle`` (:mod:`.oracle`), ``retrieval`` (:mod:`.retrieval`), and any other name a kvpress press
(:mod:`.kvpress`)."""
from __future__ import annotations

from attn.hf.arms.base import Arm, Branch, Prompt, Shared
from attn.hf.arms.kvpress import KVPress, decoding_press, replayable
from attn.hf.arms.oracle import OracleArm
from attn.hf.arms.plain import Plain
from attn.hf.arms.quantized import Quantized
from attn.hf.arms.retrieval import RetrievalArm
from attn.hf.presses import PressSpec

KINDS: dict[str, type[Arm]] = {k.name: k for k in (Plain, Quantized, OracleArm, RetrievalArm)}


def arm(spec: PressSpec) -> Arm:
    """The arm of a validated press spec (kvpress's press for any name not ours)."""
    return KINDS.get(spec.name, KVPress)(spec)


__all__ = ["KINDS", "Arm", "Branch", "KVPress", "Prompt", "Shared", "arm", "decoding_press", "replayable"]
