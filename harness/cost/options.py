"""A sweep option, declared once: a field of the spec's dataclasses (harness.cost.spec: ``Grid``, ``RunSettings``)
made with :func:`option`, which holds its default, the parser of its values (a TOML file's and the command line's
alike), its help text and its click flags. The spec's key tables (:func:`spec_keys`), the command's click options
(:func:`click_options`) and the options the command line layer passes on (:func:`cli_layer`) all follow from it.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

Parser = Callable[[Any, str], Any]  # (value, where it came from) -> the value; ValueError naming ``where`` if bad

_LENGTH = re.compile(r"^(\d+)([kKmM]?)$")
# The largest length, head count, batch or size a cell may ask for: past it tensor sizes overflow int64 before any
# memory check can refuse them (a --lengths of 10^23 ended in an OverflowError inside the cell, and a file written).
MAX_COUNT = 2**40


def parse_length(token: str | int, where: str) -> int:
    """``4096``, ``4K`` or ``1M`` (K = 1024) -> a positive int."""
    if isinstance(token, bool):
        raise ValueError(f"{where}: expected a length, got {token!r}")
    if isinstance(token, int):
        n = token
    else:
        m = _LENGTH.match(str(token).strip().replace("_", ""))
        if not m:
            raise ValueError(f"{where}: malformed length {token!r}; expected e.g. 4096, 4K or 1M")
        n = int(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[m.group(2).lower()]
    if not 1 <= n <= MAX_COUNT:
        raise ValueError(f"{where}: lengths must be between 1 and {MAX_COUNT} (1T), got {token!r}")
    return n


def parse_lengths(value: Any, where: str) -> list[int]:
    """A list, a comma list (``1024,2048``) or a doubling range (``1K..1M``) -> sorted unique lengths."""
    if isinstance(value, (list, tuple)):
        items: list[Any] = list(value)
    else:
        items = [s for s in str(value).split(",") if s.strip()] if not isinstance(value, int) else [value]
    out: list[int] = []
    for item in items:
        if isinstance(item, str) and ".." in item:
            lo_s, _, hi_s = item.partition("..")
            lo, hi = parse_length(lo_s, where), parse_length(hi_s, where)
            if lo > hi:
                raise ValueError(f"{where}: empty range {item!r} (start > end)")
            while lo <= hi:
                out.append(lo)
                lo *= 2
        else:
            out.append(parse_length(item, where))
    if not out:
        raise ValueError(f"{where}: no lengths given")
    return sorted(set(out))


def strs(split: bool) -> Callable[[Any, str], list[str]]:
    def parse(value: Any, where: str) -> list[str]:
        items = value if isinstance(value, (list, tuple)) else [value]
        out = []
        for v in items:
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"{where}: expected text, got {v!r}")
            out += [s.strip() for s in v.split(",") if s.strip()] if split else [v.strip()]
        if not out:
            raise ValueError(f"{where}: empty list")
        return out
    return parse


SIZE_UNITS = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6,
              "GB": 10**9}


def sizes(value: Any, where: str) -> list[int]:
    """Byte sizes, a comma list: ``1GiB,512MiB``, ``1.5GB`` or plain bytes."""
    import re

    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = []
    for v in items:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(v))
        if not m or not 1 <= float(m.group(1)) * SIZE_UNITS[m.group(2) or ""] <= 2**60:
            raise ValueError(f"{where}: expected sizes such as 1GiB, 512MiB or bytes, got {v!r}")
        out.append(int(float(m.group(1)) * SIZE_UNITS[m.group(2) or ""]))
    if not out:
        raise ValueError(f"{where}: empty list")
    return out


def _items(value: Any) -> list[Any]:
    """A comma list (text), a list or tuple, or one value, as a list."""
    return list(value) if isinstance(value, (list, tuple)) else str(value).split(",") if isinstance(value, str) else [value]


def ints(value: Any, where: str) -> list[int]:
    items = _items(value)
    out = []
    for v in items:
        try:
            n = int(v) if not isinstance(v, (bool, float)) else None
        except ValueError:
            n = None
        if n is None or not 1 <= n <= MAX_COUNT:
            raise ValueError(f"{where}: expected positive integers up to {MAX_COUNT}, got {str(v)[:40]!r}")
        out.append(n)
    if not out:
        raise ValueError(f"{where}: empty list")
    return sorted(set(out))


def ratios(value: Any, where: str) -> list[float]:
    """Fractions in [0, 1), a comma list: ``0,0.5``."""
    items = _items(value)
    out = []
    for v in items:
        try:
            r = float(v) if not isinstance(v, bool) else -1.0
        except ValueError:
            r = -1.0
        if not 0 <= r < 1:
            raise ValueError(f"{where}: expected fractions in [0, 1), got {v!r}")
        out.append(r)
    if not out:
        raise ValueError(f"{where}: empty list")
    return sorted(set(out))


def of_kind(test: Callable[[Any], bool], what: str) -> Callable[[Any, str], Any]:
    """A parser that accepts a value passing ``test`` as it is, else says it expected ``what``."""
    def parse(value: Any, where: str) -> Any:
        if not test(value):
            raise ValueError(f"{where}: expected {what}, got {value!r}")
        return value
    return parse


integer = of_kind(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
boolean = of_kind(lambda v: isinstance(v, bool), "true or false")
text = of_kind(lambda v: isinstance(v, str) and bool(v), "text")


def positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def count(minimum: int) -> Callable[[Any, str], int]:
    def parse(value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{where}: expected an integer >= {minimum}, got {value!r}")
        return value
    return parse


def choice(valid: Sequence[str]) -> Callable[[Any, str], str]:
    def parse(value: Any, where: str) -> str:
        if value not in valid:
            raise ValueError(f"{where}: unknown value {value!r}; valid: {', '.join(valid)}")
        return value
    return parse


# -- the declaration ---------------------------------------------------------------------------

def option(default: Any = dataclasses.MISSING, *, parse: Parser, help: str | None = None,
           flags: tuple[str, ...] = (), **click: Any) -> Any:
    """A dataclass field that is a sweep option: spec key ``name`` (the field's), parsed by ``parse``; with ``help``
    also ``--name`` on the command line (``flags`` replace that spelling, ``click`` adds click's own arguments, e.g.
    ``multiple=True``). The command line passes None (or ()) for an option not given: the default stays the field's."""
    return dataclasses.field(default=default, metadata={"parse": parse, "help": help, "flags": flags, "click": click})


def _options(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "parse" in f.metadata]


def spec_keys(cls: type) -> dict[str, Parser]:
    """Spec key -> its parser, in declaration order (the order an unknown key's message lists them in)."""
    return {f.name: f.metadata["parse"] for f in _options(cls)}


def cli_names(*classes: type) -> list[str]:
    """The options of ``classes`` that are also command-line options."""
    return [f.name for cls in classes for f in _options(cls) if f.metadata["help"] is not None]


def click_options(*classes: type, start: str | None = None, stop: str | None = None) -> Callable[[Any], Any]:
    """The click options of ``classes``' options in declaration order, from ``start`` through ``stop`` (names)."""
    import click

    fields = [f for cls in classes for f in _options(cls) if f.metadata["help"] is not None]
    names = [f.name for f in fields]
    fields = fields[names.index(start) if start else 0:names.index(stop) + 1 if stop else None]

    def apply(command: Any) -> Any:
        for f in reversed(fields):
            flags = f.metadata["flags"] or (f"--{f.name.replace('_', '-')}",)
            command = click.option(*flags, f.name, default=None, help=f.metadata["help"], **f.metadata["click"])(command)
        return command
    return apply


def cli_layer(opts: dict[str, Any]) -> dict[str, Any]:
    """The options the user actually gave (click passes None / () for the others), lists for repeated ones."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in opts.items() if v is not None and v != ()}


__all__ = [
    "Parser", "boolean", "choice", "cli_layer", "cli_names", "click_options", "count", "integer", "ints", "of_kind",
    "option", "parse_length", "parse_lengths", "positive", "ratios", "sizes", "spec_keys", "strs", "text",
]
