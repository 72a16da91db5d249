"""RULER's example generators (Hsieh et al. 2024, https://arxiv.org/abs/2404.06654): the templates, the length rule and
the four task families, in bytes or in a checkpoint's tokens (``Count``). What the task does with them -- training,
scoring, a checkpoint's prompts -- is :mod:`harness.accuracy.tasks.ruler`'s, which says what is RULER's and what departs
from it.
"""
from __future__ import annotations

import json
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.accuracy.common import check_split, rng_for, split_of
from harness.accuracy.words import random_value, word_lists

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


__all__ = ["END", "NIAH", "TASK_NAMES", "TEMPLATES", "Example", "RulerConfig", "byte_count", "example", "fit", "generate",
           "insert_at"]
