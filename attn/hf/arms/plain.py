"""``none``: the context's keys as the prefill left them, the uncompressed baseline every press is compared with."""
from __future__ import annotations

from typing import Any

from attn.hf.arms.base import Arm, Branch, Prompt, Shared
from attn.hf.presses import NONE, cache_columns


class Plain(Arm):
    name = NONE

    def branch(self, model: Any, prompt: Prompt, shared: Shared | None) -> Branch:
        assert shared is not None
        cache = shared.replay(model, self.spec)
        return Branch(cache, prompt.ids[prompt.cut:], prompt.cut, cache_columns(cache))
