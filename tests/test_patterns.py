"""Layer patterns (attn/patterns.py): parsing and its errors, each layer of the backbone running its own spec and
state, decoding a hybrid equal to one forward, and the pattern as a sweep and accuracy axis."""
import json

import pytest
import torch
from definitions import prefill_then_steps

import attn
from attn.patterns import PATTERNS, parse_pattern
from harness.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_units_repeat_fold_and_name():
    p = parse_pattern("sliding_window:window=512,sinks=4*3; full")
    assert p.unit == ("sliding_window:window=512,sinks=4",) * 3 + ("full",)
    assert p.text == "sliding_window:window=512,sinks=4*3; full" and p.label == p.text
    assert parse_pattern(["full", "gated_deltanet"]).text == "full; gated_deltanet"
    g = parse_pattern("gemma3")
    assert g.label == "gemma3" and g.unit == parse_pattern(PATTERNS["gemma3"]).unit and len(g.unit) == 6
    # a depth that is not a multiple of the unit cuts the last unit (Gemma 3 1B: 26 layers)
    layers = g.layers(8)
    assert layers[5] == "full" and layers[:5] == layers[6:] + ["sliding_window:window=512"] * 3
    assert parse_pattern("qwen3-next").full_fraction() == 0.25


@pytest.mark.parametrize("text, message", [
    ("", "empty layer pattern"),
    ("full;;full", "an empty layer"),
    ("gemma4", "named patterns: gemma3"),
    ("full; nope:x=1", "nope"),
    ("sliding_window:windw=4", "windw"),
])
def test_bad_patterns_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_pattern(text)
    with pytest.raises(ValueError, match="must be at least that"):
        parse_pattern("full*3; linear").layers(2)


def test_each_layer_runs_its_spec_and_a_hybrid_decodes_as_one_forward():
    torch.manual_seed(0)
    pattern = "gated_deltanet; sliding_window:window=4,backend=blocked; mla; full"
    config = attn.TransformerConfig.preset("tiny", n_layers=4, layers=pattern, position="rope")
    model = attn.Transformer(config).eval()
    assert [b.attn.attn.name for b in model.blocks] == ["gated_deltanet", "sliding_window", "mla", "full"]
    assert model.blocks[1].attn.attn.backend == "blocked" and model.blocks[1].attn.attn.config.window == 4
    assert "gk" not in model.blocks[3].attn.inputs and set(model.blocks[0].attn.inputs) == {"g", "beta"}
    steps, full, state = prefill_then_steps(model, length=13, prefill=5)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    kinds = [type(s).__name__ for s in state.layers]
    assert kinds[0] == "MatrixState" and kinds[2] == "LatentCache" and kinds[3] == "KVCache" and kinds[1] != "KVCache"


def test_the_default_is_one_variant_everywhere():
    config = attn.TransformerConfig(attention="linear", n_layers=3)
    assert config.layer_specs() == [("linear", {}, "auto")] * 3


def run(argv, capsys):
    rc = main(argv)
    return rc or 0, capsys.readouterr().err


FAST = ["--heads", "2", "--head-dim", "8", "--min-run-time", "0.02", "--max-run-time", "0.1", "--retries", "0"]


def test_sweep_pattern_rows_say_the_pattern_count_each_layer_and_sum_the_states(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    rc, err = run(["sweep", "--scope", "model", "--layers", "4", "--pattern", "qwen3-next", "--variant", "full",
                   "--variant", "gated_deltanet", "--mode", "forward,decode", "--lengths", "32", *FAST, "--out", str(out)],
                  capsys)
    assert rc == 0, err
    rows = {(r["variant_spec"], r["mode"]): r for r in map(json.loads, out.read_text().splitlines())}
    hybrid = rows["qwen3-next", "decode"]
    assert hybrid["status"] == "ok" and hybrid["variant"] == "layers"
    assert hybrid["variant_params"] == {"pattern": "gated_deltanet*3; full"} and hybrid["layers"] == 4
    # 3 recurrent states and 1 KV cache: a quarter of full's cache plus three quarters of gated_deltanet's states
    full, gdn = rows["full", "decode"]["state_bytes"], rows["gated_deltanet", "decode"]["state_bytes"]
    assert hybrid["state_bytes"] == full // 4 + 3 * gdn // 4
    for mode in ("forward", "decode"):
        expected = (rows["full", mode]["flops"] + 3 * rows["gated_deltanet", mode]["flops"]) / 4
        assert rows["qwen3-next", mode]["flops"] == pytest.approx(expected, rel=1e-3)  # the gates' projections differ


def test_pattern_needs_the_model_scope_and_a_whole_unit(tmp_path, capsys):
    rc, err = run(["sweep", "--pattern", "qwen3-next", "--out", str(tmp_path / "x.jsonl")], capsys)
    assert rc == 2 and "--scope model" in err and not (tmp_path / "x.jsonl").exists()
    rc, err = run(["sweep", "--scope", "model", "--pattern", "gemma3", "--out", str(tmp_path / "x.jsonl")], capsys)
    assert rc == 2 and "n_layers (2) must be at least that" in err


def test_accuracy_takes_patterns_at_a_depth(tmp_path, capsys):
    rc, err = run(["accuracy", "--task", "mqar", "--pattern", "gated_deltanet; full", "--pattern", "full",
                   "--n-layers", "2", "--dry-run"], capsys)
    assert rc == 0 and "2 runs (2 trained models)" in err, err
    rc, err = run(["accuracy", "--task", "mqar", "--pattern", "qwen3-next", "--n-layers", "2", "--dry-run"], capsys)
    assert rc == 2 and "must be at least that" in err
