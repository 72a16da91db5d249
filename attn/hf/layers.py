"""One variant spec per layer type, for models whose config lists ``layer_types`` (Gemma 2/3's sliding and global
layers, Qwen2 with use_sliding_window, any hybrid transformers describes that way).

A layer spec is the model's own pattern unless told otherwise:

- ``own`` (or nothing): sliding layers run our ``sliding_window`` at the model's window, full layers ``full``;
- a plain spec (``full``, ``block_sparse:block_size=64``): every layer type runs it (``full`` = all-global);
- ``TYPE=SPEC;TYPE=SPEC``: the named types run those specs, the others their own (``sliding_attention=
  sliding_window:sinks=4`` = the model's window plus StreamingLLM's sinks; ``full_attention=block_sparse``).

A sliding layer that runs anything but the model's own window (another window, sinks, full, block-sparse...)
needs every key the model's cache would drop (it keeps only ``window - 1``), so its window is *lifted*: the
config's ``sliding_window`` is set past any length (the cache keeps everything; the RoPE of each layer type is
untouched) and the layer's attention ignores the window transformers passes. Rows record the spec per type.
"""
from __future__ import annotations

from attn.hf.needs import transformers as _transformers  # noqa: F401  (first: a broken install is an ImportError)

# isort: split

import re
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedConfig
from transformers.masking_utils import AttentionMaskInterface

from attn.hf.interface import PREFIX, attention_function, variant_of
from attn.hf.padding import padding_mask
from attn.registry import shorten

OWN = "own"
SLIDING, FULL = "sliding_attention", "full_attention"
LIFTED_WINDOW = 2**30  # a sliding_window no evaluation reaches: the cache keeps every key


@dataclass(frozen=True)
class LayerPlan:
    """The spec each layer type runs, and the sliding types whose model window is lifted."""

    specs: tuple[tuple[str, str], ...]  # (layer type, variant spec), in the model's order of first appearance
    lifted: tuple[str, ...]
    every: str | None = None  # the plain spec every type runs, when the layer spec was one

    @property
    def is_own(self) -> bool:
        """The model's own pattern (any backend): its window where it has one, plain full attention elsewhere."""
        return not self.lifted and all(t == SLIDING or (variant_of(s).name == "full" and not variant_of(s).params)
                                       for t, s in self.specs)


def own_spec(layer_type: str, window: int | None) -> str:
    if layer_type == SLIDING:
        return f"sliding_window:window={window}"
    if layer_type == FULL:
        return "full"
    raise ValueError(f"layer type {layer_type!r} has no attn-bench equivalent (known: {SLIDING}, {FULL})")


def parse_layer_spec(text: str | None) -> tuple[str | None, dict[str, str]]:
    """``own`` / a plain spec / ``TYPE=SPEC;...`` -> (spec for every type or None, per-type specs)."""
    if text in (None, "", OWN):
        return None, {}
    parts = [p.strip() for p in text.split(";")]
    typed = [re.match(r"^(\w+)=(.+)$", p) for p in parts]
    if not any(typed):  # no part starts with TYPE= (a variant spec has ':' before any '=')
        if len(parts) > 1:
            raise ValueError(f"layer spec {shorten(text)}: separate per-type specs as TYPE=SPEC;TYPE=SPEC")
        return text, {}
    if not all(typed):
        raise ValueError(f"layer spec {shorten(text)}: every part must be TYPE=SPEC (e.g. {SLIDING}=full;{FULL}=full)")
    out: dict[str, str] = {}
    for m in typed:
        if m.group(1) in out:
            raise ValueError(f"layer spec {shorten(text)}: layer type {m.group(1)} given twice")
        out[m.group(1)] = m.group(2)
    return None, out


def is_own_window(spec: str, window: int | None) -> bool:
    """Exactly the model's sliding window (what its cache serves): sliding_window with that window, nothing else."""
    v = variant_of(spec)
    params = dict(v.params)
    return v.name == "sliding_window" and params.pop("window", window) == window and not params


def layer_plan(config: PreTrainedConfig, text: str | None) -> LayerPlan | None:
    """The plan for a model with layer types (None for a model without, or with one type given a plain spec: one
    spec for all, under the sliding-window rule); ValueError naming the model's layer types for an unknown one, and for
    any invalid spec."""
    types = list(dict.fromkeys(getattr(config, "layer_types", None) or ()))
    every, typed = parse_layer_spec(text)
    if not types:
        if typed:
            raise ValueError(f"this model has no layer types (config.layer_types is unset): give one variant spec, "
                             f"not {', '.join(typed)}")
        return None
    if len(types) == 1 and every is not None:  # one layer type (Qwen2, Gemma 2 configured so): one spec, as before
        return None
    if types == [FULL] and text is None:  # every layer full attention (Qwen2): no pattern to keep, a plain model
        return None
    unknown = [t for t in typed if t not in types]
    if unknown:
        raise ValueError(f"the model has no layer type {unknown[0]}; its layer types: {', '.join(types)}")
    window = getattr(config, "sliding_window", None)
    if window is not None and window >= LIFTED_WINDOW:
        raise ValueError(f"config.sliding_window={window} is already lifted: plan the model from its own config")
    specs = tuple((t, typed.get(t) or every or own_spec(t, window)) for t in types)
    for _, spec in specs:
        variant_of(spec)  # ValueError for an unknown variant, parameter or backend
    return LayerPlan(specs, lifted_types(specs, window), every)


def lifted_types(specs: tuple[tuple[str, str], ...], window: int | None) -> tuple[str, ...]:
    """The sliding types whose spec is not exactly the model's window: their window is lifted (module docstring)."""
    return tuple(t for t, s in specs if t == SLIDING and not is_own_window(s, window))


def own_pattern(layer_specs: dict[str, str], window: int | None) -> bool:
    """Recorded layer specs that are the model's own pattern at its ``window`` (:attr:`LayerPlan.is_own`)."""
    specs = tuple(layer_specs.items())
    return window is not None and LayerPlan(specs, lifted_types(specs, window)).is_own


def window_layers(config: Any) -> dict[int, int]:
    """Layer index -> window, for the layers the model's own sliding window serves (none once the window is lifted).
    Presses leave them uncompressed, and a press arm's cache keeps their last ``window - 1`` keys, what transformers'
    sliding cache keeps: the memory such a layer really holds."""
    window = getattr(config, "sliding_window", None)
    if window is None or window >= LIFTED_WINDOW:
        return {}
    return {i: int(window) for i, t in enumerate(getattr(config, "layer_types", None) or ()) if t == SLIDING}


def register_layers(plan: LayerPlan, config: PreTrainedConfig) -> str:
    """Register the plan's attention under one ``attn_implementation`` name and lift ``config``'s window if the plan
    says so (a copy the caller owns); returns the name."""
    variants = {t: variant_of(s) for t, s in plan.specs}
    functions = {t: attention_function(v) for t, v in variants.items()}
    lifted = set(plan.lifted)
    # the name says everything the function does (transformers keeps one function per name)
    name = PREFIX + "layers." + "+".join(f"{t}{'.lifted' if t in lifted else ''}-{v.hf_name[len(PREFIX):]}"
                                         for t, v in variants.items())

    def attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
        # dropout may come by position: kvpress's attention_patch wraps every registered function and passes it so
        layer_type = module.config.layer_types[module.layer_idx]  # the layer's own model, not one captured here
        if layer_type in lifted:
            kwargs["sliding_window"] = None  # the lifted window: the spec's own pattern rules
        return functions[layer_type](module, query, key, value, attention_mask, dropout, **kwargs)

    attend.__name__ = attend.__qualname__ = re.sub(r"\W", "_", name)
    AttentionInterface.register(name, attend)
    AttentionMaskInterface.register(name, padding_mask)
    if lifted:
        config.sliding_window = LIFTED_WINDOW
    return name


__all__ = ["FULL", "LIFTED_WINDOW", "OWN", "SLIDING", "LayerPlan", "is_own_window", "layer_plan", "lifted_types",
           "own_pattern", "parse_layer_spec", "register_layers", "window_layers"]
