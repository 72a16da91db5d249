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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch
import torch.nn.functional as F

from harness.accuracy.common import rng_for, split_of, tokens_per_batch_for
from harness.accuracy.stats import Measure, mean_ci
from harness.accuracy.tasks.base import TaskOption, TrainedTask
from harness.accuracy.tasks.registry import register_task

SEPARATOR = b"\x00"  # between documents; files containing NUL are treated as binary and skipped


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


@register_task("lm", config=LMConfig)
class LM(TrainedTask):
    """Byte-level language modelling: bits per byte of held-out text."""

    vocab_size = 256
    main_metric = "bpb"
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
