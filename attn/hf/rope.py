"""RoPE between transformers' ``config.rope_parameters`` and our position methods, both ways.

Our RoPE family uses Hugging Face's parameter names and formulas (``attn/positions/rope_scaling.py``), so
the mapping is a rename of the type plus the keys each type reads. One table, ``HF_TYPES``:

====================  ===============  ===========================================================
transformers          attn-bench       note
====================  ===============  ===========================================================
default               rope
linear                rope_linear
dynamic               rope_dynamic     transformers grows the base past ``config.max_position_embeddings``:
                                       that is our ``original_max_position_embeddings``
yarn                  rope_yarn        ``factor: null`` means max_position_embeddings / original (as HF)
llama3                rope_llama3
(none)                rope_ntk         static NTK is plain RoPE with base theta * s^(r/(r-2)): written as
                                       ``default`` with that ``rope_theta`` (same inv_freq; reads back as rope)
longrope, proportional, ...            refused: no attn-bench position computes them
====================  ===============  ===========================================================
"""
from __future__ import annotations

from attn.hf.needs import transformers as _transformers  # noqa: F401  (first: a broken install is an ImportError)

# isort: split

from typing import Any

from transformers import PreTrainedConfig, PreTrainedModel

from attn.registry import POSITIONS, parse_spec

# transformers rope_type -> (our position name, the keys of rope_parameters that type reads)
HF_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "default": ("rope", ()),
    "linear": ("rope_linear", ("factor",)),
    "dynamic": ("rope_dynamic", ("factor",)),
    "yarn": ("rope_yarn", ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                           "mscale", "mscale_all_dim", "truncate")),
    "llama3": ("rope_llama3", ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")),
}
OURS = {ours: hf for hf, (ours, _) in HF_TYPES.items()}


def _get(config: PreTrainedConfig | dict, key: str, default: Any = None) -> Any:
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def head_dim(config: PreTrainedConfig | dict) -> int:
    return _get(config, "head_dim") or _get(config, "hidden_size") // _get(config, "num_attention_heads")


def rope_dict(config: PreTrainedConfig | dict) -> dict[str, Any]:
    """transformers 5's ``rope_parameters``, or the legacy ``rope_scaling`` + ``rope_theta`` (a v4 config.json)."""
    params = _get(config, "rope_parameters")
    if not params:
        params = dict(_get(config, "rope_scaling") or {})
        params.setdefault("rope_theta", _get(config, "rope_theta", 10000.0))
    params = dict(params)
    params["rope_type"] = params.get("rope_type", params.pop("type", "default"))
    layer_types = _get(config, "layer_types") or ()
    if any(t in params for t in layer_types):
        raise ValueError("this config has one RoPE per layer type (rope_parameters keyed by layer type); "
                         "attn-bench maps a single RoPE")
    return params


def position_from_hf(config: PreTrainedConfig | dict) -> tuple[str, dict[str, Any]]:
    """A model config (object or config.json dict) -> (our position name, its params incl. head_dim)."""
    rp = rope_dict(config)
    kind = rp["rope_type"]
    if kind not in HF_TYPES:
        raise ValueError(f"rope_type {kind!r} has no attn-bench position; supported: {', '.join(HF_TYPES)}")
    name, keys = HF_TYPES[kind]
    params: dict[str, Any] = {"head_dim": head_dim(config), "rope_theta": float(rp["rope_theta"])}
    partial = rp.get("partial_rotary_factor", _get(config, "partial_rotary_factor"))
    if partial is not None and partial != 1.0:
        if int(params["head_dim"] * partial) % 2:
            raise ValueError(f"partial_rotary_factor={partial} gives an odd rotary dimension; RoPE rotates pairs")
        params["partial_rotary_factor"] = float(partial)
    params.update({k: rp[k] for k in keys if rp.get(k) is not None})
    if kind == "dynamic":
        params["original_max_position_embeddings"] = int(_get(config, "max_position_embeddings"))
    if kind == "yarn" and rp.get("factor") is None:
        params["factor"] = _get(config, "max_position_embeddings") / rp["original_max_position_embeddings"]
    if kind == "yarn":  # transformers reads beta_fast=0 as unset (`or 32`); our config would refuse it
        params = {k: v for k, v in params.items() if not (k in ("beta_fast", "beta_slow") and not v)}
    POSITIONS.make_config(name, params)  # ValueError if the checkpoint's values are out of range
    return name, params


def position_to_hf(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Our position name and params -> a ``rope_parameters`` dict (the keys given, plus rope_type and rope_theta).

    ``rope_dynamic``'s original_max_position_embeddings is not a rope_parameters key in transformers: it
    is ``config.max_position_embeddings`` (:func:`override_rope` checks the two agree).
    """
    config = POSITIONS.make_config(name, params)  # validates; fills rope_theta's default
    if name == "rope_ntk":
        r = config.rotary_dim
        out = {"rope_type": "default", "rope_theta": config.rope_theta * config.factor ** (r / (r - 2))}
    elif name in OURS:
        hf = OURS[name]
        out = {"rope_type": hf, "rope_theta": config.rope_theta}
        out.update({k: params[k] for k in HF_TYPES[hf][1] if k in params})
    else:
        raise ValueError(f"position {name!r} is not RoPE with a transformers rope_type; mappable: "
                         f"{', '.join([*OURS, 'rope_ntk'])}")
    if config.partial_rotary_factor != 1.0:
        out["partial_rotary_factor"] = config.partial_rotary_factor
    return out


def override_rope(model_or_config: PreTrainedModel | PreTrainedConfig, spec: str) -> dict[str, Any]:
    """Replace a model's (or config's) RoPE scaling with one of ours by spec, e.g. ``'rope_yarn:factor=4'``.

    Unspecified rope_theta, partial_rotary_factor and original_max_position_embeddings keep the checkpoint's
    values (the last falls back to max_position_embeddings, as transformers does). A model's rotary
    embeddings are rebuilt so the new frequencies take effect. Returns the new ``rope_parameters``.
    """
    is_model = isinstance(model_or_config, PreTrainedModel)
    config = model_or_config.config if is_model else model_or_config
    name, params = parse_spec(spec)
    current = rope_dict(config)
    params = {"head_dim": head_dim(config), "rope_theta": current["rope_theta"], **params}
    if "partial_rotary_factor" in current and "partial_rotary_factor" not in params:
        params["partial_rotary_factor"] = current["partial_rotary_factor"]
    fields = POSITIONS.get(name).params()  # ValueError naming the registered positions
    if "original_max_position_embeddings" in fields and "original_max_position_embeddings" not in params:
        params["original_max_position_embeddings"] = (current.get("original_max_position_embeddings")
                                                      or config.max_position_embeddings)
    if name == "rope_dynamic" and int(params["original_max_position_embeddings"]) != config.max_position_embeddings:
        raise ValueError(f"rope_dynamic: transformers grows the base past config.max_position_embeddings "
                         f"({config.max_position_embeddings}); set that to {params['original_max_position_embeddings']} "
                         "instead of original_max_position_embeddings")
    typed = POSITIONS.make_config(name, params)  # coerces the spec's strings
    rope_parameters = position_to_hf(name, {k: getattr(typed, k) for k in params})
    config.rope_parameters = rope_parameters
    if is_model:
        _rebuild_rotary(model_or_config)
    return rope_parameters


def _rebuild_rotary(model: PreTrainedModel) -> None:
    """Rotary-embedding modules compute inv_freq at construction: build each again from the new config."""
    for path, module in list(model.named_modules()):
        if "inv_freq" not in dict(module.named_buffers(recurse=False)) or not hasattr(module, "rope_type"):
            continue
        parent_path, _, attr = path.rpartition(".")
        fresh = type(module)(config=module.config).to(module.inv_freq.device)
        setattr(model.get_submodule(parent_path) if parent_path else model, attr, fresh)


__all__ = ["HF_TYPES", "override_rope", "position_from_hf", "position_to_hf", "rope_dict"]
