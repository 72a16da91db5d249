"""The continuation table beside the frontier (harness/analysis/continuation.py) on synthetic rows: no model runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_frontier_analysis import press_row, ruler_row

from harness.analysis import continuation as C
from harness.analysis import frontier as FR
from harness.cli import main

RNG = np.random.default_rng(0)
FULL = list(1.0 + 0.2 * RNG.random(20))  # 20 windows' bpb


def bpb_row(press: str, per_window: list[float], **kw) -> dict:
    return press_row(press, per_window, task="continuation", **kw) | {"metric": "bpb"}


def rows() -> list[dict]:
    mixed = [b + (0.05 if i % 2 else -0.05) for i, b in enumerate(FULL)]
    return [bpb_row("none", FULL), bpb_row("quantized", list(FULL), nbits=4),  # every window full's: a tie
            bpb_row("snapkv", [b + 0.1 + 0.01 * i for i, b in enumerate(FULL)], budget="1/8"),  # worse on all 20
            bpb_row("tova", mixed, budget="1/8"),  # 10 worse, 10 better by as much: no difference
            bpb_row("kvzip", [], budget="1/8", status="error", error="no tokenizer\nin its .gguf file"),
            bpb_row("knorm", FULL[:12], budget="1/8")]  # a run cut short: 12 of the 20 windows


def test_each_method_is_paired_with_full_on_its_windows_and_holm_adjusted():
    recs = {r["method"]: r for r in C.against_full(C.cells(rows(), FR.arm)[("m", 4096)])}
    assert set(recs) == {"full", "quantized 4-bit", "snapkv", "tova"}  # the error row is not compared
    assert recs["quantized 4-bit"]["tie"] and "p_adj" not in recs["quantized 4-bit"]
    snap = recs["snapkv"]
    assert snap["diff"][0] == pytest.approx(np.mean([0.1 + 0.01 * i for i in range(20)]))
    assert snap["diff"][1] > 0 and (snap["worse"], snap["better"]) == (20, 0)
    assert snap["p"] < 1e-3 and snap["p_adj"] == pytest.approx(min(1.0, 2 * snap["p"]))  # Holm over the two tested
    tova = recs["tova"]
    assert (tova["worse"], tova["better"]) == (10, 10) and tova["p_adj"] > 0.5 and tova["diff"][1] < 0 < tova["diff"][2]
    assert recs["snapkv"]["kv"] == pytest.approx(0.125)


def test_the_table_says_worse_not_resolved_tie_and_what_did_not_run():
    text = "\n".join(C.lines(rows(), FR.arm, "##"))
    line = {m: next(s for s in text.splitlines() if s.startswith(f"| {m} |")) for m in ("full", "snapkv", "tova")}
    assert line["snapkv"].endswith("| worse than full |") and line["tova"].endswith("| not resolved |")
    assert "| tie: full's bpb on every window |" in text and line["full"].endswith("| reference |")
    assert "- kvzip at 1/8: error: no tokenizer in its .gguf file" in text  # one line
    assert "Holm over the 2 methods compared" in text
    assert "Not paired (not full's 20 windows: a run cut short): knorm at 1/8 (12 windows)." in text


def test_the_frontier_command_renders_continuation_alone_and_beside_the_ranking(tmp_path, capsys):
    alone, both = tmp_path / "c.jsonl", tmp_path / "b.jsonl"
    alone.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    ruler = [ruler_row("none", [1.0] * 15 + [0.0] * 5), ruler_row("snapkv", [1.0] * 10 + [0.0] * 10, budget="1/8")]
    both.write_text("".join(json.dumps(r) + "\n" for r in ruler))
    assert main(["frontier", str(alone)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Memory-quality frontier") and "the text read after a compressed context" in out
    assert main(["frontier", str(both), str(alone)]) == 0
    out = capsys.readouterr().out
    assert "Ranked tasks: niah_single_1" in out and out.index("Ranked tasks") < out.index("text read after")


def test_the_text_answer_renders_the_table_from_the_continuation_files():
    from harness.analysis import answers as A
    from harness.analysis.questions import QUESTIONS

    assert QUESTIONS["text"].files == A.CONTINUATION_FILES
    out = "\n".join(A.text({A.CONTINUATION_FILES[0]: rows(), A.CONTINUATION_FILES[1]: []}))
    assert "#### m at 4096 tokens: the text read after a compressed context" in out
    assert out.count("| worse than full |") == 1 and out.count("| not resolved |") == 1
