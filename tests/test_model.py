"""The shared backbone, with every registered variant: causality, decode == forward, batch independence."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attn

# Small parameters so every variant's structure (windows, blocks, chunks) shows at test lengths.
SMALL = {"sliding_window": {"window": 4}, "block_sparse": {"block_size": 4}, "linear": {"chunk_size": 4},
         "moba": {"block_size": 2, "topk": 3}, "quest": {"page_size": 2, "token_budget": 4},
         "dsa": {"topk": 8, "index_heads": 2, "index_dim": 8},
         "nsa": {"block_len": 4, "stride": 2, "select_block": 4, "topk": 2, "window": 8}}


def variants(causal=True):
    return [s["name"] for s in attn.list_attention() if s["causal" if causal else "bidirectional"]]


def model_for(name, **overrides):
    torch.manual_seed(0)
    cfg = attn.TransformerConfig.preset("tiny", attention=name, attention_params=SMALL.get(name, {}), **overrides)
    return attn.Transformer(cfg).eval()


@pytest.mark.parametrize("name", variants())
@given(T=st.integers(2, 23), i=st.integers(0, 22), seed=st.integers(0, 100))
def test_future_tokens_never_change_past_logits(name, T, i, seed):
    i = min(i, T - 2)
    model = model_for(name)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 256, (1, T), generator=g)
    changed = idx.clone()
    changed[:, i + 1 :] = torch.randint(0, 256, (1, T - i - 1), generator=g)
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, : i + 1], b[:, : i + 1], atol=1e-5, rtol=1e-5)


# A dense_prefill variant (Quest) equals the forward call by call, not one forward over every token: test_quest.py.
@pytest.mark.parametrize("name", [n for n in variants() if next(s for s in attn.list_attention() if s["name"] == n)["decode"]
                                  and not attn.registry.ATTENTION.get(n).cls.dense_prefill])
@pytest.mark.parametrize("chunks", [[1] * 19, [5, 1, 7, 6], [19]])
def test_decoding_with_the_cache_equals_the_full_forward(name, chunks):
    model = model_for(name)
    idx = torch.randint(0, 256, (2, sum(chunks)), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        state = model.init_state(2, max_len=idx.shape[1])
        outs, t = [], 0
        for c in chunks:
            outs.append(model(idx[:, t : t + c], state=state))
            t += c
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", variants())
def test_batch_rows_are_independent(name):
    model = model_for(name)
    idx = torch.randint(0, 256, (3, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        together = model(idx)
        alone = torch.cat([model(idx[b : b + 1]) for b in range(3)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


@given(T=st.integers(2, 20), seed=st.integers(0, 1000))
def test_bidirectional_full_without_positions_is_permutation_equivariant(T, seed):
    model = model_for("full", causal=False, position="none")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 256, (1, T), generator=g)
    perm = torch.randperm(T, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[:, perm], model(idx[:, perm]), atol=1e-5, rtol=1e-5)


def test_causal_model_is_not_permutation_equivariant():
    """Guards the test above: the property must fail where it should not hold."""
    model = model_for("full", causal=True, position="none")
    idx = torch.arange(10)[None]
    perm = torch.arange(9, -1, -1)
    with torch.no_grad():
        assert not torch.allclose(model(idx)[:, perm], model(idx[:, perm]), atol=1e-4)


@pytest.mark.parametrize("overrides", [dict(norm="post", ffn="relu"), dict(ffn="swiglu"), dict(dropout=0.1, bias=True)])
def test_backbone_options_train(overrides):
    model = model_for("full", **overrides).train()
    idx = torch.randint(0, 256, (2, 12))
    loss = model.loss(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_paper_base_preset_is_the_2017_base_model():
    cfg = attn.TransformerConfig.preset("paper-base")
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.norm, cfg.ffn, cfg.dropout) == (
        512, 8, 2048, 6, "post", "relu", 0.1)
    with pytest.raises(ValueError, match="unknown model preset 'huge'; valid: paper-base"):
        attn.TransformerConfig.preset("huge")


@pytest.mark.parametrize("bad, match", [
    (dict(d_model=100, n_heads=3), "divisible by n_heads"),
    (dict(attention="nope"), "unknown attention variant 'nope'"),
    (dict(position="nope"), "unknown position method 'nope'"),
    (dict(ffn="tanh"), "ffn must be"),
])
def test_bad_backbone_config(bad, match):
    with pytest.raises(ValueError, match=match):
        attn.TransformerConfig(**bad)


def test_decoding_needs_a_causal_model():
    with pytest.raises(ValueError, match="causal"):
        model_for("full", causal=False).init_state(1, 4)
