"""One registry mechanism for everything pluggable: attention variants and position methods.

A registered class takes a validated config dataclass; params arrive from Python or from
``name:key=value`` spec strings and are checked against the dataclass's field types here,
once, so every variant gets the same clear errors for free.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn.specs import check_config_defaults, coerce, one_line, parse_spec, shorten


@dataclass(frozen=True)
class Entry:
    """A registered name: its class, its config dataclass and where it came from."""

    name: str
    cls: type
    config: type
    source: str = "builtin"

    def params(self) -> dict[str, Any]:
        """Parameter name -> default; required parameters map to the string ``"<required>"``."""
        out = {}
        for f in dataclasses.fields(self.config):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
            else:
                out[f.name] = "<required>"
        return out

    def required(self) -> list[str]:
        return [
            f.name
            for f in dataclasses.fields(self.config)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]


class NameTaken(ValueError):
    """A name registered twice. From a ``--plugin`` it is refused, not skipped like other plugin failures: the command
    would otherwise run the built-in under the name the user meant for their own variant."""


def _reloaded(old: type, new: type) -> bool:
    """Whether ``new`` is ``old`` loaded again from a plugin file of the same name (a test's copy in another folder,
    a file loaded again after an edit): the later one replaces it. Two different classes, or any class taking a
    built-in's name, are a clash."""
    def stem(cls: type) -> str | None:
        module = cls.__module__
        return module.rstrip("0123456789") if module.startswith("attn_plugin_") else None

    return stem(old) is not None and stem(old) == stem(new) and old.__qualname__ == new.__qualname__


class Registry:
    """Name -> (class, config dataclass). Entry-point plugins load lazily on first lookup."""

    def __init__(self, kind: str, entry_point_group: str | None = None, base: str | None = None):
        """``base`` (``"module.Class"``) is what every class must subclass, found by name in the class's MRO: the
        registry imports no variant module (they import it)."""
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.base = base
        self._entries: dict[str, Entry] = {}
        self._entry_points_loaded = False
        self.plugin_errors: dict[str, str] = {}
        self.name_clashes: dict[str, str] = {}  # plugin label -> its NameTaken message (also in plugin_errors)
        self._loading_source = "builtin"

    # -- registration -------------------------------------------------------------------
    def register(self, name: str, config: type) -> Callable[[type], type]:
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"config for {self.kind} {shorten(name)} must be a dataclass, got {shorten(config)}")

        def decorator(cls: type) -> type:
            self._check_class(name, cls)
            check_config_defaults(f"{self.kind} {shorten(name)}", config)
            if name in self._entries and not _reloaded(self._entries[name].cls, cls):
                raise NameTaken(
                    f"{self.kind} {shorten(name)} is already registered "
                    f"(by {self._entries[name].cls.__module__}.{self._entries[name].cls.__qualname__})"
                )
            self._entries[name] = Entry(name, cls, config, self._loading_source)
            cls.name = name
            cls.config_class = config
            return cls

        return decorator

    def _check_class(self, name: str, cls: Any) -> None:
        """Refuse a class the harness cannot use now, not with a traceback in a later sweep."""
        if self.base is None:
            return
        attr = self.base.rpartition(".")[2]
        if not (isinstance(cls, type) and any(f"{c.__module__}.{c.__qualname__}" == self.base for c in cls.__mro__)):
            what = cls.__qualname__ if isinstance(cls, type) else f"{type(cls).__name__} {shorten(cls)}"
            raise TypeError(
                f"{self.kind} {shorten(name)}: {what} is not a subclass of attn.{attr}; "
                f"write `class {getattr(cls, '__name__', 'MyVariant')}(attn.{attr})` and register that"
            )
        check = getattr(cls, "check_declaration", None)
        if check is not None:
            check()  # the class's own declarations (e.g. Attention.auto_order) name what exists

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    # -- plugins ------------------------------------------------------------------------
    def load_entry_points(self) -> None:
        if self._entry_points_loaded or self.entry_point_group is None:
            return
        self._entry_points_loaded = True
        for ep in importlib.metadata.entry_points(group=self.entry_point_group):
            self._load(ep.name, ep.load, source=f"entry point {ep.value}")

    def load_plugin(self, path_or_module: str) -> bool:
        """Import a file (``my_attn.py``) or module (``pkg.mod``) so its decorators register.

        A failure is recorded in ``plugin_errors`` and returns False; it never raises.
        """
        def do_import() -> Any:
            p = Path(path_or_module)
            if p.suffix == ".py" or p.exists():
                if not p.is_file():
                    raise FileNotFoundError(f"no such file: {path_or_module}")
                mod_name = f"attn_plugin_{p.stem}_{abs(hash(str(p.resolve()))) % 10**8}"
                if mod_name in sys.modules:
                    return sys.modules[mod_name]
                spec = importlib.util.spec_from_file_location(mod_name, p)
                module = importlib.util.module_from_spec(spec)
                sys.modules[mod_name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[mod_name]
                    raise
                return module
            return importlib.import_module(path_or_module)

        return self._load(path_or_module, do_import, source=f"plugin {path_or_module}")

    def _load(self, label: str, loader: Callable[[], Any], source: str) -> bool:
        previous, self._loading_source = self._loading_source, source
        try:
            loader()
            self.plugin_errors.pop(label, None)
            self.name_clashes.pop(label, None)
            return True
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # a broken plugin (even one calling sys.exit) must not break the others
            self.plugin_errors[label] = one_line(e)
            if isinstance(e, NameTaken):
                self.name_clashes[label] = str(e)
            return False
        finally:
            self._loading_source = previous

    # -- lookup and build ---------------------------------------------------------------
    def names(self) -> list[str]:
        self.load_entry_points()
        return list(self._entries)

    def get(self, name: str) -> Entry:
        if name not in self._entries:
            self.load_entry_points()
        if name not in self._entries:
            msg = f"unknown {self.kind} {shorten(name)}; registered: {', '.join(sorted(self._entries))}"
            if self.plugin_errors:
                msg += "; plugins that failed to load: " + "; ".join(
                    f"{shorten(k, quote=False)} ({v})" for k, v in self.plugin_errors.items()
                )
            else:
                msg += " (a variant of your own? load its file with --plugin my_attn.py)"
            raise ValueError(msg)
        return self._entries[name]

    def make_config(self, name: str, params: dict[str, Any]) -> Any:
        """Validate ``params`` against the config dataclass of ``name`` and instantiate it."""
        entry = self.get(name)
        fields = {f.name: f for f in dataclasses.fields(entry.config)}
        unknown = sorted(set(params) - set(fields))
        if unknown:
            valid = ", ".join(fields) or "(none)"
            shown = ", ".join(map(shorten, unknown[:5])) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
            raise ValueError(
                f"unknown parameter{'s' if len(unknown) > 1 else ''} {shown} for {self.kind} {shorten(name)}; "
                f"valid: {valid}"
            )
        missing = [f for f in entry.required() if f not in params]
        if missing:
            raise ValueError(f"{self.kind} {shorten(name)} needs parameter(s): {', '.join(missing)}")
        hints = typing.get_type_hints(entry.config)
        typed = {k: coerce(v, hints.get(k, Any), f"{name}.{k}") for k, v in params.items()}
        try:
            return entry.config(**typed)
        except ValueError as e:
            text = str(e) if len(str(e)) <= 300 else str(e)[:300] + "..."  # configs may echo a huge value
            raise ValueError(f"{name}: {text}") from None

    def specs(self) -> list[dict[str, Any]]:
        out = []
        for name in self.names():
            entry = self._entries[name]
            spec = {"name": name, "params": entry.params(), "source": entry.source}
            describe = getattr(entry.cls, "describe", None)
            if callable(describe):
                spec.update(describe())
            out.append(spec)
        return out


def check(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``: the one way configs state their rules."""
    if not condition:
        raise ValueError(message)


ATTENTION = Registry("attention variant", entry_point_group="attn.variants", base="attn.attention.base.Attention")
POSITIONS = Registry("position method", entry_point_group="attn.variants", base="attn.positions.base.Position")


@dataclass(frozen=True)
class Variant:
    """An attention spec resolved once: its name, typed config, the fields the text set, and the backend asked for."""

    name: str
    config: Any
    given: dict[str, Any]
    backend: str = "auto"

    @property
    def fields(self) -> dict[str, Any]:
        """Every init field of the config (what a results row records)."""
        return {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config) if f.init}


def check_backend(name: str, backend: str, backends: list[str], spec: str | None = None) -> None:
    """``ValueError`` unless ``backend`` is ``auto`` or one of the variant's ``backends``."""
    if backend != "auto" and backend not in backends:
        where = f" in {spec!r}" if spec is not None else ""
        raise ValueError(f"unknown backend {backend!r} for {name!r}{where}; valid: auto, {', '.join(backends)}")


def resolve_variant(spec: str) -> Variant:
    """``"name:key=v,...,backend=b"`` -> :class:`Variant`, every value typed and checked by the registry (the one
    place both harnesses and the CLI read a variant's name); ``ValueError`` names what is wrong and what is valid."""
    name, raw = parse_spec(spec)
    backend = raw.pop("backend", "auto")
    entry = ATTENTION.get(name)
    check_backend(name, backend, [b.name for b in entry.cls.backends], spec)
    config = ATTENTION.make_config(name, raw)
    return Variant(name, config, {k: getattr(config, k) for k in raw}, backend)


def register_attention(name: str, config: type) -> Callable[[type], type]:
    """Class decorator: ``@register_attention("my_variant", config=MyConfig)``."""
    return ATTENTION.register(name, config)


def register_position(name: str, config: type) -> Callable[[type], type]:
    return POSITIONS.register(name, config)


def build_attention(name: str, backend: str = "auto", **params: Any) -> Any:
    """Validated params -> attention module; ``ValueError`` names what is wrong and what is valid."""
    entry = ATTENTION.get(name)
    return entry.cls(ATTENTION.make_config(name, params), backend=backend)


def build_position(name: str, **params: Any) -> Any:
    entry = POSITIONS.get(name)
    return entry.cls(POSITIONS.make_config(name, params))


def list_attention() -> list[dict[str, Any]]:
    return ATTENTION.specs()


def list_positions() -> list[dict[str, Any]]:
    return POSITIONS.specs()


def load_plugin(path_or_module: str) -> bool:
    """Import a user's file or module of variants; failures land in ``plugin_errors()``."""
    return ATTENTION.load_plugin(path_or_module)


def name_clashes() -> dict[str, str]:
    """Plugins that registered a name already taken (a built-in's, another plugin's): label -> the message."""
    return {**POSITIONS.name_clashes, **ATTENTION.name_clashes}


def plugin_errors() -> dict[str, str]:
    ATTENTION.load_entry_points()
    POSITIONS.load_entry_points()
    return {**POSITIONS.plugin_errors, **ATTENTION.plugin_errors}


__all__ = [
    "ATTENTION", "POSITIONS", "Entry", "NameTaken", "Registry", "Variant", "build_attention", "build_position", "check",
    "check_backend", "resolve_variant",
    "list_attention", "list_positions", "load_plugin", "name_clashes", "parse_spec", "plugin_errors",
    "register_attention", "register_position", "shorten",
]
