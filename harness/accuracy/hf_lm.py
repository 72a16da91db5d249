"""``lm`` on a pretrained checkpoint: bits per byte and perplexity of the corpus's test text in its own tokens.

lm: the test text is the first ``eval_bytes`` of the corpus's test split (:mod:`harness.accuracy.tasks.lm`), grown
until it holds the longest length in tokens. Its documents (cut at the corpus's NUL separators) are
tokenized one by one into one stream, ``boundary doc1 boundary doc2 ...``; every document token is scored
(predicted from the tokens before it), boundaries are context only. Windows of ``eval_len`` inputs tile
the stream without overlap (the last one shorter), so every length scores exactly the same tokens and
differs only in how much context each token sees. ``bpb`` = total NLL in bits / UTF-8 bytes of the
documents' text; ``perplexity`` = exp(mean NLL per scored token), per token of the checkpoint's tokenizer.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from harness.accuracy.hf_checkpoint import Checkpoint, Tokens
from harness.accuracy.hf_tasks import CheckpointTask, register_checkpoint_task
from harness.accuracy.jobs import short_hash
from harness.accuracy.stats import Measure, mean_ci
from harness.accuracy.tasks.lm import SEPARATOR, LMConfig, load_corpus

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


def windows(num_targets: int, eval_len: int) -> list[slice]:
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
    spans = windows(len(y), eval_len)
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


@register_checkpoint_task("lm")
class CheckpointLM(CheckpointTask):
    """Every length scores the same tokens of the test text; only the context each token sees differs."""

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


__all__ = ["CheckpointLM", "LMText", "lm_measures", "lm_text", "token_bits", "window_bits", "windows"]
