"""KV presses (kvpress) on a checkpoint: the tokens each keeps, one recorded prefill replayed for every press equal to
kvpress's own prefill, ``none`` equal to the run without presses, our ``full`` + a press equal to sdpa + the press, rows
and refusals through ``attn-bench accuracy``. Tiny random Llamas (the real SmolLM2 check is in test_checkpoints.py)."""
import pytest

pytest.importorskip("kvpress")

import torch  # noqa: E402
from kvpress.utils import compute_n_kept  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache, GenerationConfig  # noqa: E402

from attn import hf  # noqa: E402
from attn.hf import presses, replay  # noqa: E402
from harness.accuracy.checkpoint_presets import PRESSES  # noqa: E402
from harness.accuracy.prefill import SharedPrefill  # noqa: E402
from harness.accuracy.pretrained import equal_memory_specs  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.results import read_rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = 300  # tokens: past every press's own window (SnapKV's 64, ExpectedAttention's n_future_positions below)
SPECS = [f"{p}:compression_ratio={r}" + (",n_future_positions=64" if p == "expected_attention" else "")
         for p in PRESSES for r in (0.5, 0.75)]


def tiny(attn: str = "full", seed: int = 0):
    config = hf.tiny_config("llama", num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=1024, initializer_range=0.2)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    if attn == "sdpa":
        model.set_attn_implementation("sdpa")
    else:
        hf.set_variant(model, attn)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny()


def prompt(seed: int, n: int = CONTEXT + 6) -> list[int]:
    return torch.randint(1, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("text", SPECS)
def test_each_press_keeps_the_tokens_kvpress_promises_and_replay_equals_its_own_prefill(model, text):
    """Through the harness (one prefill shared with another prompt's prefix, replayed) the press keeps
    int(context * (1 - ratio)) tokens a layer (PyramidKV: that many on average, more in low layers), the very keys
    kvpress's own ``with press(model)`` prefill keeps."""
    spec = presses.parse_press(text)
    cache = SharedPrefill([spec])
    gen = GenerationConfig(max_new_tokens=2, min_new_tokens=2)
    first, second = prompt(1), prompt(1)[:200] + prompt(2)[200:]  # the second reuses the first's 200-token prefix
    cache.answers(model, first, CONTEXT, gen)
    cache.answers(model, second, CONTEXT, gen)
    kept = cache.take_stats(spec.label)
    n = compute_n_kept(CONTEXT, spec.ratio)
    assert kept["kv_tokens_mean"] == n and kept["context_tokens"] == CONTEXT
    if spec.name != "pyramidkv":
        assert kept["kv_tokens_min"] == kept["kv_tokens_max"] == n
    else:
        assert kept["kv_tokens_min"] <= n <= kept["kv_tokens_max"]  # uniform where its window leaves no room
    replayed = replay.compress(model, spec, cache.presses[0], [layer.keys for layer in cache.cache.layers],
                                [layer.values for layer in cache.cache.layers], cache.recorder)
    own = replay.prefill_with(model, spec, spec.build(), torch.tensor([second[:CONTEXT]]))
    for a, b in zip(replayed.layers, own.layers, strict=True):
        assert a.keys.shape == b.keys.shape
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


def test_none_answers_what_the_run_without_presses_does(model):
    """Press ``none`` (context prefilled, then the question decoded against the whole cache) generates the very tokens
    the plain prefix cache generates from the whole prompt, prompt after prompt."""
    gen = GenerationConfig(max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=1, pad_token_id=0)
    plain, pressed = SharedPrefill(), SharedPrefill([presses.parse_press("none")])
    for seed in (3, 4, 5):
        p = prompt(seed)
        assert plain.answers(model, p, CONTEXT, gen)[None] == pressed.answers(model, p, CONTEXT, gen)["none"]


@pytest.mark.parametrize("text", ["snapkv:compression_ratio=0.5", "pyramidkv:compression_ratio=0.5",
                                  "quantized:nbits=4"])
def test_our_full_with_a_press_equals_sdpa_with_it(text):
    """Our ``full`` in every layer + the press = transformers' sdpa + the press: the kept keys, and the logits of a
    question decoded against them (<= 1e-4). PyramidKV leaves layers of different lengths, which transformers' own
    mask for a multi-token question cannot follow: sdpa is checked token by token there."""
    ours, theirs = tiny("full", 1), tiny("sdpa", 1)
    theirs.load_state_dict(ours.state_dict())
    spec = presses.parse_press(text)
    ctx, question = torch.tensor([prompt(6)[:CONTEXT]]), prompt(7, 5)
    logits = []
    for model in (ours, theirs):
        cache = replay.prefill_with(model, spec, spec.build(), ctx)
        step = 1 if spec.name == "pyramidkv" else len(question)
        out = []
        for i in range(0, len(question), step):
            pos = torch.arange(CONTEXT + i, CONTEXT + i + step)[None]
            with torch.no_grad():
                out.append(model(input_ids=torch.tensor([question[i:i + step]]), past_key_values=cache,
                                 position_ids=pos, use_cache=True).logits)
        logits.append(torch.cat(out, dim=1))
    assert (logits[0] - logits[1]).abs().max() <= 1e-4


def test_the_quantized_cache_keeps_every_token_at_a_fraction_of_the_bytes(model):
    full, quant = (presses.parse_press(t) for t in ("none", "quantized:nbits=4"))
    cache = SharedPrefill([full, quant])
    cache.answers(model, prompt(8), CONTEXT, GenerationConfig(max_new_tokens=1, min_new_tokens=1))
    a, b = cache.take_stats("none"), cache.take_stats(quant.label)
    assert a["kv_tokens_mean"] == b["kv_tokens_mean"] == CONTEXT
    assert 0.1 < b["kv_cache_bytes"] / a["kv_cache_bytes"] < 0.25  # 4 of 32 bits, plus a scale and shift per 64
    assert (a["kv_cache"], b["kv_cache"]) == ("DynamicCache", "QuantizedCache")


def test_equal_memory_variants_hold_the_budget():
    assert equal_memory_specs(2048) == [
        "sliding_window:window=2048,backend=blocked", "sliding_window:sinks=4,window=2044,backend=blocked",
        "block_sparse:block_size=128,global_blocks=1,local_blocks=15,backend=gathered"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("presses")
    tiny().save_pretrained(root / "ckpt")
    return root / "ckpt"


def test_press_rows_through_the_command(checkpoint, tmp_path, capsys):
    """One row per cell and press, saying the press, its ratio and what the cache kept; the equal-memory variants
    with the budget; a press on a variant that picks keys by position is a recorded `unsupported`."""
    out = tmp_path / "acc.jsonl"
    args = ["accuracy", "--hf-model", str(checkpoint), "--task", "passkey", "--eval-lens", "512", "--eval-examples", "2",
            "--depths", "0.5", "--variant", "full", "--variant", "sliding_window:window=64,backend=blocked",
            "--press", "none", "--press", "snapkv:compression_ratio=0.5", "--equal-memory", "--no-progress",
            "--out", str(out)]
    assert main(args) == 0
    rows = read_rows(out)
    full = {r["press_spec"]: r for r in rows if r["variant"] == "full"}
    assert set(full) == {"none", "snapkv:compression_ratio=0.5"} and all(r["status"] == "ok" for r in full.values())
    snap, none = full["snapkv:compression_ratio=0.5"], full["none"]
    assert none["kv_tokens_mean"] == none["context_tokens"] and none["compression_ratio"] == 0.0
    assert none["kv_cache"] == snap["kv_cache"] == "DynamicCache"  # the cache each arm decoded against
    assert snap["compression_ratio"] == 0.5 and snap["kv_tokens_mean"] == compute_n_kept(int(snap["context_tokens"]), 0.5)
    assert snap["press_params"]["window_size"] == 64 and not snap["query_aware"]
    window = [r for r in rows if r["variant_spec"].startswith("sliding_window:window=64")]
    assert {r["status"] for r in window} == {"unsupported"} and "presses compose with full only" in window[0]["error"]
    matched = [r for r in rows if r.get("matched_ratio") == 0.5]
    assert len(matched) == 3 and {r["kv_tokens_mean"] for r in matched} == {256}
    assert main([*args, "--resume"]) == 0 and len(read_rows(out)) == len(rows)  # each press is a cell of its own
    capsys.readouterr()
    assert main([*args, "--resume", "--dtype", "bfloat16"]) == 2 and len(read_rows(out)) == len(rows)
    assert f"holds float32 rows of {rows[0]['model']} and this run is bfloat16" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--press", "bogus"], "unknown press 'bogus'; valid: none, quantized,"),
    (["--press", "snapkv:compression_ratio=1.5"], "kvpress refuses it (AssertionError: Compression ratio must be"),
    (["--press", "snapkv:window=3"], "press snapkv has no parameter 'window'"),
    (["--press", "adakv"], "press adakv wraps another press: give it one, adakv(snapkv)"),
    (["--press", "snapkv(knorm)"], "press snapkv wraps no press"),
    (["--press", "adakv(snapkv"], "unbalanced parentheses"),
    (["--press", "adakv(bogus)"], "unknown press 'bogus'"),
    (["--press", "quantized:nbits=3"], "has to be one of [`2`, `4`]"),
    (["--equal-memory"], "--equal-memory needs --press"),
    (["--press", "none", "--task", "lm"], "--task lm scores every position"),
    (["--press", "none", "--task", "passkey", "--variant", "sliding_window:window=64"],
     "cannot run on any --variant given: sliding_window selects keys by position"),
])
def test_bad_presses_exit_2_with_one_line(args, message, checkpoint, tmp_path, capsys):
    out = tmp_path / "acc.jsonl"
    assert main(["accuracy", "--hf-model", str(checkpoint), *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_a_press_wraps_another_and_a_budget_sizes_the_press_it_wraps():
    """``adakv(snapkv)``: kvpress's wrappers take any press (AdaKV, ChunkKV, CriticalKV, whose ``press`` is an
    argument of its own ``__init__``, not a field); the label reads back as given, rows record the wrapped press and its
    ratio, and a budget sets the ratio of the press it wraps."""
    spec = presses.parse_press("adakv(snapkv:compression_ratio=0.5):alpha_safeguard=0.1")
    assert spec.label == "adakv(snapkv:compression_ratio=0.5):alpha_safeguard=0.1" and spec.ratio == 0.5
    assert presses.parse_press(spec.label) == spec
    built = spec.build()
    assert type(built).__name__ == "AdaKVPress" and built.alpha_safeguard == 0.1 and built.compression_ratio == 0.5
    cols = spec.columns(False)
    assert cols["press"] == "adakv" and cols["press_params"]["press"] == "snapkv:compression_ratio=0.5"
    sized = presses.parse_press("criticalkv(expected_attention)").at(compression_ratio=0.875)
    assert sized.label == "criticalkv(expected_attention:compression_ratio=0.875)"
    assert sized.build().press.compression_ratio == 0.875
    assert presses.parse_press("chunkkv(knorm):chunk_length=8").build().chunk_length == 8
    from harness.accuracy.budgets import takes_budget

    assert takes_budget("adakv(snapkv)") and not takes_budget("adakv(snapkv:compression_ratio=0.5)")


def test_press_without_a_checkpoint_is_refused(tmp_path, capsys):
    assert main(["accuracy", "--task", "mqar", "--press", "none", "--out", str(tmp_path / "a.jsonl")]) == 2
    assert "--press applies to --hf-model" in capsys.readouterr().err


def test_a_dynamic_cache_is_untouched_by_replay(model):
    """Replaying a press never prunes the recorded cache it reads (every press gets its own)."""
    cache = SharedPrefill([presses.parse_press("snapkv:compression_ratio=0.75"), presses.parse_press("none")])
    p = prompt(9)
    got = cache.answers(model, p, CONTEXT, GenerationConfig(max_new_tokens=2, min_new_tokens=2))
    assert all(layer.keys.shape[-2] == CONTEXT for layer in cache.cache.layers)
    assert isinstance(cache.cache, DynamicCache) and set(got) == {"snapkv:compression_ratio=0.75", "none"}


def test_a_press_that_refuses_the_model_is_unsupported_and_the_others_go_on(model):
    """ObservedAttention needs eager attention weights, which our variants do not return: kvpress's own assertion
    becomes that press's `unsupported`, and ``none`` beside it still answers."""
    cache = SharedPrefill([presses.parse_press("observed_attention:compression_ratio=0.5"), presses.parse_press("none")])
    got = cache.answers(model, prompt(10), CONTEXT, GenerationConfig(max_new_tokens=2, min_new_tokens=2))
    err = cache.failed["observed_attention:compression_ratio=0.5"]
    assert type(err).__name__ == "UnsupportedBackend" and "cannot run here: AssertionError" in str(err)
    assert len(got["none"]) == 2 and "none" not in cache.failed


def test_a_press_missing_a_part_this_checkpoint_has_nowhere_refuses_and_is_not_retried(model):
    """LU-KV keeps budget curves for a few named models, QFilter and ExpectedAttention's statistics come from the Hub by
    the model's name: with none for this model (or offline) the press refuses (`unsupported`, never run again on
    resume) instead of failing as an `error`, which re-ran its cells and kept none of their prompts' answers."""
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    from harness.presses import needs_a_part, press_refusal

    lukv = "lukv(snapkv:compression_ratio=0.5)"
    cache = SharedPrefill([presses.parse_press(lukv), presses.parse_press("none")])
    got = cache.answers(model, prompt(11), CONTEXT, GenerationConfig(max_new_tokens=2, min_new_tokens=2))
    err = cache.failed[presses.parse_press(lukv).label]
    assert type(err).__name__ == "UnsupportedBackend" and "LU-KV budget curve" in str(err) and len(got["none"]) == 2
    cache.next_cell()
    assert presses.parse_press(lukv).label in cache.failed  # a refusal stays refused in the next cell
    try:  # as kvpress raises it: its own message, the Hub's error as its context
        try:
            raise LocalEntryNotFoundError("cannot find the requested files in the local cache")
        except LocalEntryNotFoundError:
            raise ValueError("No statistics found for model m on the Hub") from None
    except ValueError as e:
        assert not needs_a_part(e)  # `from None` cut the chain: a ValueError alone is an error
    wrapped = ValueError("No statistics found")
    wrapped.__context__ = HFValidationError("Repo id must use alphanumeric chars")
    assert needs_a_part(wrapped) and type(press_refusal("p", wrapped)).__name__ == "UnsupportedBackend"
    assert press_refusal("p", ValueError("a bug")).__class__ is ValueError and not needs_a_part(KeyError("x"))


def test_an_arm_that_failed_in_one_cell_runs_in_the_next_and_one_that_refused_does_not(model, monkeypatch):
    """A failure that may pass (memory, oneDNN's "could not create a primitive") costs its arm one cell, not every
    later cell of the setting: a run that failed once wrote `error` rows for five cells it never tried. A refusal
    (`unsupported`) stays. The kept exception holds no traceback (its frames hold every arm's cache)."""
    snap, refuses = "snapkv:compression_ratio=0.5", "observed_attention:compression_ratio=0.5"
    cache = SharedPrefill([presses.parse_press(snap), presses.parse_press(refuses), presses.parse_press("none")])
    arm = next(a for a in cache.members if a.label == snap)
    real, calls = arm.branch, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("could not create a primitive")
        return real(*args, **kwargs)

    monkeypatch.setattr(arm, "branch", flaky)
    config = GenerationConfig(max_new_tokens=2, min_new_tokens=2)
    got = cache.answers(model, prompt(12), CONTEXT, config)
    assert got[snap] == [] and set(cache.failed) == {snap, refuses} and cache.failed[snap].__traceback__ is None
    cache.next_cell()
    got = cache.answers(model, prompt(13), CONTEXT, config)
    assert len(got[snap]) == 2 and len(got["none"]) == 2 and set(cache.failed) == {refuses} and len(calls) == 2
