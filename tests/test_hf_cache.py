"""attn.hf.cache.VariantCache: our variants decode inside a transformers model through their own bounded state, with
the logits of the unbounded path (the variant over every key), and ``--scope hf`` decodes through it."""
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

from attn import hf  # noqa: E402
from attn.attention.state import KVCache  # noqa: E402
from attn.hf.cache import VariantCache  # noqa: E402
from harness.cost.cells import Cell  # noqa: E402
from harness.cost.scopes.hf import build_hf  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=128)
# chunks smaller than the prompt: a prefill runs the chunked form on transformers' (transposed) keys
BOUNDED = ["sliding_window:window=6", "linear:chunk_size=8", "block_sparse:block_size=4,local_blocks=2",
           "retention:chunk_size=8"]


def model(spec: str):
    torch.manual_seed(0)
    return hf.build_model(hf.tiny_config("llama", **TINY), spec)


def ids(batch: int = 2, length: int = 30) -> torch.Tensor:
    return torch.randint(1, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def decoded(m, tokens: torch.Tensor, cache, prompt: int) -> torch.Tensor:
    """Logits of a prefill of ``prompt`` tokens, then one decoding step per remaining token."""
    out = [m(tokens[:, :prompt], past_key_values=cache).logits]
    out += [m(tokens[:, t:t + 1], past_key_values=cache).logits for t in range(prompt, tokens.shape[1])]
    return torch.cat(out, 1)


@pytest.mark.parametrize("spec", ["full", *BOUNDED])
def test_prefill_and_steps_equal_the_unbounded_path(spec):
    m, tokens = model(spec), ids()
    with torch.no_grad():
        whole = m(tokens).logits  # the variant over every key, no cache
    dynamic = decoded(m, tokens, DynamicCache(config=m.config), 20)  # transformers' cache: every key each step
    cache = VariantCache(m.config)
    ours = decoded(m, tokens, cache, 20)
    torch.testing.assert_close(ours, whole, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours, dynamic, atol=1e-5, rtol=0)
    assert cache.get_seq_length() == 30 and len(cache.layers) == TINY["num_hidden_layers"]
    assert isinstance(cache.layers[0].state, KVCache) == (spec == "full")


def test_each_layer_type_keeps_its_own_state():
    """A model with sliding and full layers (attn.hf.layers): each layer's state is its own variant's."""
    config = hf.tiny_config("qwen2", **TINY, use_sliding_window=True, sliding_window=6, max_window_layers=1)
    torch.manual_seed(0)
    m = hf.build_model(config, "sliding_attention=sliding_window:sinks=2;full_attention=linear")
    tokens = ids(length=24)
    with torch.no_grad():
        whole = m(tokens).logits
    cache = VariantCache(m.config)
    torch.testing.assert_close(decoded(m, tokens, cache, 12), whole, atol=1e-5, rtol=0)
    assert [type(layer.state).__name__ for layer in cache.layers] == ["LinearState", "RollingKVCache"]


@pytest.mark.parametrize("spec", ["sliding_window:window=6", "linear"])
def test_the_state_does_not_grow_and_generate_picks_the_same_tokens(spec):
    m, tokens = model(spec), ids(length=10)
    cache = VariantCache(m.config)
    decoded(m, ids(length=12), cache, 8)
    held = cache.nbytes()
    decoded(m, ids(length=24), VariantCache(m.config), 8)
    with torch.no_grad():
        m(tokens[:, :1], past_key_values=cache)  # one more token
    assert cache.nbytes() == held > 0
    greedy = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(m.generate(tokens, past_key_values=VariantCache(m.config), **greedy), m.generate(tokens, **greedy))


@pytest.mark.parametrize("spec", ["sliding_window:window=6", "linear:chunk_size=8"])
def test_crop_rewinds_one_step(spec):
    m, tokens = model(spec), ids(batch=1)  # one row: transformers' keys are views no reshape flattens
    cache = VariantCache(m.config)
    with torch.no_grad():
        m(tokens, past_key_values=cache)
        first = m(tokens[:, :1], past_key_values=cache).logits
        cache.crop(-1)
        assert cache.get_seq_length() == 30
        again = m(tokens[:, :1], past_key_values=cache).logits
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    cache.crop(-1)
    with pytest.raises(ValueError, match="cannot"):  # evicted or absorbed: one step back only
        cache.crop(-1)


def test_what_cannot_work_is_refused_in_one_line():
    m, tokens = model("linear"), ids(length=10)
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0
    refusals = {
        "padding": lambda: m.generate(tokens, attention_mask=mask, max_new_tokens=2, pad_token_id=0,
                                      past_key_values=VariantCache(m.config)),
        "beam search": lambda: m.generate(tokens, num_beams=2, max_new_tokens=2, pad_token_id=0,
                                          past_key_values=VariantCache(m.config)),
    }
    for what, run in refusals.items():
        with pytest.raises(ValueError, match="VariantCache") as e:
            run()
        assert "\n" not in str(e.value), what
    theirs = AutoModelForCausalLM.from_config(hf.tiny_config("llama", **TINY), attn_implementation="sdpa").eval()
    with pytest.raises(ValueError, match="attn-bench variant"):
        VariantCache(theirs.config)
    cache = VariantCache()  # no config to check: sdpa attends over the new keys only, caught at the next update
    with torch.no_grad(), pytest.raises(ValueError, match="did not run attn-bench's step"):
        theirs(tokens, past_key_values=cache)
        theirs(tokens[:, :1], past_key_values=cache)


def hf_cell(spec: str, length: int) -> Cell:
    name, _, params = spec.partition(":")
    values = dict(p.split("=") for p in params.split(",")) if params else {}
    return Cell(variant=name, variant_params={k: int(v) for k, v in values.items()}, backend_requested="auto",
                position="rope", position_params={"head_dim": 16, "rope_theta": 10000.0}, scope="hf", mode="decode",
                device="cpu", dtype="float32", batch_size=1, num_heads=4, head_dim=16, seq_len=length, layers=4,
                num_kv_heads=2, hf_config="llama")


@pytest.mark.parametrize("spec, cache_type, bounded", [("sliding_window:window=16", VariantCache, True),
                                                       ("linear", VariantCache, True), ("full", VariantCache, False)])
def test_scope_hf_decodes_every_variant_through_its_own_state(spec, cache_type, bounded, monkeypatch):
    import harness.cost.scopes.hf as scope

    tiny = hf.tiny_config("llama", **TINY)
    monkeypatch.setattr(scope, "load", lambda *a, **k: tiny)
    held = []
    for length in (24, 40):
        measured = build_hf(hf_cell(spec, length))
        first = measured.fn()
        again = measured.fn()
        torch.testing.assert_close(first, again, atol=0, rtol=0)  # each timed step is rewound to L
        assert type(measured.state) is cache_type and measured.state.get_seq_length() == length
        columns = measured.columns()
        assert columns["hf_cache"] == cache_type.__name__
        held.append(columns["state_bytes"])
    assert (held[0] == held[1]) == bounded
