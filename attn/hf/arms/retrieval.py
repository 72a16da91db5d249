"""``retrieval``: the question (never cut) ranks the context's chunks, the kept ones are prefilled alone, and the
question is decoded right after them (:mod:`attn.hf.retrieval`). A prompt of its own, so it reads no shared prefill;
its cache is a plain one, decoded in the shared batch at its own positions."""
from __future__ import annotations

from typing import Any

from attn.hf.arms.base import Arm, Branch, Prompt, Shared
from attn.hf.presses import cache_columns
from attn.hf.retrieval import RETRIEVAL

EMPTY = dict.fromkeys(("kv_tokens_min", "kv_tokens_mean", "kv_tokens_max", "kv_cache_bytes"), 0)


class RetrievalArm(Arm):
    name = RETRIEVAL
    replays = False

    def branch(self, model: Any, prompt: Prompt, shared: Shared | None) -> Branch:
        if prompt.decode is None:
            raise ValueError(f"press {self.label} reads text: this evaluation gives no tokenizer")
        at = min(prompt.question_at, len(prompt.ids) - 1)
        ids = self.press.choose(model, prompt.ids[:at], prompt.ids[at:], prompt.decode, prompt.needles)
        cache = self.press.prefill(model, ids, lambda: self.spec.new_cache(model.config))
        held = cache_columns(cache) if ids else dict(EMPTY)  # no chunk fit the budget
        return Branch(cache, prompt.ids[at:], len(ids), {**held, **self.press.last, "context_tokens": at})
