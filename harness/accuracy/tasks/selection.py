"""Selector fidelity: how much of full attention each variant's choice of keys keeps, on the same queries.

For a query ``t`` of head ``h``, full attention's probabilities ``p_t`` over the keys it sees, and the keys the variant
reads when ``t`` is the newest token (``Attention.kept_keys``: a window, a block layout, MoBA's routed blocks, Quest's
pages), three numbers:

- ``mass``: ``sum_{j kept} p_t(j)``, the share of full attention's probability on the kept keys (1 = nothing lost);
- ``recall``: the fraction of full attention's ``recall_k`` most probable keys that are kept (queries that see at
  least ``recall_k`` keys);
- ``kept``: kept keys / visible keys, the budget the selection spends.

Each is averaged over the queries of a head (``*_tail``: only the queries in the last eighth of the sequence, where a
budget binds hardest and decoding happens), with a normal interval over those queries. Sources, as the fidelity
task has: ``random`` (i.i.d. N(0, 1) q and k, near-uniform attention: the worst case) and ``trained`` (the q and k,
after rotary positions, that each layer of a model trained with full attention produces on test data); and for a
selector with trained weights of its own (:func:`learns_selection`), ``own`` (the q and k of a model trained with it,
its choice made by its trained weights and token inputs). Inside a pretrained transformers model the same numbers come
from its checkpoint face (``OnCheckpoint`` below).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

import attn
from attn.attention.base import Attention, UnsupportedBackend
from harness.accuracy import build
from harness.accuracy.build import Spec
from harness.accuracy.jobs import Job, Plan, resolved, short_hash
from harness.accuracy.stats import Measure
from harness.accuracy.tasks.base import CheckpointTask, Metric
from harness.accuracy.tasks.fidelity import Fidelity, Runner, _row, attention_inputs, random_qkv
from harness.accuracy.tasks.lm import LMConfig, LMText, lm_text, load_corpus
from harness.accuracy.tasks.registry import register_task

if TYPE_CHECKING:
    import pandas as pd

    from harness.accuracy.checkpoint import Checkpoint

RECALL_K = 16
NAMES = ("mass", "mass_tail", "recall", "kept")
QUERY_CHUNK = 512  # queries scored at once: bounds the (B, H, C, L) probabilities and masks


def _mean(x: torch.Tensor) -> Measure:
    """Mean of per-query values with a 95% normal interval (queries as observations)."""
    n = x.numel()
    if n == 0:
        return Measure(math.nan, None, None, 0)
    m = float(x.mean())
    if n < 2:
        return Measure(m, None, None, n)
    half = 1.96 * float(x.std()) / math.sqrt(n)
    return Measure(m, m - half, m + half, n)


def learns_selection(variant: Spec) -> bool:
    """A variant that keeps keys chosen by weights it trains (its token inputs or parameters: NSA's compression, DSA's
    indexer): besides full attention's model, it is measured in a model trained with it (source ``own``)."""
    m = build.eval_attention(variant)
    return type(m).kept_keys is not Attention.kept_keys and bool(m.token_inputs or list(m.parameters()))


@torch.no_grad()
def selection_measures(module: Any, q: torch.Tensor, k: torch.Tensor, recall_k: int = RECALL_K,
                       inputs: dict[str, torch.Tensor] | None = None) -> list[dict[str, Measure]] | None:
    """Per query head, ``mass``, ``mass_tail``, ``recall`` and ``kept`` of ``module``'s kept keys against full causal
    attention: q (B, H, L, D), k (B, H_kv, L, D), the variant's token inputs (B, H_kv, L, .) if it selects by them ->
    one dict per head; None if the variant keeps no key subset."""
    B, H, L, D = q.shape
    g = H // k.shape[1]
    inputs = inputs or {}

    def upto(e: int) -> dict[str, torch.Tensor]:
        return {n: x[:, :, :e] for n, x in inputs.items()}

    if module.kept_keys(q[:, :, :1], k[:, :, :1], **upto(1)) is None:
        return None
    per: dict[str, list[torch.Tensor]] = {n: [] for n in ("mass", "recall", "kept", "pos")}
    # a dynamic sparse prefill chooses from the whole prompt at once: its (B, H, blocks, L) choice, read per chunk
    whole = module.chosen_keys(q, k) if getattr(module, "sparse_prefill", False) else None
    for a in range(0, L, QUERY_CHUNK):
        e = min(L, a + QUERY_CHUNK)
        qc, kc = q[:, :, a:e].float(), k[:, :, :e].float()
        kept = (module.kept_keys(q[:, :, a:e], k[:, :, :e], **upto(e)) if whole is None
                else whole[:, :, torch.arange(a, e, device=q.device) // module.block, :e]).to(q.device)  # (B, H, C, e)
        t = torch.arange(a, e, device=q.device)
        visible = torch.arange(e, device=q.device)[None, :] <= t[:, None]  # (C, e)
        scores = qc @ kc.repeat_interleave(g, 1).transpose(-2, -1) / math.sqrt(D)
        p = torch.softmax(scores.masked_fill(~visible, -math.inf), -1)
        kept = kept & visible
        per["mass"].append((p * kept).sum(-1))  # (B, H, C)
        per["kept"].append(kept.sum(-1) / visible.sum(-1))
        top = p.topk(min(recall_k, e), -1).indices
        per["recall"].append(kept.gather(-1, top).double().mean(-1))
        per["pos"].append(t.expand(B, H, -1))
    cat = {n: torch.cat(v, -1) for n, v in per.items()}  # (B, H, L)
    tail = cat["pos"] >= L - max(1, L // 8)
    enough = cat["pos"] >= recall_k - 1  # queries that see at least recall_k keys
    return [{"mass": _mean(cat["mass"][:, h]), "mass_tail": _mean(cat["mass"][:, h][tail[:, h]]),
             "recall": _mean(cat["recall"][:, h][enough[:, h]]), "kept": _mean(cat["kept"][:, h])}
            for h in range(H)]


def pooled(heads: list[dict[str, Measure]]) -> dict[str, Measure]:
    """Per-head measures -> their mean over heads, with a 95% normal interval over the heads (heads as observations)."""
    out = {}
    for name in heads[0]:
        values = torch.tensor([h[name].value for h in heads], dtype=torch.float64)
        out[name] = _mean(values[~values.isnan()])
    return out


def _metrics(source: str) -> tuple[str, ...]:
    return tuple(f"{n}_{source}" for n in NAMES)


def _append(runner: Runner, row: dict[str, Any], source: str, module: Any, q: torch.Tensor, k: torch.Tensor,
            inputs: dict[str, torch.Tensor] | None = None) -> None:
    heads = selection_measures(module, q, k, inputs=inputs)
    if heads is None:
        raise UnsupportedBackend(f"{row['variant']} keeps a state, not a subset of keys: nothing to compare")
    for h, measures in enumerate(heads):
        runner.append({**row, "head": h}, {f"{n}_{source}": m for n, m in measures.items()})


def run_selection(runner: Runner, p: Plan) -> None:
    job = p.job
    H, D = job.fidelity_heads, job.fidelity_head_dim
    for seed in job.seeds:
        for L in p.eval_lens:
            q, k, _ = random_qkv(seed, H, L, D)
            for variant in p.variants:
                row = _row(runner, p, variant, seed, L, "random", run_id=f"random|H{H}|D{D}|s{seed}", position="none",
                           position_params={}, train_len=None, num_heads=H, head_dim=D, task="selection")
                if not runner.pending({**row, "head": 0}, _metrics("random")):
                    continue
                try:
                    _append(runner, row, "random", build.eval_attention(variant), q, k)
                except Exception as e:
                    runner.fail(row, _metrics("random"), e)
        for run in (r for r in p.runs if r.seed == seed):
            run_trained(runner, p, run)


def run_trained(runner: Runner, p: Plan, run: Any) -> None:
    """The selection measures on the q and k of one trained model, per layer, at every length: full attention's model
    measures every variant (source ``trained``); a model trained with a learned selector measures that selector's own
    choice, by its trained weights and token inputs, against full attention on the same q and k (source ``own``)."""
    job = p.job
    own = run.variant.name != "full"
    source, variants = ("own", [run.variant]) if own else ("trained", p.variants)
    base = {**runner.base_row(p, run, "zero_shot"), "task": "selection", "base_task": p.task.name}
    layers = attn.PRESETS[job.model]["n_layers"]
    todo = []
    for L in p.eval_lens:
        params = build.scaled_params(run.position, job.train_len, L, p.head_dim)
        at = {**base, "eval_len": L, "source": source,
              "position_params": resolved("position", Spec(run.position.name, params), p.head_dim)}
        cells = [({**at, "variant": v.name, "variant_params": resolved("attention", v), "variant_spec": v.label,
                   "backend_requested": v.backend, "layer": i}, v) for v in variants for i in range(layers)]
        cells = [c for c in cells if runner.pending({**c[0], "head": 0}, _metrics(source))]
        if cells:
            todo.append((L, params, cells))
    if not todo:
        return
    runner.echo(f"selection {run.position.label} seed {run.seed}: {len(todo)} lengths")
    try:
        model, result = runner.trained(p, run)
    except Exception as e:
        for _, _, cells in todo:
            for r, _ in cells:
                runner.fail(r, _metrics(source), e)
        return
    extra = {"params": model.num_params(), "train_loss": result.final_loss}
    for L, params, cells in todo:
        build.set_position(model, run.position.name, params)
        captured = attention_inputs(model, p.task.sample_inputs(max(1, 4096 // L), L))
        for r, variant in cells:
            q, k, _, _, inputs = captured[r["layer"]]
            try:
                if own:  # the trained module itself: its compression weights; its indexer's inputs from this text
                    _append(runner, {**r, **extra}, source, model.blocks[r["layer"]].attn.attn, q, k, inputs)
                else:
                    _append(runner, {**r, **extra}, source, build.eval_attention(variant), q, k)
            except Exception as e:
                runner.fail({**r, **extra}, _metrics(source), e)

# -- on a pretrained checkpoint ---------------------------------------------------------------------------------------
# ``selection`` on a pretrained checkpoint: how much of full attention each variant's kept keys hold inside the model.
#
# The checkpoint reads one window of ``eval_len`` tokens of lm's test text (the lm task's checkpoint face) with full
# attention, and every layer's queries and keys (after its rotary positions) are recorded; each variant then chooses
# its keys on them (``Attention.kept_keys``) and is scored against full attention's probabilities by
# :func:`harness.accuracy.tasks.selection.selection_measures`. One cell per (length, layer), pooled over the layer's
# query heads (their interval is over heads). The capture is made once per length and RoPE and shared by every variant
# of the run: it does not depend on the variant, whose model runs full attention for it.
SOURCE = "checkpoint"
METRICS = tuple(f"{n}_{SOURCE}" for n in NAMES)
_CAPTURED: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # the last capture only (key -> per layer q, k)


@torch.no_grad()
def capture(model: torch.nn.Module, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(q, k) each attention layer receives on ``ids`` (1, L), with the model switched to full attention meanwhile."""
    from attn.hf import set_variant

    before = model.config._attn_implementation
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(module: torch.nn.Module, args: tuple, out: Any) -> None:
        if isinstance(module, Attention):
            seen.append((args[0].detach().cpu(), args[1].detach().cpu()))

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        set_variant(model, "full")
        model.base_model(input_ids=ids, use_cache=False)
    finally:
        handle.remove()
        model.set_attn_implementation(before)
    return seen


def layers_of(model_config: Any) -> int:
    return int(model_config.num_hidden_layers)


class OnCheckpoint(CheckpointTask):
    """Full attention's mass on each variant's kept keys, per layer of the checkpoint, on its own text."""

    @classmethod
    def config(cls, params: dict[str, Any]) -> LMConfig:
        return LMConfig(**params)  # lm's text source: the corpus and how much of its test split to read

    @classmethod
    def prepare(cls, ckpt: Checkpoint, config: LMConfig, lens: Sequence[int]) -> tuple[LMText, int]:
        return lm_text(config, ckpt.tokens, lens[-1]), layers_of(ckpt.config)

    @classmethod
    def cells(cls, config: LMConfig, lens: Sequence[int], data: tuple[LMText, int]
              ) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
        return [({"eval_len": L, "source": SOURCE, "layer": i}, METRICS) for L in lens for i in range(data[1])]

    @classmethod
    def eval_id(cls, ckpt: Checkpoint, config: LMConfig, data: tuple[LMText, int]) -> str:
        corpus = load_corpus(config.corpus, config.test_fraction)
        return short_hash({"corpus": corpus.name, "test_bytes": len(corpus.test), "region": data[0].region_bytes,
                           "tokens": ckpt.tokens.name, "task": "selection"})

    @classmethod
    def evaluate(cls, model: torch.nn.Module, ckpt: Checkpoint, config: LMConfig, data: tuple[LMText, int],
                 cell: dict[str, Any], device: str, cache: Any) -> dict[str | None, dict[str, Measure]]:
        from attn.hf.interface import check_model_window, config_window, current_variant

        variant = current_variant(model)
        if variant is None:
            raise UnsupportedBackend("selection scores one attn-bench variant in every layer; this model runs "
                                     f"{model.config._attn_implementation}")
        module = variant.build(check_model_window(variant, config_window(model.config)))
        L = cell["eval_len"]
        key = (ckpt.ident, L, repr(getattr(model.config, "rope_parameters", None)),
               repr(getattr(model.config, "rope_scaling", None)))
        if key not in _CAPTURED:
            _CAPTURED.clear()
            _CAPTURED[key] = capture(model, data[0].ids[:L][None].to(device))
        q, k = _CAPTURED[key][cell["layer"]]
        heads = selection_measures(module, q, k)
        if heads is None:
            raise UnsupportedBackend(f"{module.name} keeps a state, not a subset of keys: nothing to compare")
        return {None: {f"{n}_{SOURCE}": m for n, m in pooled(heads).items()}}


@register_task("selection")
class Selection(Fidelity):
    """How much of full attention's probability mass, and of its top keys, each variant's kept keys hold."""

    pretrained = OnCheckpoint
    main_metric = "mass_trained"
    columns = ("source", "layer", "head")
    figures = ("selection",)

    @classmethod
    def metric(cls, name: str) -> Metric:
        """``mass_*``, ``kept_*``, ``recall_*``: shares of full attention's mass, of the keys, of its top keys."""
        return Metric(name, "proportion" if name.startswith(("mass_", "kept_", "recall_")) else "mean")

    @classmethod
    def default_job(cls) -> Job:
        return Job(cls.name, variants=["sliding_window", "block_sparse", "moba", "quest"], positions=["rope"])

    @classmethod
    def trained_variants(cls, variants: list[Spec]) -> list[Spec]:
        return [Spec("full"), *(v for v in variants if learns_selection(v))]

    @classmethod
    def eval_bytes_per_token(cls, job: Job, hidden: int) -> int:
        return max(hidden, 2 * 4 * job.fidelity_heads * job.fidelity_head_dim)  # random float32 q, k

    @classmethod
    def run_inputs(cls, runner: Any, p: Plan) -> None:
        run_selection(runner, p)

    @classmethod
    def run_model(cls, runner: Any, p: Plan, run: Any) -> None:
        run_trained(runner, p, run)

    @classmethod
    def summary(cls, rows: list[dict[str, Any]]) -> tuple[str, pd.DataFrame] | None:
        import pandas as pd

        from harness.accuracy.stats import summarize

        sel = pd.DataFrame(summarize(r for r in rows if r.get("task") == cls.name))
        if not len(sel):
            return None
        sel = sel[sel["metric"].str.startswith(("mass", "kept"))]
        t = sel.pivot_table(index=["metric", "variant_spec"], columns="eval_len", values="value", aggfunc="mean")
        return "selection vs full attention (mean over layers, heads and seeds)", t


__all__ = ["NAMES", "RECALL_K", "Selection", "learns_selection", "pooled", "run_selection", "run_trained", "selection_measures"]
