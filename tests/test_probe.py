"""The task probe (harness/analysis/probe.py): full attention's score per task decides which tasks enter the frontier."""
import json

import pytest

from harness.analysis.probe import ProbeConfig, lines, probe
from harness.cli import main


def row(task, subtask, per_example, **extra):
    """A row as the runner writes it: full attention on a task's ranked metric, with its declaration."""
    return {"task": task, "metric": "string_match" if task == "ruler" else "exact_match", "model": "m", "eval_len": 4096,
            "variant_spec": "full", "status": "ok", "per_example": per_example, "subtask": subtask,
            "metric_kind": "proportion", "metric_role": "ranked", "task_label": subtask or task, "versus_full": False,
            "value": sum(per_example) / len(per_example), "n": len(per_example), **extra}


ROWS = [
    row("ruler", "niah_single_1", [1.0] * 8),  # the ceiling
    row("ruler", "cwe", [0.0] * 7 + [0.25]),  # the floor
    row("ruler", "vt", [1.0, 1.0, 0.5, 1.0, 0.75, 0.5, 1.0, 1.0]),  # 0.84: in
    row("passkey", None, [1.0, 0.0, 1.0, 1.0], depth=0.0, draws=4),  # two depths pool into one 8-example cell
    row("passkey", None, [1.0, 1.0, 0.0, 1.0], depth=1.0, draws=4),
    row("ruler", "niah_single_1", [0.0] * 8, press="snapkv", budget="1/8"),  # a press arm: not the probe's
    row("ruler", "niah_single_1", [0.0] * 8, metric="all_found", metric_role=""),  # not the ranked metric
    {**row("ruler", "fwe", [0.0]), "status": "error", "error": "OutOfMemoryError: boom", "per_example": None},
]


def test_the_probe_keeps_the_tasks_full_half_solves_and_says_why_the_others_are_out():
    df = probe(ROWS).set_index("task")
    assert df.loc["niah_single_1", "verdict"] == "ceiling" and df.loc["niah_single_1", "score"] == 1.0
    assert df.loc["cwe", "verdict"] == "floor"
    assert df.loc["vt", "verdict"] == "in" and df.loc["vt", "score"] == pytest.approx(0.84375)
    assert df.loc["passkey", "n"] == 8 and df.loc["passkey", "draws"] == 8 and df.loc["passkey", "verdict"] == "in"
    assert df.loc["fwe", "verdict"] == "failed" and "boom" in df.loc["fwe", "why"]
    assert (df["ci_low"].dropna() < df["ci_high"].dropna()).all()  # never an interval of zero width, even at 1.0
    assert df.loc["niah_single_1", "ci_low"] < 1.0
    text = "\n".join(lines(probe(ROWS)))
    assert "Kept: `passkey`, `vt`." in text and "| cwe | 0.03 |" in text and "out: full below 0.5" in text
    stricter = probe(ROWS, ProbeConfig(low=0.9, high=0.99)).set_index("task")  # the bounds are the caller's
    assert stricter.loc["vt", "verdict"] == "floor" and stricter.loc["niah_single_1", "verdict"] == "ceiling"


def test_the_probe_command_writes_markdown_and_refuses_bad_bounds_in_one_line(tmp_path, capsys):
    f = tmp_path / "probe.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert main(["probe", str(f), "--out", str(tmp_path / "probe.md")]) == 0
    assert "Kept: `passkey`, `vt`." in (tmp_path / "probe.md").read_text()
    assert main(["probe", str(f), "--low", "0.9", "--high", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--low 0.9 must be below --high 0.5" in err and "Traceback" not in err
