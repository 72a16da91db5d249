"""Prompts a pretrained checkpoint answers by greedy generation: passkey and RULER, and the prefix cache they share.

passkey: the Landmark/YaRN prompt (their instruction, a repeated filler haystack, the key sentence at a
depth, the question), built in tokens to exactly ``eval_len`` tokens; the model greedily generates a few
tokens and the first run of digits in them must equal the key (``exact_match`` per example).

ruler: RULER's generators (:mod:`harness.accuracy.tasks.ruler`) sized by the checkpoint's tokenizer under RULER's length
rule (boundary + prompt + RULER's ``tokens_to_generate`` for the task <= ``eval_len``); the prompt ends with the
task's answer prefix, the model greedily generates at most the reference answer's tokens + ``ANSWER_ROOM``, cut at
the first line break after the answer starts, and RULER's ``string_match_all`` scores it. Prompts are plain text
(no chat template, for base and instruct checkpoints alike; RULER adds a one-shot example to ``vt`` for pretrained
models, which this does not).

Every prompt goes through one :class:`PrefixCache` per model: it is prefilled only past its longest common prefix
with the tokens already cached (causal attention makes those keys exactly what a fresh prefill computes), with the
LM head on the last position only (``generate``), then decoded through the cache.
"""
from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from harness.accuracy.common import rng_for
from harness.accuracy.hf_checkpoint import Checkpoint, Tokens
from harness.accuracy.hf_tasks import CheckpointTask, register_checkpoint_task
from harness.accuracy.jobs import short_hash
from harness.accuracy.stats import Measure, accuracy, clustered_accuracy
from harness.accuracy.tasks.passkey import FILLER, KEY_SENTENCE, QUESTION, PasskeyConfig, draw_key
from harness.accuracy.tasks.ruler import NIAH, RulerConfig, generate, string_match_all

# RULER's tokens_to_generate (scripts/synthetic.yaml): the room its length rule keeps for the answer.
RULER_ROOM = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}
# Landmark attention's / YaRN's passkey instruction, kept: the model is a pretrained LM, not trained on the task.
INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
               "I will quiz you about the important information there. ")
ANSWER_SLACK = 10  # tokens generated beyond the key's digits (an instruct model may say "the pass key is" first)
ANSWER_ROOM = 16  # ruler: tokens generated beyond the reference answer's


# -- passkey ------------------------------------------------------------------------------------------------

def filler_ids(tokens: Tokens, n: int) -> list[int]:
    """``n`` tokens of the repeated filler paragraph (tokenized whole: a subword tokenizer packs several characters
    into a token, so the paragraph is repeated until it holds ``n`` tokens)."""
    reps = n // len(FILLER) + 1
    while len(ids := tokens.encode(FILLER * reps)) < n:
        reps *= 2
    return ids[:n]


def passkey_prompt(tokens: Tokens, length: int, depth: float, key: str, filler: list[int]) -> list[int]:
    """Exactly ``length`` tokens: boundary, instruction, filler with the key sentence after ``depth`` of it, question."""
    head = [tokens.boundary, *tokens.encode(INSTRUCTION)]
    needle = tokens.encode(KEY_SENTENCE.format(key=key))
    question = tokens.encode(QUESTION.rstrip())
    n = length - len(head) - len(needle) - len(question)
    if n < 0 or n > len(filler):
        raise ValueError(f"passkey: length {length} is too short for the prompt (needs >= {length - n} tokens)")
    before = round(depth * n)
    return head + filler[:before] + needle + filler[before:n] + question


def min_passkey_len(tokens: Tokens, digits: int) -> int:
    """The shortest prompt, with slack for keys that take more tokens than the sample key."""
    key = "9" * digits
    fixed = 1 + len(tokens.encode(INSTRUCTION)) + len(tokens.encode(KEY_SENTENCE.format(key=key)))
    return fixed + len(tokens.encode(QUESTION.rstrip())) + digits


def answer(text: str) -> str:
    """The first run of digits the model generated ("" if none)."""
    found = re.search(r"\d+", text)
    return found.group() if found else ""


class PrefixCache:
    """One KV cache reused across prompts: a prompt prefills only what follows its longest common prefix with the
    last one (crop, never recompute). Causal attention makes the cached keys exactly those a full prefill computes;
    every layer keeps all its keys (a config-free ``DynamicCache``: a sliding layer's variant masks them itself)."""

    def __init__(self) -> None:
        self.ids: list[int] = []  # the tokens whose keys the cache holds
        self.cache: Any = None

    def reuse(self, prompt: list[int]) -> Any:
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        keep = 0
        for a, b in zip(self.ids, prompt[:-1], strict=False):  # the last prompt token is always fed (its logits answer)
            if a != b:
                break
            keep += 1
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[..., :keep, :], layer.values[..., :keep, :]
        self.ids = prompt[:keep]
        return self.cache

    @torch.no_grad()
    def generate(self, model: torch.nn.Module, prompt: list[int], config: Any, stop: Any = None) -> list[int]:
        """Greedy continuation of one prompt (``config``: a GenerationConfig); returns the new tokens."""
        x = torch.tensor([prompt], device=model.device)
        with warnings.catch_warnings():  # transformers 5.2x renames it `cache` (past_key_values works until 6.0)
            warnings.filterwarnings("ignore", message=".past_key_values. is deprecated", category=FutureWarning)
            out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=config,
                                 past_key_values=self.reuse(prompt), stopping_criteria=stop)[0].tolist()
        self.ids = out[: self.cache.get_seq_length()]
        return out[len(prompt):]


    arms: tuple[str | None, ...] = (None,)  # one answer per prompt: the model's own cache (a PressCache: one per press)

    def answers(self, model: torch.nn.Module, prompt: list[int], question_at: int, config: Any,
                stop: Any = None) -> dict[str | None, list[int]]:
        """The new tokens of each arm (here one, None); ``question_at``: where the question starts (unused here)."""
        return {None: self.generate(model, prompt, config, stop)}


def shared_order(prompts: Sequence[list[int]]) -> list[int]:
    """Indices of the prompts in token order: neighbours share the longest prefixes (the order never changes a score)."""
    return sorted(range(len(prompts)), key=lambda i: prompts[i])


def generate_answers(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, tokens: Tokens,
                     cache: Any = None, question_at: Sequence[int] | None = None) -> dict[str | None, list[str]]:
    """Greedy continuations of exactly ``new_tokens`` tokens, decoded, in the prompts' order, per arm of the cache
    (:class:`PrefixCache`: one, None; a press cache: one per press). ``question_at``: where each question starts."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                           pad_token_id=tokens.boundary)
    cache = cache or PrefixCache()
    out: dict[str | None, list[str]] = {a: [""] * len(prompts) for a in cache.arms}
    for i in shared_order(prompts):
        for arm, new in cache.answers(model, prompts[i], question_at[i] if question_at else len(prompts[i]), gen).items():
            out[arm][i] = tokens.decode(new)
    return out


def passkey_measure(model: torch.nn.Module, tokens: Tokens, config: PasskeyConfig, length: int, depth: float,
                    cache: Any = None) -> dict[str | None, Measure]:
    """Exact match over ``eval_examples`` test keys (the same keys for every variant and position), per arm of the
    cache (see :func:`generate_answers`); the question is the prompt's last sentence."""
    rng = rng_for(config.data_seed, length, 1 + round(depth * 1e6), config.digits, 1)
    keys = [draw_key(rng, config.digits, "test") for _ in range(config.eval_examples)]
    filler = filler_ids(tokens, length)
    prompts = [passkey_prompt(tokens, length, depth, k, filler) for k in keys]
    asked = len(tokens.encode(QUESTION.rstrip()))
    said = generate_answers(model, prompts, config.digits + ANSWER_SLACK, tokens, cache, [len(p) - asked for p in prompts])
    return {arm: accuracy(sum(answer(s) == k for s, k in zip(out, keys, strict=True)), len(keys))
            for arm, out in said.items()}


# -- ruler --------------------------------------------------------------------------------------------------------

def ruler_room(task: str) -> int:
    return RULER_ROOM["niah" if task in NIAH else task]


def ruler_count(tokens: Tokens, task: str) -> Callable[[Any], int]:
    """RULER's length rule in the checkpoint's tokens: boundary + prompt + the task's tokens_to_generate."""
    room = ruler_room(task)
    return lambda ex: 1 + len(tokens.encode(ex.prompt)) + room


class AnswerEnded:
    """Stops greedy generation at the first line break after the answer has started (RULER answers are one line)."""

    def __init__(self, tokens: Tokens, start: int):
        self.tokens, self.start = tokens, start

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        text = self.tokens.decode(input_ids[0, self.start:].tolist())
        ended = "\n" in text.lstrip()
        return torch.full((input_ids.shape[0],), ended, dtype=torch.bool, device=input_ids.device)


def ruler_measures(model: torch.nn.Module, tokens: Tokens, config: RulerConfig, task: str, length: int,
                   cache: Any = None) -> dict[str | None, dict[str, Measure]]:
    """string_match (references found, clustered by example) and all_found over ``eval_examples`` test examples,
    the same for every variant and position. Generation: greedy, at most the reference answer's tokens + 16 (RULER's
    room counts in the length rule; a right answer needs no more), cut at the first line break once it starts.
    Per arm of the cache (see :func:`generate_answers`). With presses (a cache of several arms) the prompt is tokenized
    in two parts, the context up to its last line break and the question after it, so that the press compresses the
    context alone; a plain cache tokenizes it whole, as before."""
    from transformers import GenerationConfig, StoppingCriteriaList

    exs = generate(task, config.eval_examples, length, "test", config.data_seed, config, ruler_count(tokens, task))
    cache = cache or PrefixCache()
    split = cache.arms != (None,)
    parts = [ex.prompt.rpartition("\n") for ex in exs]
    prompts = ([[tokens.boundary, *tokens.encode(c + nl), *tokens.encode(q)] for c, nl, q in parts] if split
               else [[tokens.boundary, *tokens.encode(ex.prompt)] for ex in exs])
    asked = [len(tokens.encode(q)) if split else 0 for _, _, q in parts]
    said: dict[str | None, list[str]] = {a: [""] * len(exs) for a in cache.arms}
    for i in shared_order(prompts):
        room = min(ruler_room(task), len(tokens.encode(exs[i].answer)) + ANSWER_ROOM)
        gen = GenerationConfig(max_new_tokens=room, do_sample=False, num_beams=1, pad_token_id=tokens.boundary)
        stop = StoppingCriteriaList([AnswerEnded(tokens, len(prompts[i]))])
        for arm, new in cache.answers(model, prompts[i], len(prompts[i]) - asked[i], gen, stop).items():
            said[arm][i] = tokens.decode(new).lstrip().split("\n", 1)[0]
    totals = [len(ex.references) for ex in exs]
    out = {}
    for arm, answers in said.items():
        found = [string_match_all(a, ex.references) for a, ex in zip(answers, exs, strict=True)]
        out[arm] = {"string_match": clustered_accuracy(found, totals),
                    "all_found": accuracy(sum(f == t for f, t in zip(found, totals, strict=True)), len(found))}
    return out


# -- the checkpoint tasks ---------------------------------------------------------------------------------------

@register_checkpoint_task("passkey")
class CheckpointPasskey(CheckpointTask):
    """The key at each depth of a filler haystack, exactly ``eval_len`` tokens; exact match of the generated digits."""

    default = True
    prompts = True

    @classmethod
    def prepare(cls, ckpt: Checkpoint, config: PasskeyConfig, lens: Sequence[int]) -> None:
        if lens[0] < (need := min_passkey_len(ckpt.tokens, config.digits)):
            raise ValueError(f"passkey: eval length {lens[0]} is too short: the prompt takes at least {need} tokens")

    @classmethod
    def cells(cls, config: PasskeyConfig, lens: Sequence[int], data: Any) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        return [({"eval_len": L, "depth": d}, ("exact_match",)) for L in lens for d in config.depths]

    @classmethod
    def eval_id(cls, ckpt: Checkpoint, config: PasskeyConfig, data: Any) -> str:
        return short_hash(dataclasses.asdict(config) | {"tokens": ckpt.tokens.name})

    @classmethod
    def evaluate(cls, model: torch.nn.Module, ckpt: Checkpoint, config: PasskeyConfig, data: Any, cell: dict[str, Any],
                 device: str, cache: Any) -> dict[str | None, dict[str, Measure]]:
        return {arm: {"exact_match": m}
                for arm, m in passkey_measure(model, ckpt.tokens, config, cell["eval_len"], cell["depth"], cache).items()}


@register_checkpoint_task("ruler")
class CheckpointRuler(CheckpointTask):
    """RULER's prompts fitted in the checkpoint's tokens; ``string_match_all`` of the greedy answer."""

    prompts = True
    defaults = {"tasks": ("niah_single_1", "niah_multikey_1", "vt")}  # RULER's retrieval core; --subtask for the rest

    @classmethod
    def prepare(cls, ckpt: Checkpoint, config: RulerConfig, lens: Sequence[int]) -> None:
        for t in config.tasks:  # too short a length is refused now, naming it
            generate(t, 1, lens[0], "test", config.data_seed, config, ruler_count(ckpt.tokens, t))

    @classmethod
    def cells(cls, config: RulerConfig, lens: Sequence[int], data: Any) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        return [({"eval_len": L, "subtask": t}, ("string_match", "all_found")) for L in lens for t in config.tasks]

    @classmethod
    def eval_id(cls, ckpt: Checkpoint, config: RulerConfig, data: Any) -> str:
        return short_hash({"eval_examples": config.eval_examples, "data_seed": config.data_seed,
                           "num_hops": config.num_hops, "alpha": config.alpha, "num_cw": config.num_cw,
                           "room": RULER_ROOM, "tokens": ckpt.tokens.name})

    @classmethod
    def evaluate(cls, model: torch.nn.Module, ckpt: Checkpoint, config: RulerConfig, data: Any, cell: dict[str, Any],
                 device: str, cache: Any) -> dict[str | None, dict[str, Measure]]:
        return ruler_measures(model, ckpt.tokens, config, cell["subtask"], cell["eval_len"], cache)


__all__ = ["ANSWER_ROOM", "ANSWER_SLACK", "INSTRUCTION", "RULER_ROOM", "AnswerEnded", "CheckpointPasskey", "CheckpointRuler",
           "PrefixCache", "answer", "filler_ids", "generate_answers", "min_passkey_len", "passkey_measure", "passkey_prompt",
           "ruler_count", "ruler_measures", "ruler_room", "shared_order"]
