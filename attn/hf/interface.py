"""Any registered variant as a transformers attention implementation (``AttentionInterface``).

``name = register("sliding_window:window=4096")`` registers two functions under one name: the attention
function (transformers' signature, mapped onto our ``m(q, k, v, causal)``) and the matching mask function
in ``AttentionMaskInterface`` -- without it transformers hands a custom implementation
``attention_mask=None`` and padding would be silently ignored (see :mod:`attn.hf.padding`).

Naming: ``attn_bench.<variant>[.<key>=<value>...]``, the spec's parameters in the order given, values as
validated (``sliding_window:window=0256`` -> ``attn_bench.sliding_window.window=256``), ``backend=`` kept.
transformers reads meaning into names: ``org/repo[:fn]`` is a hub kernel, a ``paged|`` prefix selects the
paged cache, and the substrings ``flash``, ``sdpa`` and ``flex_attention`` trigger those kernels' checks.
So ``:``, ``,`` and any other character outside ``[A-Za-z0-9_.=+-]`` become ``.``, and those substrings
are written in capitals (a plugin ``flash_linear`` is ``attn_bench.FLASH_linear``).

Decoding: with transformers' caches every call gets all cached keys; with :class:`attn.hf.cache.VariantCache` the
function gets only the new tokens, which it recognises (``claim``), and runs the variant's ``run_step`` on its own
bounded state (a window, a recurrence, a band of blocks).

Softcapping (Gemma 2 passes ``softcap``): honoured by variants with a ``softcap`` parameter (``full``,
``sliding_window``), with the model's value unless the spec sets a different one (refused); others refuse it.

The sliding-window rule: a model layer that passes ``sliding_window=w`` (Mistral, Qwen2 sliding layers)
can only be served by our ``sliding_window`` variant, with the model's ``w`` when the spec names no
window; a spec window that differs from the model's is refused (the model's cache keeps only ``w - 1``
past keys, and the two paths would no longer be the same model). Layers without a window (Llama, full
layers of hybrids) use the spec's window, or the variant's default.
"""
from __future__ import annotations

from attn.hf.needs import transformers as _transformers  # noqa: F401  (first: a broken install is an ImportError)

# isort: split

import math
import re
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedConfig, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface

from attn.attention.base import Attention
from attn.hf.cache import claim
from attn.hf.naming import PREFIX
from attn.hf.padding import padding_mask, run_padded
from attn.registry import ATTENTION, build_attention, parse_spec, shorten

# Substrings transformers gives a meaning to inside an attn_implementation name (see module docstring).
RESERVED = ("flash", "sdpa", "flex_attention", "paged")
# Keywords models pass that change the math when set (to anything but None or False): refused, by name.
UNSUPPORTED = ("s_aux", "sinks", "position_bias", "head_mask", "cu_seq_lens_q", "cu_seq_lens_k",
               "max_length_q", "max_length_k", "output_attentions")
# Keywords that carry no math (bookkeeping). Any other keyword with a value is refused too: unknown, so not honoured.
HARMLESS = ("use_cache", "cache_position", "past_key_values", "layer_idx")


@dataclass(frozen=True)
class Variant:
    """A registered spec: variant name, the parameters it gave (validated), and the backend."""

    hf_name: str
    name: str
    params: tuple[tuple[str, Any], ...]
    backend: str = "auto"

    def build(self, window: int | None = None, softcap: float | None = None) -> Attention:
        params = dict(self.params)
        if window is not None:
            params["window"] = window
        if softcap is not None:
            params["softcap"] = softcap
        return build_attention(self.name, backend=self.backend, **params)


_VARIANTS: dict[str, Variant] = {}


def hf_name(spec: str) -> str:
    """The ``attn_implementation`` name of a spec (see module docstring); ValueError if the spec is invalid."""
    return variant_of(spec).hf_name


def variant_of(spec: str) -> Variant:
    """A spec, validated (ValueError: unknown variant, parameter or backend), with its name (module docstring)."""
    name, raw = parse_spec(spec)
    backend = raw.pop("backend", "auto")
    config = ATTENTION.make_config(name, raw)  # ValueError naming the bad parameter
    params = tuple((k, getattr(config, k)) for k in raw)
    build_attention(name, backend=backend, **dict(params))  # an unknown backend fails here, not in a forward
    text = ".".join([name, *(f"{k}={v}" for k, v in params), *([f"backend={backend}"] if backend != "auto" else [])])
    text = re.sub(r"[^A-Za-z0-9_.=+-]", ".", text)
    for word in RESERVED:
        text = text.replace(word, word.upper())
    return Variant(PREFIX + text, name, params, backend)


def register(spec: str) -> str:
    """Make a variant spec (built-in or plugin) usable as ``attn_implementation=``; returns that name.

    Idempotent. Registers the attention function and the padding-mask function under the same name.
    """
    variant = variant_of(spec)
    known = _VARIANTS.get(variant.hf_name)
    if known is not None and known != variant:
        raise ValueError(f"spec {shorten(spec)} and an earlier one ({known.name}, {dict(known.params)}) both map to "
                         f"the name {variant.hf_name!r}; write the values differently")
    _VARIANTS[variant.hf_name] = variant
    AttentionInterface.register(variant.hf_name, attention_function(variant))
    AttentionMaskInterface.register(variant.hf_name, padding_mask)
    return variant.hf_name


def set_variant(model_or_config: PreTrainedModel | PreTrainedConfig, spec: str) -> str:
    """Register ``spec`` and switch a model (``set_attn_implementation``) or a config to it; returns the name."""
    name = register(spec)
    if isinstance(model_or_config, PreTrainedModel):
        model_or_config.set_attn_implementation(name)
        if model_or_config.config._attn_implementation != name:
            raise ValueError(f"{type(model_or_config).__name__} cannot switch its attention implementation "
                             "(it does not dispatch through transformers' AttentionInterface)")
    else:
        model_or_config._attn_implementation = name
    return name


def current_variant(model: PreTrainedModel) -> Variant | None:
    """The registered variant a model's attention dispatches to now (None: transformers' own, or a layer-typed one)."""
    return _VARIANTS.get(model.config._attn_implementation)


def config_window(config: PreTrainedConfig) -> int | None:
    """The sliding window some layer of the model uses, or None (Qwen2 sets one only with use_sliding_window)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return int(window)


def check_model_window(variant: Variant, model_window: int | None) -> int | None:
    """The window our variant runs with on a layer that passes ``model_window``; ValueError under the
    sliding-window rule (module docstring)."""
    if model_window is None:
        return None
    if variant.name != "sliding_window":
        raise ValueError(f"{variant.name}: the model uses sliding_window={model_window} (its cache keeps only the last "
                         f"{model_window - 1} keys), which only attn-bench's sliding_window variant can serve; use "
                         f"sliding_window, or set config.sliding_window=None")
    spec_window = dict(variant.params).get("window")
    if spec_window is not None and spec_window != model_window:
        raise ValueError(f"sliding_window: the spec's window={spec_window} differs from the model's "
                         f"sliding_window={model_window}; drop window= from the spec to use the model's")
    return model_window


def check_model_softcap(variant: Variant, softcap: float | None) -> float | None:
    """The softcap our variant runs with when the model passes ``softcap`` (Gemma 2): the model's, on a variant with
    a ``softcap`` parameter that the spec leaves unset or sets to the same value; else ValueError."""
    if not softcap:
        return None
    fields = ATTENTION.get(variant.name).params()
    if "softcap" not in fields:
        raise ValueError(f"{variant.name}: the model passes softcap={softcap:g}, and {variant.name} has no softcap "
                         "parameter (full and sliding_window have), so it would be silently ignored")
    spec_cap = dict(variant.params).get("softcap")
    if spec_cap not in (None, softcap):
        raise ValueError(f"{variant.name}: the spec's softcap={spec_cap:g} differs from the model's softcap={softcap:g}")
    return float(softcap)


def _module(hf_module: torch.nn.Module, variant: Variant, window: int | None, softcap: float | None = None) -> Attention:
    """Our module for this HF attention layer, built once and kept on it.

    A plain dict in ``__dict__``: not a registered submodule, so the checkpoint's ``state_dict`` and
    module tree stay as transformers made them (variants create their own buffers on the inputs' device).
    """
    cache = hf_module.__dict__.setdefault("_attn_bench_modules", {})
    key = (variant, window, softcap)
    if key not in cache:
        cache[key] = variant.build(window, softcap)
    return cache[key]


def attention_modules(model: torch.nn.Module) -> list[Attention]:
    """Our modules inside a transformers model, one per (layer, variant, window) that has run: the harness
    reads ``last_backend`` from them, as from the backbone's layers."""
    return [m for layer in model.modules() for m in layer.__dict__.get("_attn_bench_modules", {}).values()]


def _check_keywords(variant: Variant, module: Attention, scaling: float | None, dropout: float, head_dim: int,
                    kwargs: dict[str, Any]) -> float:
    """Refuse what the variant cannot honour; returns the factor to pre-scale q by (exact variants only)."""
    for key, value in kwargs.items():
        if key in HARMLESS or value is None or value is False:
            continue
        what = "not supported" if key in UNSUPPORTED else "a keyword attn-bench does not know"
        raise ValueError(f"{variant.name}: the model passes {key}={shorten(value)} ({what}); attn-bench variants "
                         "compute their own attention from q, k, v alone, so it would be silently ignored")
    if dropout:
        raise ValueError(f"{variant.name}: attention dropout={dropout} is not supported (transformers passes it in "
                         "training mode: set config.attention_dropout=0, or call model.eval())")
    if scaling is None or math.isclose(scaling, head_dim**-0.5, rel_tol=1e-6):
        return 1.0
    if not module.exact:
        raise ValueError(f"{variant.name}: the model scales scores by {scaling:g}, not 1/sqrt(head_dim)="
                         f"{head_dim**-0.5:g}, and {variant.name} is not softmax attention, so q cannot be rescaled")
    return scaling * math.sqrt(head_dim)  # softmax(s q k^T): pre-scale q, the variant divides by sqrt(D)


def _check_unpacked(position_ids: torch.Tensor | None) -> None:
    """Without a padding mask, position ids that restart mid-row mean packed documents (as transformers reads them)."""
    if position_ids is not None and position_ids.shape[-1] > 1 and bool((position_ids.diff(dim=-1) != 1).any()):
        raise ValueError("position_ids restart inside a row (packed sequences); attn-bench variants take no "
                         "document mask, so each row must hold one sequence")


def attention_function(variant: Variant):
    """transformers' attention signature -> our contract, for one registered variant."""

    def attend(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        sliding_window: int | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        # query: (B, H, Lq, D); key, value: (B, H_kv, Lk, D); attention_mask: (B, Lw) bool or None (padding_mask)
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"{variant.hf_name} got a {attention_mask.dim()}-D attention mask; it needs the mask from "
                             "its own registered mask function (register() adds it; do not pass a 4-D mask)")
        softcap = check_model_softcap(variant, kwargs.pop("softcap", None))
        ours = _module(module, variant, check_model_window(variant, sliding_window), softcap)
        scale = _check_keywords(variant, ours, scaling, dropout, query.shape[-1], kwargs)
        if attention_mask is None:
            _check_unpacked(position_ids)
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        q = query * scale if scale != 1.0 else query
        layer = claim(key)  # the new tokens of a VariantCache: the variant's own step (attn.hf.cache)
        if layer is not None:
            if not causal or attention_mask is not None:
                raise ValueError(f"{variant.name}: VariantCache decodes causal attention over rows without padding "
                                 "(each row's state would absorb its padding): use DynamicCache, or unpadded rows")
            return layer.step(ours, q, key, value).transpose(1, 2).contiguous(), None
        out = run_padded(lambda q_, k_, v_: ours(q_, k_, v_, causal=causal), q, key, value, attention_mask)
        return out.transpose(1, 2).contiguous(), None  # (B, Lq, H, D), as sdpa_attention_forward returns

    attend.__name__ = attend.__qualname__ = re.sub(r"\W", "_", variant.hf_name)
    return attend


__all__ = ["PREFIX", "Variant", "attention_function", "attention_modules", "check_model_window", "config_window",
           "current_variant", "hf_name",
           "register", "set_variant", "variant_of"]
