"""``sweep --base REF`` and ``--at REF``: the variants as a git ref holds them, measured by this checkout's harness.

REF is checked out in a temporary git worktree (``git worktree add --detach``) of each repository where it names a
commit: the checkout the imported ``attn`` package comes from, and the repository of each ``--plugin`` file. The
workers of that side start with a folder first on their import path that holds only REF's ``attn`` (a link), and
load the plugin files from REF's tree: the harness that gates, times and counts is the same on both sides, only the
variants differ. A REF that names a commit in none of them is refused before anything runs. The worktrees are
removed when the sweep ends.
"""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pinned:
    """REF's side: its commit, the worker's import path and the plugin files as REF holds them."""

    ref: str
    commit: str  # attn's checkout at REF, else the (first) plugin repository's
    path: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()


def on_ref(pinned: Pinned | None, side: str | None) -> bool:
    """Whether a cell of ``side`` runs on the ref's variants: the base side of --base, every cell of --at."""
    return pinned is not None and side != "head"


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def repository(path: Path) -> Path | None:
    """The top of the git checkout holding ``path`` (a folder), or None."""
    top = _git(path, "rev-parse", "--show-toplevel") if path.is_dir() else None
    return Path(top).resolve() if top else None


def commit_of(repo: Path, ref: str) -> str | None:
    """The commit ``ref`` names in ``repo`` (a branch, tag, sha, ``main~3``), or None."""
    return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")


def attn_repository() -> Path | None:
    import attn

    return repository(Path(attn.__file__).resolve().parent)


@contextlib.contextmanager
def pinned(ref: str, plugins: tuple[str, ...] = ()) -> Iterator[Pinned]:
    """Check REF out (ValueError if it names no commit anywhere) and yield its side; remove the worktrees after."""
    tmp = Path(tempfile.mkdtemp(prefix="attn-bench-ref-"))
    trees: dict[Path, Path] = {}  # repository -> its worktree at REF

    def tree(repo: Path, commit: str) -> Path:
        if repo not in trees:
            where = tmp / f"tree{len(trees)}"
            if _git(repo, "worktree", "add", "--detach", "--force", str(where), commit) is None:
                raise ValueError(f"git could not check out {ref} ({commit[:12]}) of {repo} in a worktree")
            trees[repo] = where
        return trees[repo]

    try:
        home = attn_repository()
        commit = commit_of(home, ref) if home else None
        path: tuple[str, ...] = ()
        if commit:
            overlay = tmp / "path"
            overlay.mkdir()
            (overlay / "attn").symlink_to(tree(home, commit) / "attn")
            path = (str(overlay),)
        files = []
        for p in plugins:
            file = Path(p).resolve()
            repo = repository(file.parent) if p.endswith(".py") and file.is_file() else None
            at = commit_of(repo, ref) if repo else None
            if at is None:
                files.append(p)  # a module, or a file outside any repository where REF is a commit: as it is
                continue
            commit = commit or at
            mapped = tree(repo, at) / file.relative_to(repo)
            if not mapped.is_file():
                raise ValueError(f"--plugin {p}: {ref} ({at[:12]}) has no {file.relative_to(repo)}")
            files.append(str(mapped))
        if commit is None:
            where = ", ".join(str(r) for r in [home, *{repository(Path(p).resolve().parent) for p in plugins
                                                       if p.endswith(".py") and Path(p).is_file()}] if r)
            raise ValueError(f"{ref!r} names no commit in {where or 'any git checkout'} (attn-bench's checkout and each "
                             f"--plugin file's repository are searched)")
        yield Pinned(ref, commit, path, tuple(files))
    finally:
        for repo, where in trees.items():
            _git(repo, "worktree", "remove", "--force", str(where))
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["Pinned", "attn_repository", "commit_of", "on_ref", "pinned", "repository"]
