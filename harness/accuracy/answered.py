"""Answers already given, kept per prompt, so a cell cut short resumes from its next prompt.

A results row is written once its whole cell is answered: 20 prompts of every arm. A 16K prompt of a 0.5B checkpoint
takes minutes on one CPU core, so a cell takes hours and a run cut mid-cell (a session's end, a killed job) would lose
every prompt it had answered. Each prompt's answers -- every arm's tokens (or bits) and its row statistics -- are
appended as one line to a sidecar of the results file (``OUT.answers``, JSON lines, one writer: the results file's
lock); ``--resume`` answers a prompt found there from its line instead of the model. Once a cell's rows are written
its lines are dropped, so the sidecar holds only cut cells, and is removed when it holds none.

A line is found by what decides its answers: the setting's run id (checkpoint, variant, position, dtype), the cell,
the arms, and the prompt's tokens, question offset, decoding limits and needles. What the code does with them is not
in the key, exactly as a resumed results file keeps its finished cells: a change to what an arm does starts a new
``--out``.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from harness.results import write_atomic


def answers_path(out: Path) -> Path:
    """Where a run keeps its cut cells' answers: ``OUT.answers`` next to the results file."""
    return out.with_suffix(".answers")


class Answered:
    """The sidecar's lines by key, read once; :meth:`put` appends, :meth:`drop` removes a finished cell's."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: dict[str, dict[str, Any]] = {}
        if path.exists():
            for text in path.read_text().splitlines():
                try:
                    line = json.loads(text)
                except json.JSONDecodeError:  # a line the run was cut writing: that prompt is answered again
                    continue
                self.lines[line["key"]] = line

    @staticmethod
    def key(scope: str, parts: Any) -> str:
        return hashlib.sha256(json.dumps([scope, parts], sort_keys=True).encode()).hexdigest()

    def get(self, scope: str, parts: Any) -> dict[str, Any] | None:
        return self.lines.get(self.key(scope, parts))

    def put(self, scope: str, parts: Any, record: dict[str, Any]) -> None:
        line = {"key": self.key(scope, parts), "scope": scope, **record}
        self.lines[line["key"]] = line
        with self.path.open("a") as f:  # one line a prompt, flushed: a cut run loses at most the prompt it was on
            f.write(json.dumps(line) + "\n")

    def drop(self, scope: str) -> None:
        """A cell's rows are on record: its prompts' lines go (the file, once it holds none)."""
        if not any(line["scope"] == scope for line in self.lines.values()):
            return
        self.lines = {k: v for k, v in self.lines.items() if v["scope"] != scope}
        if self.lines:
            write_atomic(self.path, "".join(json.dumps(v) + "\n" for v in self.lines.values()))
        else:
            self.path.unlink(missing_ok=True)


__all__ = ["Answered", "answers_path"]
