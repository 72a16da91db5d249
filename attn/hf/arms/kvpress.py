"""Any kvpress press by name (``snapkv:compression_ratio=0.5``), replayed from the shared prefill where it can be.

Replay (:func:`attn.hf.replay.compress`) serves presses that act through kvpress's standard hook and compress only
during the prefill (:func:`replayable`); the others prefill the context themselves, kvpress's way
(:func:`attn.hf.replay.prefill_with`). A press that compresses while decoding (:func:`decoding_press`) keeps its
hooks on then, so it decodes alone; the others decode in the shared batch.

Scores shared across budgets: the presses of :data:`SHARED_SCORES` score a layer's keys from what the layer saw,
never from the budget, then keep the top ``n``; arms whose presses score with one function and the same parameters of
the class that defines it (one press at several ratios; PyramidKV beside SnapKV, whose scores it inherits) score each
layer once per prompt and each keeps its own top ``n`` of the same scores. The test compares every one of them with a
press scoring alone.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attn.hf import headmask
from attn.hf.arms.base import Arm, Branch, Prompt, Shared
from attn.hf.presses import cache_bytes, cache_columns, kept_tokens, layer_bytes
from attn.hf.replay import prefill_with

# kvpress presses whose ``score`` reads nothing of the budget and draws nothing at random (checked against kvpress's
# source; tests/test_arms.py compares each shared score with the press's own)
SHARED_SCORES = frozenset({"knorm", "snapkv", "pyramidkv", "tova", "expected_attention", "keydiff"})


@contextlib.contextmanager
def checkpoint_tokenizer(press: Any) -> Iterator[None]:
    """A press that loads the model's tokenizer itself (KVzip, for its chat template and its "repeat the context"
    prompts: ``AutoTokenizer.from_pretrained(model.config.name_or_path)``) gets the checkpoint's, from the GGUF file
    it lives in where the folder holds one (transformers reads a GGUF checkpoint's tokenizer only given the file)."""
    module = sys.modules.get(type(press).__module__)
    auto = getattr(module, "AutoTokenizer", None)
    if auto is None:
        yield
        return

    class FromCheckpoint:
        @staticmethod
        def from_pretrained(path: Any, *args: Any, **kwargs: Any) -> Any:
            from attn.hf.models import load_tokenizer

            ggufs = sorted(Path(str(path)).glob("*.gguf"))
            if len(ggufs) == 1 and not args and not kwargs:  # read once per process, as the checkpoint's own is
                return load_tokenizer(path, ggufs[0].name)
            return auto.from_pretrained(path, *args, **kwargs)

    module.AutoTokenizer = FromCheckpoint
    try:
        yield
    finally:
        module.AutoTokenizer = auto


def replayable(press: Any) -> bool:
    """Whether one recorded prefill can stand for this press's own: it hooks the attention layers the standard way
    (``BasePress.__call__``) and compresses only during the prefill."""
    from kvpress import BasePress, DecodingPress, PrefillDecodingPress

    return type(press).__call__ is BasePress.__call__ and not isinstance(press, (DecodingPress, PrefillDecodingPress))


def decoding_press(press: Any) -> bool:
    """Whether the press also compresses while the question and the answer are decoded (kvpress's pipeline)."""
    from kvpress import DecodingPress, DMSPress, PrefillDecodingPress

    return isinstance(press, (DecodingPress, PrefillDecodingPress)) or (isinstance(press, DMSPress) and press.decoding)


class KVPress(Arm):
    name = "kvpress"

    def __init__(self, spec: Any):
        super().__init__(spec)
        self.replays = replayable(self.press)
        self.decodes = decoding_press(self.press)

    def branch(self, model: Any, prompt: Prompt, shared: Shared | None) -> Branch:
        import torch

        t0 = time.perf_counter()
        if not self.replays:
            ctx = torch.tensor([prompt.ids[:prompt.cut]], device=model.device)
            with checkpoint_tokenizer(self.press):
                cache = prefill_with(model, self.spec, self.press, ctx)
        else:
            assert shared is not None
            with self._shared_scores(shared):
                cache = shared.replay(model, self.spec, self.press)
        spent = time.perf_counter() - t0  # its own prefill, or its scoring of the shared one (KVzip's reconstruction)
        masks = headmask.take(model)  # AdaKV's keys dropped per head: this arm's alone, set while it decodes
        cols = cache_columns(cache) | (_masked_columns(cache, masks, prompt.cut) if masks else {})
        cols["compress_seconds"] = spent
        return Branch(cache, prompt.ids[prompt.cut:], prompt.cut, cols, batches=not self.decodes and not masks,
                      state=masks or None)

    @contextlib.contextmanager
    def _shared_scores(self, shared: Shared):
        """The press scores each layer once per prompt for every ratio of it (module docstring)."""
        if self.spec.name not in SHARED_SCORES:
            yield
            return
        press, own = self.press, type(self.press).score
        owner = next(c for c in type(press).__mro__ if "score" in vars(c))  # PyramidKV scores as SnapKV does
        fields = {f.name for f in dataclasses.fields(owner)} - {"compression_ratio"}
        same = (owner, tuple(kv for kv in self.spec.all_params.items() if kv[0] in fields))

        def score(module: Any, *args: Any) -> Any:
            key = (same, module.layer_idx)
            if key not in shared.scores:
                shared.scores[key] = own(press, module, *args)
            return shared.scores[key]

        press.score = score
        try:
            yield
        finally:
            del press.score

    def decoding(self, model: Any, branch: Branch) -> contextlib.AbstractContextManager[Any]:
        if branch.state:
            return headmask.active(model, branch.state)
        return self.press(model) if self.decodes else contextlib.nullcontext()


def _masked_columns(cache: Any, masks: headmask.Masks, context: int) -> dict[str, Any]:
    """What a decoded token reads of a cache whose keys are masked per head: every key stays resident (its bytes are
    the cache's), each layer's kept share of the context's keys is what a head-sparse kernel would read."""
    tokens, read = [], 0.0
    for i, (n, b) in enumerate(zip(kept_tokens(cache), layer_bytes(cache), strict=True)):
        share = headmask.kept_share(masks, i, cache.layers[i].keys.shape[1], context) if i in masks else 1.0
        tokens.append(n - context * (1 - share))
        read += b * (n - context * (1 - share)) / max(n, 1)
    return {"kv_tokens_min": min(tokens), "kv_tokens_mean": sum(tokens) / len(tokens), "kv_tokens_max": max(tokens),
            "kv_cache_bytes": read, "kv_resident_bytes": cache_bytes(cache)}
