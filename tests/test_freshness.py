"""A results file is stale once a later commit changes the code its rows name, and fresh until then."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.analysis.freshness import freshness, named_code
from harness.cli import main
from harness.environment import checkout_commit

IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
            "PATH": "/usr/bin:/bin"}


def git(root: Path, *args: str, when: str = "") -> str:
    env = {**IDENTITY, "HOME": str(root), **({"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when} if when else {})}
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True, env=env).stdout.strip()


def commit(root: Path, files: dict[str, str], message: str, when: str) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message, when=when)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    return tmp_path


ROW = {"variant": "sliding_window", "scope": "op", "backend": "flex", "seq_len": 1024, "status": "ok"}


def test_a_change_to_the_code_a_row_names_makes_its_file_stale(repo):
    first = commit(repo, {"attn/attention/sliding_window.py": "a = 1\n", "attn/attention/flex.py": "f = 1\n",
                          "attn/attention/linear.py": "b = 1\n", "harness/cost/scopes/op.py": "op = 1\n"},
                   "first", "2026-12-01T10:00:00+00:00")
    recorded = repo / "recorded.jsonl"
    recorded.write_text(json.dumps({**ROW, "code_commit": first + "-dirty"}) + "\n")
    stamped = repo / "stamped.jsonl"  # an older file: its commit is found from its timestamp
    stamped.write_text(json.dumps({**ROW, "timestamp": "2026-12-01T11:00:00+00:00"}) + "\n")
    assert named_code([ROW], repo) == ("attn/attention/flex.py", "attn/attention/sliding_window.py",
                                       "harness/cost/scopes/op.py")
    assert freshness(recorded, repo).status == "fresh" and freshness(stamped, repo).inferred
    commit(repo, {"attn/attention/linear.py": "b = 2\n"}, "another variant", "2026-12-02T10:00:00+00:00")
    assert freshness(recorded, repo).status == freshness(stamped, repo).status == "fresh"
    commit(repo, {"attn/attention/flex.py": "f = 2\n"}, "the flex backend", "2026-12-03T10:00:00+00:00")
    for path in (recorded, stamped):
        f = freshness(path, repo)
        assert f.status == "stale" and f.commit == first and [c.split(" ", 1)[1] for c in f.changed] == ["the flex backend"]


def test_a_base_comparison_is_as_fresh_as_its_head_rows(repo):
    """``sweep --base``: the base rows hold the ref's older commit on purpose; the head's say when the file was made."""
    old = commit(repo, {"attn/attention/sliding_window.py": "a = 1\n"}, "old kernel", "2026-12-01T10:00:00+00:00")
    new = commit(repo, {"attn/attention/sliding_window.py": "a = 2\n"}, "new kernel", "2026-12-02T10:00:00+00:00")
    both = repo / "base.jsonl"
    both.write_text("".join(json.dumps({**ROW, "side": side, "code_commit": c}) + "\n"
                            for side, c in (("base", old), ("head", new))))
    assert freshness(both, repo).status == "fresh" and freshness(both, repo).commit == new
    only_ref = repo / "at.jsonl"  # sweep --at OLD: the variants as that commit held them
    only_ref.write_text(json.dumps({**ROW, "code_commit": old, "ref": old}) + "\n")
    assert freshness(only_ref, repo).status == "stale"


def test_no_commit_known_is_unknown_not_fresh(repo, tmp_path):
    commit(repo, {"attn/attention/sliding_window.py": "a = 1\n"}, "first", "2026-12-01T10:00:00+00:00")
    early = repo / "early.jsonl"  # measured before the first commit: no producing commit in this history
    early.write_text(json.dumps({**ROW, "timestamp": "2026-11-01T00:00:00+00:00"}) + "\n")
    foreign = repo / "foreign.jsonl"  # a commit this clone does not hold (a shallow clone, another fork)
    foreign.write_text(json.dumps({**ROW, "code_commit": "0" * 40}) + "\n")
    assert freshness(early, repo).status == freshness(foreign, repo).status == "unknown"


def test_the_stale_command_lists_this_checkouts_results(capsys):
    assert main(["stale", "--all", "results/linear-long-cpu.jsonl"]) in (0, None)
    out = capsys.readouterr().out
    assert out.split("\t")[0] in ("fresh", "stale", "unknown") and "attn/attention/linear.py" in out


def test_a_run_appending_to_a_results_file_leaves_the_code_clean_and_a_code_change_does_not(repo):
    """A row names the commit its code ran from: a committed results file growing beside the run is data, not code (the
    project's resumable runs append to them); a changed tracked source file is ``-dirty``."""
    head = commit(repo, {"attn/x.py": "a = 1\n", "results/run.jsonl": "{}\n"}, "first", "2026-12-01T10:00:00+00:00")
    (repo / "results/run.jsonl").write_text("{}\n{}\n")
    (repo / "results/new.jsonl").write_text("{}\n")  # untracked: never dirty
    assert checkout_commit(repo) == head
    (repo / "attn/x.py").write_text("a = 2\n")
    assert checkout_commit(repo) == head + "-dirty"
    assert checkout_commit(repo / "results") is None  # not a checkout's root
