"""``quantized``: transformers' ``QuantizedCache`` (quanto), every context token kept at fewer bits.

While fewer tokens are decoded after the context than its full-precision residual holds (``residual_length``), each
step attends over the dequantized context and the decoded tokens at full precision (``QuantizedLayer.update``): the arm
then decodes in the shared batch from the context dequantized once, the same keys. Past that it would re-quantize, and
the arm decodes alone against its own ``QuantizedCache``."""
from __future__ import annotations

from typing import Any

from attn.hf.arms.base import Arm, Branch, Prompt, Shared
from attn.hf.presses import QUANTIZED, cache_columns


class Quantized(Arm):
    name = QUANTIZED

    def branch(self, model: Any, prompt: Prompt, shared: Shared | None) -> Branch:
        from transformers import DynamicCache

        assert shared is not None
        cache = shared.replay(model, self.spec)
        question = prompt.ids[prompt.cut:]
        cols = cache_columns(cache)
        if len(question) + prompt.new_tokens + 1 >= min(layer.residual_length for layer in cache.layers):
            return Branch(cache, question, prompt.cut, cols, batches=False)
        plain = DynamicCache()
        for i, layer in enumerate(cache.layers):
            plain.update(layer._dequantize(layer._quantized_keys), layer._dequantize(layer._quantized_values), i)
        return Branch(plain, question, prompt.cut, cols | {"kv_cache": type(cache).__name__})
