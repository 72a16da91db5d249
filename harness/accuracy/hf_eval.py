"""Evaluating a pretrained Hugging Face checkpoint: each variant and RoPE scaling at each length, no training.

The YaRN paper's evaluation (Peng et al. 2023, https://arxiv.org/abs/2309.00071) on the user's own model:
the checkpoint runs every ``--variant`` (through :mod:`attn.hf`) with its own RoPE scaling or an override
(``--position rope_yarn:factor=4``), at lengths up to and past the length it was trained at.

Tokens: the checkpoint's own tokenizer; a directory without one gets UTF-8 bytes as token ids (vocab >= 256).
Every sequence starts with a document-boundary token: BOS, else EOS, in byte mode NUL (the lm corpus's
document separator).

lm: the test text is the first ``eval_bytes`` of the corpus's test split (:mod:`harness.accuracy.lm`), grown
until it holds the longest length in tokens. Its documents (cut at the corpus's NUL separators) are
tokenized one by one into one stream, ``boundary doc1 boundary doc2 ...``; every document token is scored
(predicted from the tokens before it), boundaries are context only. Windows of ``eval_len`` inputs tile
the stream without overlap (the last one shorter), so every length scores exactly the same tokens and
differs only in how much context each token sees. ``bpb`` = total NLL in bits / UTF-8 bytes of the
documents' text; ``perplexity`` = exp(mean NLL per scored token), per token of the checkpoint's tokenizer.

passkey and ruler: prompts answered by greedy generation, :mod:`harness.accuracy.hf_prompts`.

Cost: the weights are read once per evaluation (a GGUF file takes a minute to dequantise) and every (variant,
position) model is built on them; a prompt is prefilled once with the LM head on its last position only and
decoded greedily through the cache (``generate``); ``lm`` runs the head on the scored positions in chunks.

Layer types (Gemma 3's sliding and global layers): ``--variant`` is a layer spec (:mod:`attn.hf.layers`), by
default ``own`` (the model's pattern); rows carry ``layer_specs``, the spec each layer type ran.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from harness.accuracy.build import Spec, parse_variant
from harness.accuracy.hf_checkpoint import CHECKPOINT, Checkpoint, Tokens, load_checkpoint
from harness.accuracy.hf_prompts import RULER_ROOM, PrefixCache, min_passkey_len, passkey_measure, ruler_count, ruler_measures
from harness.accuracy.jobs import resolved, short_hash
from harness.accuracy.lm import SEPARATOR, LMConfig, load_corpus
from harness.accuracy.passkey import PasskeyConfig
from harness.accuracy.ruler import RulerConfig, generate
from harness.accuracy.stats import Measure, mean_ci

if TYPE_CHECKING:
    from harness.accuracy.runner import Runner

HF_TASKS = ("lm", "passkey", "ruler")
HF_DEFAULT_TASKS = ("lm", "passkey")  # ruler on request: its prompts need >= ~600 tokens
HF_RULER_TASKS = ("niah_single_1", "niah_multikey_1", "vt")  # --task ruler's default on a checkpoint
TOKENS_PER_BATCH = 8192  # tokens per forward: windows of one length are batched up to this
HEAD_CHUNK = 1024  # positions per LM-head call: full logits of a long window (L x vocab floats) would dwarf the model
# Config fields that change logits after the head (Gemma 2 softcapping, Cohere, Granite): then the model's own forward.
LOGIT_MODIFIERS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


# -- what runs: one model per (variant, position) ---------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One model to build: a variant (or, for a model with layer types, a layer spec) and a RoPE override spec
    (None: the checkpoint's own)."""

    spec: str  # what attn.hf.load_model takes
    override: str | None
    position: str  # our position name, as rows carry it
    position_params: dict[str, Any]
    variant: str  # rows' columns: the variant name ("own" / "layers" for a layer spec), its spec, params, backend
    variant_spec: str
    variant_params: dict[str, Any]
    backend: str = "auto"
    layer_specs: dict[str, str] | None = None  # layer type -> spec, for a model with layer types
    layer_pattern: str | None = None  # "own" (the model's pattern) or "custom", for a model with layer types

    @property
    def position_spec(self) -> str:
        return self.override or CHECKPOINT


def own_position(config: Any) -> tuple[str, dict[str, Any]]:
    """Our (name, params) for a config's RoPE; a scaling attn-bench cannot name keeps transformers' parameters."""
    from attn.hf import position_from_hf

    try:
        name, params = position_from_hf(config)
    except ValueError:
        return CHECKPOINT, {"rope_parameters": getattr(config, "rope_parameters", None)}
    head_dim = params.pop("head_dim")
    return name, resolved("position", Spec(name, params), head_dim)


def make_setting(ckpt: Checkpoint, variant: str | None, position: str | None) -> Setting:
    """Validate a (variant, position override) on a copy of the config -- exactly what loading will do."""
    from attn.hf.layers import OWN, layer_plan
    from attn.hf.models import check_config
    from attn.hf.rope import override_rope

    config = copy.deepcopy(ckpt.config)
    layers = layer_plan(config, variant)  # None: a model without layer types, one spec for all
    override = None if position in (None, CHECKPOINT) else position
    if layers is None:
        spec = parse_variant(variant or "full")
        check_config(config, spec.label)  # unknown names, bad parameters, the sliding-window rule
        cols: dict[str, Any] = dict(spec=spec.label, variant=spec.name, variant_spec=spec.label,
                                    variant_params=resolved("attention", spec), backend=spec.backend)
    else:
        text = variant or OWN
        plain = parse_variant(layers.every) if layers.every else None
        check_config(config, text)
        cols = dict(spec=text, variant=plain.name if plain else text if text == OWN else "layers",
                    variant_spec=plain.label if plain else text,
                    variant_params=resolved("attention", plain) if plain else {},
                    backend=plain.backend if plain else "auto", layer_specs=dict(layers.specs),
                    layer_pattern="own" if layers.is_own else "custom")
    if override is not None:
        override_rope(config, override)
    return Setting(override=override, **dict(zip(("position", "position_params"), own_position(config), strict=True)),
                   **cols)


# -- lm: the scored text ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LMText:
    """The token stream every length scores."""

    ids: torch.Tensor  # (T,) int64: boundary doc1 boundary doc2 ...
    scored: torch.Tensor  # (T,) bool: a document token (scored as a target), not a boundary
    num_bytes: int  # UTF-8 bytes of the documents' text
    region_bytes: int  # corpus test bytes read

    @property
    def num_scored(self) -> int:
        return int(self.scored[1:].sum())


def tokenize_docs(docs: Sequence[str], tokens: Tokens, region_bytes: int) -> LMText:
    ids: list[int] = []
    scored: list[bool] = []
    for doc in docs:
        part = tokens.encode(doc)
        ids += [tokens.boundary, *part]
        scored += [False] + [True] * len(part)
    return LMText(torch.tensor(ids, dtype=torch.int64), torch.tensor(scored), sum(len(d.encode()) for d in docs),
                  region_bytes)


def region_docs(test: np.ndarray, num_bytes: int) -> list[str]:
    """The first ``num_bytes`` test bytes as documents (split at the separator), empty ones dropped."""
    text = test[:num_bytes].tobytes().decode("utf-8", "replace")
    return [d for d in text.split(SEPARATOR.decode()) if d]


def lm_text(config: LMConfig, tokens: Tokens, min_tokens: int) -> LMText:
    """The first ``eval_bytes`` test bytes, doubled until they hold ``min_tokens`` scored tokens (ValueError if the
    test split is too small)."""
    corpus = load_corpus(config.corpus, config.test_fraction)
    n = config.eval_bytes
    while True:
        n = min(n, len(corpus.test))
        text = tokenize_docs(region_docs(corpus.test, n), tokens, n)
        if text.num_scored >= min_tokens:
            return text
        if n >= len(corpus.test):
            raise ValueError(f"lm: the test split of {corpus.name} holds {text.num_scored} tokens, fewer than the "
                             f"longest evaluation length {min_tokens}; use shorter --eval-lens or a larger --corpus")
        n *= 2


def windows(num_targets: int, eval_len: int) -> list[slice]:
    """Non-overlapping windows of ``eval_len`` positions tiling [0, num_targets); the last may be shorter."""
    return [slice(s, min(s + eval_len, num_targets)) for s in range(0, num_targets, eval_len)]


@torch.no_grad()
def token_bits(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in bits of each next token: x, y (B, L) -> (B, L).

    The LM head runs on HEAD_CHUNK positions at a time (a model whose config modifies logits after the head
    runs its own forward instead).
    """
    if any(getattr(model.config, k, None) not in (None, 1, 1.0) for k in LOGIT_MODIFIERS):
        logits = model(input_ids=x, use_cache=False).logits  # (B, L, V)
        return F.cross_entropy(logits.transpose(1, 2).float(), y, reduction="none") / math.log(2)
    hidden = model.base_model(input_ids=x, use_cache=False).last_hidden_state  # (B, L, d)
    head = model.get_output_embeddings()
    parts = [F.cross_entropy(head(h).transpose(1, 2).float(), t, reduction="none")
             for h, t in zip(hidden.split(HEAD_CHUNK, dim=1), y.split(HEAD_CHUNK, dim=1), strict=True)]
    return torch.cat(parts, dim=1) / math.log(2)


def window_bits(model: torch.nn.Module, text: LMText, eval_len: int, device: str = "cpu") -> list[tuple[float, int]]:
    """(bits, scored tokens) of every window; windows of one length run in batches of TOKENS_PER_BATCH tokens."""
    x, y, keep = text.ids[:-1], text.ids[1:], text.scored[1:]
    spans = windows(len(y), eval_len)
    out: list[tuple[float, int]] = []
    for length in sorted({s.stop - s.start for s in spans}, reverse=True):
        group = [s for s in spans if s.stop - s.start == length]
        for i in range(0, len(group), max(1, TOKENS_PER_BATCH // length)):
            batch = group[i : i + max(1, TOKENS_PER_BATCH // length)]
            xb, yb, kb = (torch.stack([t[s] for s in batch]).to(device) for t in (x, y, keep))
            bits = token_bits(model, xb, yb) * kb  # (n, length), unscored positions zeroed
            out += [(float(b), int(k)) for b, k in zip(bits.sum(dim=1).tolist(), kb.sum(dim=1).tolist(), strict=True)]
    return out


def lm_measures(per_window: list[tuple[float, int]], num_bytes: int) -> dict[str, Measure]:
    """bpb and perplexity from per-window (bits, tokens); intervals are Student t over windows of the mean bits
    per token, carried to each scale (x tokens/bytes for bpb, 2^ for perplexity)."""
    bits = sum(b for b, _ in per_window)
    tokens = sum(t for _, t in per_window)
    m = mean_ci([b / t for b, t in per_window if t])
    scale = tokens / num_bytes

    def carried(f: Callable[[float], float], value: float) -> Measure:
        lo, hi = (None, None) if m.ci_low is None else (f(m.ci_low), f(m.ci_high))
        return Measure(value, lo, hi, m.n)

    return {"bpb": carried(lambda v: v * scale, bits / num_bytes),
            "perplexity": carried(lambda v: 2.0**v, 2.0 ** (bits / tokens))}


# -- the plan and the run -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HFPlan:
    """A validated evaluation of one checkpoint."""

    ckpt: Checkpoint
    tasks: tuple[str, ...]
    settings: list[Setting]
    eval_lens: list[int]
    lm: LMConfig
    passkey: PasskeyConfig
    text: LMText | None  # lm only
    ruler: RulerConfig = RulerConfig()

    def describe(self) -> str:
        c = self.ckpt
        return (f"{c.name} ({c.config.model_type}, trained at {c.train_len}, tokens: {c.tokens.name}): "
                f"{', '.join(self.tasks)} x {len(self.settings)} (variant, position) x eval {self.eval_lens}")

    def cells(self) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        """(cell columns, metrics) per cell of one setting."""
        out: list[tuple[dict[str, Any], tuple[str, ...]]] = []
        if "lm" in self.tasks and self.text is not None:
            out += [({"task": "lm", "eval_len": L, "scored_bytes": self.text.num_bytes,
                      "scored_tokens": self.text.num_scored}, ("bpb", "perplexity")) for L in self.eval_lens]
        if "passkey" in self.tasks:
            out += [({"task": "passkey", "eval_len": L, "depth": d}, ("exact_match",))
                    for L in self.eval_lens for d in self.passkey.depths]
        if "ruler" in self.tasks:
            out += [({"task": "ruler", "eval_len": L, "subtask": t}, ("string_match", "all_found"))
                    for L in self.eval_lens for t in self.ruler.tasks]
        return out

    def eval_id(self, task: str) -> str:
        if task == "lm":
            corpus = load_corpus(self.lm.corpus, self.lm.test_fraction)
            return short_hash({"corpus": corpus.name, "test_bytes": len(corpus.test), "region": self.text.region_bytes,
                               "tokens": self.ckpt.tokens.name})
        if task == "ruler":
            return short_hash({"eval_examples": self.ruler.eval_examples, "data_seed": self.ruler.data_seed,
                               "num_hops": self.ruler.num_hops, "alpha": self.ruler.alpha, "num_cw": self.ruler.num_cw,
                               "room": RULER_ROOM, "tokens": self.ckpt.tokens.name})
        return short_hash(dataclasses.asdict(self.passkey) | {"tokens": self.ckpt.tokens.name})


def check_tasks(tasks: Sequence[str]) -> None:
    """A pretrained checkpoint is evaluated as it is: tasks that need training (mqar...) are refused."""
    bad = [t for t in tasks if t not in HF_TASKS]
    if bad:
        raise ValueError(f"--task {bad[0]} trains a model; with --hf-model only {' and '.join(HF_TASKS)} are evaluated")


def plan(path: str | Path, tasks: Sequence[str], variants: Sequence[str], positions: Sequence[str],
         eval_lens: Sequence[int] | None, lm: LMConfig, passkey: PasskeyConfig, ruler: RulerConfig | None = None) -> HFPlan:
    """Validate everything (ValueError, one line) before a weight is read: checkpoint, tokens, specs, lengths, corpus."""
    check_tasks(tasks)
    ckpt = load_checkpoint(path)
    settings = [make_setting(ckpt, v, p) for v in (variants or [None]) for p in (positions or [CHECKPOINT])]
    L = ckpt.train_len
    lens = sorted(set(eval_lens or [L, 2 * L, 4 * L]))
    if "passkey" in tasks and lens[0] < (need := min_passkey_len(ckpt.tokens, passkey.digits)):
        raise ValueError(f"passkey: eval length {lens[0]} is too short: the prompt takes at least {need} tokens")
    ruler = ruler or RulerConfig()
    if "ruler" in tasks:
        for t in ruler.tasks:  # too short a length is refused now, naming it
            generate(t, 1, lens[0], "test", ruler.data_seed, ruler, ruler_count(ckpt.tokens, t))
    text = lm_text(lm, ckpt.tokens, lens[-1]) if "lm" in tasks else None
    return HFPlan(ckpt, tuple(tasks), settings, lens, lm, passkey, text, ruler)


def base_row(p: HFPlan, s: Setting) -> dict[str, Any]:
    from harness.environment import environment

    c = p.ckpt
    return {
        **environment(device=device_for(), seed=0),
        "run_id": f"hf|{s.variant_spec}|{s.position_spec}|{c.ident}", "variant": s.variant,
        "variant_params": s.variant_params, "backend_requested": s.backend, "layer_specs": s.layer_specs,
        "layer_pattern": s.layer_pattern,
        "position": s.position, "position_params": s.position_params, "variant_spec": s.variant_spec,
        "position_spec": s.position_spec, "train_len": c.train_len, "stage": "pretrained", "model": c.name,
        "model_file": str(c.path),
        "model_type": c.config.model_type, "max_position_embeddings": c.config.max_position_embeddings,
        "tokenizer": c.tokens.name, "note": c.tokens.note, "status": "ok", "error": None,
    }


def device_for() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def evaluate_cell(model: torch.nn.Module, p: HFPlan, cell: dict[str, Any], device: str,
                  cache: PrefixCache | None = None) -> dict[str, Measure]:
    """One cell's measures; ``cache``: the setting's prefix cache, shared by its cells (passkey's depths share the
    haystack before the key, RULER's examples the template and the noise before the first needle)."""
    if cell["task"] == "lm":
        return lm_measures(window_bits(model, p.text, cell["eval_len"], device), p.text.num_bytes)
    if cell["task"] == "ruler":
        return ruler_measures(model, p.ckpt.tokens, p.ruler, cell["subtask"], cell["eval_len"], cache)
    return {"exact_match": passkey_measure(model, p.ckpt.tokens, p.passkey, cell["eval_len"], cell["depth"], cache)}


def backends(model: torch.nn.Module) -> str:
    from attn.hf import attention_modules

    return ",".join(sorted({m.last_backend for m in attention_modules(model) if getattr(m, "last_backend", None)}))


def pending_cells(runner: Runner, p: HFPlan, s: Setting) -> list[tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]]:
    base = base_row(p, s)
    todo = [({**base, **cell, "eval_id": p.eval_id(cell["task"])}, cell, m) for cell, m in p.cells()]
    return [t for t in todo if runner.pending(t[0], t[2])]


def run_setting(runner: Runner, p: HFPlan, s: Setting, device: str, weights: dict[str, torch.Tensor] | None) -> None:
    """Build this setting's model on the checkpoint's weights and evaluate its pending cells; a failure becomes rows."""
    from attn.hf import load_model

    todo = pending_cells(runner, p, s)
    if not todo:
        return
    runner.echo(f"{s.variant_spec} {s.position_spec}: {len(todo)} cells")
    try:
        model = load_model(p.ckpt.path, s.spec, s.override, weights=weights, config=p.ckpt.config).to(device)
    except Exception as e:  # one failing setting never stops the others
        for row, _, metrics in todo:
            runner.fail(row, metrics, e)
        return
    extra = {"params": sum(t.numel() for t in model.parameters())}
    cache = PrefixCache()
    for row, cell, metrics in todo:
        t0 = time.perf_counter()
        try:
            measures = evaluate_cell(model, p, cell, device, cache)
        except Exception as e:
            runner.fail({**row, **extra}, metrics, e)
            cache = PrefixCache()  # a generate cut short leaves the cache out of step with its tokens
            continue
        runner.append({**row, **extra, "backend": backends(model), "eval_seconds": time.perf_counter() - t0}, measures)
        runner.echo(f"  {cell}: " + ", ".join(f"{k} {m.value}" for k, m in measures.items())
                    + f" ({time.perf_counter() - t0:.0f} s)")


def run(plans: Sequence[HFPlan], out: Path, resume: bool, echo: Callable[[str], None] = print) -> Runner:
    """Evaluate every setting of every plan in order, appending rows to ``out`` (the accuracy Runner's store, keys and
    resume). The weights of a checkpoint are read once for all its plans."""
    import contextlib

    from attn.hf.models import load_weights
    from harness.accuracy.runner import Runner, memory_cap

    runner = Runner(out, out.parent / ".ckpt", resume, progress=False, echo=echo)
    device = device_for()
    weights: dict[Path, dict[str, torch.Tensor] | None] = {}
    with memory_cap() if device == "cpu" else contextlib.nullcontext():  # an address-space cap breaks CUDA
        for p in plans:
            if not any(pending_cells(runner, p, s) for s in p.settings):
                continue
            echo(p.describe())
            if p.ckpt.path not in weights:
                t0 = time.perf_counter()
                try:
                    weights = {p.ckpt.path: load_weights(p.ckpt.path)}  # every setting's model is built on them
                    echo(f"weights of {p.ckpt.name} read in {time.perf_counter() - t0:.0f} s")
                except Exception as e:  # then each setting loads (and records a failure) on its own
                    echo(f"  the weights do not load once ({type(e).__name__}: {e}); each setting loads its own")
                    weights = {p.ckpt.path: None}
            for s in p.settings:
                run_setting(runner, p, s, device, weights[p.ckpt.path])
    return runner


__all__ = ["HF_DEFAULT_TASKS", "HF_RULER_TASKS", "HF_TASKS", "HFPlan", "LMText", "Setting", "check_tasks", "lm_measures",
           "lm_text", "plan", "run", "token_bits", "window_bits", "windows"]
