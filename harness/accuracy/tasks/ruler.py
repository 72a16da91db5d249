"""RULER's synthetic tasks (Hsieh et al. 2024, https://arxiv.org/abs/2404.06654), generated offline.

The rules are RULER's generators (``scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,
freq_words_extraction}.py``, templates in ``constants.py``, configs in ``synthetic.yaml``); the words are the
``wonderwords`` package's lists, as RULER uses them, so nothing is downloaded. Every example is a prompt -- RULER's
template with its context and answer prefix -- and the reference strings the answer must contain:

- ``niah_*``: needles "One of the special magic {numbers} for {key} is: {value}." hidden in a haystack of the
  noise paragraph (``noise``) or of other needles (``needle``, the distractor haystack); single, multi-key,
  multi-value and multi-query as RULER's configs set them.
- ``vt`` (variable tracking): a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... (4 hops) among noise sentences;
  the answer is every variable holding the value.
- ``cwe`` (common words): a numbered list where 10 words appear often and the rest rarely; name the 10.
- ``fwe`` (frequent words): coded words with Zipf counts (alpha 2, the most frequent is the '...' noise); name the
  three most frequent.

The length rule is RULER's: the haystack (sentences, needles or words) is the largest that keeps the prompt plus
the room for the answer within the target length, counted by a ``Count`` of the example: for a pretrained
checkpoint its tokenizer and RULER's fixed ``tokens_to_generate`` (the task's checkpoint face below); for a
byte-level model trained on the task, whose answer is exact, the bytes of prompt and answer (:func:`byte_count`)
-- evaluation generates up to the target length.
Two deliberate departures, both because the models here are trained on the task from scratch: no Paul Graham essay
haystack (RULER downloads it; the noise and needle haystacks stand in, so RULER's essay configs run on noise), and
no few-shot example in ``vt``/``cwe`` (RULER adds one for pretrained models).

Scoring is RULER's ``string_match_all``: the fraction of references found (case-insensitively) in the greedy
generation, with a cluster-robust interval (the references of one example are one cluster); ``all_found`` is the
fraction of examples with every reference found (Wilson). Train and test never share an example: the split is a
hash of the example's query and references.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click
import torch

from harness.accuracy.common import IGNORE, rng_for
from harness.accuracy.jobs import Job, short_hash
from harness.accuracy.prefill import SharedPrefill, shared_order
from harness.accuracy.stats import Measure, accuracy, clustered_accuracy
from harness.accuracy.tasks.base import EVAL_EXAMPLES, CheckpointTask, Metric, TaskOption, TrainedTask
from harness.accuracy.tasks.registry import register_task
from harness.accuracy.tasks.ruler_data import END, NIAH, TASK_NAMES, Example, RulerConfig, example, generate

if TYPE_CHECKING:
    from harness.accuracy.checkpoint import Checkpoint, Tokens

def string_match_all(prediction: str, references: Sequence[str]) -> int:
    """RULER's metric, per example: how many references occur in the prediction (case-insensitive)."""
    p = prediction.lower()
    return sum(r.lower() in p for r in references)


def encode(examples: Sequence[Example], length: int, targets: str = "answer") -> tuple[torch.Tensor, torch.Tensor]:
    """Byte inputs (n, length) padded with 0, and next-byte targets: the answer bytes only, or (``"all"``) every byte
    of prompt and answer; the padding is never scored."""
    x = torch.zeros(len(examples), length, dtype=torch.int64)
    y = torch.full_like(x, IGNORE)
    for i, ex in enumerate(examples):
        data = ex.text.encode("utf-8")
        p = 1 if targets == "all" else len(ex.prompt.encode("utf-8"))
        x[i, : len(data)] = torch.tensor(list(data))
        y[i, p - 1 : len(data) - 1] = x[i, p : len(data)]
    return x, y


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: bytes, max_len: int) -> str:
    """Greedy byte generation after ``prompt`` until END or ``max_len`` total bytes, through the decoding state."""
    model.eval()
    state = model.init_state(1, max_len)
    logits = model(torch.tensor([list(prompt)]), state=state)
    out = bytearray()
    while len(prompt) + len(out) < max_len:
        token = int(logits[0, -1].argmax())
        if token == END.encode()[0]:
            break
        out.append(token)
        logits = model(torch.tensor([[token]]), state=state)
    return out.decode("utf-8", errors="replace")

# -- on a pretrained checkpoint: the prompt in its tokens, answered by greedy generation ----------------------------
# RULER's tokens_to_generate (scripts/synthetic.yaml): the room its length rule keeps for the answer.
RULER_ROOM = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}
ANSWER_ROOM = 16  # tokens generated beyond the reference answer's


def ruler_room(task: str) -> int:
    return RULER_ROOM["niah" if task in NIAH else task]


def ruler_count(tokens: Tokens, task: str) -> Callable[[Any], int]:
    """RULER's length rule in the checkpoint's tokens: the prompt (boundary or chat turns included) + the task's
    tokens_to_generate."""
    room = ruler_room(task)
    return lambda ex: len(ruler_prompt(tokens, ex)[0]) + room


def ruler_prompt(tokens: Tokens, ex: Example, split: bool = False) -> tuple[list[int], int]:
    """The example's prompt in the checkpoint's tokens (:attr:`Tokens.opening`, then the context and question as the
    user's message and the answer prefix: :meth:`Tokens.ask`) and how many of its last tokens ask: with ``split``, the
    context up to its last line break and the question after it are tokenized apart, so that a press compresses the
    context alone; without, the prompt is tokenized whole (0 asking)."""
    user = ex.prompt[: len(ex.prompt) - len(ex.prefix)]
    if not split:
        return [*tokens.opening, *tokens.ask(user, ex.prefix)], 0
    context, nl, question = user.rpartition("\n")
    asked = tokens.ask(question, ex.prefix)
    return [*tokens.opening, *tokens.encode(context + nl), *asked], len(asked)


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
    Per arm of ``cache`` (:class:`harness.accuracy.prefill.SharedPrefill`). With press arms the prompt is tokenized in
    two parts (:func:`ruler_prompt`); the plain arm tokenizes it whole."""
    from transformers import GenerationConfig, StoppingCriteriaList

    exs = generate(task, config.eval_examples, length, "test", config.data_seed, config, ruler_count(tokens, task))
    cache = cache or SharedPrefill()
    prompts, asked = zip(*(ruler_prompt(tokens, ex, cache.arms != (None,)) for ex in exs), strict=True)
    said: dict[str | None, list[str]] = {a: [""] * len(exs) for a in cache.arms}
    for i in shared_order(prompts):
        room = min(ruler_room(task), len(tokens.encode(exs[i].answer)) + ANSWER_ROOM)
        gen = GenerationConfig(max_new_tokens=room, do_sample=False, num_beams=1, pad_token_id=tokens.boundary)
        stop = StoppingCriteriaList([AnswerEnded(tokens, len(prompts[i]))])
        needles = exs[i].references if task in NIAH else None  # where the task knows what its context hides
        for arm, new in cache.answers(model, prompts[i], len(prompts[i]) - asked[i], gen, stop, needles).items():
            said[arm][i] = tokens.decode(new).lstrip().split("\n", 1)[0]
    totals = [len(ex.references) for ex in exs]
    out = {}
    for arm, answers in said.items():
        found = [string_match_all(a, ex.references) for a, ex in zip(answers, exs, strict=True)]
        every = [f == t for f, t in zip(found, totals, strict=True)]
        out[arm] = {"string_match": clustered_accuracy(found, totals, keep=True),
                    "all_found": accuracy(sum(every), len(every), outcomes=every)}
    return out


class OnCheckpoint(CheckpointTask):
    """RULER on a pretrained checkpoint: its prompts fitted in the checkpoint's tokens; ``string_match_all`` of the
    greedy answer."""

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


@register_task("ruler", config=RulerConfig)
class Ruler(TrainedTask):
    """RULER's synthetic tasks (needles, variable tracking, common and frequent words), trained as a mix."""

    pretrained = OnCheckpoint
    vocab_size = 256
    main_metric = "string_match"
    declares = (Metric("string_match", ranks=True), Metric("all_found"))
    columns = ("subtask",)
    label_column = "subtask"
    options = (TaskOption("subtasks", "tasks", "RULER task to train and evaluate (repeatable; default all).",
                          click.Choice(TASK_NAMES), multiple=True, flag="--subtask", parse=tuple), EVAL_EXAMPLES)
    figures = ("ruler", "position_heatmap", "tradeoff")

    @classmethod
    def default_job(cls) -> Job:
        """Trained on RULER's task mix at 1K bytes, evaluated to 4x."""
        from harness.accuracy.presets import RULER_VARIANTS

        return Job(cls.name, variants=list(RULER_VARIANTS), positions=["rope"], train_len=1024,
                   eval_lens=[1024, 2048, 4096], model="small")

    def __init__(self, config: RulerConfig | None = None):
        self.config = config or RulerConfig()

    def check(self, train_len: int, eval_lens: Sequence[int]) -> None:
        for L in [train_len, *eval_lens]:
            for t in self.config.tasks:
                example(t, rng_for(0, L), L, self.config)  # raises ValueError naming the length that is too short

    def train_batch(self, seed: int, step: int, batch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        tasks = self.config.tasks
        seeds = rng_for(seed, step).integers(2**62, size=batch_size)
        exs = [generate(tasks[(step * batch_size + i) % len(tasks)], 1, length, "train", int(s), self.config)[0]
               for i, s in enumerate(seeds)]
        return encode(exs, length, self.config.targets)

    def cells(self, train_len: int, eval_lens: Sequence[int]) -> list[dict[str, Any]]:
        return [{"eval_len": L, "subtask": t} for L in eval_lens for t in self.config.tasks]

    def metrics(self, cell: dict[str, Any], train_len: int) -> tuple[str, ...]:
        return ("string_match", "all_found")

    def evaluate(self, model: torch.nn.Module, cell: dict[str, Any], train_len: int) -> dict[str, Measure]:
        L, c = cell["eval_len"], self.config
        found, totals = [], []
        for ex in generate(cell["subtask"], c.eval_examples, L, "test", c.data_seed, c):
            found.append(string_match_all(greedy(model, ex.prompt.encode("utf-8"), L), ex.references))
            totals.append(len(ex.references))
        return {"string_match": clustered_accuracy(found, totals),
                "all_found": accuracy(sum(f == t for f, t in zip(found, totals, strict=True)), len(found))}

    def sample_inputs(self, n: int, length: int) -> torch.Tensor:
        tasks = self.config.tasks
        exs = [generate(tasks[i % len(tasks)], 1, length, "test", self.config.data_seed + i, self.config)[0] for i in range(n)]
        return encode(exs, length)[0]

    def train_params(self) -> dict[str, Any]:
        c = self.config
        return {"tasks": list(c.tasks), "num_hops": c.num_hops, "alpha": c.alpha, "num_cw": c.num_cw, "targets": c.targets}

    def eval_params(self) -> dict[str, Any]:
        return {"eval_examples": self.config.eval_examples, "data_seed": self.config.data_seed}


__all__ = ["Ruler", "encode", "greedy", "ruler_measures", "ruler_prompt", "string_match_all"]
