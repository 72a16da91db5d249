"""`mla` (multi-head latent attention): the absorbed decode equals the expanded form and one forward, its cache holds
the latent and the RoPE key only (576 numbers a token at DeepSeek-V3's sizes), its FLOPs match a hand count, a broken
absorbed form is caught by `attn-bench check`'s layer check, and op-scope sweeps refuse it."""
import pytest
import torch
from definitions import prefill_then_steps

import attn
from attn.attention.mla import MLALayer
from attn.checks import check_layer

pytestmark = pytest.mark.usefixtures("one_thread")


def model(**params):
    torch.manual_seed(0)
    config = attn.TransformerConfig(d_model=64, n_heads=4, n_layers=2, position="rope", attention="mla",
                                    attention_params=params)
    return attn.Transformer(config).double().eval()


@pytest.mark.parametrize("params", [{}, {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 4,
                                         "qk_nope_head_dim": 8, "v_head_dim": 12}], ids=["defaults", "v3-like"])
def test_absorbed_decode_equals_expanded_forward(params):
    m = model(**params)
    steps, full, _ = prefill_then_steps(m, length=19, prefill=7)
    torch.testing.assert_close(steps, full, atol=1e-10, rtol=1e-10)
    assert {b.attn.attn.last_backend for b in m.blocks} == {"absorbed"}  # the single tokens took the absorbed form
    assert all(isinstance(b.attn, MLALayer) for b in m.blocks)


def test_the_cache_holds_the_latent_and_the_rope_key_only():
    """DeepSeek-V3's sizes (128 heads of 128, latent 512, RoPE key 64): 576 numbers a token and layer, against
    2 H_kv D for a KV cache."""
    v3 = attn.build_attention("mla", kv_lora_rank=512, qk_rope_head_dim=64).config.dims(128)
    assert v3[0] + v3[1] == 576
    m = model()
    with torch.no_grad():
        state = m.init_state(3, 40)
        m(torch.zeros(3, 40, dtype=torch.long), state=state)
    r, rope, _, _ = m.blocks[0].attn.attn.config.dims(16)  # head dim 64 / 4
    assert [s.nbytes() for s in state.layers] == [3 * 40 * (r + rope) * 8] * 2  # fp64
    assert m.blocks[0].attn.cache_numbers_per_token() == r + rope == 64 + 8


def test_flops_by_hand():
    m = attn.build_attention("mla", kv_lora_rank=20, qk_rope_head_dim=6, qk_nope_head_dim=10, v_head_dim=12)
    L, H = 9, 3
    pairs = L * (L + 1) // 2
    assert m.mode_flops("forward", 2, H, L, 16) == 2 * 2 * H * pairs * (10 + 6 + 12)
    assert m.mode_flops("train", 2, H, L, 16) == 3 * m.mode_flops("forward", 2, H, L, 16)
    assert m.mode_flops("decode", 2, H, L, 16) == 2 * 2 * H * (L + 1) * (20 + 6 + 20)  # q.c, q.k_rope; p.c


def test_the_layer_check_catches_a_broken_absorbed_form(monkeypatch):
    assert [f.status for f in check_layer("mla", {})] == ["ok"]
    original = MLALayer.absorbed
    monkeypatch.setattr(MLALayer, "absorbed", lambda self, qn, qr, c, kr: original(self, qn, torch.zeros_like(qr), c, kr))
    (finding,) = check_layer("mla", {})
    assert finding.status == "mismatch" and "off from one forward" in finding.detail


def test_op_scope_refuses_a_layer_level_variant():
    from harness.cost.cells import Cell
    from harness.cost.scopes.op import build_op

    cell = Cell(variant="mla", variant_params={}, backend_requested="auto", position="none", position_params={},
                scope="op", mode="forward", device="cpu", dtype="float32", batch_size=1, num_heads=2, head_dim=8, seq_len=16)
    with pytest.raises(attn.UnsupportedBackend, match="--scope model"):
        build_op(cell)


def test_the_absorbed_form_of_a_chunk_equals_the_expanded_one():
    """Several queries at once against the cached latents (the causal mask bottom-right): both forms agree."""
    layer = model(kv_lora_rank=16, qk_rope_head_dim=4).blocks[0].attn
    g = torch.Generator().manual_seed(2)
    B, H, T, L = 2, 4, 3, 11
    q_nope, q_rope = torch.randn(B, H, T, layer.nope, generator=g, dtype=torch.float64), \
        torch.randn(B, H, T, layer.rope_dim, generator=g, dtype=torch.float64)
    c, k_rope = torch.randn(B, 1, L, 16, generator=g, dtype=torch.float64), \
        torch.randn(B, 1, L, 4, generator=g, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer.absorbed(q_nope, q_rope, c, k_rope),
                                   layer.expanded(q_nope, q_rope, c, k_rope), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("lq, lk, causal", [(13, 13, True), (5, 13, True), (13, 13, False), (1, 7, True)])
def test_sdpa_with_values_narrower_than_the_keys_equals_the_reference(lq, lk, causal):
    """The expanded heads' values (v_head_dim) are narrower than their queries and keys (nope + rope): SDPA runs them
    padded to the key width, and the cut output equals the dense reference."""
    g = torch.Generator().manual_seed(lq + lk)
    q, k = torch.randn(2, 4, lq, 12, generator=g), torch.randn(2, 4, lk, 12, generator=g)
    v = torch.randn(2, 4, lk, 8, generator=g)
    sdpa = attn.build_attention("mla", backend="sdpa")(q, k, v, causal=causal)
    assert sdpa.shape == (2, 4, lq, 8)
    torch.testing.assert_close(sdpa, attn.build_attention("mla", backend="reference")(q, k, v, causal=causal),
                               atol=1e-5, rtol=1e-5)
