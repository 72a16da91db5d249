"""``attn-bench sweep --scope hf --press``: rows carry the press and what its cache kept (as many tokens as kvpress
promises), a decode step runs against the compressed cache and returns it as it was, a press that cannot run is a
status, bad press input is one line, and without --press the cells are what they were."""
from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("kvpress")

import torch  # noqa: E402

from attn.attention.base import UnsupportedBackend  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.cost.cells import KEY_FIELDS, Cell  # noqa: E402
from harness.cost.scopes.hf import build_hf  # noqa: E402
from harness.cost.spec import build_spec, expand  # noqa: E402
from harness.results import cell_key, read_rows  # noqa: E402

TINY = dict(model_type="llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
FAST = ["--min-run-time", "0.02", "--max-run-time", "0.1", "--retries", "0", "--threads", "1"]
SNAPKV = "snapkv:compression_ratio=0.5"
L = 96


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def cells(tiny_config, **grid):
    return expand(build_spec([("command line", dict(variant=["full"], scope=["hf"], hf_config=[tiny_config],
                                                    lengths=[L], **grid))]))


def one(tiny_config, press: str, mode: str) -> Cell:
    (cell,) = cells(tiny_config, mode=[mode], press=[press])
    return cell


def test_press_cells_carry_the_press_and_cells_without_one_keep_their_keys(tiny_config):
    plain = cells(tiny_config, mode=["forward", "decode"])
    assert {(c.press, c.press_spec, c.press_params, c.compression_ratio) for c in plain} == {(None,) * 4}
    for c in plain:  # a row written before presses existed (no press columns) is the same cell
        old = {k: v for k, v in c.as_row().items() if not k.startswith("press") and k != "compression_ratio"}
        assert cell_key(old, KEY_FIELDS) == c.key()
    pressed = cells(tiny_config, mode=["forward"], press=["none", SNAPKV, "quantized:nbits=4"])
    by = {c.press: c for c in pressed}
    assert by["snapkv"].press_params == {"compression_ratio": 0.5, "window_size": 64, "kernel_size": 5}
    assert (by["snapkv"].compression_ratio, by["none"].compression_ratio) == (0.5, 0.0)
    assert by["quantized"].press_params["nbits"] == 4
    assert len({c.key() for c in [*plain, *pressed]}) == 5


def test_a_forward_press_keeps_what_kvpress_promises_and_counts_no_lm_head(tiny_config):
    torch.manual_seed(0)
    columns = {}
    for press in ("none", SNAPKV, "pyramidkv:compression_ratio=0.5"):
        measured = build_hf(one(tiny_config, press, "forward"))
        measured.fn()
        columns[press] = measured.columns()
    kept = int(L * (1 - 0.5))
    assert [columns[SNAPKV][k] for k in ("kv_tokens_min", "kv_tokens_mean", "kv_tokens_max")] == [kept] * 3
    assert columns["none"]["kv_tokens_mean"] == L
    assert columns["pyramidkv:compression_ratio=0.5"]["kv_tokens_mean"] == kept  # per layer it varies, not in all
    assert columns[SNAPKV]["kv_cache_bytes"] * 2 == columns["none"]["kv_cache_bytes"]


@pytest.mark.parametrize("press", [SNAPKV, "quantized:nbits=4"])
def test_decode_runs_against_the_compressed_cache_and_puts_it_back(tiny_config, press):
    torch.manual_seed(0)
    measured = build_hf(one(tiny_config, press, "decode"))
    kept = [int(layer.keys.shape[-2]) for layer in measured.state.layers] if press == SNAPKV else None
    first = measured.fn()
    for _ in range(3):
        again = measured.fn()
    torch.testing.assert_close(first, again)  # the same step against the same cache every time
    assert measured.state.get_seq_length() == (L // 2 if press == SNAPKV else L)
    if kept is not None:
        assert [int(layer.keys.shape[-2]) for layer in measured.state.layers] == kept == [L // 2] * 2
    torch.manual_seed(0)
    none = build_hf(one(tiny_config, "none", "decode"))
    assert (measured.flops < none.flops) == (press == SNAPKV)  # attention over the kept tokens, not L


def test_a_sweep_records_press_rows_and_refusals(tiny_config, tmp_path, capsys):
    sweep = tmp_path / "s.toml"
    sweep.write_text(f"""scope = "hf"\nhf_config = ["{tiny_config}"]\nlengths = [{L}]\nmode = ["decode"]
[[grid]]\nvariant = ["full"]\npress = ["knorm:compression_ratio=0.5"]
[[grid]]\nvariant = ["sliding_window:window=16"]\npress = ["knorm:compression_ratio=0.5"]
[[grid]]\nvariant = ["full"]\n""")
    out = tmp_path / "p.jsonl"
    rc = main(["sweep", "--config", str(sweep), "--out", str(out), *FAST])
    assert rc == 0, capsys.readouterr().err
    rows = {(r["variant"], r["press_spec"]): r for r in read_rows(out)}
    assert len(rows) == 3
    knorm = rows[("full", "knorm:compression_ratio=0.5")]
    assert knorm["status"] == "ok" and knorm["press"] == "knorm" and knorm["compression_ratio"] == 0.5
    assert knorm["kv_tokens_mean"] == L // 2 and knorm["kv_cache_bytes"] > 0 and knorm["peak_mem_bytes"] is not None
    window = rows[("sliding_window", "knorm:compression_ratio=0.5")]
    assert window["status"] == "unsupported" and "compose with full only" in window["error"]
    plain = rows[("full", None)]
    assert plain["status"] == "ok" and plain["press_params"] is None and "kv_tokens_mean" not in plain


def test_nothing_pruned_runs_with_any_variant(tiny_config):
    (cell,) = expand(build_spec([("command line", dict(
        variant=["sliding_window:window=16"], scope=["hf"], hf_config=[tiny_config], lengths=[L], press=["none"]))]))
    measured = build_hf(cell)
    measured.fn()
    assert measured.columns()["kv_tokens_mean"] == L


@pytest.mark.parametrize("argv, expected", [
    (["--press", "bogus"], "unknown press 'bogus'"),
    (["--press", "snapkv:compression_ratio=2"], "kvpress refuses it"),
    (["--press", "snapkv:ratio=0.5"], "has no parameter"),
    (["--press", "none", "--mode", "train"], "mode train"),
    (["--press", "none", "--scope", "op"], "needs --scope hf"),
    (["--pattern", "own"], "one layer type"),  # llama: no layer types to give specs to
])
def test_bad_press_input_is_one_line_and_exit_2(argv, expected, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    rc = main(["sweep", "--scope", "hf", "--variant", "full", "--lengths", "32", *argv, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()


GEMMA = dict(model_type="gemma3_text", num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=1, head_dim=16, vocab_size=97, sliding_window=8, query_pre_attn_scalar=16,
             layer_types=["sliding_attention", "sliding_attention", "full_attention"], max_position_embeddings=512)


def test_a_model_with_layer_types_is_pressed_on_its_own_pattern(tmp_path):
    """Gemma 3's pattern (``--pattern own``): a press prunes the global layer only, the sliding layers keep their last
    window - 1 keys (what the evaluation's caches hold), each layer's attention is counted as its own variant's, and a
    plain variant with a press is refused with the way to ask for the model's pattern."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA))
    grid = dict(scope=["hf"], hf_config=[str(path)], lengths=[L], mode=["decode"])
    own = {c.press_spec: c for c in expand(build_spec([("command line", dict(pattern=["own"], press=["none", SNAPKV],
                                                                                  **grid))]))}
    assert {(c.variant, c.variant_spec, c.position) for c in own.values()} == {("layers", "own", "checkpoint")}
    torch.manual_seed(0)
    pressed = build_hf(own[SNAPKV])
    assert [int(layer.keys.shape[-2]) for layer in pressed.state.layers] == [7, 7, L // 2]
    first = pressed.fn()
    torch.testing.assert_close(first, pressed.fn())  # the cache put back after each step
    assert pressed.columns()["kv_tokens_max"] == L // 2
    unpressed = build_hf(own["none"])
    assert [int(layer.keys.shape[-2]) for layer in unpressed.state.layers] == [7, 7, L]  # the model's own cache
    (plain,) = expand(build_spec([("command line", dict(variant=["full"], **grid))]))  # every layer global
    assert pressed.flops < unpressed.flops < build_hf(plain).flops
    (refused,) = expand(build_spec([("command line", dict(variant=["full"], press=[SNAPKV], **grid))]))
    with pytest.raises(UnsupportedBackend, match="--pattern own"):
        build_hf(refused)


def test_list_shows_the_presses_or_how_to_install_them(capsys, monkeypatch):
    assert main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["presses"]["snapkv"] == {"compression_ratio": 0.0, "window_size": 64, "kernel_size": 5}
    assert listing["presses_install"] is None and "quantized" in listing["presses"]

    import attn.hf.presses

    monkeypatch.setitem(sys.modules, "kvpress", None)  # what `import kvpress` meets without it
    attn.hf.presses.press_classes.cache_clear()
    try:
        assert main(["list"]) == 0
    finally:
        attn.hf.presses.press_classes.cache_clear()  # the real kvpress again, for the tests after this one
    text = capsys.readouterr().out
    assert f"unavailable: kvpress is not installed ({attn.hf.presses.INSTALL})" in text.split("KV presses")[1]
