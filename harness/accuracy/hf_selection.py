"""``selection`` on a pretrained checkpoint: how much of full attention each variant's kept keys hold inside the model.

The checkpoint reads one window of ``eval_len`` tokens of lm's test text (:mod:`harness.accuracy.hf_lm`) with full
attention, and every layer's queries and keys (after its rotary positions) are recorded; each variant then chooses
its keys on them (``Attention.kept_keys``) and is scored against full attention's probabilities by
:func:`harness.accuracy.tasks.selection.selection_measures`. One cell per (length, layer), pooled over the layer's
query heads (their interval is over heads). The capture is made once per length and RoPE and shared by every variant
of the run: it does not depend on the variant, whose model runs full attention for it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attn.attention.base import Attention, UnsupportedBackend
from harness.accuracy.hf_checkpoint import Checkpoint
from harness.accuracy.hf_lm import LMText, lm_text
from harness.accuracy.hf_tasks import CheckpointTask, register_checkpoint_task
from harness.accuracy.jobs import short_hash
from harness.accuracy.stats import Measure
from harness.accuracy.tasks.lm import LMConfig, load_corpus
from harness.accuracy.tasks.selection import NAMES, pooled, selection_measures

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


@register_checkpoint_task("selection")
class CheckpointSelection(CheckpointTask):
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


__all__ = ["CheckpointSelection", "capture"]
