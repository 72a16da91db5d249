"""RULER's words: the ``wonderwords`` package's noun, adjective and verb lists, as RULER reads them (nothing is
downloaded), and the random keys and values its needles are made of (:mod:`harness.accuracy.tasks.ruler`)."""
from __future__ import annotations

import functools
import uuid

import numpy as np


@functools.lru_cache(maxsize=1)
def word_lists() -> dict[str, list[str]]:
    """wonderwords' noun, adjective and verb lists (profanity removed), as RULER reads them."""
    from importlib.resources import files

    assets = files("wonderwords.assets")

    def read(name: str) -> list[str]:
        return [w.strip() for w in assets.joinpath(name).read_text(encoding="utf-8").splitlines() if w.strip()]

    bad = set(read("profanitylist.txt"))
    return {kind: sorted({w for w in read(f"{kind}list.txt") if w not in bad and w.isascii()})
            for kind in ("noun", "adjective", "verb")}


def random_key_word(rng: np.random.Generator) -> str:
    """RULER's niah word: an adjective-noun pair."""
    w = word_lists()
    return f"{w['adjective'][rng.integers(len(w['adjective']))]}-{w['noun'][rng.integers(len(w['noun']))]}"


def random_value(rng: np.random.Generator, kind: str) -> str:
    if kind == "numbers":
        return str(int(rng.integers(10**6, 10**7)))  # RULER: 7 digits
    if kind == "words":
        return random_key_word(rng)
    return str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "little"), version=4))


__all__ = ["random_key_word", "random_value", "word_lists"]
