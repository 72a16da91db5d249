"""Named checkpoint evaluations (``attn-bench accuracy --preset NAME``): one dict, looked up exactly.

Each preset is one checkpoint and a list of groups, each group one plan (variants x positions x lengths x tasks);
groups run in order into one results file, most telling first, so a run cut short keeps the rows that matter.
Sized for the 2-core CPU (results/README.md's checkpoint runs say what was cut).

Backends are pinned where ``auto`` would compile Flex: prompts of a real task vary in length (RULER's prompts are
fitted in tokens, cached prefixes leave different suffixes), and Flex compiles one kernel per shape, so
``sliding_window`` runs ``blocked`` and ``block_sparse`` runs ``gathered`` (both exact, tested against the reference).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WINDOW = "sliding_window:window=1024,backend=blocked"
SINKS = "sliding_window:window=1024,sinks=4,backend=blocked"  # StreamingLLM: the window plus 4 attention sinks
# block-sparse with the window's budget: a 1024-token local band of 128-token blocks plus the first block, global
BLOCKS = "block_sparse:block_size=128,local_blocks=8,global_blocks=1,backend=gathered"
SMOLLM2_VARIANTS = ["full", WINDOW, SINKS, BLOCKS]
DEPTHS = (0.0, 0.5, 1.0)
# 2x the trained 8192 positions: each scaling with factor 2 (original_max_position_embeddings: the checkpoint's)
SCALINGS = ["checkpoint", "rope_yarn:factor=2", "rope_ntk:factor=2", "rope_dynamic:factor=2"]


@dataclass(frozen=True)
class Group:
    """One plan of a preset (``hf_eval.plan``'s arguments)."""

    tasks: tuple[str, ...]
    variants: tuple[str, ...]
    eval_lens: tuple[int, ...]
    positions: tuple[str, ...] = ("checkpoint",)
    ruler_tasks: tuple[str, ...] = ("niah_single_1",)
    passkey: dict[str, Any] = field(default_factory=lambda: {"depths": DEPTHS})
    examples: int = 3  # per cell, passkey and ruler alike
    lm: dict[str, Any] = field(default_factory=lambda: {"eval_bytes": 1 << 15})
    presses: tuple[str, ...] = ()  # KV presses, arms of every setting (harness/accuracy/hf_presses.py)
    equal_memory: bool = False

    def params(self) -> dict[str, dict[str, Any]]:
        """Each checkpoint task's config fields."""
        return {"lm": dict(self.lm), "passkey": {**self.passkey, "eval_examples": self.examples},
                "ruler": {"tasks": self.ruler_tasks, "eval_examples": self.examples}, "selection": dict(self.lm)}


@dataclass(frozen=True)
class HFPreset:
    model: str
    groups: tuple[Group, ...]
    doc: str


def _smollm2() -> HFPreset:
    v = tuple(SMOLLM2_VARIANTS)
    # ~2 h of one core here: a 16K prompt takes 3-7 min on one thread, 8K ~1.5 min; passkey at depth 0 shares no
    # prefix (the key comes first), so it costs a full prefill per example
    return HFPreset("smollm2-135m", (
        Group(("passkey", "ruler", "lm"), v, (2048, 4096)),
        Group(("ruler",), v, (2048,), ruler_tasks=("niah_multikey_1", "vt")),
        Group(("passkey", "ruler"), ("full",), (16384,), positions=tuple(SCALINGS), examples=1),
        Group(("passkey", "ruler", "lm"), v, (8192,), examples=1),
    ), "SmolLM2-135M: full, a 1024 window, the window + 4 sinks and block-sparse at 2K-8K; RoPE scalings at 16K")


def _gemma3() -> HFPreset:
    # its own 5:1 pattern (the sliding layers' backend pinned: `own` would let auto compile Flex), all-global, all-local
    patterns = ("sliding_attention=sliding_window:backend=blocked", "full", "sliding_window:window=512,backend=blocked")
    return HFPreset("gemma3-270m", (
        Group(("passkey", "ruler"), patterns, (4096, 8192)),
        Group(("passkey", "ruler"), patterns, (16384,), examples=1),  # all-global: ~7 min a 16K prompt on one thread
    ), "Gemma 3 270M: its own 5 sliding : 1 global pattern against all-global and all-local, 4K-16K")


# kvpress's presses most compared (its leaderboard), by their kvpress names
PRESSES = ("streaming_llm", "snapkv", "tova", "knorm", "expected_attention", "pyramidkv")


def _kvpress_smollm2() -> HFPreset:
    def at(ratio: float) -> tuple[str, ...]:
        return tuple(f"{p}:compression_ratio={ratio}" for p in PRESSES)

    # one prefill per prompt serves every press (hf_presses.PressCache); the equal-memory variants prefill their own
    return HFPreset("smollm2-135m", (
        Group(("passkey", "ruler"), ("full",), (4096,), examples=8, presses=("none", *at(0.5)), equal_memory=True),
        Group(("passkey", "ruler"), ("full",), (4096,), examples=8, presses=at(0.75), equal_memory=True),
        Group(("ruler",), ("full",), (4096,), examples=8, ruler_tasks=("niah_multikey_1", "vt"),
              presses=("none", *at(0.5))),
        Group(("passkey", "ruler"), ("full",), (8192,), examples=8, presses=("none", *at(0.5)), equal_memory=True),
    ), "SmolLM2-135M under kvpress's presses at ratios 0.5 and 0.75, beside the window, the window + sinks and "
       "block-sparse holding as many tokens, 4K (8K last)")


def _selective_smollm2() -> HFPreset:
    # 512 keys per query (1/8 of 4K): a window, the window + 4 sinks, block-sparse (the first block and 7 local ones),
    # MoBA (its block and 7 routed 64-token blocks) and Quest (its page and 31 bounded 16-token pages); then the two
    # selectors at their defaults (256 keys) beside the 256 window
    budget = ("sliding_window:window=512,backend=blocked", "sliding_window:window=508,sinks=4,backend=blocked",
              "block_sparse:block_size=64,local_blocks=7,global_blocks=1,backend=gathered", "moba:block_size=64,topk=8",
              "quest:page_size=16,token_budget=512")
    defaults = ("sliding_window:window=256,backend=blocked", "moba", "quest")
    answered = ("full", budget[0], *budget[2:])
    return HFPreset("smollm2-135m", (
        Group(("selection",), (*budget, *defaults), (4096, 8192)),
        # 4K only: after the cached prefix, a prompt's suffix is a call with Lq < Lk, where Quest selects (150 s an
        # example at 4K on 2 cores, 13x full's), so passkey and RULER at 8K did not fit the session that ran this
        Group(("passkey", "ruler"), answered, (4096,), examples=8),
    ), "SmolLM2-135M with attention that selects by content (MoBA, Quest) beside the window and block-sparse at the "
       "same 512-key budget: full attention's mass on the kept keys per layer at 4K and 8K, then passkey and RULER at 4K")


HF_PRESETS: dict[str, HFPreset] = {"smollm2-cpu": _smollm2(), "gemma3-cpu": _gemma3(),
                                   "kvpress-smollm2-cpu": _kvpress_smollm2(), "selective-smollm2-cpu": _selective_smollm2()}

__all__ = ["HF_PRESETS", "Group", "HFPreset"]
