"""Optional modules (transformers, kvpress, fla, xformers, Ray, submitit, ...), imported so that a broken install
costs only the feature that needs it.

A broken install does not always raise ImportError: a compiled extension built against another torch raises
RuntimeError or OSError, a package may assert on its dependencies' versions. Whatever its import raised, an optional
module is either the module or one line saying why not; :class:`Unavailable` carries that line as an ImportError, so
every caller that handles a missing package handles a broken one the same way.
"""
from __future__ import annotations

import importlib
from types import ModuleType


class Unavailable(ImportError):
    """An optional module that cannot be imported; the message is one line: which module, and why."""


def try_import(module: str, hint: str = "") -> ModuleType | str:
    """``module`` imported, or the one-line reason it is not available (``hint``: how to install it, appended).

    A module that is not installed says so ("kvpress is not installed"); one that is installed but whose import
    fails, in itself or in a submodule, C extension or dependency, says what its import raised ("kvpress does not
    import: RuntimeError: ..."). Nothing is cached: a broken import is tried again, and says the same, each time.
    """
    why = f" ({hint})" if hint else ""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 -- ImportError, or whatever the package raises at import
        missing = isinstance(e, ModuleNotFoundError) and e.name is not None and (
            module == e.name or module.startswith(e.name + "."))
        if missing:
            return f"{e.name} is not installed{why}"
        return f"{module} does not import: {type(e).__name__}: {first_line(e)}{why}"


def require(module: str, hint: str = "") -> ModuleType:
    """``module`` imported, or :class:`Unavailable` (an ImportError) with the reason :func:`try_import` gives."""
    found = try_import(module, hint)
    if isinstance(found, str):
        raise Unavailable(found, name=module)
    return found


def unavailable(module: str, hint: str = "") -> str | None:
    """None if ``module`` imports, else the one-line reason (an availability probe)."""
    found = try_import(module, hint)
    return found if isinstance(found, str) else None


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, cut to 300 characters (tracebacks of extensions run long)."""
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


__all__ = ["Unavailable", "first_line", "require", "try_import", "unavailable"]
