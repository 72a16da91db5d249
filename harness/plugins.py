"""Loading ``--plugin`` files and modules for a command: each failure is warned once, in one
wording, and a command may validate its input first so a bad spec still ends with one line."""
from __future__ import annotations

from pathlib import Path

import click

from attn.registry import shorten


def warn_plugin(label: str, error: str) -> None:
    """The one line that says a plugin failed; every command words it the same."""
    click.echo(f"attn-bench: plugin {shorten(label, quote=False)} failed to load: {error}", err=True)


def load_plugins(plugins: tuple[str, ...], report: bool = True) -> set[str]:
    """Load ``--plugin`` files/modules; a broken one is reported once, by name, and skipped.

    Returns the labels that failed. ``report=False`` leaves the warning to :func:`report_plugins`, so a
    command can validate first: a bad spec then ends with one line (which names the failed plugins).

    A plugin registering a name already taken (``full``) is refused instead, ValueError naming the plugin and the
    name, before anything is written: going on would measure the built-in under the name meant for the plugin's own.
    """
    import attn
    from attn.registry import name_clashes

    failed: set[str] = set()
    for p in dict.fromkeys(plugins):  # a plugin given twice is loaded (and reported) once
        if not attn.load_plugin(p):
            if p in name_clashes():
                raise ValueError(f"--plugin {shorten(p, quote=False)}: {name_clashes()[p]}; a plugin's variants "
                                 "need names of their own")
            if report:
                warn_plugin(p, attn.plugin_errors()[p])
            failed.add(p)
    return failed


def report_plugins(failed: set[str]) -> None:
    """Warn about plugins that failed to load, once each (after a command's input was validated)."""
    import attn

    for p in sorted(failed):
        warn_plugin(p, attn.plugin_errors().get(p, "unknown error"))


def absolute_plugins(plugins: tuple[str, ...]) -> tuple[str, ...]:
    """Plugin files by absolute path, so hosts started elsewhere (another directory, another node) find them;
    modules are imported by name and stay as given."""
    return tuple(str(Path(p).resolve()) if p.endswith(".py") and Path(p).exists() else p for p in plugins)


__all__ = ["absolute_plugins", "load_plugins", "report_plugins", "warn_plugin"]
