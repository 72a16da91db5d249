"""The press axis of ``--scope hf`` (``--press``): what a KV press (attn.hf.presses: kvpress's presses by name,
``none``, ``quantized``) costs inside a transformers model, timed the way kvpress's pipeline runs it.

- ``forward``: the prefill of L tokens with the press's hooks on, into a fresh cache of the press's kind each call
  (``with press(model): model.model(input_ids, past_key_values=cache)``: attn.hf.replay.prefill_with), so the row
  says what scoring and pruning cost on top of the prefill; ``none`` is the same prefill into a cache without hooks.
  The LM head does not run (kvpress prefills the base model). The kept tokens are the last timed call's cache's.
- ``decode``: the context prefilled and compressed outside the timed region, then one token decoded against the
  compressed cache at position L (the context's true position, as kvpress decodes), the cache put back after each
  timed step (:func:`rewind`).
- ``train``: refused when the grid is read (training keeps no KV cache to compress).

On a model with layer types a press runs on the model's own pattern (``--pattern own``: its sliding layers at their
window, the others pressed), replayed on a recorded prefill (:func:`context_cache`), as the evaluation runs it.

Rows carry the press (``press``, ``press_spec``, ``press_params``, ``compression_ratio``: Cell fields) and what the
cache holds (attn.hf.presses.cache_columns). Presses that prune compose with our ``full`` variant only
(attn.hf.presses.press_unsupported); such a cell, a press that compresses while decoding in a decode
cell, and a press that fails inside the model (kvpress's observed_attention wants eager attention) are recorded as
``unsupported`` with the reason.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from attn.attention.base import UnsupportedBackend
from harness.cost.cells import Cell, Measured
from harness.cost.options import strs


def press_labels(value: Any, where: str) -> list[str]:
    """The ``press`` option: press specs, each validated now (harness.presses) -> their labels."""
    from harness.presses import parse_presses as specs

    return [s.label for s in specs(strs(split=False)(value, where), where)]  # commas belong to a spec: name:k=v,k=v


def press_fields(text: str) -> dict[str, Any]:
    """The Cell fields of a press spec (every parameter it runs with, defaults included, as rows record them)."""
    from attn.hf.presses import parse_press

    return parse_press(text).columns()


def check_press(cell: Cell, config: Any, arm: Any, layer_specs: dict[str, str] | None) -> None:
    """Refuse (UnsupportedBackend) what a press cannot time here: a pruning press on a variant that picks keys by
    position or on a model with several layer types outside its own pattern (``--pattern own``), and in decode a press
    that compresses while decoding (``arm``: the spec's :class:`attn.hf.arms.Arm`). ``config``: the built model's;
    ``layer_specs``: the spec each of its layer types runs (None: one layer type), as the model was built."""
    from attn.hf.presses import press_unsupported
    from attn.patterns import LAYERS

    # none and quantized keep every key
    why = (press_unsupported(cell.variant, layer_specs, getattr(config, "sliding_window", None))
           if arm.press is not None else None)
    if why is not None and layer_specs is not None and cell.variant != LAYERS:
        why += " (--pattern own)"
    if why is None and cell.mode == "decode" and arm.decodes:
        why = (f"press {cell.press_spec} compresses while decoding too, so a decode step's cost changes from step to "
               "step: time it in forward")
    if why is not None:
        raise UnsupportedBackend(why)


def context_cache(model: Any, spec: Any, arm: Any, idx: torch.Tensor) -> Any:
    """The context ``idx`` prefilled into a cache as the arm leaves it: by the press's own prefill (kvpress's
    pipeline), except on a model whose sliding layers keep their window (Gemma 3), where kvpress's hooks would press
    those layers too: there every arm that replays is replayed on a recorded prefill as the evaluation does it
    (attn.hf.replay.compress): the sliding layers keep their last window - 1 keys, the global ones what the press
    leaves (all of them for ``none`` and the quantized caches)."""
    from transformers import DynamicCache

    from attn.hf.layers import window_layers
    from attn.hf.presses import language_model
    from attn.hf.replay import Recorder, compress, prefill_with

    if not arm.replays or not window_layers(model.config):
        return prefill_with(model, spec, arm.press, idx)
    cache, recorder = DynamicCache(), Recorder(model)
    with torch.no_grad(), recorder.recording():
        language_model(model)(input_ids=idx, past_key_values=cache, use_cache=True)
    return compress(model, spec, arm.press, [layer.keys for layer in cache.layers],
                    [layer.values for layer in cache.layers], recorder)


def rewind(cache: Any) -> Callable[[], None]:
    """What puts ``cache`` back as it is now after a decode step: ``crop(-1)``, layer by layer (a press may keep a
    different number of tokens per layer). A quantized layer cannot be cropped (``crop`` would cut its full-precision
    residual only, and not its count of tokens seen): its attributes are put back as they were instead, which holds
    because ``update`` rebinds them and never writes into their tensors. Each timed step of a quantized cache thus
    dequantizes all L tokens, as every step does; its re-quantization every ``residual_length`` steps is not timed."""
    from transformers.cache_utils import QuantizedLayer

    if not any(isinstance(layer, QuantizedLayer) for layer in cache.layers):
        return functools.partial(cache.crop, -1)
    saved = [dict(vars(layer)) for layer in cache.layers]

    def restore() -> None:
        for layer, state in zip(cache.layers, saved, strict=True):
            vars(layer).update(state)
    return restore


def build_press(cell: Cell, model: Any, idx: torch.Tensor, backend: Callable[[], str | None],
                flops: Callable[[list[int] | None], int], layer_specs: dict[str, str] | None) -> Measured:
    """The measured callable of a press cell (forward or decode) on ``model`` with context ``idx`` (B, L).
    ``flops(kept)``: the cell's FLOPs, a decode step attending over ``kept`` tokens per layer (None in forward);
    ``layer_specs``: the spec each layer type of ``model`` runs (:func:`check_press`)."""
    from attn.hf.arms import arm
    from attn.hf.presses import cache_columns, kept_tokens, parse_press
    from harness.presses import press_refusal

    spec = parse_press(cell.press_spec or "")
    measured = arm(spec)
    check_press(cell, model.config, measured, layer_specs)
    B, L = idx.shape
    if cell.mode == "forward":
        last: list[Any] = []

        def prefill() -> None:
            last.clear()  # the previous call's cache goes before this one fills: one cache alive, as in a pipeline
            try:
                last.append(context_cache(model, spec, measured, idx))
            except Exception as e:  # noqa: BLE001  (kept as the cell's status)
                raise press_refusal(cell.press_spec or "", e) from e

        return Measured(prefill, flops(None), B * L, backend, columns=lambda: cache_columns(last[0]))
    try:
        cache = context_cache(model, spec, measured, idx)  # untimed: the compressed context
    except Exception as e:  # noqa: BLE001
        raise press_refusal(cell.press_spec or "", e) from e
    token = torch.randint(0, model.config.vocab_size, (B, 1), device=idx.device)
    position = torch.full((B, 1), L, device=idx.device)  # the context's length, not the cache's
    back, columns = rewind(cache), cache_columns(cache)

    def decode_step() -> torch.Tensor:
        with torch.no_grad():
            out = model(token, past_key_values=cache, position_ids=position, use_cache=True).logits
        back()  # every timed step decodes against the same compressed cache
        return out

    return Measured(decode_step, flops(kept_tokens(cache)), B, backend, cache, columns=lambda: columns)


__all__ = ["build_press", "check_press", "context_cache", "press_fields", "press_labels", "rewind"]
