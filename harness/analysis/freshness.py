"""Which committed results are stale: files whose producing code changed after the commit that produced them.

A results file is produced at a commit: the one its rows record (``code_commit``, written by every run from a git
checkout), or for files written before rows recorded it, the last commit before its first row's timestamp. The code
a file's rows name is the variant's own module (its backends live there), a FlexAttention backend's module,
the cost scope's module (with ``attn/hf`` for a transformers scope or a KV press), a layer pattern's module, and an
accuracy task's module (with its ``<task>_*.py`` companions). A file is stale when a later commit touched any of them:
its numbers were measured on code that is no longer the code, so a document quotes it only once re-measured (or says
it is stale).

Git is asked, never guessed: outside a checkout, or in one too shallow to hold the commit, a file's freshness is
``unknown``.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[2]
ATTENTION = "attn/attention"


@dataclass(frozen=True)
class Freshness:
    """One results file: the commit that produced it, the code its rows name, and the later commits touching it."""

    path: str
    commit: str | None  # None: not known (no git, no timestamp, history too shallow)
    inferred: bool  # the commit was found from the rows' timestamp (rows written before ``code_commit``)
    code: tuple[str, ...]
    changed: tuple[str, ...]  # "<short sha> <subject>", newest first

    @property
    def status(self) -> str:
        return "unknown" if self.commit is None else ("stale" if self.changed else "fresh")


def git(*args: str, root: Path = ROOT) -> str | None:
    """``git args`` in ``root``; None if git is missing or says no (not a checkout, an unknown commit)."""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def named_code(rows: Iterable[dict[str, Any]], root: Path = ROOT) -> tuple[str, ...]:
    """The repository files the rows name: what produced their numbers (see the module docstring)."""
    code: set[str] = set()
    for r in rows:
        variant = r.get("variant")
        if variant == "layers":
            code.add("attn/patterns.py")
        elif isinstance(variant, str):
            code.add(f"{ATTENTION}/{variant}.py")
        if r.get("backend") == "flex" or r.get("backend_requested") == "flex":
            code.add(f"{ATTENTION}/flex.py")
        scope = r.get("scope")
        if isinstance(scope, str) and "task" not in r:
            code.add(f"harness/cost/scopes/{scope}.py")
        if scope == "hf" or r.get("press") or r.get("hf_model") or r.get("model"):
            code.add("attn/hf")
        task = r.get("task")
        if isinstance(task, str) and (root / f"harness/accuracy/tasks/{task}.py").is_file():
            code.add(f"harness/accuracy/tasks/{task}.py")  # and its companions (ruler_data.py: RULER's generators)
            code.update(str(f.relative_to(root)) for f in (root / "harness/accuracy/tasks").glob(f"{task}_*.py"))
    return tuple(sorted(p for p in code if (root / p).exists()))


def produced_at(rows: Sequence[dict[str, Any]], root: Path = ROOT) -> tuple[str | None, bool]:
    """(commit, inferred): the rows' ``code_commit``, else the last commit before the first row's timestamp. A
    ``sweep --base`` file's base rows hold the ref's commit on purpose: its head rows say when it was produced."""
    recorded = next((r["code_commit"] for r in rows if isinstance(r.get("code_commit"), str) and r.get("side") != "base"),
                    None)
    if recorded:
        full = git("rev-parse", "--verify", "--quiet", f"{recorded.removesuffix('-dirty')}^{{commit}}", root=root)
        return full, False
    stamps = sorted(r["timestamp"] for r in rows if isinstance(r.get("timestamp"), str))
    if not stamps:
        return None, True
    return git("rev-list", "-1", f"--before={stamps[0]}", "HEAD", root=root) or None, True


def freshness(path: str | Path, root: Path = ROOT) -> Freshness:
    """How fresh one results file is against the checkout at ``root``."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    commit, inferred = produced_at(rows, root)
    code = named_code(rows, root)
    changed: tuple[str, ...] = ()
    if commit and code:
        log = git("log", "--format=%h %s", f"{commit}..HEAD", "--", *code, root=root)
        if log is None:
            commit = None
        else:
            changed = tuple(line for line in log.splitlines() if line)
    return Freshness(str(path), commit, inferred, code, changed)


@click.command("stale")
@click.argument("results", nargs=-1, required=True)
@click.option("--all", "show_all", is_flag=True, help="List fresh files too.")
def stale_command(results: tuple[str, ...], show_all: bool) -> None:
    """List results files whose producing code (variant, backend, scope, task modules) changed after them."""
    for p in results:
        if not Path(p).is_file():
            raise click.BadParameter(f"{p} is not a file", param_hint="RESULTS")
    for p in results:
        f = freshness(p)
        if f.status == "fresh" and not show_all:
            continue
        at = "unknown commit" if f.commit is None else f"{f.commit[:9]}{' (by its timestamp)' if f.inferred else ''}"
        click.echo(f"{f.status}\t{p}\t{at}\t{len(f.changed)} later commit(s) to {', '.join(f.code) or '-'}")
        for line in f.changed[:3]:
            click.echo(f"\t\t{line}")


__all__ = ["Freshness", "freshness", "named_code", "produced_at", "stale_command"]
