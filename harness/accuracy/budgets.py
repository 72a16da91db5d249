"""A KV memory budget, and every method sized to it: the arms of the memory-quality frontier.

A budget is the share of the context's KV entries a method may keep (``1/8``) or a number of tokens (``512``): kvpress
users ask for both. At an evaluation length it becomes, per method,

- a press's ``compression_ratio`` (the share dropped: ``1 - kept / length``), for every press that takes one, and
  for the oracle (:mod:`attn.hf.oracle`), the ceiling of any selector of that size;
- an attention variant that attends to that many keys per query (:data:`SIZED`): a window, a window with 4 sinks,
  block-sparse (the first block and local blocks), MoBA's and Quest's routed blocks and pages -- other models, each
  with a prefill of its own; and the dynamic sparse prefills, whose budget is the share of the prefill's pairs they
  compute (:data:`PREFILL_AT`), while decoding reads the whole cache;
- presses without a budget (``none``, ``quantized``) stay as given: they sit where their bytes put them.

Rows carry ``budget`` (the text), ``budget_fraction`` (kept / length) and ``kv_bytes``: the bytes of the context's
keys and values a decoded token reads -- measured on the cache a press leaves (for the oracle: its share of the full
cache), computed for a variant as its keys per query x layers x key-value heads x head size x 2 x the dtype's bytes.
An evicting press also *holds* only that much; Quest, MoBA and the oracle keep every key resident and read the budget.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.accuracy.pretrained import HFPlan

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


# The dynamic sparse prefills (attn/attention/prompt_sparse.py) at a budget: the share of the prefill's causal
# (query, key) pairs they compute. Their density follows the prompt, so a budget names parameters measured to reach
# about that share on SmolLM2-135M's 4K passkey prompts (untimed calibration, results/README.md "Dynamic sparse
# prefill"); vertical-slash's counts scale with the length. Every row records the density its prompts reached.
# Decoding reads the whole cache: their kv_bytes are full's.
PREFILL_AT: dict[str, dict[str, str]] = {
    "1/4": {"xattention": "xattention:threshold=0.85", "flexprefill": "flexprefill:gamma=0.85,min_budget=256",
            "vertical_slash": "vertical_slash:vertical_size={L100},slash_size={S100}"},
    "1/8": {"xattention": "xattention:threshold=0.5", "flexprefill": "flexprefill:gamma=0.6,min_budget=128",
            "vertical_slash": "vertical_slash:vertical_size={L50},slash_size={S40}"},
}
PREFILL = ("vertical_slash", "flexprefill", "xattention")


def prefill_sized(family: str, budget: Budget, length: int) -> str | None:
    """The spec of a dynamic prefill at ``budget`` (a share listed in :data:`PREFILL_AT`) for ``length``-token prompts;
    None when no parameters are measured for that share. Vertical-slash's counts, measured at 4K, scale with length:
    ``{L<n>}`` is n columns per 4096 tokens, ``{S<n>}`` the 100 nearest distances and n more per 4096 tokens."""
    text = PREFILL_AT.get(budget.text, {}).get(family)
    if text is None:
        return None
    for key in ("L100", "L50"):
        text = text.replace("{" + key + "}", str(max(30, int(key[1:]) * length // 4096)))
    for key in ("S100", "S40"):
        text = text.replace("{" + key + "}", str(100 + int(key[1:]) * length // 4096))
    return text


SIZED = ("sliding_window", "sinks", "block_sparse", "moba", "quest", *PREFILL)


def takes_budget(press: str) -> bool:
    """Whether a press spec takes a compression_ratio (a budget sizes it), from its parameters (a wrapper's: the
    press it wraps)."""
    from attn.hf.presses import parse_press, press_params

    spec = parse_press(press)
    while spec.inner is not None and "compression_ratio" not in press_params(spec.name):  # a wrapper: its press's
        spec = spec.inner
    return "compression_ratio" in press_params(spec.name) and "compression_ratio" not in dict(spec.params)


def kv_bytes_per_token(config: Any, dtype: str) -> int:
    """Bytes one context token's keys and values take in every layer of the model."""
    import torch

    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(config.num_hidden_layers * heads * head_dim * 2 * getattr(torch, dtype).itemsize)


# -- the plan ------------------------------------------------------------------------------------------------------

def plan(path: str | Path, tasks: Sequence[str], variants: Sequence[str], positions: Sequence[str],
         eval_lens: Sequence[int] | None, configs: dict[str, Any] | None = None, presses: Sequence[str] = (),
         query_aware: bool = False, equal_memory: bool = False, dtype: str = "float32", budgets: Sequence[str] = (),
         families: Sequence[str] = (), chat_template: bool = False) -> HFPlan:
    """:func:`harness.accuracy.pretrained.plan`, or with ``budgets`` (``1/8``, ``512``) :func:`budget_plan`: each press
    that takes a compression ratio and is given none runs at each budget, each ``families`` variant (:data:`SIZED`)
    at each budget and length."""
    from harness.accuracy import pretrained

    if budgets:
        if equal_memory:
            raise ValueError("--equal-memory sizes variants to press ratios; with --budget use --sized")
        return budget_plan(path, tasks, variants, positions, eval_lens, configs, presses, query_aware, dtype, budgets,
                           families, chat_template)
    if families:
        raise ValueError("--sized needs --budget (the budget sizes each variant)")
    return pretrained.plan(path, tasks, variants, positions, eval_lens, configs, presses, query_aware, equal_memory,
                           dtype, chat_template)


def budget_plan(path: str | Path, tasks: Sequence[str], variants: Sequence[str], positions: Sequence[str],
                eval_lens: Sequence[int] | None, configs: dict[str, Any] | None, presses: Sequence[str],
                query_aware: bool, dtype: str, budgets: Sequence[str], families: Sequence[str],
                chat_template: bool = False) -> HFPlan:
    """``pretrained.plan`` with budgets: per length, one setting (full attention, or the one variant given: a layer-typed
    model's own pattern) whose press arms are the presses sized to each budget (and those without one as given), then
    each sized variant at each budget."""
    import dataclasses

    from harness.accuracy.pretrained import CHECKPOINT, check_tasks, get_checkpoint_task, make_setting, press_refusals
    from harness.accuracy.pretrained import plan as plain
    from harness.presses import parse_presses

    check_tasks(tasks)
    parsed = [parse_budget(b) for b in budgets]
    bad = [f for f in families if f not in SIZED]
    if bad:
        raise ValueError(f"--sized {bad[0]!r}: valid: {', '.join(SIZED)}")
    if len(variants) > 1 or (families and list(variants) not in ([], ["full"])):
        raise ValueError("--budget sizes the variants itself (--sized): give at most one --variant, the model the "
                         "presses run on (full, or a layer-typed model's own pattern), and none with --sized")
    sizable = parse_presses([p for p in presses if takes_budget(p)])  # each sized below: spec.at(compression_ratio=...)
    if sizable and (scored := [t for t in tasks if not get_checkpoint_task(t).prompts]):
        raise ValueError(f"--press compresses the context a question is asked about: --task {scored[0]} scores every "
                         "position")
    if not sizable and not families:
        raise ValueError("--budget sizes presses that take a compression_ratio (given none) or --sized variants")
    base = plain(path, tasks, list(variants) or ["full"], positions, eval_lens, configs,
                 [p for p in presses if not takes_budget(p)], False, False, dtype, chat_template)
    if sizable and (refused := press_refusals(base.ckpt, base.settings)):
        raise ValueError(f"--press cannot run on --variant {variants[0]}: {refused[0]}")
    per_token = kv_bytes_per_token(base.ckpt.config, base.dtype)  # "auto" resolved: the dtype the plan runs in
    settings = []
    for L in base.eval_lens:
        for s0 in base.settings:
            arms, cols = list(s0.presses), []
            for b in parsed:
                for press in sizable:
                    spec = press.at(compression_ratio=b.ratio(L))
                    arms.append(spec)
                    cols.append((spec.label, (("budget", b.text), ("budget_fraction", b.share(L)))))
            if len({a.label for a in arms}) < len(arms):
                raise ValueError(f"two budgets give one press the same ratio at length {L}: {budgets}")
            if arms:  # without presses the sized variants run alone (full is the press grid's `none` arm)
                settings.append(dataclasses.replace(s0, presses=tuple(arms), only_len=L, arm_columns=tuple(cols),
                                                    query_aware=query_aware))
        for b in parsed:
            for fam in families:
                got = (sized(fam, b.kept(L)) if fam not in PREFILL
                       else (spec, L) if (spec := prefill_sized(fam, b, L)) else None)  # a prefill keeps every key
                if got is None:
                    continue
                spec, n = got
                for pos in positions or [CHECKPOINT]:
                    settings.append(dataclasses.replace(make_setting(base.ckpt, spec, pos), only_len=L, columns=(
                        ("budget", b.text), ("budget_fraction", b.share(L)), ("kv_tokens_min", n),
                        ("kv_tokens_mean", n), ("kv_tokens_max", n), ("kv_bytes", n * per_token))))
    return dataclasses.replace(base, settings=settings)


__all__ = ["PREFILL", "PREFILL_AT", "SIZED", "Budget", "prefill_sized", "budget_plan", "plan", "kv_bytes_per_token",
           "parse_budget", "sized", "takes_budget"]
