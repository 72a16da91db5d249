"""Evaluating a pretrained Hugging Face checkpoint: each variant and RoPE scaling at each length, no training.

The YaRN paper's evaluation (Peng et al. 2023, https://arxiv.org/abs/2309.00071) on the user's own model:
the checkpoint runs every ``--variant`` (through :mod:`attn.hf`) with its own RoPE scaling or an override
(``--position rope_yarn:factor=4``), at lengths up to and past the length it was trained at.

Tokens: the checkpoint's own tokenizer; a directory without one gets UTF-8 bytes as token ids (vocab >= 256).
Every sequence starts with a document-boundary token: BOS, else EOS, in byte mode NUL (the lm corpus's
document separator).

The tasks are those of the one task registry (:mod:`harness.accuracy.tasks`) that declare how they run on a checkpoint
(their ``pretrained`` face, in the task's own file): ``lm`` (bits per byte of the corpus's test text), ``passkey`` and
``ruler`` (prompts answered by greedy generation), ``selection``; this module builds the models and runs their cells.

Subject, arms: the checkpoint is the subject. A *setting* is an arm that changes the prefill (a variant or layer
pattern, a RoPE override) and so is a model of its own, built on the weights read once; within a setting, the *press
arms* (``none``, ``quantized``, kvpress's presses) leave the prefill unchanged and branch from one shared prefill per
prompt (:class:`harness.accuracy.prefill.SharedPrefill`). ``--dtype`` runs every model in float32 or bfloat16.

Cost: the weights are read once per evaluation (a GGUF file takes a minute to dequantise); a prompt is prefilled once
per setting, past the prefix it shares with the last prompt, and each arm decodes its answer greedily against its own
cache; ``lm`` runs the head on the scored positions in chunks.

Layer types (Gemma 3's sliding and global layers): ``--variant`` is a layer spec (:mod:`attn.hf.layers`), by
default ``own`` (the model's pattern); rows carry ``layer_specs``, the spec each layer type ran.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attn.hf.presses import press_unsupported
from harness.accuracy.answered import Answered, answers_path
from harness.accuracy.build import Spec, parse_variant
from harness.accuracy.checkpoint import CHECKPOINT, Checkpoint, load_checkpoint
from harness.accuracy.equal_memory import equal_memory_budget, equal_memory_specs
from harness.accuracy.jobs import resolved
from harness.accuracy.loop import Todo, evaluate
from harness.accuracy.prefill import SharedPrefill
from harness.accuracy.stats import Measure
from harness.accuracy.tasks import checkpoint_task_names, get_checkpoint_task

if TYPE_CHECKING:
    from attn.hf.presses import PressSpec
    from harness.accuracy.runner import Runner


def default_tasks() -> list[str]:
    """The tasks ``--hf-model`` runs without ``--task`` (ruler on request: its prompts need >= ~600 tokens)."""
    return [t for t in checkpoint_task_names() if get_checkpoint_task(t).default]


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
    presses: tuple[PressSpec, ...] = ()  # KV presses, one arm each (:mod:`harness.accuracy.prefill`); () none asked
    query_aware: bool = False
    only_len: int | None = None  # an equal-memory variant: the one length its budget matches
    columns: tuple[tuple[str, Any], ...] = ()  # row columns of its own (an equal-memory variant's budget)
    arm_columns: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()  # press label -> its budget's row columns

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


# -- the plan and the run -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HFPlan:
    """A validated evaluation of one checkpoint: per task its config and what its cells share (lm's text)."""

    ckpt: Checkpoint
    tasks: tuple[str, ...]
    settings: list[Setting]
    eval_lens: list[int]
    configs: dict[str, Any]  # task -> its config, for the tasks run
    data: dict[str, Any]  # task -> CheckpointTask.prepare's result, for the tasks run
    dtype: str = "float32"  # what every model of the plan runs in (float32 or bfloat16; rows record it)
    batch_arms: bool = True  # the arms of a prompt decode their answers in one batch (False: one at a time, the same)

    def describe(self) -> str:
        c = self.ckpt
        return (f"{c.name} ({c.config.model_type}, trained at {c.train_len}, tokens: {c.tokens.name}"
                f"{', in its chat template' if c.tokens.chat else ''}): "
                f"{', '.join(self.tasks)} x {len(self.settings)} (variant, position) x eval {self.eval_lens}, {self.dtype}")

    def cells(self, only_len: int | None = None) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        """(cell columns, metrics) per cell of one setting, task by task in the registry's order (``only_len``: the
        cells at that length alone)."""
        lens = [only_len] if only_len is not None else self.eval_lens
        return [({"task": t, **cell}, metrics) for t in checkpoint_task_names() if t in self.tasks
                for cell, metrics in get_checkpoint_task(t).cells(self.configs[t], lens, self.data[t])]

    def eval_id(self, task: str) -> str:
        return get_checkpoint_task(task).eval_id(self.ckpt, self.configs[task], self.data[task])


def check_tasks(tasks: Sequence[str]) -> None:
    """A pretrained checkpoint is evaluated as it is: tasks that need training (mqar...) are refused."""
    names = checkpoint_task_names()
    bad = [t for t in tasks if t not in names]
    if bad:
        raise ValueError(f"--task {bad[0]} trains a model; with --hf-model only {', '.join(names)} are evaluated")


DTYPES = ("float32", "bfloat16", "auto")


def check_dtype(dtype: str) -> str:
    """``--dtype``: float32 or bfloat16 as given; ``auto``, the faster of the two on this machine (measured once and
    cached: :func:`harness.environment.faster_dtype`)."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        from harness.environment import faster_dtype

        return faster_dtype()
    return dtype


def plan(path: str | Path, tasks: Sequence[str], variants: Sequence[str], positions: Sequence[str],
         eval_lens: Sequence[int] | None, configs: dict[str, Any] | None = None, presses: Sequence[str] = (),
         query_aware: bool = False, equal_memory: bool = False, dtype: str = "float32", chat_template: bool = False) -> HFPlan:
    """Validate everything (ValueError, one line) before a weight is read: checkpoint, tokens, specs, lengths, corpus,
    presses. ``configs``: task -> config (a task left out gets its checkpoint defaults). ``presses``: KV press specs,
    arms of every setting; ``equal_memory``: also the variants with each press ratio's budget at each length;
    ``dtype``: float32, bfloat16 or auto; ``chat_template``: every prompt in the checkpoint's chat template, the
    context and question as the user's message, the answer's prefix after the assistant's turn opens (KV budgets:
    :func:`harness.accuracy.budgets.budget_plan`)."""
    from harness.presses import parse_presses

    check_tasks(tasks)
    dtype = check_dtype(dtype)
    specs = parse_presses(presses)
    if (query_aware or equal_memory) and not specs:
        raise ValueError(f"--{'query-aware' if query_aware else 'equal-memory'} needs --press")
    for given, what in ((specs, "--press compresses the context a question is asked about"),
                        (chat_template, "--chat-template puts a prompt in the model's chat turns")):
        if given and (plain := [t for t in tasks if not get_checkpoint_task(t).prompts]):
            raise ValueError(f"{what}: --task {plain[0]} scores every position (use "
                             f"{' or '.join(t for t in checkpoint_task_names() if get_checkpoint_task(t).prompts)})")
    ckpt = load_checkpoint(path, chat_template)
    settings = [dataclasses.replace(make_setting(ckpt, v, p), presses=tuple(specs), query_aware=query_aware)
                for v in (variants or [None]) for p in (positions or [CHECKPOINT])]
    refused = press_refusals(ckpt, settings) if specs else []
    if refused and len(refused) == len(settings):  # in a grid where some setting can, the others are recorded
        raise ValueError(f"--press cannot run on any --variant given: {refused[0]}")
    L = ckpt.train_len
    lens = sorted(set(eval_lens or [L, 2 * L, 4 * L]))
    if equal_memory:
        for ratio in sorted({s.ratio for s in specs if s.ratio > 0}):
            for n in lens:
                budget = equal_memory_budget(n, ratio)
                for v in equal_memory_specs(budget):
                    for p in positions or [CHECKPOINT]:
                        settings.append(dataclasses.replace(make_setting(ckpt, v, p), only_len=n, columns=(
                            ("matched_ratio", ratio), ("kv_tokens_min", budget), ("kv_tokens_mean", budget),
                            ("kv_tokens_max", budget))))
    configs = {t: (configs or {}).get(t) or get_checkpoint_task(t).config({}) for t in tasks}
    data = {t: get_checkpoint_task(t).prepare(ckpt, configs[t], lens) for t in tasks}
    return HFPlan(ckpt, tuple(tasks), settings, lens, configs, data, dtype)


def press_refusals(ckpt: Checkpoint, settings: Sequence[Setting]) -> list[str]:
    """Why presses cannot run, for each of ``settings`` that refuses them (:func:`attn.hf.presses.press_unsupported`)."""
    from attn.hf.interface import config_window

    window = config_window(ckpt.config)
    return [why for s in settings if (why := press_unsupported(s.variant, s.layer_specs, window))]


def base_row(p: HFPlan, s: Setting) -> dict[str, Any]:
    from harness.environment import environment

    c = p.ckpt
    return {
        **environment(device=device_for(), seed=0),
        # float32 runs without a chat template keep the run id they had before --dtype existed, so their files resume
        "run_id": f"hf|{s.variant_spec}|{s.position_spec}|{c.ident}" + ("" if p.dtype == "float32" else f"|{p.dtype}")
                  + ("|chat" if c.tokens.chat else ""),
        "dtype": p.dtype, "chat_template": c.tokens.chat is not None, "variant": s.variant,
        "variant_params": s.variant_params, "backend_requested": s.backend, "layer_specs": s.layer_specs,
        "layer_pattern": s.layer_pattern,
        "position": s.position, "position_params": s.position_params, "variant_spec": s.variant_spec,
        "position_spec": s.position_spec, "train_len": c.train_len, "stage": "pretrained", "model": c.name,
        "model_file": str(c.path),
        "model_type": c.config.model_type, "max_position_embeddings": c.config.max_position_embeddings,
        "tokenizer": c.tokens.name, "note": c.tokens.note, "status": "ok", "error": None, **dict(s.columns),
    }


def device_for() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def backends(model: torch.nn.Module) -> str:
    from attn.hf import attention_modules

    return ",".join(sorted({m.last_backend for m in attention_modules(model) if getattr(m, "last_backend", None)}))


def prefill_choices(model: torch.nn.Module) -> dict[str, Any]:
    """A dynamic sparse prefill's choices since the last call, over layers and prompts (density per head, seconds
    choosing against attending): attn.attention.prompt_sparse.selection_columns."""
    from attn.attention.prompt_sparse import selection_columns
    from attn.hf import attention_modules

    return selection_columns([c for m in attention_modules(model) if hasattr(m, "take_selection")
                              for c in m.take_selection()])


def pending_cells(runner: Runner, p: HFPlan, s: Setting) -> list[Todo]:
    """The rows still to measure: one per cell and press (a setting without presses: one per cell, arm None)."""
    base = base_row(p, s)
    own = dict(s.arm_columns)
    arms = [(spec.label, {**spec.columns(s.query_aware), **dict(own.get(spec.label, ())),  # each press its own run
                          "run_id": f"{base['run_id']}|press={spec.label}{'|query_aware' if s.query_aware else ''}"})
            for spec in s.presses] or [(None, {})]
    todo = [({**base, **cell, **cols, "eval_id": p.eval_id(cell["task"])}, cell, m, arm)
            for cell, m in p.cells(s.only_len) for arm, cols in arms]
    return [t for t in todo if runner.pending(t[0], t[2])]


def run_setting(runner: Runner, p: HFPlan, s: Setting, device: str, weights: dict[str, torch.Tensor] | None,
                answered: Answered | None = None) -> None:
    """This setting's pending cells through the evaluation loop (``answered``: prompts of cut cells answered before,
    and where to keep this run's); a setting that refuses its presses records why."""
    from attn.attention.base import UnsupportedBackend

    todo = pending_cells(runner, p, s)
    refused = press_refusals(p.ckpt, [s]) if s.presses and todo else []
    if refused:
        for row, _, metrics, _ in todo:
            runner.fail(row, metrics, UnsupportedBackend(refused[0]))
        return
    evaluate(runner, CheckpointRun(p, s, device, weights, answered), todo, say_rows=True)


@dataclass
class CheckpointRun:
    """One setting of a checkpoint (variant, position, its press arms) as the evaluation loop's subject: the model
    built on the checkpoint's weights, every arm of a cell answered from one shared prefill."""

    p: HFPlan
    s: Setting
    device: str
    weights: dict[str, torch.Tensor] | None
    answered: Answered | None = None
    cache: SharedPrefill | None = None
    chosen: dict[str, Any] = field(default_factory=dict)  # the dynamic sparse prefill's choices in the last cell

    def describe(self, pending: int) -> str:
        s = self.s
        return f"{s.variant_spec} {s.position_spec}{f' x {len(s.presses)} presses' if s.presses else ''}: {pending} rows"

    def load(self) -> tuple[torch.nn.Module, dict[str, Any]]:
        from attn.hf import load_model

        model = load_model(self.p.ckpt.path, self.s.spec, self.s.override, weights=self.weights, config=self.p.ckpt.config)
        model = model.to(device=self.device, dtype=getattr(torch, self.p.dtype))
        self.cache = self.fresh()
        return model, {"params": sum(t.numel() for t in model.parameters())}

    def fresh(self) -> SharedPrefill:
        return SharedPrefill(self.s.presses, self.s.query_aware, self.p.ckpt.tokens.decode, batch=self.p.batch_arms)

    def answer(self, model: torch.nn.Module, cell: dict[str, Any]) -> dict[str | None, dict[str, Measure]]:
        """One cell's measures per arm, the prompts' shared prefixes prefilled once (passkey's instruction, RULER's
        noise before the first needle...)."""
        t, c = cell["task"], self.cache
        assert c is not None
        c.answered, c.scope = self.answered, repr([self.s.variant_spec, self.s.position_spec, self.p.ckpt.ident,
                                                  self.p.dtype, sorted(cell.items())])
        measures = get_checkpoint_task(t).evaluate(model, self.p.ckpt, self.p.configs[t], self.p.data[t], cell,
                                                   self.device, self.cache)
        self.chosen = prefill_choices(model)
        return measures

    def columns(self, model: torch.nn.Module, cell: dict[str, Any], arm: str | None) -> dict[str, Any] | BaseException:
        assert self.cache is not None
        if arm in self.cache.failed:
            return self.cache.failed[arm]
        stats = self.cache.take_stats(arm)
        if "kv_cache_bytes" in stats:  # what the arm's cache held of the context: the bytes a decoded token reads
            stats["kv_bytes"] = stats["kv_cache_bytes"]
        resumed = {"prompts_resumed": self.cache.resumed} if self.cache.resumed else {}
        return {**stats, **self.chosen, **resumed, "backend": backends(model)}

    def after_cell(self, failed: bool) -> None:
        assert self.cache is not None
        self.cache.resumed = 0
        if failed:
            self.cache = self.fresh()  # an answer cut short leaves the shared cache out of step with its tokens
            return
        for arm in self.cache.arms:  # arms already on record were answered too: their statistics are dropped
            self.cache.take_stats(arm)
        self.cache.next_cell()
        if self.answered is not None:  # its rows are on record: its prompts' answers are no longer needed
            self.answered.drop(self.cache.scope)


def run(plans: Sequence[HFPlan], out: Path, resume: bool, echo: Callable[[str], None] = print) -> Runner:
    """Evaluate every setting of every plan in order, appending rows to ``out`` (the accuracy Runner's store, keys and
    resume). The weights of a checkpoint are read once for all its plans."""
    import contextlib

    from attn.hf.models import load_weights
    from harness.accuracy.runner import Runner, memory_cap

    runner = Runner(out, out.parent / ".ckpt", resume, progress=False, echo=echo)
    device = device_for()
    if not resume:
        answers_path(out).unlink(missing_ok=True)  # a new file's cut cells are its own
    answered = Answered(answers_path(out))
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
                run_setting(runner, p, s, device, weights[p.ckpt.path], answered)
    return runner


__all__ = ["HFPlan", "Setting", "check_tasks", "default_tasks", "plan", "press_refusals", "run"]
