"""The continuation task: bits per byte of real text read after a compressed context, per arm, on a tiny random
Llama (bytes as tokens). The ``none`` arm (context prefilled, then the continuation teacher-forced against its cache)
equals the plain run (one forward over the whole window): two paths, one number."""
import pytest

from harness.cli import main
from harness.results import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from attn import hf

    config = hf.tiny_config("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def run(checkpoint, out, *extra):
    args = ["accuracy", "--hf-model", str(checkpoint), "--task", "continuation", "--eval-lens", "48,96",
            "--eval-examples", "3", "--continuation", "16", "--out", str(out), *extra]
    assert main(args) == 0
    return read_rows(out)


def test_each_arm_scores_the_same_windows_after_its_own_cache_of_the_context(checkpoint, tmp_path):
    plain = {r["eval_len"]: r for r in run(checkpoint, tmp_path / "plain.jsonl")}
    assert sorted(plain) == [48, 96]
    for r in plain.values():
        assert r["metric"] == "bpb" and r["status"] == "ok" and len(r["per_example"]) == 3 == r["draws"] == r["n"]
        assert (r["metric_kind"], r["metric_role"]) == ("loss", "main") and 4 < r["value"] < 12  # random: ~8 bits
        assert r["ci_low"] < r["value"] < r["ci_high"]
    pytest.importorskip("kvpress")
    rows = run(checkpoint, tmp_path / "pressed.jsonl", "--press", "none", "--press", "knorm", "--press", "oracle",
               "--budget", "1/2")
    for L in (48, 96):
        arm = {r["press"]: r for r in rows if r["eval_len"] == L}
        assert set(arm) == {"none", "knorm", "oracle"} and all(r["status"] == "ok" for r in arm.values())
        assert arm["none"]["per_example"] == pytest.approx(plain[L]["per_example"], rel=1e-4)
        assert arm["knorm"]["kv_tokens_mean"] == pytest.approx(L / 2, abs=1)
        assert arm["knorm"]["per_example"] != pytest.approx(arm["none"]["per_example"], rel=1e-4)  # it lost something


def test_continuation_without_a_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    assert main(["accuracy", "--task", "continuation", "--out", str(tmp_path / "a.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert "continuation reads a pretrained checkpoint's text after a compressed context: give --hf-model" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "a.jsonl").exists()
