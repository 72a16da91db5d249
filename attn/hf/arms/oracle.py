"""``oracle``: every head keeps, at every decoding step, the budget's context keys of highest true weight
(:mod:`attn.hf.oracle`). It branches from the shared prefill with every key resident and chooses while it decodes, so
it decodes alone (its attention is its own, per step)."""
from __future__ import annotations

import contextlib
from typing import Any

from attn.hf.arms.base import Arm, Branch, Prompt, Shared
from attn.hf.oracle import ORACLE
from attn.hf.presses import cache_columns, kept_tokens, layer_bytes


class OracleArm(Arm):
    name = ORACLE
    decodes = True

    def branch(self, model: Any, prompt: Prompt, shared: Shared | None) -> Branch:
        from attn.hf.layers import window_layers  # needs transformers, which a run without arms may lack

        assert shared is not None
        cache = shared.replay(model, self.spec)
        cols = cache_columns(cache) | self.press.columns(layer_bytes(cache), kept_tokens(cache), prompt.cut,
                                                         window_layers(model.config))
        self.press.mass = []
        return Branch(cache, prompt.ids[prompt.cut:], prompt.cut, cols, batches=False)

    def decoding(self, model: Any, branch: Branch) -> contextlib.AbstractContextManager[Any]:
        return self.press(model)

    def after(self, columns: dict[str, Any]) -> dict[str, Any]:
        mass = self.press.mass
        return columns | {"attention_mass_kept": sum(mass) / max(len(mass), 1)}
