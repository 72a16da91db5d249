"""Fidelity: how far each variant's output is from exact ``full`` attention, on the same inputs.

Three views, from the most controlled to the most practical:

- ``random``: q, k, v drawn i.i.d. N(0, 1) (no training); near-uniform attention, the worst
  case for methods that drop keys.
- ``trained``: the q, k, v that a model trained with full attention actually produces in each
  layer on test data (peaked, local patterns), fed to each variant.
- ``swap``: that model run end to end with every layer's attention swapped for the variant
  at inference, scored with the task's own metric; ``swap_delta_*`` is the change from full.

Errors: relative L2 ``||o - o_full|| / ||o_full||`` and the mean cosine between output rows.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

import attn
from harness.accuracy import build
from harness.accuracy.build import Spec
from harness.accuracy.jobs import Job, Plan, resolved
from harness.accuracy.stats import Measure
from harness.accuracy.tasks.base import BuiltOnTask, Metric
from harness.accuracy.tasks.registry import declared_metric, register_task
from harness.environment import environment

if TYPE_CHECKING:
    import pandas as pd

CAUSAL = True


class Runner(Protocol):
    """What fidelity uses of :class:`harness.accuracy.runner.Runner` (which calls :func:`run_fidelity`)."""

    echo: Callable[[str], None]

    def pending(self, base: dict[str, Any], metrics: tuple[str, ...]) -> bool: ...

    def append(self, base: dict[str, Any], measures: dict[str, Measure]) -> None: ...

    def fail(self, base: dict[str, Any], metrics: tuple[str, ...], err: BaseException) -> None: ...

    def trained(self, p: Plan, run: Any) -> tuple[Any, Any]: ...

    def base_row(self, p: Plan, run: Any, stage: str) -> dict[str, Any]: ...


def output_error(out: torch.Tensor, ref: torch.Tensor) -> dict[str, Measure]:
    """rel_l2 and mean row cosine of ``out`` against ``ref``, both (B, H, L, D)."""
    out, ref = out.double(), ref.double()
    rel = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
    cos = torch.nn.functional.cosine_similarity(out.flatten(0, 2), ref.flatten(0, 2), dim=-1, eps=1e-30)
    n = cos.numel()
    return {"rel_l2": Measure(rel, None, None, n), "cosine": Measure(float(cos.mean()), None, None, n)}


def random_qkv(seed: int, heads: int, length: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + length)
    return tuple(torch.randn(1, heads, length, head_dim, generator=g) for _ in range(3))  # each (1, H, L, D)


@torch.no_grad()
def attention_inputs(model: attn.Transformer, inputs: torch.Tensor) -> list[tuple[Any, ...]]:
    """(q, k, v, out, token inputs) that each layer's attention sees and returns on ``inputs`` (after rotary
    positions); token inputs: the variant's own per-token inputs by name (a learned selector's indexer, gates)."""
    captured: list[tuple[Any, ...]] = []

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, out: torch.Tensor) -> None:
        captured.append((*args[:3], out, {t.name: kwargs[t.name] for t in module.token_inputs}))

    handles = [b.attn.attn.register_forward_hook(hook, with_kwargs=True) for b in model.blocks]
    try:
        model.eval()
        model(inputs)
    finally:
        for h in handles:
            h.remove()
    return captured


def _row(runner: Runner, p: Plan, variant: Spec, seed: int, length: int, source: str, **extra: Any) -> dict[str, Any]:
    return {**environment(seed=seed), "task": "fidelity", "variant": variant.name, "variant_spec": variant.label,
            "backend_requested": variant.backend,
            "variant_params": resolved("attention", variant), "eval_len": length, "source": source,
            "model": p.job.model, "status": "ok", "error": None, **extra}


def run_fidelity(runner: Runner, p: Plan) -> None:
    job = p.job
    H, D = job.fidelity_heads, job.fidelity_head_dim
    for seed in job.seeds:
        # random q, k, v: one row per variant and length
        for L in p.eval_lens:
            q, k, v = random_qkv(seed, H, L, D)
            ref = None
            for variant in p.variants:
                row = _row(runner, p, variant, seed, L, "random", run_id=f"random|H{H}|D{D}|s{seed}", position="none",
                           position_params={}, train_len=None, num_heads=H, head_dim=D)
                metrics = ("rel_l2_random", "cosine_random")
                if not runner.pending(row, metrics):
                    continue
                try:
                    ref = attn.build_attention("full")(q, k, v, causal=CAUSAL) if ref is None else ref
                    m = build.eval_attention(variant)
                    err = output_error(m(q, k, v, causal=CAUSAL), ref)
                except Exception as e:
                    runner.fail(row, metrics, e)
                    continue
                runner.append({**row, "backend": m.last_backend}, {f"{k}_random": x for k, x in err.items()})
        for run in (r for r in p.runs if r.seed == seed):
            run_trained(runner, p, run)


ACT_METRICS = ("rel_l2_trained", "cosine_trained")


def swap_metrics(p: Plan, cell: dict[str, Any], variant: Spec) -> tuple[str, ...]:
    names = p.task.metrics(cell, p.job.train_len)
    return tuple(f"swap_{m}" for m in names) + (() if variant.name == "full" else tuple(f"swap_delta_{m}" for m in names))


def run_trained(runner: Runner, p: Plan, run: Any) -> None:
    """Activation and swap fidelity of one model trained with full attention, at every length."""
    job = p.job
    vp = lambda v: {"variant": v.name, "variant_params": resolved("attention", v), "variant_spec": v.label,  # noqa: E731
                    "backend_requested": v.backend}
    base = {**runner.base_row(p, run, "zero_shot"), "task": "fidelity", "base_task": p.task.name}
    todo = []
    for L in p.eval_lens:
        params = build.scaled_params(run.position, job.train_len, L, p.head_dim)
        at = {**base, "eval_len": L, "position_params": resolved("position", Spec(run.position.name, params), p.head_dim)}
        acts = [({**at, **vp(v), "source": "trained", "layer": i}, v)
                for v in p.variants for i in range(attn.PRESETS[job.model]["n_layers"])]
        swaps = [({**at, **cell, **vp(v), "source": "swap"}, v, cell)
                 for cell in p.task.cells(job.train_len, [L]) for v in [Spec("full"), *p.variants]]
        acts = [a for a in acts if runner.pending(a[0], ACT_METRICS)]
        swaps = [s for s in swaps if runner.pending(s[0], swap_metrics(p, s[2], s[1]))]
        if acts or swaps:
            todo.append((L, params, acts, swaps))
    if not todo:
        return
    runner.echo(f"fidelity {run.position.label} seed {run.seed}: {len(todo)} lengths")
    try:
        model, result = runner.trained(p, run)
    except Exception as e:
        for _, _, acts, swaps in todo:
            for r, _ in acts:
                runner.fail(r, ACT_METRICS, e)
            for r, v, cell in swaps:
                runner.fail(r, swap_metrics(p, cell, v), e)
        return
    extra = {"params": model.num_params(), "train_loss": result.final_loss}
    for L, params, acts, swaps in todo:
        build.set_position(model, run.position.name, params)
        captured = attention_inputs(model, p.task.sample_inputs(max(1, 8192 // L), L))
        for r, variant in acts:
            q, k, v, ref, _ = captured[r["layer"]]
            try:
                m = build.eval_attention(variant)
                err = output_error(m(q, k, v, causal=CAUSAL), ref)
            except Exception as e:
                runner.fail({**r, **extra}, ACT_METRICS, e)
                continue
            runner.append({**r, **extra, "backend": m.last_backend}, {f"{k}_trained": x for k, x in err.items()})
        full: dict[str, dict[str, Measure]] = {}  # cell key -> the full model's metrics
        for r, variant, cell in swaps:
            swap(runner, p, model, {**r, **extra}, variant, cell, full)


def swap(runner: Runner, p: Plan, model: attn.Transformer, row: dict[str, Any], variant: Spec, cell: dict[str, Any],
         full: dict[str, dict[str, Measure]]) -> None:
    """The task metric with ``variant`` swapped into every layer, and its change from full attention."""
    key = repr(sorted(cell.items()))
    names = swap_metrics(p, cell, variant)
    try:
        if key not in full:
            full[key] = p.task.evaluate(model, cell, p.job.train_len)
        build.set_attention(model, variant)
        got = p.task.evaluate(model, cell, p.job.train_len)
        backend = build.last_backends(model)
    except Exception as e:
        runner.fail(row, names, e)
        return
    finally:
        build.set_attention(model, Spec("full"))
    out = {f"swap_{k}": m for k, m in got.items()}
    if variant.name != "full":
        out |= {f"swap_delta_{k}": Measure(m.value - full[key][k].value, None, None, m.n) for k, m in got.items()}
    runner.append({**row, "backend": backend}, out)


SUMMARY_METRICS = ("rel_l2_random", "rel_l2_trained", "swap_delta_bpb", "swap_delta_accuracy", "swap_delta_exact_match")


@register_task("fidelity")
class Fidelity(BuiltOnTask):
    """How far each variant's output is from full attention's: random inputs, a trained model's, the model swapped."""

    main_metric = "rel_l2_trained"
    columns = ("source", "layer")
    figures = ("fidelity",)
    versus_full = True

    @classmethod
    def metric(cls, name: str) -> Metric:
        """``rel_l2_<inputs>`` a loss, ``cosine_<inputs>`` a mean; ``swap_<m>`` the base task's metric m as it
        declares it, ``swap_delta_<m>`` its change from full (a loss's is a loss, a proportion's a mean)."""
        if name.startswith("rel_l2_"):
            return Metric(name, "loss")
        for prefix in ("swap_delta_", "swap_"):
            if name.startswith(prefix) and (base := declared_metric(name[len(prefix):])) is not None:
                kind = "mean" if prefix == "swap_delta_" and base.proportion else base.kind
                return Metric(name, kind)
        return Metric(name, "mean")

    @classmethod
    def default_eval_lens(cls, train_len: int) -> list[int]:
        return [train_len, 4 * train_len]

    @classmethod
    def default_job(cls) -> Job:
        from harness.accuracy.presets import VARIANTS

        return Job(cls.name, variants=list(VARIANTS), positions=["rope"])

    @classmethod
    def evaluated_variants(cls, variants: list[Spec]) -> list[Spec]:
        variants = [v for v in variants if v.name != "full"]
        if not variants:
            raise ValueError("fidelity compares variants with full attention: give at least one other --variant")
        return variants

    @classmethod
    def trained_variants(cls, variants: list[Spec]) -> list[Spec]:
        return [Spec("full")]  # the variants are swapped into full attention's model

    @classmethod
    def eval_bytes_per_token(cls, job: Job, hidden: int) -> int:
        return max(hidden, 3 * 4 * job.fidelity_heads * job.fidelity_head_dim)  # random float32 q, k, v

    @classmethod
    def units(cls, p: Plan) -> list[tuple[int | None, int]]:
        """Per seed: the random-input rows (no trained model), then each model trained with that seed."""
        return [u for seed in p.job.seeds for u in [(None, seed), *((i, seed) for i, r in enumerate(p.runs)
                                                                   if r.seed == seed)]]

    @classmethod
    def run_inputs(cls, runner: Any, p: Plan) -> None:
        """The random-input rows, then every trained model's (a task built on this one overrides both)."""
        run_fidelity(runner, p)

    @classmethod
    def run_model(cls, runner: Any, p: Plan, run: Any) -> None:
        run_trained(runner, p, run)

    @classmethod
    def run_unit(cls, runner: Any, p: Plan, run: int | None, seed: int) -> None:
        if run is None:
            cls.run_inputs(runner, dataclasses.replace(p, runs=[], job=dataclasses.replace(p.job, seeds=[seed])))
        else:
            cls.run_model(runner, p, p.runs[run])

    @classmethod
    def run(cls, runner: Any, p: Plan) -> None:
        cls.run_inputs(runner, p)

    @classmethod
    def summary(cls, rows: list[dict[str, Any]]) -> tuple[str, pd.DataFrame] | None:
        import pandas as pd

        from harness.accuracy.stats import summarize

        fid = pd.DataFrame(summarize(r for r in rows if r.get("task") == cls.name))
        if not len(fid):
            return None
        fid = fid[fid["metric"].isin(SUMMARY_METRICS)]
        t = fid.pivot_table(index=["metric", "variant_spec"], columns="eval_len", values="value", aggfunc="mean")
        return "fidelity vs full attention (mean over layers and seeds)", t


__all__ = ["Fidelity", "attention_inputs", "output_error", "random_qkv", "run_fidelity", "swap"]
