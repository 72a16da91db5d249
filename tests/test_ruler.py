"""RULER's synthetic tasks (harness/accuracy/tasks/ruler.py): each task's answer is recoverable from its context by a plain
program, the target length is reached within a tolerance, generation is deterministic by seed and split by hash,
the metric is RULER's, greedy generation through the decoding state equals recomputing the whole sequence, and a
ruler job runs end to end through the CLI and the figure."""
from __future__ import annotations

import collections
import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn
from harness.accuracy.common import IGNORE, split_of
from harness.accuracy.tasks import ruler, ruler_data

CONFIG = ruler_data.RulerConfig()


# -- a plain program for every task -----------------------------------------------------------------------------------
def solve(ex: ruler_data.Example) -> list[str]:
    """Answer an example from its prompt alone, by counting and matching (no model)."""
    p = ex.prompt
    if ex.task.startswith("niah"):
        needles = collections.defaultdict(list)
        for key, value in re.findall(r"One of the special magic \w+ for (\S+) is: (\S+)\.", p):
            needles[key].append(value)
        question = p[p.rindex("\nWhat "):]
        queried = re.search(r"for (.+) mentioned in the provided text\?", question).group(1)
        keys = [k for k in re.split(r", and |, ", queried)]
        return [v for k in keys for v in needles[k]]
    if ex.task == "vt":
        value = re.search(r"assigned the value (\d+) in the text above", p).group(1)
        direct = dict(re.findall(r"VAR ([A-Z]+) = (\d+)", p))
        links = dict(re.findall(r"VAR ([A-Z]+) = VAR ([A-Z]+)", p))
        holding = {v for v, val in direct.items() if val == value}
        while True:
            more = {a for a, b in links.items() if b in holding} - holding
            if not more:
                return sorted(holding)
            holding |= more
    if ex.task == "cwe":
        listed = re.findall(r"\d+\. (\S+)", p[p.index("\n") + 1 : p.rindex("\nQuestion")])
        counts = collections.Counter(listed).most_common()
        assert counts[CONFIG.num_cw - 1][1] > counts[CONFIG.num_cw][1]  # the common words are strictly more common
        return [w for w, _ in counts[: CONFIG.num_cw]]
    if ex.task == "fwe":
        text = p[p.index("coded words. ") + len("coded words. ") : p.rindex("\nQuestion")]
        counts = collections.Counter(w for w in text.split() if w != "...").most_common()
        assert counts[2][1] > counts[3][1]
        return [w for w, _ in counts[:3]]
    raise AssertionError(ex.task)


TOLERANCE = {"niah_multikey_2": 120, "niah_multikey_3": 120}  # one distractor needle; else one noise sentence or word


@settings(max_examples=20, deadline=None)
@given(task=st.sampled_from(ruler_data.TASK_NAMES), length=st.sampled_from([1200, 1500, 2048, 4096, 5000]),
       seed=st.integers(0, 10**6))
def test_every_task_is_solvable_from_its_context_at_the_target_length(task, length, seed):
    ex = ruler_data.example(task, np.random.default_rng(seed), length, CONFIG)
    assert sorted(solve(ex)) == sorted(ex.references)
    assert ruler.string_match_all(ex.answer, ex.references) == len(ex.references)  # the trained answer scores 1
    size = ruler_data.byte_count(ex)
    assert size <= length  # RULER's rule: prompt and answer fit ...
    assert size >= length - TOLERANCE.get(task, 100)  # ... with the largest haystack that does
    assert ex.answer.endswith(ruler_data.END) and ruler_data.END not in ex.answer[:-1]


def test_prompts_follow_rulers_templates():
    ex = ruler_data.example("niah_single_1", np.random.default_rng(0), 2048, CONFIG)
    assert ex.prompt.startswith("A special magic number is hidden within the following text.")
    assert "\nWhat is the special magic number for " in ex.prompt
    key = re.search(r"for (\S+) mentioned in the provided text\?", ex.prompt).group(1)
    assert ex.prompt.endswith(f"? The special magic number for {key} mentioned in the provided text is")
    assert ex.answer == f" {ex.references[0]}.\n" and re.fullmatch(r"\d{7}", ex.references[0])
    multi = ruler_data.example("niah_multivalue", np.random.default_rng(0), 2048, CONFIG)
    assert multi.prompt.startswith("Some special magic numbers are hidden") and len(multi.references) == 4
    assert multi.prompt.endswith(" mentioned in the provided text are")
    q = ruler_data.example("niah_multiquery", np.random.default_rng(0), 2048, CONFIG)
    assert len(q.references) == 4 and ", and " in q.prompt.rsplit("\n", 1)[-1]
    vt = ruler_data.example("vt", np.random.default_rng(0), 2048, CONFIG)
    assert len(vt.references) == CONFIG.num_hops + 1 and "5 variables are assigned the value" in vt.prompt


def test_distractor_haystack_is_made_of_needles():
    ex = ruler_data.example("niah_multikey_3", np.random.default_rng(1), 4096, CONFIG)
    needles = re.findall(r"One of the special magic uuids for ([0-9a-f-]{36}) is: ([0-9a-f-]{36})\.", ex.prompt)
    assert len(needles) > 10 and len({k for k, _ in needles}) == len(needles)  # every key once: one right answer


def test_generation_is_deterministic_by_seed_and_split_by_hash():
    for task in ("niah_single_1", "vt", "cwe", "fwe"):
        a = ruler_data.generate(task, 3, 1500, "test", 7, CONFIG)
        assert a == ruler_data.generate(task, 3, 1500, "test", 7, CONFIG)
        assert a != ruler_data.generate(task, 3, 1500, "test", 8, CONFIG)
        train = ruler_data.generate(task, 6, 1500, "train", 7, CONFIG)
        for ex, split in [(e, "test") for e in a] + [(e, "train") for e in train]:
            content = json.dumps([task, ex.prompt.rsplit("\n", 1)[-1], sorted(ex.references)])
            assert split_of(content.encode()) == split
        assert not {e.references for e in a} & {e.references for e in train}


def test_string_match_all_is_rulers():
    def ruler_string_match_all(preds, refs):  # RULER's scripts/eval/synthetic/constants.py, as a fraction
        return sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref)
                    for pred, ref in zip(preds, refs, strict=True)]) / len(preds)

    preds = ["The numbers are 1234567 and 7654321.", "ABCDE fghij", "nothing"]
    refs = [["1234567", "7654321", "1111111"], ["abcde", "FGHIJ"], ["x"]]
    ours = sum(ruler.string_match_all(p, r) / len(r) for p, r in zip(preds, refs, strict=True)) / len(preds)
    assert ours == pytest.approx(ruler_string_match_all(preds, refs))


def test_encode_scores_the_answer_or_every_byte_never_the_padding():
    exs = ruler_data.generate("niah_single_1", 2, 1024, "train", 0, CONFIG)
    x, y = ruler.encode(exs, 1024)
    x_all, y_all = ruler.encode(exs, 1024, "all")
    assert torch.equal(x, x_all)
    for i, ex in enumerate(exs):
        scored = (y[i] != IGNORE).nonzero().flatten()
        assert bytes(y[i, scored].tolist()).decode() == ex.answer
        assert bytes(x[i, : len(ex.text)].tolist()).decode() == ex.text and (x[i, len(ex.text):] == 0).all()
        assert bytes(y_all[i, : len(ex.text) - 1].tolist()).decode() == ex.text[1:]
        assert (y_all[i, len(ex.text) - 1 :] == IGNORE).all()


def test_train_batch_mixes_the_tasks():
    task = ruler.Ruler(ruler_data.RulerConfig(tasks=("niah_single_1", "vt", "fwe")))
    x, y = task.train_batch(0, 0, 6, 1024)
    texts = [bytes(r.tolist()).rstrip(b"\0").decode() for r in x]
    assert sum("special magic" in t for t in texts) == 2 and sum("VAR " in t for t in texts) == 2
    assert torch.equal(task.train_batch(0, 0, 6, 1024)[0], x) and not torch.equal(task.train_batch(0, 1, 6, 1024)[0], x)


@pytest.mark.parametrize("variant", ["full", "sliding_window:window=64", "linear"])
def test_greedy_through_the_decoding_state_equals_recomputing(variant):
    from harness.accuracy import build

    torch.manual_seed(0)
    model = build.make_model("tiny", 256, build.parse_variant(variant), build.parse_position("rope", 32), {}, 700, 0)
    prompt = ruler_data.generate("vt", 1, 600, "test", 0, CONFIG)[0].prompt.encode()
    got = ruler.greedy(model, prompt, len(prompt) + 12)
    for m in model.modules():  # the oracle: dense references, no Flex compile for each of the 12 lengths
        if isinstance(m, attn.Attention):
            m.backend = "reference"
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            nxt = int(model(torch.tensor([seq]))[0, -1].argmax())
            if nxt == ord(ruler_data.END):
                break
            seq.append(nxt)
    assert got == bytes(seq[len(prompt):]).decode("utf-8", errors="replace")


def test_bad_config_and_too_short_length():
    with pytest.raises(ValueError, match="unknown task"):
        ruler_data.RulerConfig(tasks=("niah_single_9",))
    with pytest.raises(ValueError, match="too short"):
        ruler.Ruler().check(200, [200])


def test_ruler_job_end_to_end(tmp_path, capsys):
    from harness.analysis.figures import plot_ruler
    from harness.analysis.frames import load_results
    from harness.cli import main
    from harness.results import read_rows

    out = tmp_path / "ruler.jsonl"
    args = ["accuracy", "--task", "ruler", "--subtask", "niah_single_1", "--subtask", "vt", "--variant", "full",
            "--variant", "sliding_window:window=64", "--position", "rope", "--train-len", "640", "--eval-lens", "640,1280",
            "--steps", "3", "--batch-size", "2", "--eval-examples", "2", "--seeds", "0", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    rows = read_rows(out)
    assert {(r["variant"], r["subtask"], r["eval_len"], r["metric"]) for r in rows} == {
        (v, t, L, m) for v in ("full", "sliding_window") for t in ("niah_single_1", "vt") for L in (640, 1280)
        for m in ("string_match", "all_found")}
    assert all(r["status"] == "ok" and 0 <= r["value"] <= 1 and r["n"] == 2 for r in rows)
    fig = plot_ruler(load_results([str(out)]).accuracy, tmp_path / "fig")
    assert (tmp_path / "fig" / "ruler.png").exists() and len(fig.axes) >= 3
    capsys.readouterr()
    assert main([*args[:-2], "--subtask", "nope", "--out", str(tmp_path / "b.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0] and not (tmp_path / "b.jsonl").exists()
