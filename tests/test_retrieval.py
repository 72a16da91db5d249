"""The retrieval arm (attn/hf/retrieval.py): chunks cut where it says, the budget held, the chunks kept in order, each
retriever finds a needle, the ``keys`` retriever is the model's own attention, and the arm answers exactly what the
model answers when given only the kept chunks and the question. Tiny random Llamas; the retrievers' packages are the
``models`` set-up's (a test that needs one says so when it is absent)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn.attention.base import UnsupportedBackend
from attn.hf import retrieval as R
from attn.hf.presses import parse_press

pytestmark = pytest.mark.usefixtures("one_thread")

PIECES = st.lists(st.sampled_from(["a", " b", ".", " c.", "\n", "!", "x?", " y"]), min_size=0, max_size=120)


@settings(max_examples=80, deadline=None)
@given(pieces=PIECES, chunk=st.integers(2, 40))
def test_chunks_partition_the_context_and_cut_after_a_sentence_where_they_can(pieces, chunk):
    bounds = R.chunk_bounds(pieces, chunk)
    ends = [p.rstrip(" ").endswith(R.SENTENCE_ENDS) for p in pieces]
    assert [a for a, _ in bounds] == [0, *(b for _, b in bounds[:-1])] if pieces else bounds == []
    assert not pieces or bounds[-1][1] == len(pieces)
    for a, b in bounds:
        assert 0 < b - a <= chunk
        if b < len(pieces) and not ends[b - 1]:  # cut inside a sentence: none ended in the chunk's second half
            assert b - a == chunk and not any(ends[a + chunk // 2:b])
        elif b < len(pieces):  # cut right after a sentence's end, the last in the chunk, in its second half
            assert b - a > chunk // 2 and not any(ends[b:a + chunk])


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=20), budget=st.integers(0, 200), lead=st.integers(0, 2),
       seed=st.integers(0, 2**16))
def test_the_best_chunks_are_kept_in_order_within_the_budget(sizes, budget, lead, seed):
    scores = torch.rand(len(sizes), generator=torch.Generator().manual_seed(seed)).tolist()
    kept = R.pick(scores, sizes, budget, lead)
    assert kept == sorted(set(kept)) and sum(sizes[i] for i in kept) <= budget
    used = sum(sizes[i] for i in kept if i < lead)
    assert all(i in kept for i in range(min(lead, len(sizes))) if used + sizes[i] <= budget) or used > 0
    for j in set(range(lead, len(sizes))) - set(kept):  # a chunk passed over did not fit beside the better ones
        better = sum(sizes[i] for i in kept if i < lead or scores[i] > scores[j] or (scores[i] == scores[j] and i < j))
        assert better + sizes[j] > budget


def _filler(n: int = 150) -> list[str]:
    return [f"The grass is green and the sky is blue, day {i} of the long walk home." for i in range(n)]


@pytest.mark.parametrize("retriever", ["bm25", "dense"])
def test_each_retriever_ranks_the_passkey_sentence_first_among_filler(retriever):
    pytest.importorskip({"bm25": "bm25s", "dense": "sentence_transformers"}[retriever])
    chunks = _filler()
    chunks.insert(97, "The pass key is 71432. Remember it. 71432 is the pass key.")
    scores = (R.bm25_scores if retriever == "bm25" else R.dense_scores)(chunks, "What is the pass key?")
    assert max(range(len(chunks)), key=scores.__getitem__) == 97


def _tiny(kind: str = "llama"):
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    from attn import hf

    config = (hf.tiny_config("llama", num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=256, max_position_embeddings=2048, initializer_range=0.2)
              if kind == "llama" else  # q/k norms, query_pre_attn_scalar, sliding layers first
              Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
                               layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                               max_position_embeddings=256, query_pre_attn_scalar=8, initializer_range=0.2))
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("kind, layer", [("llama", 0), ("gemma3", 2)])
def test_keys_scores_are_the_models_own_attention_of_the_question_over_the_context(kind, layer):
    """Against transformers' eager attention weights of the first layer without a window (Gemma 3's first two are
    sliding ones), renormalised over the context's keys: the mean over heads and question tokens, summed per chunk."""
    model = _tiny(kind)

    ids = torch.randint(1, 256, (90,), generator=torch.Generator().manual_seed(2)).tolist()
    context, bounds = 80, [(0, 30), (30, 55), (55, 80)]
    got = R.key_scores(model, ids, context, bounds)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    w = out.attentions[layer][0, :, context:, :context].double()
    per_key = (w / w.sum(-1, keepdim=True)).mean(dim=(0, 1))
    want = [float(per_key[a:b].sum()) for a, b in bounds]
    assert got == pytest.approx(want, abs=1e-5)
    assert sum(got) == pytest.approx(1.0, abs=1e-5)


def _bytes(text: str) -> list[int]:
    return list(text.encode())


def _decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", "replace")


def _prompt() -> tuple[list[int], int]:
    sentences = _filler(12)
    sentences.insert(7, "The pass key is 71432. Remember it.")
    context = _bytes("Find the pass key.\n" + " ".join(sentences) + "\n")
    return context + _bytes("What is the pass key? The pass key is"), len(context)


@pytest.mark.parametrize("retriever", ["bm25", "keys"])
def test_the_arm_answers_what_the_model_answers_given_only_the_kept_chunks(retriever):
    """The arm's answer is the plain greedy answer of the prompt made of its kept chunks and the question; the kept
    chunks fit the budget, the first is the instructions, and the rows say what was kept."""
    if retriever == "bm25":
        pytest.importorskip("bm25s")
    from transformers import GenerationConfig

    from harness.accuracy.prefill import SharedPrefill

    model = _tiny()
    prompt, at = _prompt()
    spec = parse_press(f"retrieval:retriever={retriever},chunk=64,compression_ratio=0.75")
    arms = SharedPrefill([spec], decode=_decode)
    config = GenerationConfig(max_new_tokens=4, min_new_tokens=4)
    said = arms.answers(model, prompt, at, config, needles=["71432"])[spec.label]
    assert not arms.failed, arms.failed
    press = arms.presses[0]
    stats = arms.take_stats(spec.label)
    kept_text = None
    bounds = R.chunk_bounds([_decode([t]) for t in prompt[:at]], 64)
    kept = R.pick(R.bm25_scores([_decode(prompt[a:b]) for a, b in bounds], "What is the pass key? The pass key is")
                  if retriever == "bm25" else R.key_scores(model, prompt, at, bounds),
                  [b - a for a, b in bounds], press.budget(at), 1)
    ids = [t for i in kept for t in prompt[bounds[i][0]:bounds[i][1]]]
    kept_text = _decode(ids)
    assert kept[0] == 0 and kept_text.startswith("Find the pass key.")
    assert stats["kv_tokens_mean"] == stats["retrieved_tokens"] == len(ids) <= int(at * 0.25)
    assert stats["context_tokens"] == at and stats["chunks"] == len(bounds) and stats["chunks_kept"] == len(kept)
    assert stats["needle_recall"] == float("71432" in kept_text)
    assert stats["retrieval_seconds"] >= 0 and stats["prefill_seconds"] >= 0
    if retriever == "bm25":
        assert stats["needle_recall"] == 1.0  # BM25 finds the sentence that names the pass key
    plain = SharedPrefill()
    assert said == plain.answers(model, ids + prompt[at:], len(ids), config)[None]


def test_a_retriever_whose_package_is_absent_is_unsupported(monkeypatch):
    """No bm25s: the arm fails as `unsupported`, saying what to install, and the arm beside it answers."""
    from transformers import GenerationConfig

    from attn.optional import Unavailable
    from harness.accuracy.prefill import SharedPrefill

    def absent(module, hint=""):
        raise Unavailable(f"{module} is not installed ({hint})", name=module)

    monkeypatch.setattr(R, "require", absent)
    specs = [parse_press("retrieval:retriever=bm25,compression_ratio=0.5"),
             parse_press("retrieval:retriever=keys,compression_ratio=0.5")]
    arms = SharedPrefill(specs, decode=_decode)
    prompt, at = _prompt()
    got = arms.answers(_tiny(), prompt, at, GenerationConfig(max_new_tokens=2, min_new_tokens=2))
    err = arms.failed[specs[0].label]
    assert isinstance(err, UnsupportedBackend) and "bm25s is not installed" in str(err) and "attn-bench[models]" in str(err)
    assert len(got[specs[1].label]) == 2 and specs[1].label not in arms.failed


@pytest.mark.parametrize("text, message", [
    ("retrieval:retriever=tfidf", "retriever must be one of bm25, dense, keys"),
    ("retrieval:chunk=1", "chunk must be at least 2"),
    ("retrieval:compression_ratio=1.0", "compression_ratio must be in [0, 1)"),
    ("retrieval:top=3", "press retrieval has no parameter 'top'"),
])
def test_bad_retrieval_specs_are_refused_in_one_line(text, message):
    with pytest.raises(ValueError, match=None) as e:
        parse_press(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_budget_sizes_it_as_a_press_and_rows_call_it_query_aware():
    from harness.accuracy.budgets import parse_budget, takes_budget

    assert takes_budget("retrieval:retriever=dense")
    spec = parse_press("retrieval:retriever=dense").at(compression_ratio=parse_budget("1/8").ratio(8192))
    assert spec.ratio == 0.875 and spec.build().budget(8000) == 1000
    cols = spec.columns(False)
    assert cols["query_aware"] is True and cols["press_protocol"] == R.Retrieval.PROTOCOL


def test_the_timing_bench_times_each_arm_alone_with_no_prefix_reused():
    """Each prompt is answered from a fresh cache (a second prompt sharing the first's prefix pays its whole prefill):
    the press arm's shared cache holds the whole context every time."""
    from transformers import GenerationConfig

    from harness.accuracy import bench_retrieval as B
    from harness.accuracy.checkpoint import byte_tokens
    from harness.accuracy.prefill import SharedPrefill

    model, tokens = _tiny(), byte_tokens()
    items = B.prompts(tokens, 600, 2)
    assert items[0][0][:300] == items[1][0][:300]  # the haystack before the key is shared
    row = B.time_arm(model, tokens, "retrieval:retriever=keys,compression_ratio=0.75", items)
    assert len(row["seconds"]) == 2 and row["value"] > 0 and row["query_aware"]
    assert row["kv_tokens_mean"] <= int(row["context_tokens"] * 0.25) and row["retrieval_seconds"] > 0
    kept = []  # how many cached tokens each prefill started from
    real = SharedPrefill._crop

    def spy(self, context, model, record):
        kept.append(real(self, context, model, record))
        return kept[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SharedPrefill, "_crop", spy)
        B.time_arm(model, tokens, "none", items)
        assert kept == [0, 0]
        arms = SharedPrefill([parse_press("none")])  # one cache for both: the second starts from the shared prefix
        for prompt, at in items:
            arms.answers(model, prompt, at, GenerationConfig(max_new_tokens=1))
        assert kept[2] == 0 and kept[3] >= 300
