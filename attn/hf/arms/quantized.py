"""``quantized``: transformers' ``QuantizedCache`` (quanto), every context token kept at fewer bits.

Decoded one arm at a time: a quantized cache dequantizes its own layers at each step and quantizes its residual when
it fills, which a batch of plain caches would not do."""
from __future__ import annotations

from typing import Any

from attn.hf.arms.base import Arm, Branch, Prompt, Shared
from attn.hf.presses import QUANTIZED, cache_columns, compress


class Quantized(Arm):
    name = QUANTIZED
    batches = False

    def branch(self, model: Any, prompt: Prompt, shared: Shared | None) -> Branch:
        assert shared is not None
        cache = compress(model, self.spec, None, shared.keys, shared.values, shared.recorder)
        return Branch(cache, prompt.ids[prompt.cut:], prompt.cut, cache_columns(cache))
