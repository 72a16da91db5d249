"""KV budgets (harness/accuracy/budgets.py): parsing, the variants sized to a budget, the frontier's arms through
``attn-bench accuracy --budget`` on a tiny random Llama (rows with budget, kv_bytes, per-example scores), the joined
checkpoint file, and an all-full layer-typed model (Qwen2) planned as a plain one."""
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.accuracy import budgets as B
from harness.accuracy.build import parse_variant
from harness.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("text, label, fraction, tokens", [
    ("1/8", "1/8", Fraction(1, 8), None), ("0.125", "1/8", Fraction(1, 8), None), (" 512 ", "512", None, 512),
    ("2/4", "1/2", Fraction(1, 2), None)])
def test_budgets_parse(text, label, fraction, tokens):
    b = B.parse_budget(text)
    assert (b.text, b.fraction, b.tokens) == (label, fraction, tokens)


@pytest.mark.parametrize("text", ["0", "1.0", "1/0", "-3", "abc", "1.5", "0/8", "", "8/8"])
def test_bad_budgets_are_refused_in_one_line(text):
    with pytest.raises(ValueError, match="--budget"):
        B.parse_budget(text)


def test_a_budget_at_a_length_is_a_press_ratio():
    assert B.parse_budget("1/8").ratio(4096) == 0.875 and B.parse_budget("1/8").kept(4096) == 512
    assert B.parse_budget("512").ratio(8192) == 0.9375 and B.parse_budget("512").kept(8192) == 512
    assert B.parse_budget("512").kept(100) == 100  # never more than the context
    # a budget sizes a parsed press with a number: the spec parsing the ratio would give, its other parameters kept
    from attn.hf.presses import parse_press

    sized = parse_press("retrieval:retriever=dense").at(compression_ratio=B.parse_budget("1/4").ratio(1024))
    assert sized == parse_press("retrieval:retriever=dense,compression_ratio=0.75")
    assert sized.label == "retrieval:retriever=dense,compression_ratio=0.75" and sized.ratio == 0.75
    assert parse_press("oracle").at(compression_ratio=0.5) == parse_press("oracle:compression_ratio=0.5")


@given(tokens=st.integers(1, 1 << 15))
def test_each_sized_variant_attends_to_the_budget(tokens):
    """The window, window + sinks, block-sparse band, MoBA's blocks and Quest's pages hold exactly ``tokens`` keys per
    query, or are refused (None) where their unit does not fit."""
    keys = {
        "sliding_window": lambda p: p["window"],
        "sinks": lambda p: p["window"] + p["sinks"],
        "block_sparse": lambda p: p["block_size"] * (p["local_blocks"] + p["global_blocks"]),
        "moba": lambda p: p["block_size"] * p["topk"],
        "quest": lambda p: p["token_budget"],
    }
    unit = {"block_sparse": B.BLOCK, "moba": B.BLOCK, "quest": B.PAGE}
    for family, count in keys.items():
        got = B.sized(family, tokens)
        if got is None:
            assert tokens < 2 * unit.get(family, 3)
            continue
        spec, n = got
        assert count(dict(parse_variant(spec).params)) == n
        assert n == tokens - tokens % unit.get(family, 1)  # whole blocks or pages: the budget rounded down to them


def test_takes_budget():
    assert B.takes_budget("snapkv") and B.takes_budget("oracle") and B.takes_budget("streaming_llm:n_sink=8")
    assert not B.takes_budget("snapkv:compression_ratio=0.5") and not B.takes_budget("none")
    assert not B.takes_budget("quantized:nbits=2")


pytest.importorskip("kvpress")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    from attn import hf

    config = hf.tiny_config("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=1024, initializer_range=0.2)
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("budgets")
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "ckpt")
    return root / "ckpt"


def test_budget_arms_through_the_command(checkpoint, tmp_path):
    """Each press without a ratio at each budget, the oracle reading its share of the cache, the sized window at each
    budget with its computed bytes (= the none arm's measured bytes per context token x its keys); every row carries
    its examples' scores."""
    from harness.results import read_rows

    out = tmp_path / "f.jsonl"
    args = ["accuracy", "--hf-model", str(checkpoint), "--task", "passkey", "--eval-lens", "512", "--eval-examples", "3",
            "--depths", "0.5", "--press", "none", "--press", "oracle", "--press", "snapkv", "--budget", "1/4",
            "--budget", "64", "--sized", "sliding_window", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    rows = read_rows(out)
    assert all(r["status"] == "ok" and len(r["per_example"]) == r["n"] == 3 for r in rows)
    assert all(r["value"] == sum(r["per_example"]) / 3 for r in rows)
    by = {(r.get("press_spec") or r["variant_spec"]): r for r in rows}
    assert set(by) == {"none", "oracle:compression_ratio=0.75", "snapkv:compression_ratio=0.75",
                       "oracle:compression_ratio=0.875", "snapkv:compression_ratio=0.875",
                       "sliding_window:window=128,backend=blocked", "sliding_window:window=64,backend=blocked"}
    none = by["none"]
    assert "budget" not in none and none["kv_bytes"] == none["kv_cache_bytes"]
    per_token = none["kv_bytes"] / none["context_tokens"]
    oracle, snap = by["oracle:compression_ratio=0.875"], by["snapkv:compression_ratio=0.875"]
    assert oracle["budget"] == snap["budget"] == "64" and oracle["budget_fraction"] == 0.125
    assert oracle["kv_tokens_mean"] == snap["kv_tokens_mean"] and oracle["kv_bytes"] == pytest.approx(snap["kv_bytes"])
    assert 0 < oracle["attention_mass_kept"] <= 1
    window = by["sliding_window:window=128,backend=blocked"]
    assert window["budget"] == "1/4" and window["kv_bytes"] == 128 * per_token and window["kv_tokens_mean"] == 128
    assert main([*args, "--resume"]) == 0 and len(read_rows(out)) == len(rows)


def test_sized_variants_in_the_machines_dtype_get_their_bytes_in_it(checkpoint):
    """``--dtype auto`` (every checkpoint preset's) is resolved before a sized variant's bytes are computed in it."""
    from harness.accuracy.pretrained import check_dtype

    plan = B.plan(checkpoint, ["passkey"], [], [], [512], presses=["none"], dtype="auto", budgets=["1/4"],
                  families=["sliding_window"])
    sized = [dict(s.columns) for s in plan.settings if s.columns]
    per_token = B.kv_bytes_per_token(plan.ckpt.config, check_dtype("auto"))
    assert plan.dtype == check_dtype("auto") and [c["kv_bytes"] for c in sized] == [128 * per_token]


def test_query_aware_presses_at_a_budget(checkpoint, tmp_path):
    from harness.results import read_rows

    out = tmp_path / "qa.jsonl"
    assert main(["accuracy", "--hf-model", str(checkpoint), "--task", "passkey", "--eval-lens", "512", "--eval-examples",
                 "2", "--depths", "0.5", "--press", "snapkv", "--budget", "1/4", "--query-aware", "--no-progress",
                 "--out", str(out)]) == 0
    (row,) = read_rows(out)
    assert row["status"] == "ok" and row["query_aware"] is True and row["budget"] == "1/4"
    assert row["press_spec"] == "snapkv:compression_ratio=0.75" and row["run_id"].endswith("|query_aware")


@pytest.mark.parametrize("args, message", [
    (["--budget", "1/8", "--press", "none"], "--budget sizes presses that take a compression_ratio"),
    (["--budget", "2", "--budget", "1/0", "--press", "snapkv"], "--budget '1/0'"),
    (["--sized", "moba", "--press", "snapkv"], "--sized needs --budget"),
    (["--budget", "1/8", "--press", "snapkv", "--variant", "moba"], "presses compose with full only"),
    (["--budget", "1/8", "--press", "snapkv", "--sized", "moba", "--variant", "full", "--variant", "moba"],
     "at most one --variant"),
    (["--budget", "1/8", "--press", "oracle", "--task", "lm"], "--task lm scores every position"),
    (["--press", "oracle:compression_ratio=1.0"], "press oracle:compression_ratio=1.0: oracle: compression_ratio"),
])
def test_bad_budgets_exit_2_with_one_line(args, message, checkpoint, tmp_path, capsys):
    out = tmp_path / "acc.jsonl"
    base = ["accuracy", "--hf-model", str(checkpoint), "--eval-lens", "512"]
    assert main([*base, *(["--task", "passkey"] if "--task" not in args else []), *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not out.exists()


def test_parts_join_into_one_checked_gguf(tmp_path):
    from attn.checkpoints import join_parts

    head = b"GGUF" + (3).to_bytes(4, "little")
    parts = [tmp_path / "a", tmp_path / "b"]
    parts[0].write_bytes(head + b"x" * 10)
    parts[1].write_bytes(b"y" * 6)
    out = join_parts(parts, tmp_path / "m" / "model.gguf", 24)
    assert out.read_bytes() == head + b"x" * 10 + b"y" * 6
    stamp = out.stat().st_mtime_ns
    assert join_parts(parts, out, 24) == out and out.stat().st_mtime_ns == stamp  # joined once
    with pytest.raises(ValueError, match="hold 24 bytes, not the 25"):
        join_parts(parts, tmp_path / "other.gguf", 25)
    parts[0].write_bytes(b"GGML" + head[4:] + b"x" * 10)
    with pytest.raises(ValueError, match="not a GGUF v3 file"):
        join_parts(parts, tmp_path / "bad.gguf", 24)
    assert not list(tmp_path.glob("*.part*"))  # no half-written file left behind


def test_an_all_full_layer_typed_model_is_planned_as_a_plain_one():
    """Qwen2's config lists a layer type per layer, all full attention: no pattern to keep, so presses run on it."""
    from attn import hf
    from attn.hf.layers import layer_plan

    config = hf.tiny_config("qwen2", layer_types=["full_attention"] * 2, num_hidden_layers=2)
    assert layer_plan(config, None) is None
    mixed = hf.tiny_config("qwen2", layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2,
                           sliding_window=64, use_sliding_window=True)
    assert layer_plan(mixed, None) is not None
