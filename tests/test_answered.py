"""A cell cut short resumes from its next prompt (harness/accuracy/answered.py): the prompts answered before the cut
are read back, not answered again, and the rows are those of a run never cut."""
from __future__ import annotations

import pytest
import torch

from attn import hf
from harness.accuracy import pretrained
from harness.accuracy.answered import Answered, answers_path
from harness.accuracy.prefill import SharedPrefill
from harness.results import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")
PRESSES = ["none", "streaming_llm:compression_ratio=0.5"]
SAME = ("value", "ci_low", "ci_high", "n", "per_example", "kv_tokens_mean", "kv_cache_bytes", "context_tokens")


class Cut(BaseException):
    """The run is stopped (a session's end): not a failure a cell records."""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("answered") / "ckpt"
    config = hf.tiny_config("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def plan(ckpt):
    from harness.accuracy.tasks import get_checkpoint_task

    passkey = get_checkpoint_task("passkey").config({"depths": (0.5,), "eval_examples": 3})
    return pretrained.plan(ckpt, ("passkey",), ["full"], ["checkpoint"], [300], {"passkey": passkey}, PRESSES)


def test_a_cut_cell_resumes_from_its_next_prompt_with_the_rows_of_a_run_never_cut(ckpt, tmp_path, monkeypatch):
    pytest.importorskip("kvpress")
    whole = tmp_path / "whole.jsonl"
    pretrained.run([plan(ckpt)], whole, False, echo=lambda s: None)
    assert not answers_path(whole).exists()  # a finished cell keeps no answers

    answered, real = [], SharedPrefill._answers

    def counted(self, *a, **kw):
        if len(answered) == 2:
            raise Cut
        answered.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(SharedPrefill, "_answers", counted)
    out = tmp_path / "cut.jsonl"
    with pytest.raises(Cut):
        pretrained.run([plan(ckpt)], out, False, echo=lambda s: None)
    assert not read_rows(out) and len(answers_path(out).read_text().splitlines()) == 2

    answered.clear()
    pretrained.run([plan(ckpt)], out, True, echo=lambda s: None)
    assert len(answered) == 1  # the third prompt alone
    got, expected = read_rows(out), read_rows(whole)
    assert len(got) == len(expected) >= len(PRESSES)
    for g, e in zip(sorted(got, key=lambda r: (r["run_id"], r["metric"])),
                    sorted(expected, key=lambda r: (r["run_id"], r["metric"])), strict=True):
        assert {c: g.get(c) for c in SAME} == {c: e.get(c) for c in SAME}
        assert g["prompts_resumed"] == 2 and "prompts_resumed" not in e
    assert not answers_path(out).exists()

    # a new run of a file with cut cells must say whether it continues them
    from harness.cli import main

    answers_path(out).write_text("")
    assert main(["accuracy", "--hf-model", str(ckpt), "--task", "passkey", "--out", str(out)]) == 2


def test_bits_are_read_back_as_they_were_scored(ckpt, tmp_path):
    """The continuation task's bits per token: a recalled prompt gives the same tensors and statistics, and the model
    is never run for it."""
    pytest.importorskip("kvpress")
    from attn.hf.presses import parse_press

    model = hf.load_model(ckpt, "full")
    prompt = torch.randint(0, 256, (90,), generator=torch.Generator().manual_seed(1)).tolist()
    store = Answered(tmp_path / "a.answers")
    first = SharedPrefill([parse_press(p) for p in PRESSES])
    first.answered, first.scope = store, "cell"
    scored = first.bits(model, prompt, 60)
    again = SharedPrefill([parse_press(p) for p in PRESSES])
    again.answered, again.scope = Answered(tmp_path / "a.answers"), "cell"
    recalled = again.bits(None, prompt, 60)  # no model: it must not be asked
    assert scored.keys() == recalled.keys() and all(torch.equal(scored[a], recalled[a]) for a in scored)
    assert again.resumed == 1 and again.take_stats(PRESSES[1]) == first.take_stats(PRESSES[1])
    again.answered.drop("cell")
    assert not (tmp_path / "a.answers").exists()


def test_a_refusal_is_kept_with_the_answers_and_refused_again_on_resume(ckpt, tmp_path):
    """A press that refuses the model (``unsupported``) leaves the other arms' answers resumable, and a resumed cell
    records the same refusal without asking the model; an arm that failed otherwise keeps nothing (it runs again)."""
    pytest.importorskip("kvpress")
    from attn.attention.base import UnsupportedBackend
    from attn.hf.presses import parse_press

    def refuses(*a, **kw):
        raise NotImplementedError("needs eager attention")

    model = hf.load_model(ckpt, "full")
    prompt = torch.randint(0, 256, (90,), generator=torch.Generator().manual_seed(2)).tolist()
    first = SharedPrefill([parse_press(p) for p in PRESSES])
    first.answered, first.scope = Answered(tmp_path / "a.answers"), "cell"
    first.members[1].branch = refuses
    scored = first.bits(model, prompt, 60)
    assert list(scored) == [PRESSES[0]] and isinstance(first.failed[PRESSES[1]], UnsupportedBackend)
    again = SharedPrefill([parse_press(p) for p in PRESSES])
    again.answered, again.scope = Answered(tmp_path / "a.answers"), "cell"
    recalled = again.bits(None, prompt, 60)  # no model: it must not be asked
    assert torch.equal(recalled[PRESSES[0]], scored[PRESSES[0]]) and PRESSES[1] not in recalled
    assert str(again.failed[PRESSES[1]]) == str(first.failed[PRESSES[1]])

    def breaks(*a, **kw):
        raise RuntimeError("could not create a primitive")

    other = SharedPrefill([parse_press(p) for p in PRESSES])
    other.answered, other.scope = Answered(tmp_path / "b.answers"), "cell"
    other.members[1].branch = breaks
    other.bits(model, prompt, 60)
    assert not (tmp_path / "b.answers").exists()
