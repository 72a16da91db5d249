"""A KV memory budget, and every method sized to it: the arms of the memory-quality frontier.

A budget is the share of the context's KV entries a method may keep (``1/8``) or a number of tokens (``512``): kvpress
users ask for both. At an evaluation length it becomes, per method,

- a press's ``compression_ratio`` (the share dropped: ``1 - kept / length``), for every press that takes one, and
  for the oracle (:mod:`attn.hf.oracle`), the ceiling of any selector of that size;
- an attention variant that attends to that many keys per query (:data:`SIZED`): a window, a window with 4 sinks,
  block-sparse (the first block and local blocks), MoBA's and Quest's routed blocks and pages -- other models, each
  with a prefill of its own;
- presses without a budget (``none``, ``quantized``) stay as given: they sit where their bytes put them.

Rows carry ``budget`` (the text), ``budget_fraction`` (kept / length) and ``kv_bytes``: the bytes of the context's
keys and values a decoded token reads -- measured on the cache a press leaves (for the oracle: its share of the full
cache), computed for a variant as its keys per query x layers x key-value heads x head size x 2 x the dtype's bytes.
An evicting press also *holds* only that much; Quest, MoBA and the oracle keep every key resident and read the budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

BLOCK = 64  # block and MoBA block size of the sized variants (Quest: 16-token pages), as the selective preset ran them
SINKS = 4
PAGE = 16


@dataclass(frozen=True)
class Budget:
    """``text`` as rows carry it; ``fraction`` of the length, or ``tokens`` whatever the length."""

    text: str
    fraction: Fraction | None = None
    tokens: int | None = None

    def kept(self, length: int) -> int:
        """Tokens of a ``length``-token context kept (at least one)."""
        n = int(length * self.fraction) if self.fraction is not None else int(self.tokens or 0)
        return max(1, min(n, length))

    def share(self, length: int) -> float:
        return float(self.fraction) if self.fraction is not None else self.kept(length) / length

    def ratio(self, length: int) -> float:
        """A press's compression_ratio for this budget at ``length`` (the share of the context dropped)."""
        return round(1.0 - self.share(length), 6)


def parse_budget(text: str) -> Budget:
    """``1/8``, ``0.125`` (a share in (0, 1)) or ``512`` (tokens, >= 1); ValueError (one line) otherwise."""
    t = text.strip()
    try:
        if "/" in t or "." in t:
            f = Fraction(t).limit_denominator(1 << 16)
            if not 0 < f < 1:
                raise ValueError
            return Budget(f"{f.numerator}/{f.denominator}", fraction=f)
        n = int(t)
        if n < 1:
            raise ValueError
        return Budget(str(n), tokens=n)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--budget {text!r}: give a share of the context in (0, 1) (1/8, 0.125) or a number of "
                         "tokens (512)") from None


def sized(family: str, tokens: int) -> tuple[str, int] | None:
    """The variant spec of ``family`` whose query attends to ``tokens`` keys, rounded down to its whole blocks or pages,
    and that number of keys (None: too small a budget for it)."""
    blocks, pages = tokens // BLOCK, tokens // PAGE
    specs = {
        "sliding_window": (f"sliding_window:window={tokens},backend=blocked", tokens),
        "sinks": (f"sliding_window:window={tokens - SINKS},sinks={SINKS},backend=blocked", tokens)
        if tokens > SINKS else None,
        "block_sparse": (f"block_sparse:block_size={BLOCK},local_blocks={blocks - 1},global_blocks=1,backend=gathered",
                         blocks * BLOCK) if blocks >= 2 else None,
        "moba": (f"moba:block_size={BLOCK},topk={blocks}", blocks * BLOCK) if blocks >= 1 else None,
        "quest": (f"quest:page_size={PAGE},token_budget={pages * PAGE}", pages * PAGE) if pages >= 2 else None,
    }
    return specs[family]


SIZED = ("sliding_window", "sinks", "block_sparse", "moba", "quest")


def takes_budget(press: str) -> bool:
    """Whether a press spec's name takes a compression_ratio (a budget sizes it), from its parameters."""
    from attn.hf.presses import parse_press, press_params

    spec = parse_press(press)
    return "compression_ratio" in press_params(spec.name) and "compression_ratio" not in dict(spec.params)


def press_at(press: str, budget: Budget, length: int) -> str:
    """``snapkv`` -> ``snapkv:compression_ratio=0.875`` (its other parameters kept)."""
    sep = "," if ":" in press else ":"
    return f"{press}{sep}compression_ratio={budget.ratio(length)}"


def kv_bytes_per_token(config: Any, dtype: str) -> int:
    """Bytes one context token's keys and values take in every layer of the model."""
    import torch

    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(config.num_hidden_layers * heads * head_dim * 2 * getattr(torch, dtype).itemsize)


__all__ = ["SIZED", "Budget", "kv_bytes_per_token", "parse_budget", "press_at", "sized", "takes_budget"]
