"""``attn-bench sweep --scope hf``: a transformers model timed with each variant; shapes, positions and FLOPs
come from the model config, the decode cache returns to its length after each timed step, bad configs are one line."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from harness.cli import main  # noqa: E402
from harness.cost.cells import Cell  # noqa: E402
from harness.cost.scopes.hf import build_hf, hf_flops  # noqa: E402
from harness.cost.spec import build_spec, expand  # noqa: E402
from harness.results import read_rows  # noqa: E402

TINY = dict(model_type="llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
FAST = ["--min-run-time", "0.02", "--max-run-time", "0.1", "--retries", "0"]  # behaviour, not speed: no noise retries


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_cells_take_their_shape_and_position_from_the_config(tiny_config):
    spec = build_spec([("command line", dict(variant=["full", "linear"], scope=["hf"], hf_config=[tiny_config, "llama"],
                                             lengths=[32, 64], mode=["forward", "decode"]))])
    cells = expand(spec)
    assert len(cells) == 2 * 2 * 2 * 2
    tiny = [c for c in cells if c.hf_config == tiny_config]
    assert {(c.num_heads, c.num_kv_heads, c.head_dim, c.layers, c.position) for c in tiny} == {(4, 2, 16, 2, "rope")}
    llama = [c for c in cells if c.hf_config == "llama"]
    assert {(c.num_heads, c.num_kv_heads, c.head_dim, c.layers) for c in llama} == {(8, 2, 64, 4)}


def test_kv_heads_and_a_position_override_reach_the_cells(tiny_config):
    yarn = "rope_yarn:factor=4,original_max_position_embeddings=64"
    spec = build_spec([("command line", dict(variant=["full"], scope=["hf"], hf_config=[tiny_config], lengths=[32],
                                             kv_heads=[4, 1], position=[yarn]))])
    cells = expand(spec)
    assert sorted(str(c.num_kv_heads) for c in cells) == ["1", "None"]  # 4 = as many as the query heads: None
    assert {c.position for c in cells} == {"rope_yarn"}
    assert {c.position_params["factor"] for c in cells} == {4.0}
    for c in cells:  # the model is built with those heads: 4 (multi-head, although the config has 2), and 1
        decode = Cell.from_row({**c.as_row(), "mode": "decode"})
        cache = build_hf(decode).state
        assert cache.layers[0].state.k.shape[1] == decode.kv_heads == (c.num_kv_heads or 4)


def test_a_sweep_writes_ok_rows_whose_flops_follow_the_rule(tiny_config, tmp_path, capsys):
    out = tmp_path / "hf.jsonl"
    rc = main(["sweep", "--scope", "hf", "--hf-config", tiny_config, "--variant", "full", "--variant",
               "sliding_window:window=16", "--lengths", "48", "--mode", "forward,decode", "--out", str(out), *FAST])
    assert rc == 0, capsys.readouterr().err
    rows = read_rows(out)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["backend"] for r in rows if r["variant"] == "full"} == {"sdpa"}
    for r in rows:
        cell = Cell.from_row(r)
        import attn

        m = attn.hf.build_model(attn.hf.load_config(tiny_config), "full")
        assert r["flops"] == hf_flops(m, cell, [attn.build_attention(cell.variant, **cell.variant_params)] * 2)


def test_flops_count_the_lm_head_once_in_forward_and_per_token_in_train(tiny_config):
    import attn

    m = attn.hf.build_model(attn.hf.load_config(tiny_config), "full")
    cell = lambda mode: Cell(variant="full", variant_params={}, backend_requested="auto", position="rope",
                             position_params={}, scope="hf", mode=mode, device="cpu", dtype="float32", batch_size=1,
                             num_heads=4, head_dim=16, seq_len=32, layers=2, num_kv_heads=2, hf_config=tiny_config)
    full = [attn.build_attention("full")] * 2  # each layer's module
    attention = {mode: 2 * full[0].mode_flops(mode, 1, 4, 32, 16) for mode in ("forward", "train", "decode")}
    head = 128 * 64
    body = sum(p.numel() for n, p in m.named_parameters() if n.endswith("proj.weight"))
    assert hf_flops(m, cell("forward"), full) == 2 * (32 * body + head) + attention["forward"]
    assert hf_flops(m, cell("train"), full) == 3 * 2 * 32 * (body + head) + attention["train"]
    assert hf_flops(m, cell("decode"), full) == 2 * (body + head) + attention["decode"]


def test_a_timed_decode_step_leaves_the_cache_at_its_length(tiny_config):
    cell = Cell(variant="full", variant_params={}, backend_requested="auto", position="rope",
                position_params={"head_dim": 16, "rope_theta": 10000.0}, scope="hf", mode="decode", device="cpu",
                dtype="float32", batch_size=1, num_heads=4, head_dim=16, seq_len=40, layers=2, num_kv_heads=2,
                hf_config=tiny_config)
    torch.manual_seed(0)
    measured = build_hf(cell)
    first = measured.fn()
    for _ in range(3):
        again = measured.fn()
    assert measured.state.get_seq_length() == 40
    torch.testing.assert_close(first, again)  # the same step at the same context every time
    assert measured.state.layers[0].state.k.shape[1] == 2  # the layer's KV cache holds the key/value heads


@pytest.mark.parametrize("argv, expected", [
    (["--hf-config", "/nonexistent/config.json"], "neither a preset"),
    (["--hf-config", "gpt5"], "neither a preset"),
    (["--hf-config", "llama", "--bidirectional"], "causal"),
    (["--hf-config", "llama", "--kv-heads", "3"], "must divide"),
])
def test_bad_hf_input_is_one_line_and_exit_2(argv, expected, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    rc = main(["sweep", "--scope", "hf", "--variant", "full", "--lengths", "32", *argv, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()


def test_the_hf_guide_shows_the_tested_transformers_example_and_it_runs():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    example = (root / "examples" / "hf_llama.py").read_text()
    guide = (root / "docs" / "hf.md").read_text()
    assert example.strip() in guide, "docs/hf.md's transformers block must be examples/hf_llama.py"
    p = subprocess.run([sys.executable, str(root / "examples" / "hf_llama.py")], capture_output=True, text=True,
                       timeout=300, cwd=root)
    assert p.returncode == 0, p.stderr
    assert "torch.Size([2, 48]) blocked" in p.stdout
