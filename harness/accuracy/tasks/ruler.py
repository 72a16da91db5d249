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

import json
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import torch

from harness.accuracy.common import IGNORE, check_split, rng_for, split_of
from harness.accuracy.jobs import Job, short_hash
from harness.accuracy.prefill import SharedPrefill, shared_order
from harness.accuracy.stats import Measure, accuracy, clustered_accuracy
from harness.accuracy.tasks.base import EVAL_EXAMPLES, CheckpointTask, Metric, TaskOption, TrainedTask
from harness.accuracy.tasks.registry import register_task
from harness.accuracy.words import random_value, word_lists

if TYPE_CHECKING:
    from harness.accuracy.checkpoint import Checkpoint, Tokens

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
TEMPLATES = {  # RULER's constants.py: (template, answer prefix)
    "niah": ("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. I will quiz "
             "you about the {type_v} afterwards.\n{context}\nWhat are all the special magic {type_v} for {query} "
             "mentioned in the provided text?",
             " The special magic {type_v} for {query} mentioned in the provided text are"),
    "vt": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
           "Question: Find all variables that are assigned the value {query} in the text above.",
           " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
           "assigned the value {query}, they are: "),
    "cwe": ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
            "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
            " Answer: The top 10 words that appear most often in the list are:"),
    "fwe": ("Read the following coded text and track the frequency of each coded word. Find the three most frequently "
            "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
            "What are the three most frequently appeared words in the above coded text?",
            " Answer: According to the coded text above, the three most frequently appeared words are:"),
}
# RULER's synthetic.yaml, essay haystacks replaced by noise (see the module docstring).
NIAH = {
    "niah_single_1": dict(haystack="noise", type_k="words", type_v="numbers", k=1, v=1, q=1),
    "niah_multikey_1": dict(haystack="noise", type_k="words", type_v="numbers", k=4, v=1, q=1),
    "niah_multikey_2": dict(haystack="needle", type_k="words", type_v="numbers", k=1, v=1, q=1),
    "niah_multikey_3": dict(haystack="needle", type_k="uuids", type_v="uuids", k=1, v=1, q=1),
    "niah_multivalue": dict(haystack="noise", type_k="words", type_v="numbers", k=1, v=4, q=1),
    "niah_multiquery": dict(haystack="noise", type_k="words", type_v="numbers", k=4, v=1, q=4),
}
TASK_NAMES = (*NIAH, "vt", "cwe", "fwe")
END = "\n"  # ends an answer: generation stops there


@dataclass(frozen=True)
class Example:
    """One RULER example: the prompt (ending with the answer prefix), the references, the answer a model is trained on."""

    task: str
    prompt: str
    references: tuple[str, ...]
    answer: str  # continuation after the prompt, END included
    prefix: str  # the answer prefix the prompt ends with (RULER's template's): a chat template's answer turn starts there

    @property
    def text(self) -> str:
        return self.prompt + self.answer


@dataclass(frozen=True)
class RulerConfig:
    tasks: tuple[str, ...] = TASK_NAMES  # trained as a mix, evaluated one cell per task and length
    eval_examples: int = 32  # per (task, length) cell
    data_seed: int = 1234
    num_hops: int = 4  # vt (RULER's config); one chain
    alpha: float = 2.0  # fwe's Zipf exponent
    num_cw: int = 10  # cwe's common words
    # what training scores: "all" (every next byte of prompt and answer: the haystack's repeats teach the copying that
    # retrieval needs, as language modelling does) or "answer" (the answer bytes only)
    targets: str = "all"

    def __post_init__(self) -> None:
        if self.targets not in ("all", "answer"):
            raise ValueError(f"ruler targets must be all or answer, got {self.targets!r}")
        unknown = [t for t in self.tasks if t not in TASK_NAMES]
        if unknown or not self.tasks:
            raise ValueError(f"ruler: unknown task(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(TASK_NAMES)}")
        if self.eval_examples < 1:
            raise ValueError(f"ruler eval_examples must be >= 1, got {self.eval_examples}")
        if self.num_hops < 1 or self.num_cw < 1 or self.alpha <= 1:
            raise ValueError("ruler: num_hops and num_cw must be >= 1 and alpha > 1")


# -- the length rule -----------------------------------------------------------------------------------------------
Count = Callable[["Example"], int]  # the tokens an example takes: prompt and the room its answer needs


def byte_count(ex: Example) -> int:
    """A byte model's size of an example: prompt and answer bytes (its answer is exact)."""
    return len(ex.text.encode("utf-8"))


def fit(make: Callable[[int], Example], length: int, count: Count, lo: int = 1) -> Example:
    """RULER's rule: the example with the largest haystack size n whose prompt and answer fit in ``length`` tokens
    (binary search over n: every task's ``make`` only grows with n -- fixed insertion fractions, nested word
    draws). ValueError if not even ``lo`` fits."""
    def size(n: int) -> int:
        return count(make(n))

    if size(lo) > length:
        raise ValueError(f"ruler: length {length} is too short for {make(lo).task} (its smallest example takes "
                         f"{size(lo)} tokens)")
    a, b = lo, max(2 * lo, lo + 1)  # size(a) fits; grow b until size(b) does not
    while size(b) <= length:
        a, b = b, 2 * b
    while b - a > 1:
        mid = (a + b) // 2
        a, b = (mid, b) if size(mid) <= length else (a, mid)
    return make(a)


def insert_at(items: list[str], inserts: Sequence[str], fractions: Sequence[float]) -> list[str]:
    """Insert each string at a fraction of the way through ``items`` (fixed fractions keep n -> text monotone)."""
    out = list(items)
    for s, f in sorted(zip(inserts, fractions, strict=True), key=lambda p: p[1], reverse=True):
        out.insert(round(f * len(items)), s)
    return out


# -- the tasks -----------------------------------------------------------------------------------------------------
def niah(task: str, rng: np.random.Generator, length: int, count: Count) -> Example:
    c = NIAH[task]
    k = max(c["k"], c["q"])
    keys = [random_value(rng, c["type_k"]) for _ in range(k)]
    values = [[random_value(rng, c["type_v"]) for _ in range(c["v"])] for _ in keys]
    needles = [NEEDLE.format(type_v=c["type_v"], key=key, value=v) for key, vs in zip(keys, values, strict=True) for v in vs]
    needles = [needles[i] for i in rng.permutation(len(needles))]
    fractions = rng.random(len(needles)).tolist()
    queried = sorted(rng.choice(k, c["q"], replace=False).tolist())
    queries = [keys[i] for i in queried]
    answers = [a for i in queried for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, prefix = TEMPLATES["niah"]
    type_v = c["type_v"]
    if c["q"] * c["v"] == 1:  # RULER's singular wording
        template, prefix = (t.replace("Some", "A").replace("are all", "is").replace("are", "is") for t in (template, prefix))
        type_v = type_v[:-1]
    distractor_rng = np.random.default_rng(rng.integers(2**63))
    distractors: list[str] = []

    def make(n: int) -> Example:
        if c["haystack"] == "noise":
            hay = [NOISE] * n
        else:
            while len(distractors) < n:  # distractor needles never reuse a real key (the answer stays unique)
                key = random_value(distractor_rng, c["type_k"])
                if key not in keys:
                    distractors.append(NEEDLE.format(type_v=c["type_v"], key=key,
                                                     value=random_value(distractor_rng, c["type_v"])))
            hay = distractors[:n]
        context = "\n".join(insert_at(hay, needles, fractions))
        asked = prefix.format(type_v=type_v, query=query)
        return Example(task, template.format(type_v=type_v, context=context, query=query) + asked, tuple(answers),
                       " " + ", ".join(answers) + "." + END, asked)

    return fit(make, length, count)


def variable_tracking(rng: np.random.Generator, length: int, count: Count, num_hops: int) -> Example:
    names: list[str] = []
    while len(names) < num_hops + 1:  # RULER: 5 upper-case letters, distinct
        name = "".join(rng.choice(list(string.ascii_uppercase), 5))
        if name not in names:
            names.append(name)
    value = str(int(rng.integers(10000, 99999)))
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(num_hops)]
    fractions = sorted(rng.random(len(chain)).tolist())  # in order: a variable is assigned before it is read
    template, prefix = TEMPLATES["vt"]

    def make(n: int) -> Example:
        context = "\n".join(insert_at([NOISE] * n, chain, fractions)).replace(". \n", ".\n")
        asked = prefix.format(num_v=num_hops + 1, query=value)
        return Example("vt", template.format(context=context, query=value) + asked, tuple(names), " ".join(names) + END,
                       asked)

    return fit(make, length, count)


def common_words(rng: np.random.Generator, length: int, count: Count, num_cw: int) -> Example:
    w = word_lists()
    words = sorted(set(w["noun"] + w["adjective"] + w["verb"]))
    order = rng.permutation(len(words))  # the first num_cw + n words of one draw: more words only add to the list
    seed = int(rng.integers(2**63))
    template, prefix = TEMPLATES["cwe"]

    def make(n: int, freq_cw: int, freq_ucw: int) -> Example:
        if num_cw + n > len(words):
            raise ValueError(f"ruler: cwe at this length needs more than the {len(words)} words of the word list")
        chosen = [words[i] for i in order[: num_cw + n]]
        common, rare = chosen[:num_cw], chosen[num_cw:]
        listed = common * freq_cw + rare * freq_ucw
        listed = [listed[i] for i in rng_for(seed, n).permutation(len(listed))]
        context = " ".join(f"{i + 1}. {word}" for i, word in enumerate(listed))
        answer = " " + " ".join(f"{i + 1}. {word}" for i, word in enumerate(common)) + END
        return Example("cwe", template.format(context=context) + prefix, tuple(common), answer, prefix)

    # RULER's repeats: 30 and 3 from 4096 tokens on, 6 and 1 below; bytes are ~4x shorter than RULER's tokens, so where
    # the long form's 300 common-word entries do not fit (4096 to ~4400 bytes) the short form is used
    if length >= 4096 and count(make(0, 30, 3)) <= length:
        return fit(lambda n: make(n, 30, 3), length, count, lo=0)
    return fit(lambda n: make(n, 6, 1), length, count, lo=0)


def frequent_words(rng: np.random.Generator, length: int, count: Count, alpha: float) -> Example:
    from scipy.special import zeta

    vocab_size = max(8, length // 50)  # RULER: max_seq_length // 50 coded words of 6 letters
    vocab: list[str] = []
    while len(vocab) < vocab_size:
        word = "".join(rng.choice(list(string.ascii_lowercase), 6))
        if word not in vocab:
            vocab.append(word)
    vocab[0] = "..."  # the top-ranked word is noise
    seed = int(rng.integers(2**63))
    ranks = np.arange(1, vocab_size + 1)
    template, prefix = TEMPLATES["fwe"]

    def make(n: int) -> Example:
        counts = (n * ranks**-alpha / zeta(alpha)).astype(int)
        words = [wd for wd, c in zip(vocab, counts, strict=True) for _ in range(c)]
        words = [words[i] for i in rng_for(seed, n).permutation(len(words))]
        return Example("fwe", template.format(context=" ".join(words)) + prefix, tuple(vocab[1:4]),
                       " " + " ".join(vocab[1:4]) + END, prefix)

    # The three answers must be strictly more frequent than the rest, or the question has no single answer.
    def unique(n: int) -> bool:
        counts = (n * ranks**-alpha / zeta(alpha)).astype(int)
        return counts[3] > (counts[4] if vocab_size > 4 else 0)

    lo = 1
    while not unique(lo):
        lo += 1
    return fit(make, length, count, lo=lo)


def example(task: str, rng: np.random.Generator, length: int, config: RulerConfig, count: Count = byte_count) -> Example:
    """One example of ``task`` at ``length`` tokens (by ``count``)."""
    if task in NIAH:
        return niah(task, rng, length, count)
    if task == "vt":
        return variable_tracking(rng, length, count, config.num_hops)
    if task == "cwe":
        return common_words(rng, length, count, config.num_cw)
    return frequent_words(rng, length, count, config.alpha)


def generate(task: str, n: int, length: int, split: str, seed: int, config: RulerConfig,
             count: Count = byte_count) -> list[Example]:
    """n examples of one split: each is redrawn until a hash of its query and references puts it in ``split``."""
    check_split(split)
    rng = rng_for(seed, length, TASK_NAMES.index(task), {"train": 0, "test": 1}[split])
    out = []
    while len(out) < n:
        ex = example(task, rng, length, config, count)
        content = json.dumps([task, ex.prompt.rsplit("\n", 1)[-1], sorted(ex.references)])
        if split_of(content.encode()) == split:
            out.append(ex)
    return out


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


__all__ = ["END", "NIAH", "TASK_NAMES", "TEMPLATES", "Example", "Ruler", "RulerConfig", "byte_count", "encode", "example",
           "fit", "generate", "greedy", "ruler_prompt", "string_match_all"]
