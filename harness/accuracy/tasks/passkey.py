"""Passkey retrieval (Mohtashami & Jaggi 2023, https://arxiv.org/abs/2305.16300), byte level.

A random key of a few digits is hidden at a chosen depth in repetitive filler text and asked
for at the end; the model must copy it across the whole sequence. The sentences are the
paper's (its opening instruction, written for a pretrained chat model, is dropped: our models
are trained on the task)::

    filler[:B] "The pass key is 40213. Remember it. 40213 is the pass key. " filler[B:F]
    "What is the pass key? The pass key is 40213"

The filler is one repeated paragraph, cut to make the sequence exactly ``length`` bytes;
depth d puts the key sentence after B = round(d * F) filler bytes (0 = start, 1 = just before
the question). Exact match: every answer digit is the argmax next-byte prediction, which with
teacher forcing equals greedy decoding of the answer. Keys are split train/test by hash.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import torch

from harness.accuracy.common import IGNORE, check_split, predictions, rng_for, split_of, tokens_per_batch_for
from harness.accuracy.jobs import Job, short_hash
from harness.accuracy.prefill import generate_answers
from harness.accuracy.stats import Measure, accuracy, clustered_accuracy
from harness.accuracy.tasks.base import EVAL_EXAMPLES, CheckpointTask, Metric, TaskOption, TrainedTask, comma_floats
from harness.accuracy.tasks.registry import register_task

if TYPE_CHECKING:
    from harness.accuracy.checkpoint import Checkpoint, Tokens

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEY_SENTENCE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is "


@dataclass(frozen=True)
class PasskeyConfig:
    digits: int = 5
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # evaluation depths
    eval_examples: int = 64  # per (length, depth) cell
    data_seed: int = 1234
    # on a checkpoint: keys asked in one haystack. 1: every example an independent draw (its own haystack); k > 1: the
    # shared-prefix design, k keys in one haystack answered together (a model finds all of them or none)
    keys_per_haystack: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 18:
            raise ValueError(f"passkey digits must be in [1, 18], got {self.digits}")
        if self.keys_per_haystack < 1 or self.eval_examples % self.keys_per_haystack:
            raise ValueError(f"passkey keys_per_haystack must divide eval_examples ({self.eval_examples}), got "
                             f"{self.keys_per_haystack}")
        for d in self.depths:
            if not 0.0 <= d <= 1.0:
                raise ValueError(f"passkey depth must be in [0, 1], got {d}")


def overhead(digits: int) -> int:
    """Bytes that are not filler: the key sentence, the question and the answer."""
    k = "0" * digits
    return len(KEY_SENTENCE.format(key=k)) + len(QUESTION) + digits


def draw_key(rng: np.random.Generator, digits: int, split: str) -> str:
    for _ in range(10_000):
        key = str(int(rng.integers(10 ** (digits - 1), 10**digits)))
        if split_of(key.encode()) == split:
            return key
    raise ValueError(f"passkey: no {split} key found with {digits} digits (key space too small)")


def text(length: int, depth: float, key: str) -> str:
    """The example as text: exactly ``length`` bytes (all ASCII)."""
    filler_len = length - overhead(len(key))
    if filler_len < 0:
        raise ValueError(f"passkey: length {length} is too short for a {len(key)}-digit key (needs >= {overhead(len(key))})")
    stream = FILLER * (filler_len // len(FILLER) + 1)
    before = round(depth * filler_len)
    return stream[:before] + KEY_SENTENCE.format(key=key) + stream[before:filler_len] + QUESTION + key


def answer_positions(length: int, digits: int) -> slice:
    """Positions whose next-byte prediction is an answer digit."""
    return slice(length - digits - 1, length - 1)


def repeat_positions(x: torch.Tensor, keys: list[str]) -> list[slice]:
    """Per example, the positions whose next byte is a digit of the key's second mention
    ("Remember it. 40213 is the pass key.")."""
    out = []
    marker = "Remember it. "
    for row, key in zip(x.tolist(), keys, strict=True):
        at = bytes(row).decode("ascii").index(marker) + len(marker)
        out.append(slice(at - 1, at - 1 + len(key)))
    return out


def generate(n: int, length: int, depth: float | None, split: str, seed: int, digits: int = 5,
             targets: str = "answer") -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """n examples: inputs (n, length) bytes, targets (n, length), and the keys.

    ``targets``: "answer" scores the answer digits only (evaluation); "retrieval" also the key's
    repeat inside the key sentence (the other predictable copy of it); "all" every next byte.
    ``depth=None`` draws the depth uniformly per example.
    """
    check_split(split)
    rng = rng_for(seed, length, 0 if depth is None else 1 + round(depth * 1e6), digits, {"train": 0, "test": 1}[split])
    xs, keys = [], []
    for _ in range(n):
        key = draw_key(rng, digits, split)
        d = float(rng.random()) if depth is None else depth
        xs.append(np.frombuffer(text(length, d, key).encode("ascii"), dtype=np.uint8))
        keys.append(key)
    x = torch.from_numpy(np.stack(xs).astype(np.int64))
    y = torch.full_like(x, IGNORE)
    if targets == "all":
        y[:, :-1] = x[:, 1:]
        return x, y, keys
    if targets not in ("answer", "retrieval"):
        raise ValueError(f"passkey targets must be answer, retrieval or all, got {targets!r}")
    pos = answer_positions(length, digits)
    y[:, pos] = x[:, pos.start + 1 : pos.stop + 1]
    if targets == "retrieval":
        for i, r in enumerate(repeat_positions(x, keys)):
            y[i, r] = x[i, r.start + 1 : r.stop + 1]
    return x, y, keys

# -- on a pretrained checkpoint: the prompt in its tokens, answered by greedy generation ----------------------------
# Landmark attention's / YaRN's passkey instruction, kept: the model is a pretrained LM, not trained on the task.
INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
               "I will quiz you about the important information there. ")
ASK, ANSWER_PREFIX = "What is the pass key?", " The pass key is"  # QUESTION, cut where a chat template's answer starts
SENTENCES = tuple(re.findall(r"[^.]+\. ", FILLER))  # the filler paragraph's five sentences
ANSWER_SLACK = 10  # tokens generated beyond the key's digits (an instruct model may say "the pass key is" first)


def haystack_ids(tokens: Tokens, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` tokens of one haystack drawn from ``rng``: the filler paragraph's sentences, each repetition of the
    paragraph in an order of its own, tokenized whole (a subword tokenizer packs several characters into a token, so
    repetitions are added until the text holds ``n`` tokens)."""
    reps, text = n // len(FILLER) + 1, ""
    while len(ids := tokens.encode(text)) < n:
        text += "".join(SENTENCES[i] for _ in range(reps) for i in rng.permutation(len(SENTENCES)))
        reps *= 2
    return ids[:n]


def passkey_prompt(tokens: Tokens, length: int, depth: float, key: str, filler: list[int]) -> list[int]:
    """Exactly ``length`` tokens: the opening (boundary, or a chat template's turns up to the user's message),
    instruction, the ``filler`` haystack with the key sentence after ``depth`` of it, question (and answer prefix)."""
    head = [*tokens.opening, *tokens.encode(INSTRUCTION)]
    needle = tokens.encode(KEY_SENTENCE.format(key=key))
    question = tokens.ask(ASK, ANSWER_PREFIX)
    n = length - len(head) - len(needle) - len(question)
    if n < 0 or n > len(filler):
        raise ValueError(f"passkey: length {length} is too short for the prompt (needs >= {length - n} tokens)")
    before = round(depth * n)
    return head + filler[:before] + needle + filler[before:n] + question


def passkey_examples(tokens: Tokens, config: PasskeyConfig, length: int, depth: float) -> tuple[list[list[int]], list[str]]:
    """A cell's prompts and keys: ``eval_examples`` test keys (the same for every variant and position), every
    ``keys_per_haystack`` of them in one haystack of their own, drawn from the seed after the keys.

    The haystacks differ in their noise, not their depth: the depth is the cell's (Kamradt's needle-in-a-haystack grid,
    the passkey figure's axis), so each example draws the order of the filler's sentences instead -- RULER and the
    passkey papers vary the insertion point per example in one fixed noise, which a cell of one depth cannot."""
    rng = rng_for(config.data_seed, length, 1 + round(depth * 1e6), config.digits, 1)
    keys = [draw_key(rng, config.digits, "test") for _ in range(config.eval_examples)]
    k = config.keys_per_haystack
    hays = [haystack_ids(tokens, length, rng) for _ in range(len(keys) // k)]
    return [passkey_prompt(tokens, length, depth, key, hays[i // k]) for i, key in enumerate(keys)], keys


def min_passkey_len(tokens: Tokens, digits: int) -> int:
    """The shortest prompt, with slack for keys that take more tokens than the sample key."""
    key = "9" * digits
    fixed = len(tokens.opening) + len(tokens.encode(INSTRUCTION)) + len(tokens.encode(KEY_SENTENCE.format(key=key)))
    return fixed + len(tokens.ask(ASK, ANSWER_PREFIX)) + digits


def key_said(text: str) -> bool:
    """Whether the answer's first run of digits has ended (a character follows it): :func:`said_key` is then final."""
    return re.search(r"\d\D", text) is not None


def said_key(text: str) -> str:
    """The first run of digits the model generated ("" if none)."""
    found = re.search(r"\d+", text)
    return found.group() if found else ""


def passkey_measure(model: torch.nn.Module, tokens: Tokens, config: PasskeyConfig, length: int, depth: float,
                    cache: Any = None) -> dict[str | None, Measure]:
    """Exact match over the cell's examples (:func:`passkey_examples`), per arm of the cache (see
    :func:`generate_answers`); the question is what follows the haystack."""
    prompts, keys = passkey_examples(tokens, config, length, depth)
    asked = len(tokens.ask(ASK, ANSWER_PREFIX))
    said = generate_answers(model, prompts, config.digits + ANSWER_SLACK, tokens.decode, tokens.boundary, cache,
                            [len(p) - asked for p in prompts], settled=key_said, needles=[[k] for k in keys])
    hits = {arm: [said_key(s) == k for s, k in zip(out, keys, strict=True)] for arm, out in said.items()}
    return {arm: accuracy(sum(h), len(h), outcomes=h) for arm, h in hits.items()}


class OnCheckpoint(CheckpointTask):
    """Passkey on a pretrained checkpoint: the key at each depth of a filler haystack, exactly ``eval_len`` tokens of
    its tokenizer; exact match of the generated digits. Each row says how many independent haystacks its examples sit
    in (``draws``: its examples, unless ``keys_per_haystack`` > 1), the clusters its interval counts."""

    default = True
    prompts = True

    @classmethod
    def prepare(cls, ckpt: Checkpoint, config: PasskeyConfig, lens: Sequence[int]) -> None:
        if lens[0] < (need := min_passkey_len(ckpt.tokens, config.digits)):
            raise ValueError(f"passkey: eval length {lens[0]} is too short: the prompt takes at least {need} tokens")

    @classmethod
    def cells(cls, config: PasskeyConfig, lens: Sequence[int], data: Any) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        draws = config.eval_examples // config.keys_per_haystack
        return [({"eval_len": L, "depth": d, "draws": draws}, ("exact_match",)) for L in lens for d in config.depths]

    @classmethod
    def eval_id(cls, ckpt: Checkpoint, config: PasskeyConfig, data: Any) -> str:
        return short_hash(dataclasses.asdict(config) | {"tokens": ckpt.tokens.name})

    @classmethod
    def evaluate(cls, model: torch.nn.Module, ckpt: Checkpoint, config: PasskeyConfig, data: Any, cell: dict[str, Any],
                 device: str, cache: Any) -> dict[str | None, dict[str, Measure]]:
        return {arm: {"exact_match": m}
                for arm, m in passkey_measure(model, ckpt.tokens, config, cell["eval_len"], cell["depth"], cache).items()}


@register_task("passkey", config=PasskeyConfig)
class Passkey(TrainedTask):
    """Passkey retrieval: copy a key hidden at a depth of filler text (Mohtashami & Jaggi 2023)."""

    pretrained = OnCheckpoint
    vocab_size = 256
    main_metric = "exact_match"
    declares = (Metric("exact_match", ranks=True), Metric("digit_accuracy"))
    columns = ("depth",)
    options = (TaskOption("depths", "depths", "comma-separated depths in [0, 1].", parse=comma_floats("--depths")),
               TaskOption("digits", "digits", "digits of the key.", click.IntRange(min=1)),
               TaskOption("keys_per_haystack", "keys_per_haystack", "with --hf-model, keys asked in one haystack "
                          "(default 1: each example its own; k > 1: k keys share one, answered together).",
                          click.IntRange(min=1)), EVAL_EXAMPLES)
    figures = ("accuracy", "position_heatmap", "passkey", "tradeoff")

    @classmethod
    def default_job(cls) -> Job:
        from harness.accuracy.presets import ROPE_FAMILY

        return Job(cls.name, variants=["full"], positions=list(ROPE_FAMILY))

    def __init__(self, config: PasskeyConfig | None = None):
        self.config = config or PasskeyConfig()

    def check(self, train_len: int, eval_lens: Sequence[int]) -> None:
        if self.config.keys_per_haystack != 1:
            raise ValueError("passkey: keys_per_haystack applies to a checkpoint (--hf-model): a trained model's test "
                             "keys all sit in the one filler paragraph")
        need = overhead(self.config.digits) + 1
        for what, L in [("train", train_len)] + [("eval", e) for e in eval_lens]:
            if L < need:
                raise ValueError(f"passkey: {what} length {L} is too short: a {self.config.digits}-digit key, its "
                                 f"sentence and the question take {need - 1} bytes (use >= {need})")

    def train_batch(self, seed: int, step: int, batch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, _ = generate(batch_size, length, None, "train", seed * 1_000_003 + step, self.config.digits, targets="retrieval")
        return x, y

    def cells(self, train_len: int, eval_lens: Sequence[int]) -> list[dict[str, Any]]:
        return [{"eval_len": L, "depth": d} for L in eval_lens for d in self.config.depths]

    def metrics(self, cell: dict[str, Any], train_len: int) -> tuple[str, ...]:
        return ("exact_match", "digit_accuracy")

    def evaluate(self, model: torch.nn.Module, cell: dict[str, Any], train_len: int) -> dict[str, Measure]:
        c = self.config
        L = cell["eval_len"]
        x, y, _ = generate(c.eval_examples, L, cell["depth"], "test", c.data_seed, c.digits)
        pred = predictions(model, x, tokens_per_batch_for(L))
        pos = answer_positions(L, c.digits)
        right = pred[:, pos] == y[:, pos]  # (n, digits)
        exact = int(right.all(dim=1).sum())
        per_example = [c.digits] * len(x)  # the digits of one example are one cluster, not independent trials
        return {"exact_match": accuracy(exact, len(x)),
                "digit_accuracy": clustered_accuracy(right.sum(1).tolist(), per_example)}

    def sample_inputs(self, n: int, length: int) -> torch.Tensor:
        return generate(n, length, None, "test", self.config.data_seed, self.config.digits)[0]

    def train_params(self) -> dict[str, Any]:
        return {"digits": self.config.digits}

    def eval_params(self) -> dict[str, Any]:
        return {"eval_examples": self.config.eval_examples, "data_seed": self.config.data_seed}


__all__ = ["FILLER", "KEY_SENTENCE", "QUESTION", "Passkey", "PasskeyConfig", "answer_positions", "generate", "overhead", "text"]
