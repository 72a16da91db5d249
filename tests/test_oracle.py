"""The oracle arm (attn/hf/oracle.py): its kept keys are exactly the top-k of the true weights, it keeps at least the
attention mass of every press of its budget, and it runs as one more arm of the shared prefill. Tiny random Llamas."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn.hf import oracle as O

pytestmark = pytest.mark.usefixtures("one_thread")


@settings(max_examples=40, deadline=None)
@given(lq=st.integers(1, 5), ctx=st.integers(1, 40), after=st.integers(0, 6), ratio=st.sampled_from([0.0, 0.5, 0.8, 0.95]),
       seed=st.integers(0, 2**16))
def test_kept_keys_are_the_top_k_of_the_true_weights(lq, ctx, after, ratio, seed):
    """Each query row keeps, of the context's keys, exactly the int(ctx * (1 - ratio)) of highest true weight, and every
    key after the context it may see; its weights are the true scores renormalised over those."""
    g = torch.Generator().manual_seed(seed)
    lk = ctx + after + lq
    scores = torch.randn(2, 3, lq, lk, generator=g, dtype=torch.float64)
    causal = torch.arange(lk)[None] <= torch.arange(lq)[:, None] + (lk - lq)
    scores = scores.masked_fill(~causal, float("-inf"))
    keep = O.Oracle(ratio).kept(ctx)
    weights, kept = O.oracle_weights(scores, ctx, keep)
    true = torch.softmax(scores, -1)
    for b in range(2):
        for h in range(3):
            for i in range(lq):
                want = set(true[b, h, i, :ctx].argsort(descending=True)[:keep].tolist())
                assert set(torch.nonzero(kept[b, h, i, :ctx]).flatten().tolist()) == want
                assert kept[b, h, i, ctx:].all()
                masked = scores[b, h, i].clone()
                masked[:ctx][~kept[b, h, i, :ctx]] = float("-inf")
                torch.testing.assert_close(weights[b, h, i].double(), torch.softmax(masked, -1), atol=1e-6, rtol=1e-6)


def test_a_bad_ratio_is_refused():
    with pytest.raises(ValueError, match="compression_ratio"):
        O.Oracle(1.0)


kvpress = pytest.importorskip("kvpress")


def _tiny():
    from transformers import AutoModelForCausalLM

    from attn import hf

    config = hf.tiny_config("llama", num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=1024, initializer_range=0.2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    hf.set_variant(model, "full")
    return model


CONTEXT = 200


@pytest.mark.parametrize("ratio", [0.5, 0.875])
def test_the_oracle_keeps_at_least_the_mass_of_every_press_of_its_budget(ratio, monkeypatch):
    """At the question's first step (every arm sees the same hidden states there), per layer and query head, the mass
    of the true weights on the oracle's kept keys is at least that on the keys each press of the same ratio kept; and
    the oracle arm runs through the shared prefill, its rows saying what it read."""
    from transformers import GenerationConfig

    from attn.hf import presses, replay
    from harness.accuracy.prefill import SharedPrefill

    model = _tiny()
    prompt = torch.randint(1, 256, (CONTEXT + 5,), generator=torch.Generator().manual_seed(1)).tolist()
    names = ["snapkv", "streaming_llm", "knorm", "tova", "expected_attention"]
    specs = [presses.parse_press(f"oracle:compression_ratio={ratio}"),
             *(presses.parse_press(f"{n}:compression_ratio={ratio}" + (",n_future_positions=16" if n ==
                                                                          "expected_attention" else "")) for n in names)]
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # (query, key) of each call of the oracle's first step
    chosen: list[torch.Tensor] = []  # the oracle's kept mask of each of those calls
    real, weights = O.attention, O.oracle_weights

    def probe(module, query, key, value, mask, **kw):
        if len(seen) < len(model.model.layers):
            seen.append((query.detach().clone(), key.detach().clone()))
        return real(module, query, key, value, mask, **kw)

    def chooser(scores, context_len, keep):
        out = weights(scores, context_len, keep)
        if len(chosen) < len(model.model.layers):
            chosen.append(out[1])
        return out

    monkeypatch.setattr(O, "attention", probe)
    monkeypatch.setattr(O, "oracle_weights", chooser)
    arms = SharedPrefill(specs)
    arms.answers(model, prompt, CONTEXT, GenerationConfig(max_new_tokens=2, min_new_tokens=2))
    assert not arms.failed, arms.failed
    stats = arms.take_stats(specs[0].label)
    keep = O.Oracle(ratio).kept(CONTEXT)
    assert stats["kv_tokens_mean"] == keep and stats["context_tokens"] == CONTEXT
    full_bytes = presses.cache_bytes(arms.cache)
    assert stats["kv_cache_bytes"] == pytest.approx(full_bytes * keep / CONTEXT)
    assert 0 < stats["attention_mass_kept"] <= 1

    full_keys = [layer.keys for layer in arms.cache.layers]
    for spec, press in zip(specs[1:], arms.presses[1:], strict=True):
        pressed = replay.compress(model, spec, press, full_keys, [layer.values for layer in arms.cache.layers],
                                   arms.recorder)
        for i, (query, key) in enumerate(seen):
            ctx = key[..., :CONTEXT, :]  # the full cache's context keys as this call saw them
            group = query.shape[1] // ctx.shape[1]
            scores = query[:, :, :1].float() @ ctx.float().repeat_interleave(group, 1).transpose(-1, -2)
            scores = scores * model.model.layers[i].self_attn.scaling
            # the press's kept context keys, found by value among the full cache's
            kept_keys = pressed.layers[i].keys[0]
            for h in range(query.shape[1]):
                kv = h // group
                true = torch.softmax(torch.cat([scores[0, h, 0], _later(query, key, h, group, i, model)]), -1)[:CONTEXT]
                match = (torch.cdist(kept_keys[kv].float(), ctx[0, kv].float()) < 1e-5).any(0)
                mine = chosen[i][0, h, 0, :CONTEXT]
                assert int(mine.sum()) == keep
                oracle_mass = true[mine].sum()
                assert int(match.sum()) <= keep
                assert float(true[match].sum()) <= float(oracle_mass) + 1e-6, (spec.label, i, h)


def _later(query, key, h, group, i, model):
    """Scores of the first question token against the keys after the context (itself): part of the true softmax."""
    later = key[0, h // group, CONTEXT:CONTEXT + 1].float()
    return (query[0, h, 0].float() @ later.T) * model.model.layers[i].self_attn.scaling
