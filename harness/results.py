"""The JSONL results store: one object per measured cell, appended and flushed as it finishes.

A killed run loses at most the cell in flight; a torn last line (killed mid-write) is cut off
when the file is next opened for appending, and ignored by readers, so a file is never left
corrupt. ``--resume`` skips cells whose key is already present.

Writers append only to a file that is new, empty or holds only our rows (``check_rows``), check
``--out`` is writable before any work (``check_writable``) and hold a lock on it for the whole run
(``exclusive``), so a mistyped ``--out`` never destroys a file and two runs never share one.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

COST_FIELDS = (
    "run_id", "variant", "variant_params", "backend", "position", "scope", "mode", "device", "device_name",
    "dtype", "batch_size", "num_heads", "num_kv_heads", "head_dim", "seq_len", "docs", "status", "error", "latency_ms",
    "latency_iqr_ms", "tokens_per_s", "peak_mem_bytes", "flops", "achieved_flops_per_s",
    # how far to trust it (harness.cost.noise): the matmul peak timed before and after the cell, the load
    "peak_before_flops_per_s", "peak_after_flops_per_s", "peak_flops_per_s", "peak_fraction", "other_cpu",
    "loadavg_1m", "noisy", "noisy_reason", "attempts",
    # the bandwidth roofline: bytes the call must move, the memory bandwidth timed beside the matmul peak
    "bytes", "achieved_bytes_per_s", "bandwidth_peak_bytes_per_s", "bandwidth_fraction", "arithmetic_intensity",
    "roofline_fraction", "bandwidth_level",
)
ACCURACY_FIELDS = (
    "run_id", "task", "variant", "variant_params", "position", "position_params", "train_len", "eval_len",
    "metric", "value", "ci_low", "ci_high", "n", "seed",
)
# The identity of a cost cell, defined once for every consumer: the sweep and --resume (harness.cost), compare, the
# report and the plots (harness.analysis.frames.cell_identity). Rows that differ in any field are different
# measurements; rows equal in all are one cell measured twice, and the later supersedes the earlier.
COST_KEY_FIELDS = (
    "variant", "variant_params", "backend_requested", "position", "position_params", "scope", "mode", "device",
    "dtype", "batch_size", "num_heads", "num_kv_heads", "head_dim", "seq_len", "causal", "layers", "hf_config", "docs",
    "press", "press_params",  # None in cells without a press: rows written before presses keep their keys
    "queries", "budget_bytes",  # None in plain decode cells (one token a step, the grid's batch)
    "ragged",  # None unless a decode cell's sequences hold different contexts
    "side",  # sweep --base: "base" (the ref's variants) or "head" (the working tree's); None in any other sweep
)
STATUSES = ("ok", "oom", "timeout", "error", "unsupported", "skipped", "mismatch")  # mismatch: refused by the gate


def best_lr(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], higher: bool = True) -> list[int]:
    """Positions of the rows to keep when one configuration was trained at several learning rates.

    Rows that agree on ``keys`` (``lr`` and ``seed`` aside) are one point; within each seed of a point only
    the rows of the rate with the best mean ``value`` stay (highest, or lowest with ``higher=False``;
    ties go to the smaller rate), so a point is then the mean over seeds of each seed's best rate --
    Zoology's rule (Arora et al. 2023) for its MQAR figures. A seed trained at one rate keeps every row;
    values that are None or NaN never make a rate best. Shared by the accuracy summary and the figures,
    so the tables and the plots pick the same rate."""
    groups: dict[str, dict[Any, list[int]]] = {}
    for i, r in enumerate(rows):
        point = json.dumps({k: r.get(k) for k in keys if k not in ("lr", "seed")} | {"seed": r.get("seed")},
                           sort_keys=True, default=str)
        lr = r.get("lr")
        lr = None if lr is None or (isinstance(lr, float) and math.isnan(lr)) else float(lr)
        groups.setdefault(point, {}).setdefault(lr, []).append(i)
    keep: list[int] = []
    for by_lr in groups.values():
        if len(by_lr) == 1:
            keep += next(iter(by_lr.values()))
            continue
        best, best_score = None, None
        for lr in sorted(by_lr, key=lambda v: (v is None, v or 0.0)):
            vals = [float(rows[i]["value"]) for i in by_lr[lr] if _finite(rows[i].get("value"))]
            if not vals:
                continue
            score = sum(vals) / len(vals)
            if best_score is None or (score > best_score if higher else score < best_score):
                best, best_score = lr, score
        keep += by_lr[best] if best_score is not None else [i for ids in by_lr.values() for i in ids]
    return sorted(keep)


def _finite(v: Any) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every reader parses the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def cell_key(row: dict[str, Any], key_fields: Sequence[str]) -> str:
    """Canonical identity of a cell: the same configuration always gives the same key."""
    return json.dumps({k: row.get(k) for k in key_fields}, sort_keys=True, default=str)


# What makes a line one of our rows: writers append only to files whose every line has these keys
# (the writers themselves always write the full schema above; these are the keys no row can lack).
ROW_KEYS = {"cost": ("variant", "status"), "accuracy": ("task", "value")}


def _lines(p: Path) -> list[tuple[int, str, bool]]:
    """(line number, text, ended by a newline) for every line; ValueError naming the file if it is not UTF-8 text."""
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read results file {p}: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{p} is not a JSONL results file: line {line} is not UTF-8 text (binary file?)") from None
    lines = text.split("\n")
    last = lines.pop()  # "" when the file ends with a newline
    out = [(i, t, True) for i, t in enumerate(lines, 1)]
    if last:
        out.append((len(lines) + 1, last, False))
    return out


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return _BAD


_BAD = object()


def numbered_rows(path: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) for every line that is a JSON object, so a message can name the line."""
    return [(n, v) for n, text, _ in _lines(Path(path)) if text.strip() and isinstance(v := _parse(text), dict)]


def scan_rows(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[int]]:
    """Rows of a JSONL file and the numbers of the lines that are not JSON objects.

    A final line without its newline is a row if it parses (the writer died after the row, before
    the newline); if it does not parse it is a torn write and is neither a row nor a bad line.
    """
    p = Path(path)
    if not p.exists():
        return [], []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, text, ended in _lines(p):
        if not text.strip():
            continue
        value = _parse(text)
        if isinstance(value, dict):
            rows.append(value)
        elif not (value is _BAD and not ended):
            bad.append(number)
    return rows, bad


def warn_skipped(path: str | os.PathLike, bad: Sequence[int]) -> None:
    """One stderr line per file, so a reader says what it ignored instead of failing or hiding it."""
    if bad:
        print(f"attn-bench: warning: {path}: skipped {len(bad)} line(s) that are not JSON objects "
              f"(first: line {bad[0]})", file=sys.stderr)


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every row (JSON object) of one JSONL file; other lines are skipped with a warning, a torn last line silently.

    ``ValueError`` naming the file if it cannot be read or is not text.
    """
    rows, bad = scan_rows(path)
    warn_skipped(path, bad)
    return rows


def check_rows(path: str | os.PathLike, kind: str) -> list[dict[str, Any]]:
    """The rows of a file a writer is about to append to; ValueError naming the first line that is not ours.

    Appending to (and repairing) a file that is not one of our results files would destroy it, so a
    writer accepts only a new or empty file, or one whose every line is a ``kind`` row; a torn last
    line (a killed writer's, so it starts a JSON object) is allowed, ``ResultsStore`` cuts it.
    """
    p = Path(path)
    if not p.exists():
        return []
    if not p.is_file():
        raise ValueError(f"results file {p} is not a regular file")
    keys = ROW_KEYS[kind]
    rows = []
    for number, text, ended in _lines(p):
        if not text.strip():
            continue
        value = _parse(text)
        if value is _BAD and not ended and text.lstrip().startswith("{"):
            continue  # torn final write
        if not isinstance(value, dict):
            what = "not JSON" if value is _BAD else f"JSON but not an object ({type(value).__name__})"
            raise ValueError(f"{p} is not an attn-bench results file: line {number} is {what}; "
                             f"choose another --out")
        missing = [k for k in keys if k not in value]
        other = "task" in value if kind == "cost" else False
        if missing or other:
            why = f"lacks {', '.join(missing)}" if missing else "is an accuracy row"
            raise ValueError(f"{p} is not a {kind} results file: line {number} {why}; choose another --out")
        rows.append(value)
    return rows


def _nearest_existing(p: Path) -> Path:
    q = p.parent
    while not q.exists() and q != q.parent:
        q = q.parent
    return q


def write_atomic(path: str | Path, text: str) -> Path:
    """``text`` into ``path`` so that a reader never sees half a file: written beside it, then renamed over it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def check_writable(path: str | os.PathLike, directory: bool = False, what: str = "results file") -> None:
    """ValueError (one line) unless ``path`` can be written: checked before any work, so nothing is measured,
    trained or drawn only to fail at the end. Nothing is created or changed (a probe file is anonymous)."""
    p = Path(path)
    if p.exists():
        if not directory and not p.is_dir() and not p.is_file():  # a FIFO would block the open below
            raise ValueError(f"cannot write {what} {p}: it is not a regular file")
        if directory != p.is_dir():
            raise ValueError(f"cannot write {what} {p}: it is {'not ' if directory else ''}a directory")
        target = p if directory else None
    else:
        target = _nearest_existing(p)
        if not target.is_dir():
            raise ValueError(f"cannot write {what} {p}: {target} is not a directory")
    try:
        if target is None:
            with open(p, "ab"):  # appending nothing changes neither the bytes nor the mtime
                pass
        else:
            with tempfile.TemporaryFile(dir=target):
                pass
    except OSError as e:
        where = "" if target is None else f"cannot create files in {target}: "
        raise ValueError(f"cannot write {what} {p}: {where}{e.strerror}") from None


def _lock_holder(fd: int) -> str:
    """Pid of the process holding a flock on ``fd``'s file, from /proc/locks (Linux); "unknown" elsewhere."""
    inode = os.fstat(fd).st_ino
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if "->" not in parts and len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].endswith(f":{inode}"):
                    return parts[4]
    except OSError:
        pass
    return "unknown"


_HELD: set[str] = set()  # results files this process holds the lock of


@contextlib.contextmanager
def exclusive(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on the results file for a whole run, so two writers never measure the same cells.

    The lock is a ``flock`` on the results file itself (no lock file is left behind); a second writer
    gets one line naming the holder's pid, before any work. A file (and parent directories) this
    creates is removed again if the run wrote nothing. Re-entrant within a process (a command locks
    before printing its plan, the function it calls locks again).
    """
    p = Path(path)
    key = os.path.realpath(p)
    if key in _HELD:
        yield
        return
    missing = []
    q = p.parent
    while not q.exists() and q != q.parent:
        missing.append(q)
        q = q.parent
    existed = p.exists()
    try:
        for d in reversed(missing):
            d.mkdir()
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        _remove(None, missing)
        raise ValueError(f"cannot write results file {p}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _lock_holder(fd)
        os.close(fd)
        raise ValueError(f"{p} is being written by another attn-bench (pid {holder}); "
                         f"wait for it to finish or choose another --out") from None
    _HELD.add(key)
    try:
        yield
    finally:
        _HELD.discard(key)
        empty = os.fstat(fd).st_size == 0
        if not existed and empty:
            _remove(p, missing)
        os.close(fd)


def _remove(path: Path | None, dirs: Sequence[Path]) -> None:
    """Undo what ``exclusive`` created; best effort (someone may have put files there meanwhile)."""
    with contextlib.suppress(OSError):
        if path is not None:
            path.unlink()
    for d in dirs:
        with contextlib.suppress(OSError):
            d.rmdir()


class ResultsStore:
    """Append-only JSONL file of rows; ``keys()`` tells which cells are already measured."""

    def __init__(self, path: str | os.PathLike, key_fields: Sequence[str]):
        self.path = Path(path)
        self.key_fields = tuple(key_fields)

    def keys(self, statuses: Iterable[str] | None = None) -> set[str]:
        keep = None if statuses is None else set(statuses)
        return {
            cell_key(r, self.key_fields)
            for r in read_rows(self.path)
            if keep is None or r.get("status", "ok") in keep
        }

    def _repair(self) -> None:
        """Make appends start on a fresh line: a last row missing only its newline gets it; a torn line
        (a killed writer's, which does not parse) is cut."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            data = f.read()
            start = data.rfind(b"\n") + 1
            try:
                complete = isinstance(json.loads(data[start:]), dict)
            except (ValueError, RecursionError):
                complete = False
            if complete:
                f.write(b"\n")
            else:
                f.truncate(start)

    def append(self, row: dict[str, Any]) -> dict[str, Any]:
        """Write ``row`` (flushed, synced); returns it as it reads back, so a writer need not read the file again."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        line = json.dumps(_clean(row), default=str) + "\n"
        with self.path.open("a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return json.loads(line)


__all__ = [
    "ACCURACY_FIELDS", "COST_FIELDS", "COST_KEY_FIELDS", "ROW_KEYS", "STATUSES", "ResultsStore", "best_lr",
    "cell_key", "check_rows", "check_writable", "exclusive", "numbered_rows", "read_rows", "scan_rows",
    "warn_skipped",
]
