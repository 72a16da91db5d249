"""Byte-level language modelling on real text: bits per byte by evaluation length.

The default corpus is one every machine has without a download: the Python standard
library's own source files (``sysconfig.get_paths()["stdlib"]``, ``*.py``, site-packages
excluded), or any text files and directories given with ``--corpus``. Files are split
train/test by a hash of their relative path, so no file contributes to both. A corpus too
small to split by file (a single file) is split inside each file instead: its last
``test_fraction`` of bytes are test.

Every evaluation length scores the same test bytes, so bits per byte differ across lengths
only through how much context each byte sees: segments of the longest evaluation length,
spread evenly over the whole test split (so the scored text comes from many files, not the
first few), each tiled by windows of every length. At least ``eval_bytes`` (256 KB) are scored
where the test split holds them; each row says how many bytes were scored and from how many
files. ``bpb_tail`` scores only the positions past the training length (the part the model has
never been trained on).
"""
from __future__ import annotations

import functools
import math
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import torch
import torch.nn.functional as F

from harness.accuracy.common import SEPARATOR, rng_for, split_of, tokens_per_batch_for
from harness.accuracy.jobs import short_hash
from harness.accuracy.stats import Measure, mean_ci
from harness.accuracy.tasks.base import CheckpointTask, Metric, TaskOption, TrainedTask
from harness.accuracy.tasks.registry import register_task

if TYPE_CHECKING:
    from harness.accuracy.checkpoint import Checkpoint, Tokens



@dataclass(frozen=True)
class LMConfig:
    corpus: tuple[str, ...] = ()  # files or directories; () -> the Python standard library's sources
    test_fraction: float = 0.1
    eval_bytes: int = 1 << 18  # test bytes scored at every evaluation length (256 KB)

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"lm test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.eval_bytes < 1:
            raise ValueError(f"lm eval_bytes must be >= 1, got {self.eval_bytes}")


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_text(data: bytes) -> bool:
    return b"\x00" not in data[:8192]


def corpus_files(paths: Sequence[str]) -> list[tuple[str, Path]]:
    """(relative name, path) of every file to use, sorted; directories are walked."""
    if not paths:
        root = stdlib_dir()
        return sorted(
            (str(p.relative_to(root)), p)
            for p in root.rglob("*.py")
            if p.is_file() and not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
        )
    out = []
    for given in paths:
        p = Path(given)
        if not p.exists():
            raise ValueError(f"lm: corpus path {given} does not exist")
        if p.is_file():
            out.append((p.name, p))
        else:
            out += [(str(f.relative_to(p)), f) for f in p.rglob("*")
                    if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)]
    return sorted(out)


@dataclass(frozen=True)
class Corpus:
    """The train and test byte streams of one corpus, and how they were split."""

    train: np.ndarray  # uint8
    test: np.ndarray
    name: str
    num_files: int
    split_by: str  # "file" or "bytes"
    test_starts: np.ndarray  # offset of each test document in ``test``

@functools.lru_cache(maxsize=4)
def load_corpus(paths: tuple[str, ...] = (), test_fraction: float = 0.1) -> Corpus:
    """Read, filter and split a corpus (cached per process). ValueError if it is empty."""
    files = corpus_files(paths)
    docs = [(name, data) for name, p in files if (data := p.read_bytes()) and _is_text(data)]
    label = ", ".join(paths) if paths else f"python-stdlib ({stdlib_dir()})"
    if not docs:
        raise ValueError(f"lm: corpus {label} has no non-empty text files")
    test = [d for n, d in docs if split_of(n.encode(), test_fraction) == "test"]
    train = [d for n, d in docs if split_of(n.encode(), test_fraction) == "train"]
    split_by = "file"
    if not test or not train:
        split_by = "bytes"
        cut = [len(d) - max(1, int(len(d) * test_fraction)) for _, d in docs]
        train = [d[:c] for (_, d), c in zip(docs, cut, strict=True)]
        test = [d[c:] for (_, d), c in zip(docs, cut, strict=True)]

    def stream(parts: list[bytes]) -> np.ndarray:
        return np.frombuffer(SEPARATOR.join(parts), dtype=np.uint8)

    starts = np.cumsum([0] + [len(d) + len(SEPARATOR) for d in test[:-1]])
    return Corpus(stream(train), stream(test), label, len(docs), split_by, starts)


def bits(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """Next-byte cross-entropy in bits at every position: windows (N, L + 1) -> (N, L).

    Position t predicts byte t + 1.
    """
    out = []
    model.eval()
    with torch.no_grad():
        for chunk in windows.split(tokens_per_batch_for(windows.shape[1])):
            logits = model(chunk[:, :-1])  # (n, L, 256)
            out.append(F.cross_entropy(logits.transpose(1, 2).float(), chunk[:, 1:], reduction="none") / math.log(2))
    return torch.cat(out)

# -- on a pretrained checkpoint: bits per byte and perplexity of the test text in its own tokens --------------------
# lm: the test text is the first ``eval_bytes`` of the corpus's test split (:mod:`harness.accuracy.tasks.lm`), grown
# until it holds the longest length in tokens. Its documents (cut at the corpus's NUL separators) are
# tokenized one by one into one stream, ``boundary doc1 boundary doc2 ...``; every document token is scored
# (predicted from the tokens before it), boundaries are context only. Windows of ``eval_len`` inputs tile
# the stream without overlap (the last one shorter), so every length scores exactly the same tokens and
# differs only in how much context each token sees. ``bpb`` = total NLL in bits / UTF-8 bytes of the
# documents' text; ``perplexity`` = exp(mean NLL per scored token), per token of the checkpoint's tokenizer.
TOKENS_PER_BATCH = 8192  # tokens per forward: windows of one length are batched up to this
HEAD_CHUNK = 1024  # positions per LM-head call: full logits of a long window (L x vocab floats) would dwarf the model
# Config fields that change logits after the head (Gemma 2 softcapping, Cohere, Granite): then the model's own forward.
LOGIT_MODIFIERS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass(frozen=True)
class LMText:
    """The token stream every length scores."""

    ids: torch.Tensor  # (T,) int64: boundary doc1 boundary doc2 ...
    scored: torch.Tensor  # (T,) bool: a document token (scored as a target), not a boundary
    num_bytes: int  # UTF-8 bytes of the documents' text
    region_bytes: int  # corpus test bytes read

    @property
    def num_scored(self) -> int:
        return int(self.scored[1:].sum())


def tokenize_docs(docs: Sequence[str], tokens: Tokens, region_bytes: int) -> LMText:
    ids: list[int] = []
    scored: list[bool] = []
    for doc in docs:
        part = tokens.encode(doc)
        ids += [tokens.boundary, *part]
        scored += [False] + [True] * len(part)
    return LMText(torch.tensor(ids, dtype=torch.int64), torch.tensor(scored), sum(len(d.encode()) for d in docs),
                  region_bytes)


def region_docs(test: np.ndarray, num_bytes: int) -> list[str]:
    """The first ``num_bytes`` test bytes as documents (split at the separator), empty ones dropped."""
    text = test[:num_bytes].tobytes().decode("utf-8", "replace")
    return [d for d in text.split(SEPARATOR.decode()) if d]


def lm_text(config: LMConfig, tokens: Tokens, min_tokens: int) -> LMText:
    """The first ``eval_bytes`` test bytes, doubled until they hold ``min_tokens`` scored tokens (ValueError if the
    test split is too small)."""
    corpus = load_corpus(config.corpus, config.test_fraction)
    n = config.eval_bytes
    while True:
        n = min(n, len(corpus.test))
        text = tokenize_docs(region_docs(corpus.test, n), tokens, n)
        if text.num_scored >= min_tokens:
            return text
        if n >= len(corpus.test):
            raise ValueError(f"lm: the test split of {corpus.name} holds {text.num_scored} tokens, fewer than the "
                             f"longest evaluation length {min_tokens}; use shorter --eval-lens or a larger --corpus")
        n *= 2


def token_windows(num_targets: int, eval_len: int) -> list[slice]:
    """Non-overlapping windows of ``eval_len`` positions tiling [0, num_targets); the last may be shorter."""
    return [slice(s, min(s + eval_len, num_targets)) for s in range(0, num_targets, eval_len)]


@torch.no_grad()
def token_bits(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in bits of each next token: x, y (B, L) -> (B, L).

    The LM head runs on HEAD_CHUNK positions at a time (a model whose config modifies logits after the head
    runs its own forward instead).
    """
    if any(getattr(model.config, k, None) not in (None, 1, 1.0) for k in LOGIT_MODIFIERS):
        logits = model(input_ids=x, use_cache=False).logits  # (B, L, V)
        return F.cross_entropy(logits.transpose(1, 2).float(), y, reduction="none") / math.log(2)
    hidden = model.base_model(input_ids=x, use_cache=False).last_hidden_state  # (B, L, d)
    head = model.get_output_embeddings()
    parts = [F.cross_entropy(head(h).transpose(1, 2).float(), t, reduction="none")
             for h, t in zip(hidden.split(HEAD_CHUNK, dim=1), y.split(HEAD_CHUNK, dim=1), strict=True)]
    return torch.cat(parts, dim=1) / math.log(2)


def window_bits(model: torch.nn.Module, text: LMText, eval_len: int, device: str = "cpu") -> list[tuple[float, int]]:
    """(bits, scored tokens) of every window; windows of one length run in batches of TOKENS_PER_BATCH tokens."""
    x, y, keep = text.ids[:-1], text.ids[1:], text.scored[1:]
    spans = token_windows(len(y), eval_len)
    out: list[tuple[float, int]] = []
    for length in sorted({s.stop - s.start for s in spans}, reverse=True):
        group = [s for s in spans if s.stop - s.start == length]
        for i in range(0, len(group), max(1, TOKENS_PER_BATCH // length)):
            batch = group[i : i + max(1, TOKENS_PER_BATCH // length)]
            xb, yb, kb = (torch.stack([t[s] for s in batch]).to(device) for t in (x, y, keep))
            bits = token_bits(model, xb, yb) * kb  # (n, length), unscored positions zeroed
            out += [(float(b), int(k)) for b, k in zip(bits.sum(dim=1).tolist(), kb.sum(dim=1).tolist(), strict=True)]
    return out


def lm_measures(per_window: list[tuple[float, int]], num_bytes: int) -> dict[str, Measure]:
    """bpb and perplexity from per-window (bits, tokens); intervals are Student t over windows of the mean bits
    per token, carried to each scale (x tokens/bytes for bpb, 2^ for perplexity)."""
    bits = sum(b for b, _ in per_window)
    tokens = sum(t for _, t in per_window)
    m = mean_ci([b / t for b, t in per_window if t])
    scale = tokens / num_bytes

    def carried(f: Callable[[float], float], value: float) -> Measure:
        lo, hi = (None, None) if m.ci_low is None else (f(m.ci_low), f(m.ci_high))
        return Measure(value, lo, hi, m.n)

    return {"bpb": carried(lambda v: v * scale, bits / num_bytes),
            "perplexity": carried(lambda v: 2.0**v, 2.0 ** (bits / tokens))}


class OnCheckpoint(CheckpointTask):
    """lm on a pretrained checkpoint: every length scores the same tokens of the test text in its tokens; only the
    context each token sees differs."""

    default = True

    @classmethod
    def prepare(cls, ckpt: Checkpoint, config: LMConfig, lens: Sequence[int]) -> LMText:
        return lm_text(config, ckpt.tokens, lens[-1])

    @classmethod
    def cells(cls, config: LMConfig, lens: Sequence[int], data: LMText) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        return [({"eval_len": L, "scored_bytes": data.num_bytes, "scored_tokens": data.num_scored}, ("bpb", "perplexity"))
                for L in lens]

    @classmethod
    def eval_id(cls, ckpt: Checkpoint, config: LMConfig, data: LMText) -> str:
        corpus = load_corpus(config.corpus, config.test_fraction)
        return short_hash({"corpus": corpus.name, "test_bytes": len(corpus.test), "region": data.region_bytes,
                           "tokens": ckpt.tokens.name})

    @classmethod
    def evaluate(cls, model: torch.nn.Module, ckpt: Checkpoint, config: LMConfig, data: LMText, cell: dict[str, Any],
                 device: str, cache: Any) -> dict[str | None, dict[str, Measure]]:
        return {None: lm_measures(window_bits(model, data, cell["eval_len"], device), data.num_bytes)}


@register_task("lm", config=LMConfig)
class LM(TrainedTask):
    """Byte-level language modelling: bits per byte of held-out text."""

    pretrained = OnCheckpoint
    vocab_size = 256
    main_metric = "bpb"
    declares = (Metric("bpb", "loss"), Metric("bpb_tail", "loss"), Metric("perplexity", "loss"))
    columns = ("scored_bytes",)
    options = (TaskOption("corpus", "corpus", "text files or directories (default: Python's stdlib sources).",
                          multiple=True),
               TaskOption("eval_bytes", "eval_bytes", "test bytes scored per evaluation length.", click.IntRange(min=1)))

    def __init__(self, config: LMConfig | None = None):
        self.config = config or LMConfig()

    @property
    def corpus(self) -> Corpus:
        return load_corpus(self.config.corpus, self.config.test_fraction)

    def segments(self, eval_lens: Sequence[int]) -> np.ndarray:
        """Start offsets of the scored segments: ceil(eval_bytes / longest) segments of longest + 1 bytes (as many as
        fit, if fewer), spread evenly over the test split without overlap."""
        longest = max(eval_lens)
        n_test = len(self.corpus.test)
        k = max(1, min(math.ceil(self.config.eval_bytes / longest), n_test // (longest + 1)))
        if k == 1:
            return np.zeros(1, dtype=np.int64)
        return (np.arange(k) * ((n_test - longest - 1) // (k - 1))).astype(np.int64)

    def scored_bytes(self, eval_lens: Sequence[int]) -> int:
        """Bytes scored at every length (the segments' total)."""
        return len(self.segments(eval_lens)) * max(eval_lens)

    def scored_files(self, eval_lens: Sequence[int]) -> int:
        """How many test files the scored segments draw on."""
        starts, longest = self.corpus.test_starts, max(eval_lens)
        files: set[int] = set()
        for s in self.segments(eval_lens).tolist():
            first, last = np.searchsorted(starts, [s, s + longest], side="right") - 1
            files.update(range(int(first), int(last) + 1))
        return len(files)

    def check(self, train_len: int, eval_lens: Sequence[int]) -> None:
        c = self.corpus
        if len(c.train) < train_len + 1:
            raise ValueError(f"lm: corpus {c.name} has {len(c.train)} training bytes, fewer than one "
                             f"training window of {train_len + 1}")
        longest = max(eval_lens)
        if len(c.test) < longest + 1:
            raise ValueError(f"lm: corpus {c.name} has {len(c.test)} test bytes, fewer than one evaluation "
                             f"window of {longest + 1}; use shorter --eval-lens or a larger --corpus")

    def train_batch(self, seed: int, step: int, batch_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        data = self.corpus.train
        starts = rng_for(seed, step, length).integers(0, len(data) - length, batch_size)
        w = torch.from_numpy(np.stack([data[s : s + length + 1] for s in starts]).astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def cells(self, train_len: int, eval_lens: Sequence[int]) -> list[dict[str, Any]]:
        longest, scored, files = max(eval_lens), self.scored_bytes(eval_lens), self.scored_files(eval_lens)
        return [{"eval_len": L, "scored_bytes": scored, "scored_files": files, "segment_bytes": longest} for L in eval_lens]

    def metrics(self, cell: dict[str, Any], train_len: int) -> tuple[str, ...]:
        return ("bpb", "bpb_tail") if cell["eval_len"] > train_len else ("bpb",)

    def windows(self, eval_len: int, segment_bytes: int, starts: np.ndarray | None = None) -> torch.Tensor:
        """Each segment (default: one at offset 0) tiled by windows of eval_len + 1 bytes: (N, eval_len + 1)."""
        data = torch.from_numpy(self.corpus.test.astype(np.int64))
        starts = np.zeros(1, dtype=np.int64) if starts is None else starts
        per = segment_bytes // eval_len
        offsets = (torch.from_numpy(starts)[:, None] + torch.arange(per)[None, :] * eval_len).reshape(-1)
        return data[offsets[:, None] + torch.arange(eval_len + 1)[None, :]]

    def evaluate(self, model: torch.nn.Module, cell: dict[str, Any], train_len: int) -> dict[str, Measure]:
        L, longest = cell["eval_len"], cell["segment_bytes"]
        w = self.windows(L, longest, self.segments([longest]))
        b = bits(model, w)  # (N, L)
        out = {"bpb": mean_ci(b.mean(dim=1).tolist())}
        if L > train_len:
            out["bpb_tail"] = mean_ci(b[:, train_len:].mean(dim=1).tolist())
        return {k: Measure(m.value, m.ci_low, m.ci_high, len(w)) for k, m in out.items()}

    def sample_inputs(self, n: int, length: int) -> torch.Tensor:
        return self.windows(length, min(n * length, length * ((len(self.corpus.test) - 1) // length)))[:, :-1]

    def train_params(self) -> dict[str, Any]:
        c = self.corpus
        return {"corpus": c.name, "corpus_files": c.num_files, "corpus_train_bytes": len(c.train),
                "split_by": c.split_by, "test_fraction": self.config.test_fraction}

    def eval_params(self) -> dict[str, Any]:
        return {"corpus_test_bytes": len(self.corpus.test), "scoring": "spread segments"}


__all__ = ["Corpus", "LM", "LMConfig", "bits", "corpus_files", "load_corpus", "stdlib_dir"]
