"""Spec strings and typed config values: ``name:key=value,...`` parsed, each value coerced to its field's type.

The registry checks every variant's params through these, so all variants get the same clear errors.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

ECHO_LIMIT = 80  # characters of a user's value an error message repeats
INT_LIMIT = 2**63 - 1  # the largest int a spec takes: what a torch int64 holds


def shorten(value: Any, limit: int = ECHO_LIMIT, quote: bool = True) -> str:
    """``repr(value)`` (``str`` if not ``quote``), cut to ``limit`` characters: an error echoes bad input,
    never a 100 KB line."""
    text = repr(value) if quote else str(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value):,} characters)" if isinstance(value, (str, bytes)) else ""
    return text[:limit] + "..." + size


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception as ``Type: first line`` of bounded length, so a plugin failure is one line."""
    if isinstance(error, SystemExit):
        return f"SystemExit: the plugin called sys.exit({shorten(error.code)})"
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and, for strings from the command line, convert) ``value`` against ``tp``."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            if type(None) in args:
                return None
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, where)
            except ValueError:
                pass
        raise ValueError(f"{where} must be {_type_name(tp)}, got {shorten(value)}")
    if origin is Literal:
        choices = get_args(tp)
        if value in choices:
            return value
        raise ValueError(f"{where} must be {_type_name(tp)}, got {shorten(value)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{where} must be a bool, got {shorten(value)}")
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"{where} must be an int, got {shorten(value)}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                number = int(value.replace("_", ""))
            except ValueError:
                pass
            else:  # a count, size or seed beyond 64 bits is a typo, and torch cannot hold it: refused here, not in a cell
                if abs(number) > INT_LIMIT:
                    raise ValueError(f"{where} must be an int of at most 64 bits, got {shorten(value)}")
                return number
        raise ValueError(f"{where} must be an int, got {shorten(value)}")
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"{where} must be a float, got {shorten(value)}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
            else:  # '1e400' overflows to inf: refused unless inf was written as such
                if math.isinf(number) and "inf" not in value.lower():
                    raise ValueError(f"{where} must be a float, got {shorten(value)}, which overflows to infinity")
                return number
        raise ValueError(f"{where} must be a float, got {shorten(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{where} must be a str, got {shorten(value)}")
    if origin is tuple or tp is tuple:
        if isinstance(value, str):
            value = [v for v in value.replace(";", "/").split("/") if v]
        if isinstance(value, (list, tuple)):
            inner = get_args(tp)
            if inner and inner[-1] is not Ellipsis and len(inner) != len(value):
                raise ValueError(f"{where} must have {len(inner)} items, got {shorten(value)}")
            item_tp = inner[0] if inner else Any
            return tuple(
                v if item_tp is Any else coerce(v, item_tp, f"{where}[{i}]")
                for i, v in enumerate(value)
            )
        raise ValueError(f"{where} must be a tuple, got {shorten(value)}")
    return value


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"sliding_window:window=256,backend=flex"`` -> ``("sliding_window", {"window": "256", ...})``."""
    name, _, rest = spec.strip().partition(":")
    if not name:
        raise ValueError(f"empty name in spec {shorten(spec)}; expected name[:key=value,...]")
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"malformed parameter {shorten(item)} in spec {shorten(spec)}; expected key=value")
        if key.strip() in params:
            raise ValueError(f"parameter {shorten(key.strip())} given twice in spec {shorten(spec)}")
        params[key.strip()] = value.strip()
    return name, params


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` has type ``hint``; None when the hint is not one this check understands."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        results = [_matches(value, h) for h in typing.get_args(hint)]
        return True if any(r is True for r in results) else (None if None in results else False)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return None


def check_config_defaults(what: str, config: type) -> None:
    """TypeError when a config field's default is not of its declared type (``window: int = "256"``):
    ``list`` would show it and a sweep would carry it until some arithmetic failed deep in a cell."""
    try:
        hints = typing.get_type_hints(config)
    except Exception:  # noqa: BLE001 -- unresolvable annotations: nothing to check against
        return
    for f in dataclasses.fields(config):
        if f.default is dataclasses.MISSING or f.name not in hints:
            continue
        if _matches(f.default, hints[f.name]) is False:
            raise TypeError(f"{what}: config field {f.name!r} is declared {typing_name(hints[f.name])} but its default is "
                            f"{f.default!r} ({type(f.default).__name__})")


def typing_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
