"""One prefill per prompt, shared by every arm that leaves the prefill unchanged; each arm branches from it.

A prompt is a context and, after ``question_at``, a question. The context's keys do not depend on what an arm does to
the cache afterwards -- a KV press prunes or quantizes what the *cache* keeps once a layer has attended over all of
the context -- so the context is prefilled once (:class:`SharedPrefill`), recording what kvpress's hooks read
(:class:`attn.hf.replay.Recorder`), and each arm gets a cache of its own from it: ``none`` the keys as they are,
``quantized`` a quantized copy, a kvpress press its pruned copy (replayed: :func:`attn.hf.replay.compress`). The arm
then decodes the question and its answer greedily against its own cache, the positions continuing the context's
(kvpress's protocol), and its cache is freed. Arms whose press cannot be replayed prefill the context themselves; a
retrieval arm (:mod:`attn.hf.retrieval`) prefills only the chunks it keeps, and decodes the question right after them.

Consecutive prompts share prefixes (the task's instruction; RULER's examples the noise before the first needle,
passkey's keys of one haystack, ``keys_per_haystack``, the haystack before the key): the shared prefill runs only past
the longest common prefix with the last prompt's context (crop, never recompute; causal attention makes the cached
keys those a fresh prefill computes) -- except under a dynamic sparse prefill, whose choice of keys reads the whole
prompt (:func:`whole_prompts`).

A run without presses has one plain arm (label ``None``: rows without press columns). It shares nothing with another
arm, so its context is the whole prompt: the prefill's last logits give the first answer token, exactly as
``transformers``' ``generate`` on the prompt would, and the answer is decoded into the shared cache, whose prefix the
next prompt reuses. Arms that change the prefill itself (a variant, a layer pattern, a position override) are other
models: each is its own setting, with a prefill of its own (:mod:`harness.accuracy.pretrained`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attn.hf import batched
from attn.hf.arms import Arm, Branch, Prompt, Shared
from attn.hf.arms import arm as make_arm
from attn.hf.batched import batchable
from attn.hf.presses import NONE, PressSpec, language_model
from attn.hf.replay import Recorder
from harness.accuracy.answered import Answered

# per-prompt statistics an arm may give, averaged into its row: the oracle's true attention mass on the kept keys; a
# retrieval arm's seconds retrieving and prefilling, its chunks, the tokens kept and the share of the needles kept
MEANS = ("attention_mass_kept", "retrieval_seconds", "prefill_seconds", "chunks", "chunks_kept", "retrieved_tokens",
         "needle_recall", "kv_resident_bytes", "compress_seconds")
Stop = Callable[[torch.Tensor, Any], torch.Tensor]  # a transformers StoppingCriteria: (ids (1, n), scores) -> (1,)


class SharedPrefill:
    """The arms of one setting's prompts: ``specs`` (press specs, one arm each, labelled by the spec) or, with none
    given, one plain arm labelled ``None``. Each prompt's cache statistics are kept per arm until :meth:`take_stats`;
    an arm that cannot run is in :attr:`failed` with its exception, and the other arms go on."""

    def __init__(self, specs: Sequence[PressSpec] = (), query_aware: bool = False,
                 decode: Callable[[list[int]], str] | None = None, batch: bool = True):
        self.decode = decode  # token ids -> text: what a retrieval arm's retriever reads
        self.plain = not specs
        self.specs = list(specs) or [PressSpec(NONE)]
        self.members = [make_arm(s) for s in self.specs]
        self.presses = [a.press for a in self.members]
        self.batch = batch
        self.query_aware = query_aware
        self.arms: tuple[str | None, ...] = (None,) if self.plain else tuple(s.label for s in self.specs)
        self.ids: list[int] = []  # the tokens whose keys the shared cache holds
        self.cache: Any = None
        self.recorder: Recorder | None = None
        self.stats: dict[str | None, list[dict[str, Any]]] = {a: [] for a in self.arms}
        self.failed: dict[str | None, BaseException] = {}
        self.answered: Answered | None = None  # prompts answered before a cut (set per cell with its scope)
        self.scope = ""
        self.resumed = 0  # prompts of this cell answered from ``answered``

    # -- the shared prefill -----------------------------------------------------------------------------------
    def _crop(self, context: list[int], model: Any, record: bool) -> int:
        """Cut the shared cache back to its longest common prefix with ``context`` (at least one token left to run);
        returns how many tokens it keeps."""
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
            self.recorder = Recorder(model) if record else None
        keep = 0
        for a, b in zip(self.ids, context[:-1], strict=False):
            if a != b or whole_prompts(model):
                break
            keep += 1
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[..., :keep, :], layer.values[..., :keep, :]
        if self.recorder is not None:
            self.recorder.crop(keep)
        return keep

    @torch.no_grad()
    def _prefill(self, model: Any, context: list[int]) -> torch.Tensor | None:
        """The context's keys in the shared cache, run only past the shared prefix. The plain arm gets the logits of
        the context's last position (the LM head on it alone); press arms get the layers' inputs recorded instead."""
        keep = self._crop(context, model, record=not self.plain)
        x = torch.tensor([context[keep:]], device=model.device)
        self.ids = list(context)
        if self.plain:
            return model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        with self.recorder.recording():  # type: ignore[union-attr]
            language_model(model)(input_ids=x, past_key_values=self.cache, use_cache=True)
        return None

    def _shared(self, model: Any, context: list[int]) -> Shared | None:
        """The context prefilled once and recorded, for the arms that replay it (None: no arm does)."""
        if not any(a.replays for a in self.live()):
            return None
        self._prefill(model, context)
        return Shared([layer.keys for layer in self.cache.layers], [layer.values for layer in self.cache.layers],
                      self.recorder)

    def _record(self, arm: Arm, b: Branch, context: int) -> None:
        """One prompt's row statistics of an arm, once it has decoded against its branch."""
        self.stats[arm.label].append(arm.after({"context_tokens": context, "kv_cache": type(b.cache).__name__,
                                                **b.columns}))

    def _transient(self) -> bool:
        """An arm failed in this cell other than by refusing: its prompts are answered again, and none is kept."""
        from attn.attention.base import UnsupportedBackend

        return any(not isinstance(e, UnsupportedBackend) for e in self.failed.values())

    def _recall(self, parts: Any) -> dict[str, Any] | None:
        """A prompt's line from before a cut, its statistics taken as if answered now, and the arms that refused it
        refused again (None: answer it)."""
        from attn.attention.base import UnsupportedBackend

        got = self.answered.get(self.scope, parts) if self.answered is not None and not self._transient() else None
        if got is None:
            return None
        for arm, why in got.get("refused", []):
            self.failed.setdefault(arm, UnsupportedBackend(why))
        for arm, stats in zip(self.arms, got["stats"], strict=True):
            if stats is not None and not self.plain:
                self.stats[arm].append(stats)
        self.resumed += 1
        return got

    def _keep(self, parts: Any, out: list[Any], counted: dict[str | None, int]) -> None:
        """Append a prompt's answers (``out``, per arm in order), statistics and refusals, unless an arm failed
        otherwise (a resumed cell tries it again)."""
        if self.answered is None or self._transient():
            return
        stats = [self.stats[a][-1] if len(self.stats[a]) > counted[a] else None for a in self.arms]
        refused = [[a, str(e)] for a, e in self.failed.items()]
        self.answered.put(self.scope, parts, {"out": out, "stats": stats, "refused": refused})

    # -- the arms ------------------------------------------------------------------------------------------------
    def answers(self, model: Any, prompt: list[int], question_at: int, config: Any,
                stop: Stop | None = None, needles: Sequence[str] | None = None) -> dict[str | None, list[int]]:
        """Each arm's greedy continuation of ``prompt`` (``config``: a GenerationConfig: ``max_new_tokens``, and with
        ``min_new_tokens`` exactly that many, the end-of-sequence token suppressed until then, as ``generate`` does;
        without it, until ``stop`` or the end-of-sequence token). ``needles``: the answers the context hides, where the
        task knows them (a retrieval arm records the share of them its chunks kept). The arms that batch decode
        together (:mod:`attn.hf.batched`), the others one at a time."""
        parts = ["answers", self.arms, self.query_aware, prompt, question_at, config.max_new_tokens,
                 config.min_new_tokens, stop is not None, list(needles or ())]
        if (got := self._recall(parts)) is not None:
            return {a: ids for a, ids in zip(self.arms, got["out"], strict=True) if ids is not None}
        counted = {a: len(self.stats[a]) for a in self.arms}
        said = self._answers(model, prompt, question_at, config, stop, needles)
        self._keep(parts, [said.get(a) for a in self.arms], counted)
        return said

    def _answers(self, model: Any, prompt: list[int], question_at: int, config: Any, stop: Stop | None,
                 needles: Sequence[str] | None) -> dict[str | None, list[int]]:
        greedy = Greedy(model, prompt, config, stop)
        if self.plain:
            logits = self._prefill(model, prompt)
            out = greedy.run(self.cache, [], len(prompt), logits)
            self.ids = prompt + out[:-1]  # the last answer token was never fed: its key is not cached
            return {None: out}
        cut = len(prompt) - 1 if self.query_aware else min(question_at, len(prompt) - 1)  # a question of >= 1 token
        seen = Prompt(prompt, question_at, cut, greedy.new_tokens, self.decode, needles)
        shared = self._shared(model, prompt[:cut])
        said: dict[str | None, list[int]] = {a.label: [] for a in self.members}
        branches: dict[str, Branch] = {}
        for arm in self.live():
            try:
                branches[arm.label] = arm.branch(model, seen, shared)
            except Exception as e:  # this arm cannot run here: its rows say why, the other arms go on
                self.fail(arm, e)
        together = [a for a in self.live() if a.label in branches and branches[a.label].batches] if (
            self.batch and not batchable(model)) else []
        for group in _by_question(together, branches):
            try:
                got = batched.decode(model, [branches[a.label].cache for a in group], branches[group[0].label].question,
                                     [branches[a.label].start for a in group], greedy.pick, greedy.ended,
                                     greedy.new_tokens, len(language_model(model).layers))
            except Exception as e:  # noqa: BLE001  (every arm of the batch says why)
                for a in group:
                    self.fail(a, e)
                continue
            said |= {a.label: ids for a, ids in zip(group, got, strict=True)}
        for arm in self.live():
            if arm.label not in branches or arm in together:
                continue
            b = branches[arm.label]
            try:
                with arm.decoding(model, b):
                    said[arm.label] = greedy.run(b.cache, b.question, b.start)
            except Exception as e:  # noqa: BLE001
                self.fail(arm, e)
        for arm in self.live():
            if (b := branches.pop(arm.label, None)) is not None:
                self._record(arm, b, cut)
        return said

    @torch.no_grad()
    def bits(self, model: Any, prompt: list[int], context: int) -> dict[str | None, torch.Tensor]:
        """Each arm's bits (base 2) on each token of ``prompt[context + 1:]``, teacher-forced against its cache of
        ``prompt[:context]`` (compressed once prefilled, as for :meth:`answers`). The first token after the context
        follows from its last position before any press acts, the same for every arm: it is not scored."""
        parts = ["bits", self.arms, prompt, context]
        if (got := self._recall(parts)) is not None:
            return {a: torch.tensor(b) for a, b in zip(self.arms, got["out"], strict=True) if b is not None}
        counted = {a: len(self.stats[a]) for a in self.arms}
        out = self._bits(model, prompt, context)
        self._keep(parts, [out[a].tolist() if a in out else None for a in self.arms], counted)
        return out

    def _bits(self, model: Any, prompt: list[int], context: int) -> dict[str | None, torch.Tensor]:
        import torch.nn.functional as F

        dev = model.device
        targets = torch.tensor(prompt[context + 1:], device=dev)

        def scored(cache: Any, ids: list[int], start: int) -> torch.Tensor:
            pos = torch.arange(start, start + len(ids), device=dev)[None]
            logits = model(input_ids=torch.tensor([ids], device=dev), past_key_values=cache, position_ids=pos,
                           use_cache=cache is not None).logits[0, -len(targets):]
            return F.cross_entropy(logits.float(), targets, reduction="none") / math.log(2)

        if self.plain:
            return {None: scored(None, prompt[:-1], 0)}
        seen = Prompt(prompt, context, context, 0, self.decode)
        shared = self._shared(model, prompt[:context])
        out = {}
        for arm in self.live():
            try:
                b = arm.branch(model, seen, shared)
                with arm.decoding(model, b):
                    out[arm.label] = scored(b.cache, b.question[:-1], b.start)
            except Exception as e:  # noqa: BLE001  (this arm's rows say why, the others go on)
                self.fail(arm, e)
                continue
            self._record(arm, b, context)
        return out

    def live(self) -> list[Arm]:
        return [a for a in self.members if a.label not in self.failed]

    def fail(self, arm: Arm, e: BaseException) -> None:
        """The arm is out for the rest of this cell. Its exception is kept without its traceback, whose frames hold
        every arm's cache of the prompt it failed on."""
        from harness.presses import press_refusal

        err = press_refusal(arm.label, e)
        err.__traceback__ = err.__context__ = err.__cause__ = None
        self.failed[arm.label] = err

    def next_cell(self) -> None:
        """A new cell: an arm that failed in the last one tries again (running out of memory, oneDNN's "could not
        create a primitive" may pass), except one that refused (``unsupported``: a press that cannot run here)."""
        from attn.attention.base import UnsupportedBackend

        self.failed = {a: e for a, e in self.failed.items() if isinstance(e, UnsupportedBackend)}

    def take_stats(self, arm: str | None) -> dict[str, Any]:
        """Row columns over the prompts answered since the last call: the cache class the arm decoded against
        (``kv_cache``), and for a press arm the cached tokens per layer after compression (min / mean / max over layers
        and prompts), the cache's bytes and the context's tokens (means over prompts), and the kept fraction."""
        got, self.stats[arm] = self.stats[arm], []
        if self.plain:
            return {"kv_cache": type(self.cache).__name__} if self.cache is not None else {}
        if not got:
            return {}
        n = len(got)
        mean = sum(g["kv_tokens_mean"] for g in got) / n  # every prompt's cache has the model's number of layers
        ctx = sum(g["context_tokens"] for g in got) / n
        out = {"kv_tokens_min": min(g["kv_tokens_min"] for g in got), "kv_tokens_mean": mean,
               "kv_tokens_max": max(g["kv_tokens_max"] for g in got),
               "kv_cache_bytes": sum(g["kv_cache_bytes"] for g in got) / n, "context_tokens": ctx,
               "kv_kept_fraction": mean / ctx, "kv_cache": got[-1]["kv_cache"]}
        for key in MEANS:  # the oracle's mass kept, a retrieval arm's choice: means over the prompts that have them
            if have := [g[key] for g in got if key in g]:
                out[key] = sum(have) / len(have)
        return out


def _by_question(arms: list[Arm], branches: dict[str, Branch]) -> list[list[Arm]]:
    """The arms grouped by the question they decode next (one batch step feeds the same tokens to every row)."""
    groups: dict[tuple[int, ...], list[Arm]] = {}
    for a in arms:
        groups.setdefault(tuple(branches[a.label].question), []).append(a)
    return list(groups.values())


def whole_prompts(model: Any) -> bool:
    """True when the model's attention chooses its keys from the whole prompt (a dynamic sparse prefill): a prefix's
    cached keys are the same, but the suffix's call alone would choose from the suffix, so every prompt is prefilled
    whole."""
    from attn.hf import attention_modules

    return any(getattr(m, "sparse_prefill", False) for m in attention_modules(model))


class Greedy:
    """Greedy decoding of one prompt's answer against a cache: ``generate``'s rules (``min_new_tokens`` suppresses
    the end-of-sequence token until then; otherwise it ends the answer, as does ``stop`` on prompt + answer)."""

    def __init__(self, model: Any, prompt: list[int], config: Any, stop: Stop | None):
        self.model, self.prompt, self.stop = model, prompt, stop
        self.new_tokens = int(config.max_new_tokens)
        self.exact = config.min_new_tokens is not None
        self.min_new = int(config.min_new_tokens or 0)
        eos = model.generation_config.eos_token_id
        self.eos = sorted(set(eos if isinstance(eos, list) else [] if eos is None else [eos]))

    def pick(self, logits: torch.Tensor, made: int) -> int:
        if made < self.min_new and self.eos:
            logits = logits.clone()
            logits[self.eos] = -float("inf")
        return int(logits.argmax())

    def ended(self, ids: list[int]) -> bool:
        if not self.exact and ids[-1] in self.eos:
            return True
        return self.stop is not None and bool(self.stop(torch.tensor([self.prompt + ids]), None).all())

    @torch.no_grad()
    def run(self, cache: Any, question: list[int], start: int, logits: torch.Tensor | None = None) -> list[int]:
        """The question at positions ``start``.. (the context's length, not the cache's: a press's cache is shorter),
        then greedy tokens; ``logits``: the next-token logits the prefill already gave (no question). Returns the
        generated ids."""
        dev = self.model.device

        def step(ids: list[int], at: int) -> torch.Tensor:
            pos = torch.arange(at, at + len(ids), device=dev)[None]
            out = self.model(input_ids=torch.tensor([ids], device=dev), past_key_values=cache, position_ids=pos,
                             logits_to_keep=1, use_cache=True)
            return out.logits[0, -1]

        if question:
            logits = step(question, start)
        at = start + len(question)
        ids = [self.pick(logits, 0)]  # type: ignore[arg-type]
        while len(ids) < self.new_tokens and not self.ended(ids):
            ids.append(self.pick(step(ids[-1:], at), len(ids)))
            at += 1
        return ids


def shared_order(prompts: Sequence[list[int]]) -> list[int]:
    """Indices of the prompts in token order: neighbours share the longest prefixes (the order never changes a score)."""
    return sorted(range(len(prompts)), key=lambda i: prompts[i])


def generate_answers(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, decode: Callable[[list[int]], str],
                     boundary: int, arms: SharedPrefill | None = None, question_at: Sequence[int] | None = None,
                     settled: Callable[[str], bool] | None = None,
                     needles: Sequence[Sequence[str]] | None = None) -> dict[str | None, list[str]]:
    """Greedy continuations of ``new_tokens`` tokens, decoded, in the prompts' order, per arm of ``arms`` (by default
    one plain arm). ``question_at``: where each question starts. ``settled(text)``: True once the score of an answer
    that begins with ``text`` can no longer change (passkey's first run of digits has ended); decoding stops there,
    which saves the steps and leaves every score as the full answer's (greedy answers are prefixes of each other).
    ``needles``: per prompt, the answers its context hides (:meth:`SharedPrefill.answers`)."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                           pad_token_id=boundary)
    arms = arms or SharedPrefill()
    out: dict[str | None, list[str]] = {a: [""] * len(prompts) for a in arms.arms}
    for i in shared_order(prompts):
        start = len(prompts[i])

        def stop(ids: torch.Tensor, scores: Any, start: int = start) -> torch.Tensor:
            return torch.tensor([settled(decode(ids[0, start:].tolist()))])  # type: ignore[misc]

        at = question_at[i] if question_at else start
        hidden = needles[i] if needles else None
        for arm, new in arms.answers(model, prompts[i], at, gen, stop if settled else None, hidden).items():
            out[arm][i] = decode(new)
    return out


__all__ = ["Greedy", "SharedPrefill", "generate_answers", "shared_order"]
