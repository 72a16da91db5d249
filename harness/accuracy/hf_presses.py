"""KV presses on a pretrained checkpoint (``attn-bench accuracy --hf-model ... --press snapkv:compression_ratio=0.5``).

Each prompt of a setting is answered once per press, under kvpress's protocol (:mod:`attn.hf.presses`): the context
is prefilled and compressed, then the question and the answer are decoded against the compressed cache. Query-
agnostic by default (the question comes after the compression, as when one context serves many questions);
``--query-aware`` compresses the whole prompt but its last token instead (kvpress's ``query_aware``: the press sees the
question).

One prefill per prompt serves every press: :class:`PressCache` prefills the context only past its longest common
prefix with the last prompt's (passkey's depths, RULER's examples), recording what the presses' hooks read, and each
press replays it into a cache of its own. Presses that cannot be replayed run their own prefill of the whole context.

Equal memory (``--equal-memory``): for every requested ratio r and length L, the attention variants whose decoding
state holds the same number of tokens as the press keeps, ``B = int(L * (1 - r))`` (kvpress keeps
``int(k_len * (1 - r))`` of the context's ``k_len`` tokens; the question's few tokens are not counted on either
side): ``sliding_window`` with ``window=B``, the window with 4 sinks and ``window=B-4``, and ``block_sparse`` with
128-token blocks, the first global and ``B/128 - 1`` local (``B`` rounded down to a whole block).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attn.hf.presses import (
    NONE,
    PressSpec,
    Recorder,
    cache_bytes,
    compress,
    decode,
    kept_tokens,
    language_model,
    parse_press,
    prefill_with,
    replayable,
)

SINKS = 4  # the equal-memory window's sinks (StreamingLLM's)
BLOCK = 128  # the equal-memory block_sparse's block size


def press_columns(spec: PressSpec, query_aware: bool) -> dict[str, Any]:
    """What every press row says about the press and the protocol."""
    return {"press": spec.name, "press_spec": spec.label, "press_params": spec.all_params,
            "compression_ratio": spec.ratio, "query_aware": query_aware,
            "press_protocol": "context compressed with the question" if query_aware else
            "context compressed, then question and answer decoded against it"}


def equal_memory_specs(budget: int) -> list[str]:
    """Variant specs whose decoding state holds ``budget`` tokens (see module docstring)."""
    blocks = budget // BLOCK
    # backends pinned as the checkpoint presets pin them (harness/accuracy/hf_presets.py): auto would compile Flex
    # once per prompt shape
    specs = [f"sliding_window:window={budget},backend=blocked",
             f"sliding_window:sinks={SINKS},window={budget - SINKS},backend=blocked"]
    if blocks >= 2:
        specs.append(f"block_sparse:block_size={BLOCK},global_blocks=1,local_blocks={blocks - 1},backend=gathered")
    return specs


def equal_memory_budget(length: int, ratio: float) -> int:
    return int(length * (1 - ratio))


class PressCache:
    """The arms of a setting's prompts, one per press (their labels), sharing one recorded prefill per prompt; each
    prompt's kept tokens and cache bytes per press are kept until :meth:`take_stats`."""

    def __init__(self, specs: Sequence[PressSpec], query_aware: bool = False):
        self.specs = list(specs)
        self.presses = [s.build() for s in self.specs]
        self.query_aware = query_aware
        self.arms: tuple[str | None, ...] = tuple(s.label for s in self.specs)
        self.ids: list[int] = []
        self.cache: Any = None
        self.recorder: Recorder | None = None
        self.stats: dict[str, list[tuple[list[int], int, int]]] = {a: [] for a in self.arms}
        self.failed: dict[str, BaseException] = {}  # arm -> why it could not run (the other arms go on)

    @torch.no_grad()
    def _prefill(self, model: Any, context: list[int]) -> None:
        """The context's keys in ``self.cache`` and its layer inputs in the recorder, run only past the shared prefix."""
        from transformers import DynamicCache

        if self.recorder is None:
            self.cache, self.recorder = DynamicCache(), Recorder(model)
        keep = 0
        for a, b in zip(self.ids, context, strict=False):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(context) - 1)  # at least one token runs (a cache is never empty after a prefill)
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[..., :keep, :], layer.values[..., :keep, :]
        self.recorder.crop(keep)
        with self.recorder.recording():
            x = torch.tensor([context[keep:]], device=model.device)
            language_model(model)(input_ids=x, past_key_values=self.cache, use_cache=True)
        self.ids = list(context)

    def answers(self, model: Any, prompt: list[int], question_at: int, config: Any,
                stop: Any = None) -> dict[str | None, list[int]]:
        """Each press's greedy continuation of ``prompt`` (``config``: a GenerationConfig, its ``max_new_tokens``;
        ``min_new_tokens`` set: exactly that many, else until ``stop`` or the end-of-sequence token)."""
        cut = len(prompt) - 1 if self.query_aware else question_at
        context, question = prompt[:cut], prompt[cut:]
        exact = config.min_new_tokens is not None
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

        def ended(ids: list[int]) -> bool:
            if not exact and ids[-1] in eos:
                return True
            return stop is not None and bool(stop(torch.tensor([prompt + ids]), None).all())

        replay = any(replayable(p) for p in self.presses)
        if replay:
            self._prefill(model, context)
        out: dict[str | None, list[int]] = {}
        for spec, press in zip(self.specs, self.presses, strict=True):
            if spec.label in self.failed:
                out[spec.label] = []
                continue
            try:
                if replayable(press):
                    keys = [layer.keys for layer in self.cache.layers]
                    values = [layer.values for layer in self.cache.layers]
                    cache = compress(model, spec, press, keys, values, self.recorder)
                else:
                    cache = prefill_with(model, spec, press, torch.tensor([context], device=model.device))
                self.stats[spec.label].append((kept_tokens(cache), cache_bytes(cache), len(context)))
                out[spec.label] = decode(model, press, cache, question, len(context), config.max_new_tokens, ended)
            except Exception as e:  # this press cannot run here: its rows say why, the other presses go on
                self.failed[spec.label] = press_failure(spec, e)
                out[spec.label] = []
        return out

    def take_stats(self, arm: str) -> dict[str, Any]:
        """Row columns over the prompts answered since the last call: cached tokens per layer after compression
        (min / mean / max over layers and prompts), the cache's bytes and the context's tokens (means over prompts)."""
        got, self.stats[arm] = self.stats[arm], []
        if not got:
            return {}
        kept = [k for ks, _, _ in got for k in ks]
        ctx = sum(c for _, _, c in got) / len(got)
        return {"kv_tokens_min": min(kept), "kv_tokens_mean": sum(kept) / len(kept), "kv_tokens_max": max(kept),
                "kv_cache_bytes": sum(b for _, b, _ in got) / len(got), "context_tokens": ctx,
                "kv_kept_fraction": sum(kept) / len(kept) / ctx}


def press_failure(spec: PressSpec, err: Exception) -> Exception:
    """A press that refuses this model or attention (kvpress asserts what it needs, e.g. eager attention weights) is
    ``unsupported`` with kvpress's reason; anything else stays the error it is."""
    from attn.attention.base import UnsupportedBackend
    from harness.accuracy.runner import is_oom

    if isinstance(err, (AssertionError, NotImplementedError)) and not is_oom(err):
        return UnsupportedBackend(f"press {spec.label}: kvpress refuses it here ({type(err).__name__}: "
                                  f"{err or 'assertion failed'})")
    return err


def parse_presses(texts: Sequence[str]) -> list[PressSpec]:
    """``--press`` values, validated (ValueError, one line), duplicates dropped, in order."""
    specs: list[PressSpec] = []
    for t in texts:
        spec = parse_press(t)
        if spec not in specs:
            specs.append(spec)
    return specs


__all__ = ["BLOCK", "NONE", "SINKS", "PressCache", "equal_memory_budget", "equal_memory_specs", "parse_presses",
           "press_columns"]
