"""Presses and the oracle on a model with sliding layers (a tiny random Gemma 3, attn/hf/layers.py `window_layers`):
kvpress's rule -- the global layers pressed, the sliding ones left to their window -- with the sliding layers' caches
holding only what the window reads, and every arm answering as the plain model does when nothing is pruned."""
import types

import pytest
import torch

pytest.importorskip("kvpress")

from transformers import Gemma3TextConfig, GenerationConfig  # noqa: E402

from attn import hf  # noqa: E402
from attn.hf import oracle as O  # noqa: E402
from attn.hf import presses  # noqa: E402
from attn.hf.layers import window_layers  # noqa: E402
from harness.accuracy.prefill import SharedPrefill  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW, CONTEXT, QUESTION = 8, 40, 5


def tiny():
    config = Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              max_position_embeddings=256, query_pre_attn_scalar=16, initializer_range=0.2)
    torch.manual_seed(0)
    return hf.build_model(config, "own")


PROMPT = torch.randint(1, 97, (CONTEXT + QUESTION,), generator=torch.Generator().manual_seed(3)).tolist()
GEN = GenerationConfig(max_new_tokens=6, min_new_tokens=6)


def test_unpruned_arms_answer_as_the_plain_model_and_presses_leave_the_window_layers():
    model = tiny()
    assert window_layers(model.config) == {0: WINDOW, 1: WINDOW}
    plain = SharedPrefill().answers(model, PROMPT, CONTEXT, GEN)[None]
    pressed = ("snapkv:compression_ratio=0.5,window_size=8", "oracle:compression_ratio=0.5",
               "expected_attention:compression_ratio=0.5,n_future_positions=4")  # the last rotates by the layer's RoPE
    specs = [presses.parse_press(s) for s in ("none", "oracle:compression_ratio=0.0", *pressed)]
    arms = SharedPrefill(specs)
    said = arms.answers(model, PROMPT, CONTEXT, GEN)
    assert not arms.failed, arms.failed
    assert said["none"] == plain and said["oracle:compression_ratio=0.0"] == plain
    kept = CONTEXT // 2
    for label in pressed:
        stats = arms.take_stats(label)  # the window layers hold window - 1 keys, the global one its budget
        assert (stats["kv_tokens_min"], stats["kv_tokens_max"]) == (WINDOW - 1, kept), label
        assert stats["kv_tokens_mean"] == pytest.approx((2 * (WINDOW - 1) + kept) / 3)
    none = arms.take_stats("none")
    assert (none["kv_tokens_min"], none["kv_tokens_max"]) == (WINDOW - 1, CONTEXT)
    per_token = none["kv_cache_bytes"] / (2 * (WINDOW - 1) + CONTEXT)  # every layer: one KV head of 16
    assert per_token == 2 * 16 * 4


def test_the_oracle_keeps_a_window_layer_whole_and_prunes_a_global_one():
    """One call each way under an oracle that keeps a tenth of the context: a window layer (transformers passes
    ``sliding_window``) attends over exactly its window, unpruned; a global layer over the top tenth only."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (2, 30, 30))
    oracle = O.Oracle(0.9)
    O._ACTIVE.append(oracle)
    try:
        windowed, _ = O.attention(types.SimpleNamespace(layer_idx=0), q, k, v, None, sliding_window=WINDOW)
        pruned, _ = O.attention(types.SimpleNamespace(layer_idx=2), q, k, v, None)
    finally:
        O._ACTIVE.remove(oracle)
    rows = torch.arange(2)[:, None] + 28
    cols = torch.arange(30)[None]
    scores = (q @ k.transpose(-1, -2)) * 8 ** -0.5
    want = torch.softmax(scores.masked_fill(~((cols <= rows) & (cols > rows - WINDOW)), float("-inf")), -1) @ v
    torch.testing.assert_close(windowed.transpose(1, 2), want)
    full = torch.softmax(scores.masked_fill(~(cols <= rows), float("-inf")), -1) @ v
    assert (pruned.transpose(1, 2) - full).abs().max() > 1e-3
    assert oracle.context == {2: 28} and len(oracle.mass) == 1  # only the pruned layer counts its mass


def test_presses_run_on_the_models_own_pattern_only():
    own = {"sliding_attention": f"sliding_window:window={WINDOW}", "full_attention": "full"}
    assert presses.press_unsupported("layers", own, WINDOW) is None
    for other in ({**own, "sliding_attention": f"sliding_window:window={WINDOW},sinks=4"},
                  {**own, "sliding_attention": "full"}, {**own, "full_attention": "block_sparse"}):
        assert "own pattern" in presses.press_unsupported("layers", other, WINDOW)
    assert presses.press_unsupported("layers", own, None) is not None
