"""The questions the committed results answer, each answered by a block rendered from today's rows.

A document holds each answer between ``<!-- answer: NAME -->`` and ``<!-- end answer: NAME -->``; ``attn-bench answers
DOC`` renders every block anew from the results files it names (``--check``: exit 1 when one differs), and the quote
test renders them the same way. Nothing inside a block is typed by hand: its tables, its claims (each with its paired
test, :mod:`harness.analysis.claims`), which files and commands it came from and whether their code has changed since
(:mod:`harness.analysis.freshness`).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from harness.analysis import answers as A
from harness.analysis.freshness import freshness
from harness.results import scan_rows, write_atomic


@dataclass(frozen=True)
class Question:
    """One question: the files it reads (under the results folder), the commands that made them, its renderer."""

    name: str
    title: str
    files: tuple[str, ...]
    render: Callable[[dict[str, list[dict[str, Any]]]], list[str]]
    short: bool = False  # its files in one line (the top-level README), not one with its command each


def _rows(folder: Path, files: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    return {f: scan_rows(folder / f)[0] for f in files}


def _freshness_lines(folder: Path, files: Sequence[str], commands: dict[str, str], short: bool = False) -> list[str]:
    if short:
        fr = [freshness(folder / f) for f in files]
        return ["", "Rows: " + ", ".join(f"`{f}` ({x.commit[:7] if x.commit else '?'}, {x.status})"
                                         for f, x in zip(files, fr, strict=True)) + "."]
    out = ["", "From:"]
    for f in files:
        fr = freshness(folder / f)
        state = {"fresh": "its code unchanged since", "unknown": "freshness unknown (no git history)"}.get(
            fr.status, f"stale: its code changed since, first in {fr.changed[-1].split()[0]}" if fr.changed else "stale")
        at = f"at {fr.commit[:7]}" if fr.commit else "at an unknown commit"
        out.append(f"- `{f}` ({at}, {state}){': `' + commands[f] + '`' if f in commands else ''}")
    return out


QUESTIONS: dict[str, Question] = {q.name: q for q in (
    Question("cost", "What does each attention cost at a length?", A.COST_FILES, A.cost),
    Question("keep", "What does each method keep at a budget, per model?", A.KEEP_FILES, A.keep),
    Question("prefill", "What does the prefill sparsity buy?", A.PREFILL_FILES, A.prefill),
    Question("retrieval", "What does retrieval do?", A.KEEP_FILES[:6], A.retrieval),
    Question("text", "What does each method keep of the text read after it?", A.CONTINUATION_FILES, A.text),
    Question("chat", "Does the chat template change what full attention finds?", A.CHAT_FILES, A.chat),
    Question("summary", "What does each method keep at 1/8, in one line a model?",
             A.KEEP_FILES + A.FRONTIER_COST_FILES + A.CHECKPOINT_FILES, A.summary, short=True),
)}


def commands_in(doc: str) -> dict[str, str]:
    """Each results file's command, as the document's run sections give it (the first code span naming ``--out``)."""
    out = {}
    for m in re.finditer(r"^### `([^`]+\.jsonl)`\s*\n+`([^`]+)`", doc, flags=re.M):
        out[m[1]] = m[2]
    return out


def answer(name: str, folder: Path, doc: str = "") -> str:
    """The block of question ``name`` from the files under ``folder``."""
    q = QUESTIONS[name]
    body = q.render(_rows(folder, q.files)) + _freshness_lines(folder, q.files, commands_in(doc), q.short)
    return "\n".join(body)


BLOCK = re.compile(r"(<!-- answer: (\w+) -->\n)(?:.*?\n)??(<!-- end answer: \2 -->)", flags=re.S)


def fill(doc: str, folder: Path) -> str:
    """``doc`` with every answer block rendered anew."""
    return BLOCK.sub(lambda m: m[1] + answer(m[2], folder, doc) + "\n" + m[3], doc)


@click.command("answers")
@click.argument("docs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--results", "folder", default="results", show_default=True, type=click.Path(file_okay=False),
              help="The folder the questions' results files are in.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when a block differs from its rendering.")
def answers_command(docs: tuple[str, ...], folder: str, check: bool) -> None:
    """Render the answer blocks (<!-- answer: NAME --> ... <!-- end answer: NAME -->) of DOCS from the results files
    under --results: cost, keep, prefill, retrieval, text, chat, summary."""
    stale = []
    for path in docs:
        old = Path(path).read_text()
        unknown = sorted({m[1] for m in re.finditer(r"<!-- answer: (\w+) -->", old)} - set(QUESTIONS))
        if unknown:
            raise click.UsageError(f"{path}: unknown answer {unknown[0]!r}; valid: {', '.join(QUESTIONS)}")
        new = fill(old, Path(folder))
        if new != old:
            stale.append(path)
            if not check:
                write_atomic(path, new)
    click.echo(("differ: " if check else "rewrote: ") + ", ".join(stale) if stale else "up to date")
    if check and stale:
        raise SystemExit(1)


__all__ = ["BLOCK", "QUESTIONS", "Question", "answer", "answers_command", "fill"]
