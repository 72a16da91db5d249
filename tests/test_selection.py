"""The selection task: full attention's mass on a variant's kept keys, against hand computations, in a trained model and
inside a transformers checkpoint."""
import math

import pytest
import torch

import attn
from harness.accuracy.tasks.selection import selection_measures
from harness.cli import main
from harness.results import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")


def qk(L=40, H=2, Hkv=2, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, H, L, D, generator=g), torch.randn(1, Hkv, L, D, generator=g)


def test_full_attention_and_a_window_wider_than_the_sequence_keep_everything():
    q, k = qk()
    for m in (attn.build_attention("full"), attn.build_attention("sliding_window", window=64)):
        for head in selection_measures(m, q, k):
            assert {n: round(x.value, 6) for n, x in head.items()} == {"mass": 1.0, "mass_tail": 1.0, "recall": 1.0,
                                                                       "kept": 1.0}


def test_a_window_keeps_the_probability_of_its_keys_by_hand():
    q, k = qk(L=30, H=4, Hkv=2, seed=1)
    w = 5
    got = selection_measures(attn.build_attention("sliding_window", window=w), q, k, recall_k=4)
    kk = k.repeat_interleave(2, 1).double()
    for h in range(4):
        mass, kept, recall = [], [], []
        for t in range(30):
            p = torch.softmax(q[0, h, t].double() @ kk[0, h, : t + 1].T / math.sqrt(8), -1)
            mass.append(float(p[max(0, t - w + 1):].sum()))
            kept.append(min(w, t + 1) / (t + 1))
            if t >= 3:
                top = p.topk(4).indices
                recall.append(float((top > t - w).double().mean()))
        assert got[h]["mass"].value == pytest.approx(sum(mass) / 30, abs=1e-6)
        assert got[h]["mass_tail"].value == pytest.approx(sum(mass[-3:]) / 3, abs=1e-6)  # the last eighth: 3 queries
        assert got[h]["kept"].value == pytest.approx(sum(kept) / 30, abs=1e-6)
        assert got[h]["recall"].value == pytest.approx(sum(recall) / len(recall), abs=1e-9)


def test_a_selector_beats_a_window_when_the_mass_sits_on_one_early_block():
    """Keys of block 1 are built to match every query: MoBA routes there, a window cannot reach it."""
    q, k = qk(L=64, H=1, Hkv=1, D=8, seed=2)
    q = q * 0.1
    q[..., 0] = 5.0
    k = k * 0.1
    k[:, :, 8:16, 0] = 5.0
    moba = selection_measures(attn.build_attention("moba", block_size=8, topk=2), q, k)[0]
    window = selection_measures(attn.build_attention("sliding_window", window=16), q, k)[0]
    assert moba["kept"].value <= window["kept"].value  # no larger a budget
    assert moba["mass_tail"].value > 0.9 > 0.5 > window["mass_tail"].value


def test_a_recurrence_has_nothing_to_compare():
    q, k = qk()
    assert selection_measures(attn.build_attention("linear"), q, k) is None


def test_a_trained_model_gets_rows_per_layer_and_head_and_a_recurrence_is_unsupported(tmp_path):
    out = tmp_path / "sel.jsonl"
    assert main(["accuracy", "--task", "selection", "--base-task", "lm", "--variant", "moba:block_size=8,topk=2",
                 "--variant", "linear", "--position", "rope", "--train-len", "32", "--eval-lens", "32", "--steps", "2",
                 "--seeds", "0", "--model", "tiny", "--out", str(out), "--no-progress"]) == 0
    rows = read_rows(out)
    moba = [r for r in rows if r["variant"] == "moba" and r["status"] == "ok"]
    layers, heads = attn.PRESETS["tiny"]["n_layers"], attn.PRESETS["tiny"]["n_heads"]
    trained = {(r["layer"], r["head"], r["metric"]) for r in moba if r["source"] == "trained"}
    assert len(trained) == layers * heads * 4
    assert {(r["head"], r["metric"]) for r in moba if r["source"] == "random"} == {
        (h, f"{n}_random") for h in range(4) for n in ("mass", "mass_tail", "recall", "kept")}
    assert all(0 <= r["value"] <= 1 + 1e-9 for r in moba)
    assert {r["status"] for r in rows if r["variant"] == "linear"} == {"unsupported"}


def test_a_learned_selector_is_also_measured_in_a_model_trained_with_it(tmp_path):
    """DSA's indexer and NSA's compression are trained weights: each gets `own` rows from its own model (DSA's need its
    indexer's inputs: none in full attention's model, so unsupported there); NSA also runs at its initial weights."""
    out = tmp_path / "sel.jsonl"
    assert main(["accuracy", "--task", "selection", "--base-task", "lm", "--variant", "dsa:topk=4,kl_weight=1",
                 "--variant", "nsa:block_len=4,stride=2,select_block=4,topk=2,window=4", "--variant", "moba",
                 "--position", "rope", "--train-len", "32", "--eval-lens", "32", "--steps", "2", "--seeds", "0",
                 "--model", "tiny", "--out", str(out), "--no-progress"]) == 0
    rows = read_rows(out)
    status = {(r["variant"], r["source"]): r["status"] for r in rows}
    assert status == {("dsa", "random"): "unsupported", ("dsa", "trained"): "unsupported", ("dsa", "own"): "ok",
                      ("nsa", "random"): "ok", ("nsa", "trained"): "ok", ("nsa", "own"): "ok",
                      ("moba", "random"): "ok", ("moba", "trained"): "ok"}  # moba trains nothing of its own
    layers, heads = attn.PRESETS["tiny"]["n_layers"], attn.PRESETS["tiny"]["n_heads"]
    kept = [r["value"] for r in rows if (r["variant"], r["metric"]) == ("dsa", "kept_own")]
    assert len(kept) == layers * heads
    want = sum(min(4, t + 1) / (t + 1) for t in range(32)) / 32  # its top 4 of the t + 1 keys each query sees
    assert kept == pytest.approx([want] * len(kept), abs=1e-6)  # a float32 mean


def test_inside_a_checkpoint_full_keeps_all_and_a_window_less(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from attn import hf

    config = hf.tiny_config("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "ckpt")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("".join(f"line {j}: some text {j * j % 97}\n" for j in range(300)))
    out = tmp_path / "sel.jsonl"
    assert main(["accuracy", "--hf-model", str(tmp_path / "ckpt"), "--task", "selection", "--variant", "full",
                 "--variant", "sliding_window:window=16", "--eval-lens", "96", "--out", str(out)]) == 0
    rows = [r for r in read_rows(out) if r["status"] == "ok"]
    assert {(r["variant"], r["layer"]) for r in rows} == {(v, i) for v in ("full", "sliding_window") for i in (0, 1)}
    value = {(r["variant"], r["layer"], r["metric"]): r["value"] for r in rows}
    for layer in (0, 1):
        assert value[("full", layer, "mass_checkpoint")] == pytest.approx(1.0, abs=1e-6)
        assert value[("sliding_window", layer, "kept_checkpoint")] == pytest.approx(
            sum(min(16, t + 1) / (t + 1) for t in range(96)) / 96, abs=1e-6)
        assert value[("sliding_window", layer, "mass_checkpoint")] < 1.0
