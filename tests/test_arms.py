"""The arms (attn/hf/arms/) decoded together equal each arm decoding alone: every kind, on a tiny random Llama in
float64 (padding and batching change a sum's order, never its terms: float64 keeps that below any argmax margin), with
the scores one press shares across its ratios, PyramidKV's layers of different lengths, a retrieval arm at positions
of its own, and the arms that decode alone (the quantized cache, the oracle) beside them."""
import pytest

pytest.importorskip("kvpress")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402

from attn import hf  # noqa: E402
from attn.hf import arms, batched  # noqa: E402
from attn.hf.presses import parse_press  # noqa: E402
from harness.accuracy.prefill import SharedPrefill  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = 300
SPECS = ["none", "quantized:nbits=4", "oracle:compression_ratio=0.75",
         "retrieval:retriever=bm25,chunk=32,compression_ratio=0.5",
         *(f"{p}:compression_ratio={r}" + (",n_future_positions=64" if p == "expected_attention" else "")
           for p in sorted(arms.kvpress.SHARED_SCORES | {"streaming_llm"}) for r in (0.5, 0.75))]  # its score reads
# the ratio: not shared


SECOND = ("none", "quantized:nbits=4", "oracle:compression_ratio=0.75", SPECS[3], "snapkv:compression_ratio=0.5",
          "streaming_llm:compression_ratio=0.75")


def tiny(dtype: torch.dtype):
    config = hf.tiny_config("llama", num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=1024, initializer_range=0.2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval().to(dtype)
    hf.set_variant(model, "full")
    return model


def prompt(seed: int, n: int = CONTEXT + 6) -> list[int]:
    return torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def words(ids: list[int]) -> str:
    return " ".join(f"w{i % 40}" for i in ids)  # a text for the retriever: 40 words, so chunks share some


def test_arms_decoded_together_answer_as_each_arm_alone():
    model = tiny(torch.float64)
    specs = [parse_press(t) for t in SPECS]
    gen = GenerationConfig(max_new_tokens=6, min_new_tokens=6)
    together = SharedPrefill(specs, decode=words)
    alone = {s.label: SharedPrefill([s], decode=words, batch=False) for s in specs}
    seen = set()
    for seed in (1, 2):
        p = prompt(seed)
        got = together.answers(model, p, CONTEXT, gen)
        assert not together.failed
        # every arm on the first prompt; on the second (its prefix reused) one arm of each kind: the suite's time
        for label, arm in alone.items() if seed == 1 else [(s, alone[s]) for s in SECOND]:
            assert got[label] == arm.answers(model, p, CONTEXT, gen)[label], (seed, label)
            ours, its = (untimed(a.take_stats(label)) for a in (together, arm))
            assert ours == its and ours["kv_tokens_mean"] > 0, label
        seen |= {tuple(v) for v in got.values()}
    assert len(seen) > 3  # the arms answer differently: a batch that mixed up its rows would show


def untimed(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if not k.endswith("_seconds")}


def test_an_answer_that_ends_leaves_the_batch_and_the_others_go_on():
    """Rows of different answer lengths (an end token for some): each row's answer is what it decodes alone."""
    model = tiny(torch.float64)
    specs = [parse_press(f"knorm:compression_ratio={r}") for r in (0.25, 0.5, 0.75, 0.9)]
    first = SharedPrefill(specs[:1], batch=False).answers(model, prompt(3), CONTEXT,
                                                          GenerationConfig(max_new_tokens=2, min_new_tokens=2))
    model.generation_config.eos_token_id = first[specs[0].label][1]  # the first arm stops after two tokens
    gen = GenerationConfig(max_new_tokens=8)
    got = SharedPrefill(specs).answers(model, prompt(3), CONTEXT, gen)
    for sp in specs:
        assert got[sp.label] == SharedPrefill([sp], batch=False).answers(model, prompt(3), CONTEXT, gen)[sp.label]
    assert len(got[specs[0].label]) == 2 and {len(v) for v in got.values()} != {2}


def test_rows_hold_each_arms_keys_as_they_are():
    """Stacked caches of 3, 0, 5 and 3 keys: rows of one length in one group, each row's keys as they were and room
    after them for the decoded tokens; rows that leave the batch leave their group."""
    from transformers import DynamicCache

    caches = []
    for n in (3, 0, 5):
        c = DynamicCache()
        if n:
            c.update(torch.full((1, 2, n, 4), float(n)), torch.full((1, 2, n, 4), -float(n)), 0)
        caches.append(c)
    caches.append(caches[0])
    rows = batched.stack(caches, 1, room=4).layers[0]
    assert [(r.tolist(), k.shape, n) for r, k, _, n in rows.groups] == [([0, 3], (2, 2, 7, 4), 3), ([1], (1, 2, 4, 4), 0),
                                                               ([2], (1, 2, 9, 4), 5)]
    assert (rows.groups[2][2][:, :, :5] == -5).all() and (rows.groups[0][1][:, :, :3] == 3).all()
    rows.update(torch.arange(4.0)[:, None, None, None].expand(4, 2, 2, 4), torch.ones(4, 2, 2, 4))
    assert rows.t == 2 and rows.get_seq_length() == 7
    assert (rows.groups[0][1][1, :, 3:5] == 3).all() and (rows.groups[2][1][0, :, 5:7] == 2).all()
    rows.keep([3, 2])
    assert [(r.tolist(), k.shape[0]) for r, k, _, _ in rows.groups] == [([0], 1), ([1], 1)]


def test_the_quantized_arm_in_the_batch_answers_as_its_quantized_cache():
    """Within its residual, the quantized arm decodes from its context dequantized once: the answer its own
    ``QuantizedCache`` decodes (which dequantizes at every step)."""
    from attn.hf.replay import compress
    from harness.accuracy.prefill import Greedy

    model = tiny(torch.float64)
    spec, gen, p = parse_press("quantized:nbits=4"), GenerationConfig(max_new_tokens=6, min_new_tokens=6), prompt(4)
    got = SharedPrefill([spec, parse_press("none")]).answers(model, p, CONTEXT, gen)[spec.label]
    ref = SharedPrefill([spec])
    ref._prefill(model, p[:CONTEXT])
    cache = compress(model, spec, None, [la.keys for la in ref.cache.layers], [la.values for la in ref.cache.layers],
                     ref.recorder)
    assert type(cache).__name__ == "QuantizedCache"
    assert got == Greedy(model, p, gen, None).run(cache, p[CONTEXT:], CONTEXT)


def test_a_model_with_window_layers_decodes_its_arms_together_as_alone():
    """Gemma 3's pattern (two window layers of 8, one global): the window layers hold each arm's last 7 context keys
    and the batch masks by the window; every arm answers as it does alone, over more tokens than the window."""
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=8,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              max_position_embeddings=256, query_pre_attn_scalar=16, initializer_range=0.2)
    torch.manual_seed(0)
    model = hf.build_model(config, "own").to(torch.float64)
    specs = [parse_press(t) for t in ("none", "quantized:nbits=4", "knorm:compression_ratio=0.5",
                                      "snapkv:compression_ratio=0.75,window_size=8",
                                      "retrieval:retriever=bm25,chunk=8,compression_ratio=0.5")]
    gen = GenerationConfig(max_new_tokens=12, min_new_tokens=12)
    p = torch.randint(1, 97, (45,), generator=torch.Generator().manual_seed(3)).tolist()
    got = SharedPrefill(specs, decode=words).answers(model, p, 40, gen)
    for s in specs:
        assert got[s.label] == SharedPrefill([s], decode=words, batch=False).answers(model, p, 40, gen)[s.label], s
    assert len({tuple(v) for v in got.values()}) > 2


def kvpress_answer(spec: str, p: list[int], new: int) -> list[int]:
    """kvpress's own way, the reference: its hook on a prefill of the context with transformers' SDPA (which kvpress
    patches to hide the keys AdaKV drops, per head), then the question and a greedy answer against that cache."""
    from transformers import DynamicCache

    model = tiny(torch.float64)
    model.set_attn_implementation("sdpa")
    press, cache = parse_press(spec).build(), DynamicCache()
    with torch.no_grad():
        with press(model):
            model(torch.tensor([p[:CONTEXT]]), past_key_values=cache, use_cache=True)
        ids, out = p[CONTEXT:], []
        for _ in range(new):
            at = cache.get_seq_length()
            logits = model(torch.tensor([ids]), past_key_values=cache, use_cache=True,
                           position_ids=torch.arange(at, at + len(ids))[None]).logits[0, -1]
            logits[model.generation_config.eos_token_id] = -torch.inf  # min_new_tokens: no end before the last
            ids = [int(logits.argmax())]
            out += ids
    return out


@pytest.mark.parametrize("wrapper", ["adakv", "criticaladakv"])
def test_a_press_masking_keys_per_head_answers_as_kvpress_does_and_keeps_its_masks_to_itself(wrapper):
    """AdaKV (and CriticalAdaKV) keep every key and mask the dropped ones per head: the arm replayed from the shared
    prefill and decoding under its own masks answers as kvpress's pipeline does; the arms beside it answer as alone
    (the masks never reach them), and its rows say the share of keys its heads read."""
    model = tiny(torch.float64)
    spec = f"{wrapper}(snapkv:compression_ratio=0.75):alpha_safeguard=0.1"
    specs = [parse_press(t) for t in ("none", spec, "knorm:compression_ratio=0.75")]
    gen = GenerationConfig(max_new_tokens=6, min_new_tokens=6)
    together = SharedPrefill(specs)
    for seed in (1, 2):
        p = prompt(seed)
        got = together.answers(model, p, CONTEXT, gen)
        assert not together.failed
        assert got[specs[1].label] == kvpress_answer(spec, p, 6), seed
        for s in (specs[0], specs[2]):
            assert got[s.label] == SharedPrefill([s], batch=False).answers(model, p, CONTEXT, gen)[s.label]
        stats = together.take_stats(specs[1].label)
        assert stats["kv_cache_bytes"] < stats["kv_resident_bytes"]  # its heads read a quarter, all stay resident
        assert stats["kv_tokens_mean"] == pytest.approx(CONTEXT * 0.25 + 0, abs=2)
    assert all(getattr(layer.self_attn, "masked_key_indices", None) is None for layer in model.model.layers)


def test_criticalkv_runs_on_a_model_whose_config_leaves_head_dim_to_the_model():
    """Qwen2's config has no head_dim (the model derives it); kvpress's CriticalKV reads config.head_dim to split the
    output projection by head, so the model is built with it set (it failed: "'Qwen2Config' object has no attribute
    'head_dim'")."""
    config = hf.tiny_config("qwen2", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=1024)
    assert getattr(config, "head_dim", None) is None
    torch.manual_seed(0)
    model = hf.build_model(config, "full")
    arms = SharedPrefill([parse_press("criticalkv(snapkv:compression_ratio=0.5)")])
    got = arms.answers(model, prompt(1), CONTEXT, GenerationConfig(max_new_tokens=4, min_new_tokens=4))
    assert not arms.failed and len(next(iter(got.values()))) == 4
