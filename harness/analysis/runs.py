"""A report's runs: one per committed results file and kind of row, its group (read from the rows), its command (read
from the document that introduces each committed run, results/README.md) and the digest that pins the file."""
from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

# The groups runs are shown in, in page order. A run's group is read from its rows (run_kind), not its file name.
KINDS = {
    "op": "Cost: attention operators",
    "decode": "Cost: decoding steps",
    "serving": "Cost: serving (batches, draft tokens, ragged contexts, capacity)",
    "model": "Cost: our backbone (model scope)",
    "hf": "Cost: transformers models (hf scope)",
    "trained": "Accuracy: small models trained on a task",
    "pretrained": "Accuracy: pretrained checkpoints",
}


def run_kind(rows: pd.DataFrame, accuracy: bool) -> str:
    """The group (a key of :data:`KINDS`) of one file's rows of one kind, read from the rows themselves."""
    if accuracy:
        return "trained" if "steps" in rows and rows["steps"].notna().any() else "pretrained"
    scopes = set(rows["scope"].dropna()) if "scope" in rows else set()
    if "hf" in scopes:
        return "hf"
    if "model" in scopes:
        return "model"
    batched = "batch_size" in rows and (pd.to_numeric(rows["batch_size"], errors="coerce") > 1).any()
    if batched or any(c in rows and rows[c].notna().any() for c in ("queries", "budget_bytes", "ragged")):
        return "serving"
    return "decode" if "mode" in rows and set(rows["mode"].dropna()) == {"decode"} else "op"


def _markdown_inline(text: str) -> str:
    """One Markdown paragraph as HTML: code spans and fenced code kept as code, links as their text, the rest escaped."""
    if text.startswith("```"):
        return "<code>" + html.escape("\n".join(line for line in text.splitlines() if not line.startswith("```"))) + "</code>"
    out = []
    for part in re.split(r"(`[^`]*`)", text):
        if len(part) >= 2 and part[0] == part[-1] == "`":
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", part))))
    return "".join(out)


def run_commands(markdown: str) -> dict[str, str]:
    """Each results file's command, from a document laid out as results/README.md: the first paragraph of the
    ``### `<file name>` `` section (the command and what it ran), as HTML, keyed by file name in document order.

    The rows do not record the command line; the document that introduces each committed run does."""
    out = {}
    for m in re.finditer(r"^### `([^`\n]+)`[ \t]*\n(.*?)(?=^#{1,3} |\Z)", markdown, re.S | re.M):
        out[m.group(1)] = _markdown_inline(re.split(r"\n[ \t]*\n", m.group(2).strip(), maxsplit=1)[0].strip())
    return out


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a results file as the report records it: a test compares it with the committed file."""
    p = Path(path)
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""


def runs(cost: pd.DataFrame, acc: pd.DataFrame, commands: Mapping[str, str]) -> list[tuple[str, str, str, pd.DataFrame]]:
    """(kind, group, file, rows) per results file and kind of row, in page order: by group, then in the commands
    document's order (related runs sit together there), then by name."""
    runs = []
    for kind, df in (("cost", cost), ("accuracy", acc)):
        if len(df) == 0:
            continue
        files = df["results_file"] if "results_file" in df else pd.Series("", index=df.index)
        for src, g in df.groupby(files, sort=False):
            runs.append((kind, run_kind(g, kind == "accuracy"), str(src), g))
    order = {name: i for i, name in enumerate(commands)}
    groups = list(KINDS)
    return sorted(runs, key=lambda r: (groups.index(r[1]), order.get(Path(r[2]).name, len(order)), Path(r[2]).name))


__all__ = ["KINDS", "file_digest", "run_commands", "run_kind", "runs"]
