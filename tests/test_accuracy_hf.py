"""``attn-bench accuracy --hf-model``: a saved tiny random Llama (no tokenizer: byte ids) evaluated per variant,
position and length; bits per byte equal a plain computation with transformers' own sdpa attention."""
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("transformers")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from attn import hf  # noqa: E402
from harness.accuracy.tasks.lm import load_corpus  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.results import ACCURACY_FIELDS, read_rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LENS = (256, 512)  # the checkpoint was trained at 128: both lengths lie beyond it
EVAL_BYTES = 1500
VARIANTS = ("full", "sliding_window:window=32")
POSITIONS = ("checkpoint", "rope_yarn:factor=4")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random Llama saved without a tokenizer, and a two-file corpus with multi-byte characters."""
    root = tmp_path_factory.mktemp("hf")
    config = hf.tiny_config("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
                            initializer_range=0.2)  # sharp enough attention that positions matter
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "ckpt")
    corpus = root / "corpus"
    corpus.mkdir()
    for i, word in enumerate(["naïve café", "日本語 text"]):
        (corpus / f"doc{i}.txt").write_text("".join(f"line {j}: {word} {j * j % 97}\n" for j in range(400)))
    return root / "ckpt", corpus


def run(ckpt, corpus, out, *extra):
    args = ["accuracy", "--hf-model", str(ckpt), "--eval-lens", ",".join(map(str, LENS)), "--corpus", str(corpus),
            "--eval-bytes", str(EVAL_BYTES), "--eval-examples", "2", "--depths", "0.5", "--out", str(out), *extra]
    for v in VARIANTS:
        args += ["--variant", v]
    for p in POSITIONS:
        args += ["--position", p]
    return main(args)


def plain_bpb(ckpt, corpus, eval_len: int) -> tuple[float, float]:
    """(bits per byte, perplexity) as the module docstring defines them, with transformers' sdpa, one window at a time."""
    model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="sdpa", dtype=torch.float32).eval()
    text = load_corpus((str(corpus),), 0.1).test[:EVAL_BYTES].tobytes().decode("utf-8", "replace")
    ids, scored = [], []
    for doc in filter(None, text.split("\x00")):
        ids += [0, *doc.encode()]
        scored += [False] + [True] * len(doc.encode())
    ids, scored = torch.tensor(ids), torch.tensor(scored)
    bits = 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, eval_len):
            x, y = ids[start : start + eval_len], ids[start + 1 : start + eval_len + 1]
            nll = F.cross_entropy(model(x[None]).logits[0, : len(y)], y, reduction="none") / math.log(2)
            bits += float(nll[scored[start + 1 : start + eval_len + 1]].sum())
    num_bytes = sum(len(d.encode()) for d in text.split("\x00"))
    return bits / num_bytes, 2 ** (bits / int(scored[1:].sum()))


@pytest.fixture(scope="module")
def rows(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "acc.jsonl"
    assert run(*checkpoint, out, "--no-progress") == 0
    return out, read_rows(out)


def test_rows_for_every_variant_position_length_and_metric(rows, checkpoint):
    _, got = rows
    want = {("lm", v, p, L, m) for v in VARIANTS for p in POSITIONS for L in LENS for m in ("bpb", "perplexity")}
    want |= {("passkey", v, p, L, "exact_match") for v in VARIANTS for p in POSITIONS for L in LENS}
    assert sorted((r["task"], r["variant_spec"], r["position_spec"], r["eval_len"], r["metric"]) for r in got) == sorted(want)
    for r in got:
        assert set(ACCURACY_FIELDS) <= set(r) and r["status"] == "ok", r
        assert math.isfinite(r["value"]) and r["train_len"] == 128 and r["model"] == str(checkpoint[0])
        assert r["tokenizer"] == "bytes" and "bytes" in r["note"]
        if r["metric"] != "exact_match":
            assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["n"] == math.ceil(r["scored_tokens"] / r["eval_len"])
        else:  # passkey: two examples, each in a haystack of its own
            assert r["draws"] == r["n"] == 2
        assert r["chat_template"] is False and not r["run_id"].endswith("|chat")
    yarn = [r for r in got if r["position_spec"] == "rope_yarn:factor=4"]
    assert {r["position"] for r in yarn} == {"rope_yarn"}
    assert {r["position_params"]["factor"] for r in yarn} == {4.0}
    assert {r["position_params"]["original_max_position_embeddings"] for r in yarn} == {128}
    assert {r["position"] for r in got if r["position_spec"] == "checkpoint"} == {"rope"}


def test_full_bits_per_byte_equal_a_plain_sdpa_computation_and_override_changes_them(rows, checkpoint):
    _, got = rows

    def value(variant, position, L, metric):
        (r,) = [r for r in got if (r["task"], r["variant_spec"], r["position_spec"], r["eval_len"], r["metric"])
                == ("lm", variant, position, L, metric)]
        return r["value"]

    for L in LENS:
        bpb, ppl = plain_bpb(checkpoint[0], checkpoint[1], L)
        assert value("full", "checkpoint", L, "bpb") == pytest.approx(bpb, abs=1e-4)
        assert value("full", "checkpoint", L, "perplexity") == pytest.approx(ppl, rel=1e-4)
        assert abs(value("full", "rope_yarn:factor=4", L, "bpb") - bpb) > 1e-3
    assert value("full", "checkpoint", 512, "bpb") != value("sliding_window:window=32", "checkpoint", 512, "bpb")


def test_resume_skips_finished_cells_and_a_full_file_needs_resume(rows, checkpoint, capsys):
    out, got = rows
    capsys.readouterr()
    assert run(*checkpoint, out, "--no-progress") == 2
    assert "pass --resume" in capsys.readouterr().err
    assert run(*checkpoint, out, "--resume") == 0
    assert f"wrote 0 rows to {out}" in capsys.readouterr().err
    assert len(read_rows(out)) == len(got)


@pytest.mark.parametrize("args, message", [
    (["--hf-model", "NOPE"], "is not an existing directory with a config.json"),
    (["--hf-model", "CKPT", "--task", "mqar"], "--task mqar trains a model"),
    (["--hf-model", "CKPT", "--steps", "5"], "--steps does not apply to --hf-model"),
    (["--hf-model", "CKPT", "--task", "passkey", "--eval-lens", "64"], "eval length 64 is too short"),
    (["--hf-model", "CKPT", "--position", "rope_yarn:factor=0.5"], "factor"),
    (["--hf-model", "CKPT", "--variant", "nope"], "unknown attention variant 'nope'"),
    (["--hf-model", "CKPT", "--task", "passkey", "--chat-template"], "has no tokenizer, so no chat template"),
    (["--hf-model", "CKPT", "--task", "lm", "--chat-template"], "--chat-template puts a prompt in the model's chat turns"),
    (["--hf-model", "CKPT", "--task", "passkey", "--keys-per-haystack", "3"], "keys_per_haystack must divide"),
])
def test_bad_input_exits_2_with_one_line_and_no_file(args, message, checkpoint, tmp_path, capsys):
    out = tmp_path / "sub" / "acc.jsonl"
    args = [{"NOPE": str(tmp_path / "nope"), "CKPT": str(checkpoint[0])}.get(a, a) for a in args]
    assert main(["accuracy", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists() and not out.parent.exists()


def test_rows_are_json_lines(rows):
    out, got = rows
    assert [json.loads(line) for line in out.read_text().splitlines()] == got


@given(st.text(alphabet="0123456789 .:a\n", max_size=30), st.integers(0, 30))
def test_a_passkey_answer_settled_early_scores_as_the_whole_answer(text, cut):
    """Decoding stops once ``key_said``: whatever follows cannot change the key read from the answer."""
    from harness.accuracy.tasks.passkey import key_said, said_key

    head = text[:cut]
    if key_said(head):
        assert said_key(head) == said_key(text)


def test_each_passkey_example_of_a_cell_sits_in_a_haystack_of_its_own():
    """One key per haystack: two examples of one cell never share their filler (the needle removed, the prompts differ),
    so a cell of n examples is n independent draws; ``keys_per_haystack=k`` is k keys in one drawn haystack."""
    from harness.accuracy.checkpoint import byte_tokens
    from harness.accuracy.tasks.passkey import KEY_SENTENCE, OnCheckpoint, PasskeyConfig, passkey_examples

    tokens = byte_tokens()

    def haystacks(config, depth):
        prompts, keys = passkey_examples(tokens, config, 600, depth)
        assert all(len(p) == 600 for p in prompts) and len(set(keys)) == len(keys)
        out = []
        for p, key in zip(prompts, keys, strict=True):
            needle = tokens.encode(KEY_SENTENCE.format(key=key))
            at = next(i for i in range(len(p)) if p[i : i + len(needle)] == needle)
            out.append(tuple(p[:at] + p[at + len(needle):]))
        return out

    for depth in (0.0, 0.5, 1.0):
        assert len(set(haystacks(PasskeyConfig(eval_examples=6), depth))) == 6
        shared = haystacks(PasskeyConfig(eval_examples=6, keys_per_haystack=3), depth)
        assert shared[0] == shared[1] == shared[2] != shared[3] == shared[4] == shared[5]
    assert passkey_examples(tokens, PasskeyConfig(eval_examples=6), 600, 0.5) == passkey_examples(
        tokens, PasskeyConfig(eval_examples=6), 600, 0.5)  # drawn from the seed
    (cell, _), = OnCheckpoint.cells(PasskeyConfig(eval_examples=6, keys_per_haystack=3, depths=(0.5,)), [600], None)
    assert cell == {"eval_len": 600, "depth": 0.5, "draws": 2}


def test_a_chat_template_wraps_the_user_message_and_opens_the_answer():
    """Without a template a prompt is the boundary token and one text; with one, the template's ids around the user's
    message, the answer's prefix after the assistant's turn opens."""
    import dataclasses

    from harness.accuracy.checkpoint import byte_tokens

    plain = byte_tokens()
    assert plain.opening == [plain.boundary]
    assert plain.ask("Q?", " A is") == list(b"Q? A is")
    chat = dataclasses.replace(plain, chat=(tuple(b"<u>"), tuple(b"</u><a>")))
    assert chat.opening == list(b"<u>")
    assert chat.ask("Q?", " A is") == list(b"Q?</u><a>A is")
