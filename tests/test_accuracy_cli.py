"""``attn-bench accuracy``: bad input is one line and exit 2 with the results file untouched; rows, resume."""
import json

import pytest

from harness.accuracy.runner import KEY_FIELDS
from harness.cli import main
from harness.results import ACCURACY_FIELDS, cell_key, read_rows

TINY = ["--steps", "6", "--batch-size", "4", "--no-progress"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def existing(tmp_path):
    """A results file that bad input must leave byte-for-byte as it was."""
    out = tmp_path / "acc.jsonl"
    out.write_text('{"task": "mqar", "value": 1.0}\n')
    return out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "nope"], "'nope' is not one of"),
        (["--task", "mqar", "--variant", "nope"], "unknown attention variant 'nope'"),
        (["--task", "mqar", "--variant", "sliding_window:window=x"], "window must be an int"),
        (["--task", "mqar", "--position", "rope_yarn:factor=0.5"], "factor must be >= 1"),
        (["--task", "mqar", "--train-len", "20", "--num-pairs", "8"], "8 pairs need length >= 32"),
        (["--task", "mqar", "--num-pairs", "2", "--eval-lens", "4"], "2 pairs need length >= 8"),
        (["--task", "mqar", "--train-len", "63"], "length must be even"),
        (["--task", "mqar", "--d-model", "33"], "must be a positive multiple of the 2 heads"),
        (["--task", "passkey", "--eval-lens", "128,60"], "eval length 60 is too short"),
        (["--task", "lm", "--corpus", "/no/such/dir"], "does not exist"),
        (["--task", "lm", "--corpus", "EMPTY"], "no non-empty text files"),
        (["--task", "lm", "--corpus", "SMALL", "--train-len", "16", "--eval-lens", "4096"], "fewer than one evaluation window"),
        (["--task", "mqar", "--depths", "0.5"], "--depths applies to passkey only"),
        (["--task", "passkey", "--keys-per-haystack", "2"], "keys_per_haystack applies to a checkpoint (--hf-model)"),
        (["--task", "passkey", "--chat-template"], "--chat-template applies to --hf-model"),
        (["--task", "fidelity", "--variant", "full"], "at least one other --variant"),
        (["--task", "mqar", "--seeds", "a,b"], "--seeds must be comma-separated integers"),
        (["--task", "mqar", "--model", "huge"], "unknown model preset 'huge'"),
        (["--task", "lengthgen", "--base-task", "fidelity"], "is not one of"),
        ([], "give --task"),
        (["--task", "mqar"], "already holds 1 rows; pass --resume"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_leaves_the_file(args, message, existing, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "small.txt").write_text("a few bytes of text\n" * 3)
    args = [{"EMPTY": str(tmp_path / "empty"), "SMALL": str(tmp_path / "small.txt")}.get(a, a) for a in args]
    before = existing.read_bytes()
    assert main(["accuracy", *args, "--out", str(existing), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert existing.read_bytes() == before
    assert not (tmp_path / ".ckpt").exists()  # nothing trained


def test_mqar_run_writes_schema_rows_and_resume_skips_finished_cells(tmp_path, capsys):
    out = tmp_path / "acc.jsonl"
    args = ["accuracy", "--task", "mqar", "--variant", "full", "--variant", "sliding_window:window=4", "--position", "rope",
            "--train-len", "16", "--eval-lens", "16,32", "--num-pairs", "2", "--vocab-size", "16", "--eval-examples", "8",
            "--seeds", "0,1", "--d-model", "32", "--short-conv", "3", "--out", str(out), *TINY]
    assert main(args) == 0
    rows = read_rows(out)
    cells = {(r["variant"], r["seed"], r["eval_len"], r["metric"]) for r in rows}
    assert len(rows) == len(cells) == 2 * 2 * 2 * 2  # variants x seeds x eval lengths x (accuracy, exact_match)
    for r in rows:
        assert set(ACCURACY_FIELDS) <= set(r) and r["status"] == "ok" and r["metric"] in ("accuracy", "exact_match")
        assert r["task"] == "mqar" and r["train_len"] == 16 and 0 <= r["ci_low"] <= r["value"] <= r["ci_high"] <= 1
        assert r["device_name"] and r["torch_version"] and r["backend"]
        assert r["num_pairs"] == 2 and r["baseline"] == 0.5 and r["chance"] == 1 / 8 and r["n"] == 8
        assert r["d_model"] == 32 and r["short_conv"] == 3 and r["lr"] is not None
        # the decoding state of one layer at the eval length: KV cache (2 x L x 32 floats) or the window (2 x 4 x 32),
        # plus the short convolution's last 2 inputs of the 3 x 32 q/k/v projections
        cache = 2 * (r["eval_len"] if r["variant"] == "full" else 4) * 32
        assert r["state_numbers"] == cache + 2 * 3 * 32 and r["state_bytes"] == 4 * r["state_numbers"]
    assert {r["variant_params"].get("window") for r in rows} == {None, 4}
    assert len(list((tmp_path / ".ckpt").glob("*.pt"))) == 4  # 2 variants x 2 seeds

    # a run killed part-way: drop the last rows, resume writes exactly those back, without training
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:-5]) + '{"torn')
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    err = capsys.readouterr().err
    assert "wrote 5 rows" in err and "  trained" not in err  # a cell cut between its two metrics gets only the missing one
    again = read_rows(out)
    assert sorted(cell_key(r, KEY_FIELDS) for r in again) == sorted(cell_key(r, KEY_FIELDS) for r in rows)
    assert main([*args, "--resume"]) == 0
    assert "wrote 0 rows" in capsys.readouterr().err


def test_lengthgen_scales_rope_per_length_and_shares_the_trained_model(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(8):
        (corpus / f"{i}.txt").write_text(f"document {i} " + "lorem ipsum dolor sit amet " * 40)
    out = tmp_path / "lg.jsonl"
    assert main(["accuracy", "--task", "lengthgen", "--position", "rope", "--position", "rope_linear", "--position",
                 "rope_yarn", "--train-len", "32", "--eval-lens", "32,64,128", "--corpus", str(corpus),
                 "--eval-bytes", "256", "--finetune-steps", "2", "--out", str(out), *TINY]) == 0
    rows = read_rows(out)
    assert {r["task"] for r in rows} == {"lm"} and {r["stage"] for r in rows} == {"zero_shot", "finetune"}
    zero = [r for r in rows if r["stage"] == "zero_shot" and r["metric"] == "bpb"]
    for r in zero:
        if r["position"] != "rope":
            assert r["position_params"]["factor"] == r["eval_len"] / 32
            assert r["position_params"]["original_max_position_embeddings"] == 32
        assert r["trained_as"] == "rope"
    # one trained model for the whole RoPE family: identical at the training length
    at_train = {r["position"]: r["value"] for r in zero if r["eval_len"] == 32}
    assert len(set(at_train.values())) == 1, at_train
    assert len(list((tmp_path / ".ckpt").glob("lm-*.pt"))) == 1 + 3  # base + one fine-tune per method
    tail = [r for r in rows if r["metric"] == "bpb_tail"]
    assert tail and all(r["eval_len"] > 32 for r in tail)
    assert "lm: bpb by evaluation length" in capsys.readouterr().out
    tuned = [r for r in rows if r["stage"] == "finetune"]
    assert {(r["finetune_steps"], r["finetune_len"], r["finetune_lr"]) for r in tuned} == {(2, 64, 3e-3)}
    # a fine-tune at another learning rate is another checkpoint, made from the same trained model
    out2 = tmp_path / "lg2.jsonl"
    assert main(["accuracy", "--task", "lengthgen", "--position", "rope_linear", "--train-len", "32", "--eval-lens", "32,64",
                 "--corpus", str(corpus), "--eval-bytes", "256", "--finetune-steps", "2", "--finetune-lr", "1e-4",
                 "--out", str(out2), "--ckpt-dir", str(tmp_path / ".ckpt"), *TINY]) == 0
    assert len(list((tmp_path / ".ckpt").glob("lm-*.pt"))) == 1 + 3 + 1
    assert {r["finetune_lr"] for r in read_rows(out2) if r["stage"] == "finetune"} == {1e-4}
