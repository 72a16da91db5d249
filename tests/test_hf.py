"""attn.hf: our variants inside transformers models, proven equal to transformers' own attention paths.

Every comparison builds two models from deep copies of one config, checks their attn_implementation
differ (a shared config object would make both run the same function and pass falsely), loads the same
weights into both and compares only real (unpadded) positions.
"""
import copy
import math
from dataclasses import dataclass

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

import attn  # noqa: E402
from attn import hf  # noqa: E402
from attn.attention.base import Attention, Backend  # noqa: E402
from attn.attention.full import dense_attention  # noqa: E402
from attn.hf.interface import attention_function, variant_of  # noqa: E402
from attn.hf.padding import real_runs, run_padded  # noqa: E402
from attn.registry import ATTENTION  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=128)
VOCAB = TINY["vocab_size"]


def tiny(kind: str = "llama", **overrides):
    return hf.tiny_config(kind, **{**TINY, **overrides})


def pair(config, spec: str, other: str = "sdpa", position: str | None = None):
    """(ours, theirs): one random model running ``spec`` and the same weights under ``other``."""
    torch.manual_seed(0)
    ours = hf.build_model(config, spec, position=position)
    theirs = AutoModelForCausalLM.from_config(copy.deepcopy(ours.config), attn_implementation=other).eval()
    theirs.load_state_dict(ours.state_dict())
    assert ours.config is not theirs.config
    assert ours.config._attn_implementation == hf.register(spec) != theirs.config._attn_implementation
    return ours, theirs


def batch(lengths: list[int], total: int, side: str = "left", seed: int = 0):
    """Token ids (B, total) and a 0/1 mask with each row's ``length`` real tokens on the right (left padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), total), generator=g)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = 1 if side == "left" else 0
        mask[b, :n] = 1 if side == "right" else mask[b, :n]
    return ids, mask


@torch.no_grad()
def logits(model, ids, mask):
    return model(ids, attention_mask=mask).logits


def ran_ours(model) -> bool:
    """Whether our function ran in every layer (it builds its module on a layer at the first call)."""
    return len(hf.attention_modules(model)) == model.config.num_hidden_layers


def generate(model, ids, mask, n=10):
    return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0)


# -- equal to transformers' own paths ------------------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
def test_llama_gqa_full_equals_sdpa_with_padding(side):
    ours, theirs = pair(tiny("llama"), "full")
    ids, mask = batch([20, 13, 1], 20, side)
    a, b = logits(ours, ids, mask), logits(theirs, ids, mask)
    real = mask.bool()
    assert (a - b)[real].abs().max() <= 1e-5
    assert ran_ours(ours) and not ran_ours(theirs)
    # training through it: the same gradients (padded positions excluded from the loss, as a collator would)
    for model in (ours, theirs):
        out = model(ids, attention_mask=mask).logits
        (out * real[..., None]).square().mean().backward()
    grads = [(p.grad, q.grad) for p, q in zip(ours.parameters(), theirs.parameters(), strict=True)]
    assert max((g - h).abs().max().item() for g, h in grads) <= 1e-5


def test_mistral_sliding_window_equals_mistral_own_window():
    config = tiny("mistral", sliding_window=8)
    ours, theirs = pair(config, "sliding_window")  # the spec names no window: the model's 8 is used
    ids, mask = batch([40, 33], 40)
    a, b = logits(ours, ids, mask), logits(theirs, ids, mask)
    assert (a - b)[mask.bool()].abs().max() <= 1e-5
    assert {m.config.window for m in hf.attention_modules(ours)} == {8}
    # the window matters at 40 tokens: without it the model computes something else
    wide = AutoModelForCausalLM.from_config(copy.deepcopy(tiny("mistral", sliding_window=None))).eval()
    wide.load_state_dict(ours.state_dict())
    assert (logits(wide, ids, mask) - a)[mask.bool()].abs().max() > 1e-3
    # generation runs past the window through Mistral's sliding cache (it keeps the last 7 keys)
    assert torch.equal(generate(ours, ids, mask), generate(theirs, ids, mask))


def test_sliding_window_rule_window_conflicts_are_refused_early():
    config = tiny("mistral", sliding_window=8)
    assert hf.build_model(config, "sliding_window:window=8") is not None  # agrees with the model
    with pytest.raises(ValueError, match="window=16 differs from the model's sliding_window=8"):
        hf.build_model(config, "sliding_window:window=16")
    with pytest.raises(ValueError, match="only attn-bench's sliding_window variant"):
        hf.build_model(config, "full")
    # and at call time, for a model switched by hand
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config)).eval()
    hf.set_variant(model, "linear")
    with pytest.raises(ValueError, match="linear: the model uses sliding_window=8"):
        logits(model, *batch([5], 5))


def test_generate_left_padded_equals_sdpa():
    ours, theirs = pair(tiny("llama"), "full")
    ids, mask = batch([12, 7], 12, seed=1)
    out = generate(ours, ids, mask)
    assert out.shape == (2, 22)
    assert torch.equal(out, generate(theirs, ids, mask))
    assert ran_ours(ours)
    # a static cache hands the attention its empty slots too; they are cut off by the written length
    static = dict(cache_implementation="static")
    assert torch.equal(ours.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, **static),
                       out[:, :16])


def test_qwen2_full_equals_sdpa():
    ours, theirs = pair(tiny("qwen2"), "full")
    ids, mask = batch([16, 9], 16)
    assert (logits(ours, ids, mask) - logits(theirs, ids, mask))[mask.bool()].abs().max() <= 1e-5


def test_exact_variant_with_other_scaling_prescales_q():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    layer = torch.nn.Module()
    layer.num_key_value_groups, layer.is_causal = 2, True
    fn = attention_function(variant_of("full"))
    ours, _ = fn(layer, q, k, v, None, scaling=0.1)
    theirs, _ = sdpa_attention_forward(layer, q, k, v, None, scaling=0.1)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="linear: the model scales scores by 0.1"):
        attention_function(variant_of("linear"))(layer, q, k, v, None, scaling=0.1)


# -- every built-in variant, and a plugin ----------------------------------------------------------

BUILTINS = ["full", "sliding_window:window=6", "block_sparse:block_size=4,local_blocks=2", "linear"]


@pytest.mark.parametrize("spec", BUILTINS)
def test_builtin_variant_runs_forward_and_generate(spec):
    """Greedy decoding through transformers' cache (one query against every cached key) picks the
    tokens the full forward pass over the result would pick: the decode path is the forward path."""
    torch.manual_seed(0)
    model = hf.build_model(tiny("llama"), spec)
    ids, mask = batch([10, 6], 10, seed=2)
    out = generate(model, ids, mask, n=4)
    full_mask = torch.cat([mask, torch.ones(2, 4, dtype=mask.dtype)], 1)
    picked = logits(model, out, full_mask)[:, 9:-1].argmax(-1)
    assert torch.equal(picked, out[:, 10:])
    assert ran_ours(model)


@pytest.mark.parametrize("spec", BUILTINS[1:3])
def test_masked_variants_equal_their_reference_backend(spec):
    ours, ref = pair(tiny("llama"), spec, other=hf.register(spec + ",backend=reference"))
    ids, mask = batch([30, 21], 30)
    assert (logits(ours, ids, mask) - logits(ref, ids, mask))[mask.bool()].abs().max() <= 1e-5
    assert {m.last_backend for m in hf.attention_modules(ref)} == {"reference"}
    assert "reference" not in {m.last_backend for m in hf.attention_modules(ours)}


@dataclass(frozen=True)
class TemperatureConfig:
    temperature: float = 1.0


def test_plugin_variant_usable_by_name_in_a_model():
    @attn.register_attention("flash_tempered", config=TemperatureConfig)
    class Tempered(Attention):
        """softmax(q k^T / (t sqrt(d))) v: full attention at a temperature (t=1 is full)."""

        backends = (Backend("reference", {"cpu": frozenset({"forward", "backward", "decode"})}),)
        supports_gqa = True  # repeats k, v itself

        def backend_reference(self, q, k, v, causal):
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            i = torch.arange(q.shape[2])[:, None] + k.shape[2] - q.shape[2]
            return dense_attention(q / self.config.temperature, k, v, i >= torch.arange(k.shape[2]) if causal else None)

    try:
        name = hf.register("flash_tempered:temperature=1")
        assert name == "attn_bench.FLASH_tempered.temperature=1.0"  # 'flash' would send transformers to its kernels
        ours, theirs = pair(tiny("llama"), "flash_tempered:temperature=1")
        ids, mask = batch([11, 5], 11)
        assert (logits(ours, ids, mask) - logits(theirs, ids, mask))[mask.bool()].abs().max() <= 1e-5
        hot, _ = pair(tiny("llama"), "flash_tempered:temperature=3")
        assert (logits(hot, ids, mask) - logits(theirs, ids, mask))[mask.bool()].abs().max() > 1e-3
    finally:
        ATTENTION.unregister("flash_tempered")


# -- names --------------------------------------------------------------------------------------

def test_names_are_valid_transformers_implementations_and_not_hub_kernels():
    from transformers.integrations.hub_kernels import is_kernel

    assert hf.hf_name("sliding_window:window=0256") == "attn_bench.sliding_window.window=256"
    assert hf.hf_name("block_sparse:block_size=4,backend=reference") == "attn_bench.block_sparse.block_size=4.backend=reference"
    for spec in ["full", "linear:feature_map=favor,num_features=8", "block_sparse:block_size=8,local_blocks=1"]:
        name = hf.register(spec)
        assert not is_kernel(name) and ":" not in name and "/" not in name and "|" not in name
        model = AutoModelForCausalLM.from_config(copy.deepcopy(tiny("llama"))).eval()
        assert hf.set_variant(model, spec) == name == model.config._attn_implementation
        logits(model, *batch([4], 4))
    assert hf.register("full") == hf.register("full")
    config = tiny("llama")
    assert hf.set_variant(config, "linear") == config._attn_implementation == "attn_bench.linear"
    with pytest.raises(ValueError, match="unknown parameter"):
        hf.register("sliding_window:width=3")
    with pytest.raises(ValueError, match="unknown backend"):
        hf.register("full:backend=nope")
    with pytest.raises(ValueError, match="unknown attention variant"):
        hf.register("nope")


# -- refusals -----------------------------------------------------------------------------------

def qkv_layer():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
    layer = torch.nn.Module()
    layer.is_causal = True
    return layer, q, k, v


@pytest.mark.parametrize("kwargs, match", [
    ({"softcap": 30.0}, "linear: the model passes softcap=30"),
    ({"s_aux": torch.zeros(4)}, "full: the model passes s_aux="),
    ({"some_new_flag": 1}, "some_new_flag=1 \\(a keyword attn-bench does not know\\)"),
    ({"output_attentions": True}, "output_attentions"),
    ({"position_ids": torch.tensor([[0, 1, 2, 0, 1]])}, "packed sequences"),
])
def test_unsupported_keywords_are_refused_by_name(kwargs, match):
    layer, q, k, v = qkv_layer()
    fn = attention_function(variant_of("full"))
    with pytest.raises(ValueError, match=match):
        fn(layer, q, k, v, None, scaling=8**-0.5, **kwargs)
        attention_function(variant_of("linear"))(layer, q, k, v, None, scaling=8**-0.5, **kwargs)  # no softcap parameter
    out, weights = fn(layer, q, k, v, None, scaling=8**-0.5, softcap=None, use_cache=True, output_attentions=False,
                      position_ids=torch.arange(5)[None])
    assert out.shape == (1, 5, 4, 8) and weights is None  # (B, L, H, D), as sdpa_attention_forward


def test_dropout_in_training_is_refused():
    torch.manual_seed(0)
    model = hf.build_model(tiny("llama", attention_dropout=0.1), "full")
    logits(model, *batch([4], 4))  # eval mode: transformers passes dropout=0.0
    with pytest.raises(ValueError, match="full: attention dropout=0.1"):
        model.train()(*batch([4], 4))


def test_gemma2_softcap_and_query_scaling_through_our_full_equal_eager():
    """Gemma 2 passes softcap=50 and scales queries by query_pre_attn_scalar^-1/2: our full honours both."""
    from transformers import Gemma2Config

    config = Gemma2Config(**TINY, head_dim=16, sliding_window=4096, layer_types=["full_attention"] * 2,
                          attn_logit_softcapping=5.0, query_pre_attn_scalar=24)
    ours, theirs = pair(config, "full", other="eager")
    ids, mask = batch([20, 13], 20)
    real = mask.bool()
    torch.testing.assert_close(logits(ours, ids, mask)[real], logits(theirs, ids, mask)[real], atol=1e-5, rtol=1e-5)
    assert all(m.config.softcap == 5.0 for m in hf.attention_modules(ours))
    with pytest.raises(ValueError, match="spec's softcap=9 differs"):
        logits(hf.build_model(config, "full:softcap=9"), ids, mask)
    with pytest.raises(ValueError, match="linear: the model passes softcap=5"):
        logits(hf.build_model(config, "linear"), ids, mask)


def test_non_contiguous_padding_is_refused():
    model = hf.build_model(tiny("llama"), "full")
    ids, _ = batch([6], 6)
    with pytest.raises(ValueError, match="padding between real tokens"):
        logits(model, ids, torch.tensor([[1, 1, 0, 1, 1, 1]]))


# -- padding, property-based ------------------------------------------------------------------------

def masked_reference(q, k, v, mask):
    """Dense float64 attention with the padding mask and bottom-right causal rule; padded queries -> 0."""
    Lq, Lw = q.shape[2], mask.shape[1]
    g = q.shape[1] // k.shape[1]
    k, v = k[:, :, :Lw].repeat_interleave(g, 1), v[:, :, :Lw].repeat_interleave(g, 1)
    pos = torch.arange(Lq)[:, None] + Lw - Lq
    allowed = (torch.arange(Lw)[None, :] <= pos)[None] & mask[:, None, :]  # (B, Lq, Lw)
    s = (q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed[:, None], -math.inf)
    out = torch.softmax(s, -1).nan_to_num(0.0) @ v.double()
    real_query = mask[:, Lw - Lq:]
    return out * real_query[:, None, :, None]


@settings(max_examples=30)
@given(st.data())
def test_run_padded_equals_masked_attention(data):
    B, Lk = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 24))
    Lw = data.draw(st.integers(1, Lk))  # written keys (a static cache has Lk - Lw empty slots)
    Lq = data.draw(st.integers(1, Lw))
    mask = torch.zeros(B, Lw, dtype=torch.bool)
    for b in range(B):
        s = data.draw(st.integers(0, Lw))
        mask[b, s:data.draw(st.integers(s, Lw))] = True
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    q, k, v = torch.randn(B, 4, Lq, 8, generator=g), torch.randn(B, 2, Lk, 8, generator=g), torch.randn(B, 2, Lk, 8, generator=g)
    full = attn.build_attention("full")
    out = run_padded(lambda q_, k_, v_: full(q_, k_, v_, causal=True), q, k, v, mask)
    torch.testing.assert_close(out.double(), masked_reference(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_real_runs():
    mask = torch.tensor([[0, 1, 1], [1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    assert real_runs(mask) == [(1, 3), (0, 2), (3, 3), (0, 3)]
    with pytest.raises(ValueError, match="batch row 1"):
        real_runs(torch.tensor([[1, 1, 1], [1, 0, 1]], dtype=torch.bool))


# -- RoPE ---------------------------------------------------------------------------------------------

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 500000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 256},
    "yarn_full": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512,
                  "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 1.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "original_max_position_embeddings": 512,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}


def hf_rope(rope_parameters: dict, seq_len: int | None = None):
    config = LlamaConfig(**TINY, head_dim=32, max_position_embeddings=2048, rope_parameters=copy.deepcopy(rope_parameters))
    kind = rope_parameters["rope_type"]
    fn = LlamaRotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    inv_freq, factor = fn(config) if seq_len is None else fn(config, seq_len=seq_len)  # device=None: positional in 5.17 only
    return config, inv_freq, factor


@pytest.mark.parametrize("case", list(ROPES))
def test_rope_round_trips_and_matches_transformers(case):
    config, inv_freq, factor = hf_rope(ROPES[case])
    name, params = hf.position_from_hf(config)
    assert name == hf.rope.HF_TYPES[ROPES[case]["rope_type"]][0] and params["head_dim"] == 32
    assert hf.position_to_hf(name, params) == config.rope_parameters
    p = attn.build_position(name, **params)
    torch.testing.assert_close(p.inv_freq().float(), inv_freq, rtol=1e-6, atol=0)
    assert p.attention_factor == pytest.approx(factor, rel=1e-12)
    if case == "dynamic":  # past max_position_embeddings the base grows, the same way in both
        assert params["original_max_position_embeddings"] == 2048
        _, longer, _ = hf_rope(ROPES[case], seq_len=5000)
        torch.testing.assert_close(p.inv_freq(seq_len=5000).float(), longer, rtol=1e-6, atol=0)
    # and back: our params -> rope_parameters -> the same position
    again = LlamaConfig(**TINY, head_dim=32, max_position_embeddings=2048, rope_parameters=hf.position_to_hf(name, params))
    assert hf.position_from_hf(again) == (name, params)


def test_rope_legacy_dicts_ntk_and_unsupported_types():
    legacy = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4, "max_position_embeddings": 2048,
              "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert hf.position_from_hf(legacy) == ("rope_linear", {"head_dim": 16, "rope_theta": 1e4, "factor": 2.0})
    ntk = hf.position_to_hf("rope_ntk", {"head_dim": 32, "factor": 4.0})
    assert ntk["rope_type"] == "default"  # static NTK = plain RoPE at a larger base: same frequencies
    _, inv_freq, _ = hf_rope(ntk)
    torch.testing.assert_close(attn.build_position("rope_ntk", head_dim=32, factor=4.0).inv_freq().float(), inv_freq)
    longrope = {**legacy, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}}
    with pytest.raises(ValueError, match="rope_type 'longrope' has no attn-bench position"):
        hf.position_from_hf(longrope)
    with pytest.raises(ValueError, match="not RoPE"):
        hf.position_to_hf("sinusoidal", {})


def test_override_rope_replaces_a_models_scaling():
    torch.manual_seed(0)
    model = hf.build_model(tiny("llama"), "full")
    ids, mask = batch([24], 24)
    before = logits(model, ids, mask)
    rope_parameters = hf.override_rope(model, "rope_yarn:factor=4,original_max_position_embeddings=512")
    assert model.config.rope_parameters == rope_parameters
    assert rope_parameters["rope_type"] == "yarn" and rope_parameters["factor"] == 4.0
    # the same as a model built with that scaling from the start
    direct = hf.build_model(tiny("llama"), "full", position="rope_yarn:factor=4,original_max_position_embeddings=512")
    direct.load_state_dict(model.state_dict())
    after = logits(model, ids, mask)
    torch.testing.assert_close(after, logits(direct, ids, mask))
    assert (after - before).abs().max() > 1e-4
    with pytest.raises(ValueError, match="config.max_position_embeddings"):
        hf.override_rope(model, "rope_dynamic:factor=2,original_max_position_embeddings=64")
    with pytest.raises(ValueError, match="unknown position method"):
        hf.override_rope(model, "rope_nope")


# -- configs and checkpoints ----------------------------------------------------------------------------

def test_presets_and_paths(tmp_path):
    config = hf.load_config("llama")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size) == (4, 512, 8, 2, 1376, 32000)
    assert hf.load_config("mistral").sliding_window is None and hf.load_config("qwen2").model_type == "qwen2"
    with pytest.raises(ValueError, match="unknown model kind 'gpt2'; valid: llama, mistral, qwen2"):
        hf.tiny_config("gpt2")
    with pytest.raises(ValueError, match="no field"):
        hf.tiny_config("llama", hiden_size=3)
    for missing in [tmp_path / "nope", "meta-llama/Llama-3-8B", str(tmp_path)]:
        with pytest.raises(ValueError, match="nothing is downloaded"):
            hf.load_config(missing)
        with pytest.raises(ValueError, match="only local checkpoints"):
            hf.load_model(missing, "full")


def test_load_model_from_a_local_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = hf.build_model(tiny("llama"), "full")
    model.save_pretrained(tmp_path)
    assert hf.load_config(tmp_path).hidden_size == 64 == hf.load_config(tmp_path / "config.json").hidden_size
    loaded = hf.load_model(tmp_path, "sliding_window:window=4")
    assert loaded.config._attn_implementation == "attn_bench.sliding_window.window=4"
    ids, mask = batch([9, 5], 9)
    short = batch([4], 4)
    torch.testing.assert_close(logits(loaded, *short), logits(model, *short))  # within the window: equal
    assert (logits(loaded, ids, mask) - logits(model, ids, mask))[mask.bool()].abs().max() > 1e-4
