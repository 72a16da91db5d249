"""How failures are worded, in one place: one line of bounded length, and an out-of-memory error
recognised by its message (allocators word it differently and some raise RuntimeError)."""
from __future__ import annotations

import re

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc", "memoryerror")
MESSAGE_LIMIT = 1000
# A quoted value this long in an error is cut: messages echo the user's input. The opening quote
# follows a space, a bracket, '=', ':' or ',', so the text between two quoted values never matches.
_LONG_QUOTED = re.compile(r"""(?<![^\s(\[{=:,])(['"])([^'"]{120,})\1""")


def one_line(text: object, limit: int = 400) -> str:
    """``text`` with its whitespace folded to single spaces, cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_error_line(text: object) -> str:
    """An error message as one line of bounded length: long echoed values cut, newlines folded."""
    text = _LONG_QUOTED.sub(lambda m: f"{m[1]}{m[2][:80]}...{m[1]} ({len(m[2]):,} characters)", one_line(text, 10**9))
    return one_line(text, MESSAGE_LIMIT)


def looks_like_oom(text: str) -> bool:
    return any(m in text.lower() for m in OOM_MARKERS)


def is_oom(err: BaseException) -> bool:
    """An allocation that did not fit: MemoryError (the address-space cap), torch's OutOfMemoryError,
    or an allocator's "can't allocate memory" RuntimeError."""
    import torch

    oom_types = (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))
    return isinstance(err, oom_types) or looks_like_oom(f"{type(err).__name__}: {err}")


__all__ = ["MESSAGE_LIMIT", "OOM_MARKERS", "is_oom", "looks_like_oom", "one_error_line", "one_line"]
