"""Results files (issue 14): writers never damage a file that is not theirs, never fail after the work,
never share a file; readers skip what is not a row and name the file when they cannot read it."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli import main
from harness.results import ResultsStore, cell_key, check_rows, exclusive, read_rows

REPO = Path(__file__).resolve().parents[1]
ATTN_BENCH = shutil.which("attn-bench") or str(Path(sys.executable).with_name("attn-bench"))
TINY = ["--variant", "full", "--lengths", "64", "--heads", "1", "--head-dim", "16",
        "--retries", "0", "--min-run-time", "0.01", "--max-run-time", "0.05"]
ACC = ["--task", "mqar", "--steps", "2", "--batch-size", "4", "--no-progress"]
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00\x01"


def cost_rows(lengths: tuple[int, ...] = (256, 512, 1024)) -> list[dict]:
    """Hand-made cost rows of two variants: enough for compare, plot and report."""
    out = []
    for variant, params, c in [("full", {}, 1e-5), ("sliding_window", {"window": 64}, 2e-3)]:
        for L in lengths:
            ms = c * L * L
            out.append({"run_id": "x", "variant": variant, "variant_params": params, "backend": "sdpa",
                        "position": "none", "scope": "op", "mode": "forward", "device": "cpu", "device_name": "CI box",
                        "dtype": "float32", "batch_size": 1, "num_heads": 1, "head_dim": 16, "seq_len": L,
                        "status": "ok", "error": None, "latency_ms": ms, "latency_iqr_ms": 0.02 * ms,
                        "tokens_per_s": L / ms * 1e3, "peak_mem_bytes": 1e6 * L, "flops": None,
                        "achieved_flops_per_s": None})
    return out


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def one_line_error(rc: int, err: str, *expected: str) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attn-bench: error:"), err
    for text in expected:
        assert text in lines[0], err


def attn_bench(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([ATTN_BENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


# -- 1. --out that is not our JSONL is refused and left byte-identical --------------------------------------------

def test_sweep_refuses_to_append_to_a_file_that_is_not_results(tmp_path):
    notes = tmp_path / "notes.txt"
    shutil.copy(REPO / "README.md", notes)
    with notes.open("rb+") as f:  # as in the issue: no trailing newline, so the store would cut the last line
        f.truncate(len(f.read().rstrip(b"\n")))
    before = notes.read_bytes()
    for extra in ([], ["--resume"]):
        p = attn_bench(["sweep", *TINY, "--out", str(notes), *extra], tmp_path)
        one_line_error(p.returncode, p.stderr, str(notes), "line 1")
        assert notes.read_bytes() == before


@pytest.mark.parametrize("text, line, why", [
    ('{"a": 1}\n', 1, "lacks variant, status"),
    ('{"variant": "full", "status": "ok"}\n{"task": "mqar", "value": 1, "variant": "full", "status": "ok"}\n',
     2, "accuracy row"),
    ('{"variant": "full", "status": "ok"}\nplain text', 2, "not JSON"),
    ('{"variant": "full", "status": "ok"}\n1\n', 2, "not an object"),
    ('{"variant": "full", "status": "ok"}\n[1, 2]\n', 2, "not an object"),
])
def test_sweep_refuses_json_that_is_not_cost_rows(text, line, why, tmp_path, capsys):
    out = tmp_path / "c.jsonl"
    out.write_text(text)
    for extra in ([], ["--resume"]):
        rc, err = cli(["sweep", *TINY, "--out", str(out), *extra], capsys)
        one_line_error(rc, err, str(out), f"line {line}", why)
        assert out.read_text() == text


def test_accuracy_refuses_to_append_to_a_file_that_is_not_results(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"# notes\nthe last line")
    for extra in ([], ["--resume"]):
        rc, err = cli(["accuracy", *ACC, "--out", str(notes), *extra], capsys)
        one_line_error(rc, err, str(notes), "line 1")
    cost = tmp_path / "cost.jsonl"
    cost.write_text(jsonl(cost_rows()))
    rc, err = cli(["accuracy", *ACC, "--out", str(cost), "--resume"], capsys)
    one_line_error(rc, err, str(cost), "line 1 lacks task, value")
    assert notes.read_bytes() == b"# notes\nthe last line" and cost.read_text() == jsonl(cost_rows())
    assert not (tmp_path / ".ckpt").exists()  # nothing trained


def test_a_torn_last_line_is_still_accepted_by_writers(tmp_path):
    out = tmp_path / "c.jsonl"
    out.write_text('{"variant": "full", "status": "ok"}\n{"variant": "fu')
    assert check_rows(out, "cost") == [{"variant": "full", "status": "ok"}]
    out.write_text('{"variant": "full", "status": "ok"}\nfu')  # not the start of a row: not ours
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        check_rows(out, "cost")


# -- 3. an unwritable --out fails at once, before any work ---------------------------------------------------------

def impossible_outs(tmp_path: Path, name: str) -> list[Path]:
    (tmp_path / "a_file").write_text("x")
    return [tmp_path / "a_file" / name, tmp_path / "a_file" / "deeper" / name, Path("/proc/attn-bench-none") / name]


def test_sweep_and_accuracy_with_an_unwritable_out_fail_before_measuring(tmp_path, capsys, monkeypatch):
    import harness.accuracy.runner
    import harness.executors

    def measured(*args: object, **kwargs: object) -> None:  # "before measuring", checked by what ran, not how long
        raise AssertionError("measuring started despite an unwritable --out")

    monkeypatch.setattr(harness.executors, "make_executor", measured)
    monkeypatch.setattr(harness.accuracy.runner, "run_jobs", measured)
    for out in impossible_outs(tmp_path, "o.jsonl"):
        rc, err = cli(["sweep", *TINY, "--out", str(out)], capsys)
        one_line_error(rc, err, f"cannot write results file {out}")
        rc, err = cli(["accuracy", *ACC, "--out", str(out)], capsys)
        one_line_error(rc, err, f"cannot write results file {out}")  # one line: no plan printed, nothing trained
    assert not (tmp_path / "a_file" / ".ckpt").exists() and not (tmp_path / ".ckpt").exists()
    assert (tmp_path / "a_file").read_text() == "x"


def test_sweep_with_an_unwritable_out_through_the_real_command(tmp_path):
    (tmp_path / "a_file").write_text("x")
    p = attn_bench(["sweep", *TINY, "--out", "a_file/o.jsonl"], tmp_path)
    one_line_error(p.returncode, p.stderr, "a_file is not a directory")
    assert "Traceback" not in p.stderr


def test_plot_and_report_with_an_unwritable_out_fail_before_drawing(tmp_path, capsys):
    res = tmp_path / "c.jsonl"
    res.write_text(jsonl(cost_rows()))
    for out in impossible_outs(tmp_path, "figs"):
        rc, err = cli(["plot", str(res), "--out", str(out), "--only", "latency"], capsys)
        one_line_error(rc, err, f"cannot write figure directory {out}")
    for out in impossible_outs(tmp_path, "r.html"):
        rc, err = cli(["report", str(res), "--out", str(out)], capsys)
        one_line_error(rc, err, f"cannot write report {out}")


def test_a_new_out_in_new_directories_is_created_and_removed_if_nothing_was_written(tmp_path):
    out = tmp_path / "new" / "dir" / "o.jsonl"
    with exclusive(out):
        assert out.exists()
    assert not (tmp_path / "new").exists()  # an empty run leaves no debris
    with exclusive(out):
        ResultsStore(out, ["variant"]).append({"variant": "full", "status": "ok"})
    assert read_rows(out) == [{"variant": "full", "status": "ok"}]
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.jsonl"]  # no lock file left behind


# -- 4. one writer per results file --------------------------------------------------------------------------------

HOLDER = """
import sys, time
from harness.results import exclusive
with exclusive(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


@contextlib.contextmanager
def held(out: Path) -> Iterator[int]:
    """A real second process holding ``out`` as a writer does; yields its pid."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "locked"
        yield p.pid
    finally:
        p.kill()
        p.wait()


def test_a_second_writer_is_refused_before_any_work(tmp_path, capsys):
    out, acc = tmp_path / "c.jsonl", tmp_path / "acc.jsonl"
    out.write_text(jsonl(cost_rows()[:1]))
    acc.write_text('{"task": "mqar", "value": 1.0}\n')
    before = out.read_bytes(), acc.read_bytes()
    with held(out) as pid:
        rc, err = cli(["sweep", *TINY, "--out", str(out), "--resume"], capsys)
        one_line_error(rc, err, f"{out} is being written by another attn-bench (pid {pid})")
    with held(acc) as pid:
        rc, err = cli(["accuracy", *ACC, "--out", str(acc), "--resume"], capsys)
        one_line_error(rc, err, f"{acc} is being written by another attn-bench (pid {pid})")
    assert (out.read_bytes(), acc.read_bytes()) == before
    assert not (tmp_path / ".ckpt").exists()  # nothing trained


def test_two_sweeps_on_one_file_measure_each_cell_once(tmp_path):
    out = tmp_path / "c.jsonl"
    argv = ["sweep", *TINY, "--lengths", "64,128", "--out", str(out), "--resume"]
    first = subprocess.Popen([ATTN_BENCH, *argv], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        second = attn_bench(argv, tmp_path)
        _, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    one_line_error(second.returncode, second.stderr, f"is being written by another attn-bench (pid {first.pid})")
    assert sorted(r["seq_len"] for r in read_rows(out)) == [64, 128]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


# -- 5. JSON lines that are not objects ----------------------------------------------------------------------------

def test_readers_skip_lines_that_are_not_objects_and_say_so(tmp_path, capsys):
    good = cost_rows()
    path = tmp_path / "c.jsonl"
    path.write_text(jsonl(good[:2]) + "1\n[1, 2]\n" + jsonl(good[2:]))
    assert read_rows(path) == good
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "skipped 2 line(s)" in err[0] and "line 3" in err[0]

    base = tmp_path / "base.jsonl"
    base.write_text(jsonl(good))
    assert main(["compare", str(base), str(path)]) == 0
    assert main(["plot", str(path), "--out", str(tmp_path / "figs"), "--only", "latency"]) == 0
    assert (tmp_path / "figs" / "latency.png").exists()
    assert main(["report", str(path), "--out", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count(f"{path}: skipped 2 line(s)") == 3


def test_a_file_of_only_non_objects_is_one_line_naming_it(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    path.write_text("1\n[1, 2]\n")
    for argv in (["plot", str(path), "--out", str(tmp_path / "figs")], ["report", str(path), "--out", str(tmp_path / "r.html")],
                 ["compare", str(path), str(path)]):
        rc, err = cli(argv, capsys)
        one_line_error(rc, err, str(path), "line 1")
    assert not (tmp_path / "figs").exists() and not (tmp_path / "r.html").exists()


# -- 8. a complete last row without its newline is kept --------------------------------------------------------------

def test_a_last_row_without_its_newline_is_kept_and_completed(tmp_path):
    out = tmp_path / "c.jsonl"
    first = {"variant": "full", "seq_len": 64, "status": "ok"}
    out.write_text(json.dumps(first))
    assert read_rows(out) == [first]
    store = ResultsStore(out, ["variant", "seq_len"])
    assert store.keys() == {cell_key(first, ["variant", "seq_len"])}
    second = {"variant": "full", "seq_len": 128, "status": "ok"}
    store.append(second)
    assert out.read_text() == json.dumps(first) + "\n" + json.dumps(second) + "\n"
    # a torn line (killed mid-write) is still cut
    with out.open("a") as f:
        f.write('{"variant": "fu')
    assert read_rows(out) == [first, second]
    store.append(first)
    assert read_rows(out) == [first, second, first] and out.read_text().endswith("}\n")


def test_resume_does_not_remeasure_a_row_missing_its_newline(tmp_path):
    out = tmp_path / "c.jsonl"
    p = attn_bench(["sweep", *TINY, "--out", str(out)], tmp_path)
    assert p.returncode == 0, p.stderr
    row = out.read_text()
    assert row.count("\n") == 1
    out.write_text(row.rstrip("\n"))  # the writer died between the row and its newline
    p = attn_bench(["sweep", *TINY, "--lengths", "64,128", "--out", str(out), "--resume"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "1 of 2 cells already measured" in p.stdout
    rows = read_rows(out)
    assert [r["seq_len"] for r in rows] == [64, 128] and out.read_text().startswith(row)


# -- 9. binary files: the message names the file -------------------------------------------------------------------

def test_binary_files_are_named_in_the_error(tmp_path, capsys):
    binary = tmp_path / "figure.png"
    binary.write_bytes(PNG)
    good = tmp_path / "c.jsonl"
    good.write_text(jsonl(cost_rows()))
    cases = [
        ["sweep", "--config", str(binary), "--out", str(tmp_path / "o.jsonl")],
        ["sweep", *TINY, "--out", str(binary), "--resume"],
        ["accuracy", *ACC, "--out", str(binary), "--resume"],
        ["plot", str(binary), "--out", str(tmp_path / "figs")],
        ["report", str(good), str(binary), "--out", str(tmp_path / "r.html")],
        ["compare", str(good), str(binary)],
    ]
    for argv in cases:
        rc, err = cli(argv, capsys)
        one_line_error(rc, err, str(binary))
    assert binary.read_bytes() == PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "figure.png"]


def test_reading_a_directory_names_it(tmp_path, capsys):
    rc, err = cli(["compare", str(tmp_path), str(tmp_path)], capsys)
    one_line_error(rc, err, f"{tmp_path} is not a regular file")


def test_store_still_flushes_each_row(tmp_path):
    """Unchanged behaviour: each append is on disk at once (another process sees it)."""
    out = tmp_path / "c.jsonl"
    ResultsStore(out, ["variant"]).append({"variant": "full", "status": "ok"})
    seen = subprocess.run([sys.executable, "-c", f"print(open({str(out)!r}).read(), end='')"], capture_output=True,
                          text=True, check=True).stdout
    assert seen == '{"variant": "full", "status": "ok"}\n'
    assert os.stat(out).st_size == len(seen)
