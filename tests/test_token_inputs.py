"""Per-token inputs (gates, decays) a variant declares: checked by the base class, projected per key head by the
backbone, drawn by op-scope sweeps and the property checks, carried through decoding."""
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import attn
from attn.attention.base import ALL_MODES, Attention, Backend
from attn.attention.token_inputs import TokenInput, draw_inputs
from attn.checks import check_variant
from attn.registry import ATTENTION
from harness.cost.cells import Cell
from harness.cost.scopes.op import build_op

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class GatedConfig:
    pass


class GatedValues(Attention):
    """Causal softmax attention whose values are scaled by a per-token gate in (0, 1): the smallest variant
    with a token input (the gated linear family uses the same contract)."""

    name = "test_gated_values"
    supports_gqa = False
    token_inputs = (TokenInput("gate", width=1, activation=torch.sigmoid, doc="value gate"),)
    backends = (Backend("reference", {"cpu": ALL_MODES}),)
    seen: list = []

    def backend_reference(self, q, k, v, causal, gate):
        self.seen.append(gate)
        return attn.build_attention("full", backend="reference")(q, k, v * gate, causal=causal)

    def step(self, q, k, v, state, gate):
        keys, values = state.append(k, v * gate)
        return attn.build_attention("full", backend="reference")(q, keys, values, causal=True)


@pytest.fixture
def gated():
    entry = attn.register_attention("test_gated_values", config=GatedConfig)(GatedValues)
    try:
        yield entry
    finally:
        ATTENTION.unregister("test_gated_values")
        GatedValues.seen.clear()


def test_base_class_checks_names_and_shapes(gated):
    m = attn.build_attention("test_gated_values")
    q, k = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8)
    ok = torch.rand(1, 2, 6, 1)
    assert m(q, k, k, gate=ok).shape == q.shape
    with pytest.raises(ValueError, match="takes token inputs: gate; missing gate"):
        m(q, k, k)
    with pytest.raises(ValueError, match="unknown decay"):
        m(q, k, k, gate=ok, decay=ok)
    with pytest.raises(ValueError, match=r"must be \(B, H_kv, L, width\) = \(1, 2, 6, 1\)"):
        m(q, k, k, gate=torch.rand(1, 4, 6, 1))  # per query head: wrong, gates belong to key heads
    with pytest.raises(ValueError, match="full takes token inputs: none; unknown gate"):
        attn.build_attention("full")(q, k, k, gate=ok)


def test_backbone_projects_each_input_per_key_head_and_decodes_equal_to_forward(gated):
    torch.manual_seed(0)
    cfg = attn.TransformerConfig(d_model=32, n_heads=4, num_kv_heads=2, n_layers=2, attention="test_gated_values")
    model = attn.Transformer(cfg).eval()
    proj = model.blocks[0].attn.inputs["gate"]
    assert (proj.in_features, proj.out_features) == (32, 2 * 1)
    x = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        full = model(x)
        gate = GatedValues.seen[0]
        h = model.blocks[0].ln1(model.tok_emb(x))
        expected = torch.sigmoid(proj(h).view(2, 10, 2, 1).transpose(1, 2))  # (B, H_kv, L, 1)
        torch.testing.assert_close(gate, expected.repeat_interleave(2, 1))  # no supports_gqa: repeated like k, v
        state = model.init_state(2, 10)
        steps = torch.cat([model(x[:, :3], state=state), model(x[:, 3:4], state=state), model(x[:, 4:], state=state)], 1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
    # the projection learns: its weight gets a gradient
    model.train()
    model.loss(x, x).backward()
    assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0


def test_output_norm_is_applied_by_the_backbone_only_when_declared(gated, monkeypatch):
    cfg = attn.TransformerConfig(d_model=32, n_heads=4, n_layers=1, attention="test_gated_values")
    torch.manual_seed(0)
    model = attn.Transformer(cfg).eval()
    seen = []
    model.blocks[0].attn.proj.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    x = torch.randint(0, 256, (1, 5))
    with torch.no_grad():
        model(x)
        monkeypatch.setattr(GatedValues, "output_norm", True)
        model(x)
    rms = [y.view(1, 5, 4, 8).pow(2).mean(-1).sqrt() for y in seen]  # per token and head
    assert not torch.allclose(rms[0], torch.ones_like(rms[0]), atol=1e-2)
    torch.testing.assert_close(rms[1], torch.ones_like(rms[1]), atol=1e-4, rtol=1e-4)


def test_op_cells_draw_the_inputs_and_train_differentiates_them(gated):
    for mode in ("forward", "train", "decode"):
        cell = Cell(variant="test_gated_values", variant_params={}, backend_requested="auto", position="none",
                    position_params={}, scope="op", mode=mode, device="cpu", dtype="float32", batch_size=1, num_heads=4,
                    head_dim=8, seq_len=16, num_kv_heads=2)
        measured = build_op(cell)
        out = measured.fn()
        if mode == "train":
            assert len(out) == 4 and out[3].shape == (1, 2, 16, 1)  # dq, dk, dv and d gate
        gate = GatedValues.seen[-1]
        assert gate.min() > 0 and gate.max() < 1 and gate.shape[1] == 4  # sigmoid of a normal, repeated to H


def test_checks_draw_inputs_and_catch_a_backend_that_ignores_them(gated, monkeypatch):
    GatedValues.backends = (Backend("reference", {"cpu": ALL_MODES}), Backend("fast", {"cpu": ALL_MODES}))
    try:
        GatedValues.backend_fast = lambda self, q, k, v, causal, gate: self.backend_reference(q, k, v, causal, gate)
        findings = check_variant("test_gated_values", dtypes=(torch.float32,))
        assert findings and all(f.status != "mismatch" for f in findings), [f for f in findings if f.status == "mismatch"]
        GatedValues.backend_fast = lambda self, q, k, v, causal, gate: self.backend_reference(q, k, v, causal,
                                                                                              torch.ones_like(gate))
        bad = [f for f in check_variant("test_gated_values", dtypes=(torch.float32,)) if f.status == "mismatch"]
        assert bad and any("dgate" in f.detail or "output" in f.detail for f in bad)
    finally:
        GatedValues.backends = (Backend("reference", {"cpu": ALL_MODES}),)
        del GatedValues.backend_fast


def test_draw_is_the_activation_of_a_standard_normal():
    spec = TokenInput("gk", activation=lambda x: F.logsigmoid(x) / 16)
    g = torch.Generator().manual_seed(3)
    got = draw_inputs((spec,), 2, 3, 5, 8, generator=g, dtype=torch.float64)["gk"]
    expected = F.logsigmoid(torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)) / 16
    torch.testing.assert_close(got, expected)
    assert spec.channels(8) == 8 and TokenInput("b", width=1).channels(8) == 1


class HeadScale(torch.nn.Module):
    """sigmoid(raw) times a learned scale per key head: an input with weights of its own after the projection."""

    def __init__(self, heads):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.arange(1.0, heads + 1) / (heads + 1))

    def forward(self, raw):
        return torch.sigmoid(raw) * self.scale[:, None, None]


def test_an_input_with_its_own_weights_gets_them_per_layer_and_trains_them(gated, monkeypatch):
    spec = TokenInput("gate", width=1, layer=HeadScale)
    monkeypatch.setattr(GatedValues, "token_inputs", (spec,))
    torch.manual_seed(0)
    model = attn.Transformer(attn.TransformerConfig(d_model=32, n_heads=4, num_kv_heads=2, n_layers=2,
                                                    attention="test_gated_values"))
    maps = [b.attn.input_maps["gate"] for b in model.blocks]
    assert maps[0] is not maps[1] and maps[0].scale.shape == (2,)  # one module per layer, sized by the key heads
    x = torch.randint(0, 256, (2, 7))
    model.loss(x, x).backward()
    assert all(m.scale.grad is not None and m.scale.grad.abs().sum() > 0 for m in maps)
    with torch.no_grad():
        h = model.blocks[0].ln1(model.tok_emb(x))
        raw = model.blocks[0].attn.inputs["gate"](h).view(2, 7, 2, 1).transpose(1, 2)
        model.eval()(x)
    got = GatedValues.seen[-2]  # layer 0's gate of the eval forward, repeated to the query heads
    torch.testing.assert_close(got, (torch.sigmoid(raw) * torch.tensor([1 / 3, 2 / 3])[:, None, None]).repeat_interleave(2, 1))
    # an op sweep draws what a fresh layer's module makes of a standard normal
    drawn = spec.draw(1, 2, 5, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    raw = torch.randn(1, 2, 5, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(drawn, torch.sigmoid(raw) * torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)[:, None, None])
